"""KV-cache compaction in one Triton launch (beside its torch reference).

After verification the cache holds ``past`` committed positions and the ``n``
tree nodes; the root and the accepted path are kept, the other nodes dropped
(:mod:`specdec.kernels.kv_compact`: :func:`~specdec.kernels.kv_compact.kv_keep_index`
says which positions survive, :func:`~specdec.kernels.kv_compact.compact_kv_reference`
defines the result). :func:`compact_kv_triton` computes that result in place,
like :func:`~specdec.kernels.kv_compact.compact_kv_inplace`, but moves the
kept rows of every layer's keys and values in ONE kernel launch (the torch
version issues a gather and a copy per tensor: 120 launches for a 30-layer
model, which dominate on a GPU).

The kernel: one program per (tensor, batch, head); it walks the moved
positions ``j = start .. S'-1`` (``start`` = first ``j`` with
``keep[j] != j``) in chunks, loading the source rows ``keep[j]`` of a chunk
into registers, then (after a barrier) storing them at rows ``j``. In place is
race-free because ``keep`` is strictly increasing, so ``keep[j] > j`` for every
moved ``j``: a chunk's sources are never rows an earlier chunk wrote, and
within a chunk all loads finish before any store. Rows are copied as raw bits
(any dtype).

This module imports Triton; :func:`specdec.kernels.select.compact_kv_auto`
(importable without Triton) uses the kernel for CUDA tensors when Triton is
installed and :func:`~specdec.kernels.kv_compact.compact_kv_inplace` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
import torch
import triton
import triton.language as tl

from specdec.kernels.kv_compact import compact_kv_reference

__all__ = ["compact_kv_triton", "compact_kv_reference"]

@triton.jit
def _compact_kv_kernel(
    ptrs_ptr,
    keep_ptr,
    start,
    n,
    heads,
    batch_heads,
    stride_b,
    stride_h,
    stride_s,
    stride_d,
    head_dim,
    ELEM_BYTES: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    t = pid // batch_heads
    bh = pid % batch_heads
    b = bh // heads
    h = bh % heads
    # a static branch on a constexpr: the one taken binds ELEM to a dtype (kept as such at compile time)
    if ELEM_BYTES == 1:
        ELEM = tl.int8
    elif ELEM_BYTES == 2:
        ELEM = tl.int16
    elif ELEM_BYTES == 4:
        ELEM = tl.int32
    else:
        ELEM = tl.int64
    base = tl.load(ptrs_ptr + t).to(tl.pointer_type(ELEM))
    base = base + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_dim
    rows = tl.arange(0, CHUNK)
    for j0 in range(start, n, CHUNK):
        js = j0 + rows
        jmask = js < n
        src = tl.load(keep_ptr + js, mask=jmask, other=0)
        m2 = jmask[:, None] & dmask[None, :]
        vals = tl.load(base + src[:, None] * stride_s + d[None, :] * stride_d, mask=m2)
        tl.debug_barrier()  # every source row of the chunk is read before any row is written
        tl.store(base + js.to(tl.int64)[:, None] * stride_s + d[None, :] * stride_d, vals, mask=m2)
        tl.debug_barrier()


def _start_and_check(keep_index: torch.Tensor, lengths: Sequence[int]) -> tuple[int, int]:
    """``(start, S')`` for ``keep_index``; raise unless it is strictly increasing and in range."""
    if keep_index.dim() != 1 or keep_index.dtype != torch.int64:
        raise ValueError(f"keep_index must be a 1-D int64 tensor, got {keep_index.dtype} {tuple(keep_index.shape)}")
    keep = keep_index.cpu()
    n = keep.numel()
    if n == 0:
        return 0, 0
    if bool((keep[1:] <= keep[:-1]).any()) or int(keep[0]) < 0:
        raise ValueError("compact_kv_triton needs a strictly increasing keep_index of positions >= 0 (in-place gather)")
    if lengths and int(keep[-1]) >= min(lengths):
        raise ValueError(f"keep_index position {int(keep[-1])} outside a cache of {min(lengths)} positions")
    moved = torch.nonzero(keep != torch.arange(n)).flatten()
    return (int(moved[0]) if moved.numel() else n), n


def compact_kv_triton(
    cache_tensors: Sequence[torch.Tensor], keep_index: torch.Tensor, *, chunk: int = 16
) -> list[torch.Tensor]:
    """:func:`~specdec.kernels.kv_compact.compact_kv_reference`'s result, in place, in one launch.

    Args:
        cache_tensors: ``2L`` tensors ``[B, H, S, D]`` (keys and values of every
            layer), on one device (CUDA, or CPU under ``TRITON_INTERPRET=1``);
            **modified in place**. Tensors sharing shape, strides and dtype are
            moved in the same launch (one launch per group).
        keep_index: ``[S']`` int64 strictly increasing positions, each ``< S``.
        chunk: positions moved per step of a program (power of two).

    Returns:
        Views ``t[..., :S', :]`` of the inputs (sharing their storage).

    Raises:
        ValueError: bad shapes, or ``keep_index`` not strictly increasing / out of range.

    Example (needs Triton; on a CPU set ``TRITON_INTERPRET=1``):

        k = torch.arange(6.0).reshape(1, 1, 6, 1)
        compact_kv_triton([k], torch.tensor([0, 1, 3, 5]))[0].flatten().tolist()  # [0.0, 1.0, 3.0, 5.0]
    """
    for t in cache_tensors:
        if t.dim() != 4:
            raise ValueError(f"cache tensors must be [B, H, S, D], got shape {tuple(t.shape)}")
    start, n = _start_and_check(keep_index, [t.shape[-2] for t in cache_tensors])
    out = [t[..., :n, :] for t in cache_tensors]
    if start >= n or not cache_tensors:
        return out
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in cache_tensors:
        groups.setdefault((tuple(t.shape), t.stride(), t.dtype, t.device), []).append(t)
    for (shape, stride, dtype, device), tensors in groups.items():
        batch, heads, _, head_dim = shape
        if batch * heads * head_dim == 0:
            continue
        ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64).to(device)
        keep = keep_index.to(device)
        elem = torch.empty((), dtype=dtype).element_size()
        _compact_kv_kernel[(len(tensors) * batch * heads,)](
            ptrs,
            keep,
            start,
            n,
            heads,
            batch * heads,
            stride[0],
            stride[1],
            stride[2],
            stride[3],
            head_dim,
            ELEM_BYTES=elem,
            CHUNK=chunk,
            BLOCK_D=triton.next_power_of_2(head_dim),
        )
    return out
