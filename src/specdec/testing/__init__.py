"""Tools to prove losslessness: exact enumeration of every random branch.

Shipped with the library so that a researcher who registers a new verifier or
builder can check it exactly, the way specdec's own tests do.
"""

from specdec.testing.enumerate import EnumeratingRandom, TooManyBranchesError, exact_law

__all__ = ["EnumeratingRandom", "TooManyBranchesError", "exact_law"]
