"""Verifiers: one file per rule of docs/verifiers.md, all registered under role ``"verifier"``.

- ``greedy``: rule 1, accept ``argmax p`` (temperature 0); any children.
- ``match``: rule 2, sample-and-match; any children.
- ``rejection-iid``: rule 3, recursive rejection; sampled children drawn i.i.d.
- ``rejection-wor``: rule 4, recursive rejection; sampled children drawn without replacement.
- ``mixed``: rule 5 (RheoSampling), sampled children first (rules 3/4 on ``q'``),
  then rule 2 over the deterministic ones; any children.
- ``kseq``: rule 6, SpecTr K-SEQ; sampled children drawn i.i.d.
- ``traversal``: rule 7, traversal verification (path-level, leaf to root); sampled
  children drawn i.i.d. or without replacement (:mod:`specdec.verify.traversal`).
- ``block``: rule 8, block verification (path-level); chains of sampled children.

The per-node math is in :mod:`specdec.verify.residual`; see ``docs/verifiers.md``.
"""

from specdec.verify.base import NodeOutcome, Verifier, VerifyResult, WholeTreeVerifier
from specdec.verify.greedy import GreedyVerifier
from specdec.verify.kseq import KSeqVerifier
from specdec.verify.match import MatchVerifier
from specdec.verify.mixed import MixedVerifier
from specdec.verify.rejection import RejectionIIDVerifier, RejectionWORVerifier
from specdec.verify.traversal import BlockVerifier, TraversalVerifier

__all__ = [
    "BlockVerifier",
    "GreedyVerifier",
    "KSeqVerifier",
    "MatchVerifier",
    "MixedVerifier",
    "NodeOutcome",
    "RejectionIIDVerifier",
    "RejectionWORVerifier",
    "TraversalVerifier",
    "Verifier",
    "VerifyResult",
    "WholeTreeVerifier",
]
