"""Which implementation runs: the torch references or the Triton kernels.

Importing this module never imports Triton. The rule everywhere in specdec:
the Triton kernel runs when Triton is importable and the tensors are on a
CUDA device; otherwise the torch reference runs (always on CPU). Under
``TRITON_INTERPRET=1`` the kernels can also be forced onto CPU tensors (the
tests do), slowly.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import torch

from specdec.kernels.kv_compact import compact_kv_inplace

__all__ = ["triton_available", "interpreter_enabled", "kv_compaction_path", "compact_kv_auto"]

_TRITON: bool | None = None


def triton_available() -> bool:
    """Whether Triton is installed (cached; does not import it)."""
    global _TRITON
    if _TRITON is None:
        try:
            _TRITON = importlib.util.find_spec("triton") is not None
        except (ImportError, ValueError):  # a broken or blocked installation
            _TRITON = False
    return _TRITON


def interpreter_enabled() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``): kernels then
    run on CPU tensors, slowly; the tests use it."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kv_compaction_path(cache_tensors: Sequence[torch.Tensor]) -> str:
    """``"triton"`` if :func:`compact_kv_auto` uses the kernel for these tensors, else ``"torch"``."""
    if cache_tensors and cache_tensors[0].is_cuda and triton_available():
        return "triton"
    return "torch"


def compact_kv_auto(cache_tensors: Sequence[torch.Tensor], keep_index: torch.Tensor) -> list[torch.Tensor]:
    """A ``kv_compactor`` for the model wrappers:
    :func:`~specdec.kernels.kv_compact_triton.compact_kv_triton` (one launch
    for every layer) for CUDA tensors when Triton is installed,
    :func:`~specdec.kernels.kv_compact.compact_kv_inplace` otherwise. Both
    compute :func:`~specdec.kernels.kv_compact.compact_kv_reference`'s result in
    place and return views of the inputs.

    Example:
        >>> import torch
        >>> k = torch.arange(6.0).reshape(1, 1, 6, 1)
        >>> compact_kv_auto([k], torch.tensor([0, 1, 3, 5]))[0].flatten().tolist()
        [0.0, 1.0, 3.0, 5.0]
    """
    if kv_compaction_path(cache_tensors) == "triton":
        from specdec.kernels.kv_compact_triton import compact_kv_triton

        return compact_kv_triton(cache_tensors, keep_index)
    return compact_kv_inplace(cache_tensors, keep_index)
