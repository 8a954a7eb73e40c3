"""Verifiers: one file per rule of ALGORITHMS.md, all registered under role ``"verifier"``."""

from specdec.verify.base import NodeOutcome, Verifier, VerifyResult

__all__ = ["NodeOutcome", "Verifier", "VerifyResult"]
