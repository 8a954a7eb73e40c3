"""Tools to prove losslessness: exact enumeration of every random branch, exact
laws that scale, and the conformance suites that prove a plug-in.

Shipped with the library so that a researcher who registers a new verifier or
builder can check it exactly, the way specdec's own tests do: in one command,
``python -m specdec.testing.conformance my_pkg.my_module``
(:mod:`specdec.testing.conformance`), or piece by piece with :func:`exact_law`,
:class:`ExactLaws` and the cases of :mod:`specdec.testing.cases` and
:mod:`specdec.testing.shapes`.
"""

from typing import TYPE_CHECKING

from specdec._deprecation import deprecated_aliases
from specdec.testing.cases import Mix, draw_children, make_node_case, run_node_case
from specdec.testing.enumerate import EnumeratingRandom, TooManyBranchesError, exact_law
from specdec.testing.laws import RENAMED as _RENAMED
from specdec.testing.laws import ExactLaws, LawGap, compare_laws, sparse_markov_pair
from specdec.testing.markov import MarkovLM, markov_pair, random_markov_logits
from specdec.testing.proposal import ProposalLM
from specdec.testing.shapes import SHAPES, ShapeBuilder
from specdec.testing.statistical import ChiSquareResult, chi_square_test, total_variation

__all__ = [
    "SHAPES",
    "ChiSquareResult",
    "EnumeratingRandom",
    "ExactLaws",
    "LawGap",
    "MarkovLM",
    "Mix",
    "ProposalLM",
    "ShapeBuilder",
    "TooManyBranchesError",
    "chi_square_test",
    "compare_laws",
    "draw_children",
    "exact_law",
    "make_node_case",
    "markov_pair",
    "random_markov_logits",
    "run_node_case",
    "sparse_markov_pair",
    "total_variation",
]

if not TYPE_CHECKING:  # random_tables -> sparse_markov_pair (0.1.0; removed in 0.2.0), warns
    __getattr__ = deprecated_aliases(__name__, globals(), _RENAMED)
