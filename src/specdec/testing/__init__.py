"""Tools to prove losslessness: exact enumeration of every random branch.

Shipped with the library so that a researcher who registers a new verifier or
builder can check it exactly, the way specdec's own tests do.
"""

from specdec.testing.enumerate import EnumeratingRandom, TooManyBranchesError, exact_law
from specdec.testing.markov import MarkovLM, markov_pair, random_markov_logits
from specdec.testing.proposal import ProposalLM
from specdec.testing.statistical import ChiSquareResult, chi_square_test, total_variation

__all__ = [
    "ChiSquareResult",
    "EnumeratingRandom",
    "MarkovLM",
    "ProposalLM",
    "TooManyBranchesError",
    "chi_square_test",
    "exact_law",
    "markov_pair",
    "random_markov_logits",
    "total_variation",
]
