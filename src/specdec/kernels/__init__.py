"""Compute kernels, each beside its pure-torch reference.

A kernel and its reference share one signature; the reference defines the
semantics (and is what the tests compare a kernel against). The Triton
kernels (:mod:`specdec.kernels.verify_triton`,
:mod:`specdec.kernels.kv_compact_triton`) are imported only when used, so
importing specdec never needs Triton; see ``docs/kernels.md``.

- KV compaction: :func:`compact_kv_reference` (reference),
  :func:`compact_kv_inplace` (torch, in place), ``compact_kv_triton`` (one
  launch), :func:`compact_kv_auto` (picks by device).
- Verification (docs/verifiers.md rules 2-5): the registered verifiers run with a
  :class:`CounterRandom` (reference); the fused kernel's driver,
  :mod:`specdec.kernels.verify_fused` (``fused_verify``: one launch for every node of
  host trees; ``fused_verify_batch``: one launch for a device tree batch, what the
  generation loop runs when its dispatch picks the kernel), sits with the verification
  rules in the strategies layer (docs/architecture.md), so it is imported from its module,
  not from this package.
"""

from specdec.rng import CounterRandom
from specdec.kernels.kv_compact import compact_kv_inplace, compact_kv_reference, kv_keep_index
from specdec.kernels.select import compact_kv_auto, triton_available

__all__ = [
    "CounterRandom",
    "compact_kv_auto",
    "compact_kv_inplace",
    "compact_kv_reference",
    "kv_keep_index",
    "triton_available",
]
