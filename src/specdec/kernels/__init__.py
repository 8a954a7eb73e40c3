"""Compute kernels, each beside its pure-torch reference.

A kernel and its reference share one signature; the reference defines the
semantics (and is what the tests compare a kernel against).
"""

from specdec.kernels.kv_compact import compact_kv_inplace, compact_kv_reference, kv_keep_index

__all__ = ["compact_kv_inplace", "compact_kv_reference", "kv_keep_index"]
