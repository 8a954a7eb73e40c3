"""KV-cache compaction after verification: keep the committed context and the
accepted path of a draft tree, drop the rejected nodes.

Words: after a target forward over a draft tree of ``n`` nodes, the KV cache
holds ``past`` committed positions followed by the ``n`` tree nodes in node
order. The *accepted* path is a chain of nodes below the root; the root and the
accepted nodes become committed context, every other node is dropped.

Shapes: ``B`` batch (1 in specdec), ``H`` KV heads, ``S`` cached positions
before compaction, ``S'`` after, ``D`` head dim.

The step is split in two pure functions so that a fused kernel can replace
:func:`compact_kv_reference` without touching the bookkeeping:
:func:`kv_keep_index` (which positions survive) and
:func:`compact_kv_reference` (gather them). :func:`compact_kv_inplace` is the
torch implementation the model wrappers use by default: the same result,
moving only the positions after the untouched prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["kv_keep_index", "compact_kv_reference", "compact_kv_inplace"]


def kv_keep_index(past_len: int, tree_nodes: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """Cache positions that survive compaction.

    Args:
        past_len: number of committed positions cached before the tree.
        tree_nodes: tree node indices to keep, in sequence order (root first:
            ``[0, *accepted]``). Node ``i`` sits at cache position ``past_len + i``.
        device: device of the returned index.

    Returns:
        ``[past_len + len(tree_nodes)]`` int64 positions, ascending when
        ``tree_nodes`` is (parents precede children in a
        :class:`~specdec.tree.DraftTree`, so an accepted path always is).

    Example:
        >>> kv_keep_index(3, [0, 2, 5]).tolist()
        [0, 1, 2, 3, 5, 8]
    """
    if past_len < 0:
        raise ValueError(f"past_len must be >= 0, got {past_len}")
    nodes = torch.as_tensor(list(tree_nodes), dtype=torch.int64)
    if nodes.numel() and int(nodes.min()) < 0:
        raise ValueError("tree node indices must be >= 0")
    return torch.cat([torch.arange(past_len, dtype=torch.int64), nodes + past_len]).to(device)


def compact_kv_reference(cache_tensors: Sequence[torch.Tensor], keep_index: torch.Tensor) -> list[torch.Tensor]:
    """Gather the kept positions of every cache tensor (pure torch reference).

    Args:
        cache_tensors: the KV cache as a flat sequence of ``2L`` tensors (keys
            and values of each of ``L`` layers, any order), each
            ``[B, H, S, D]``; ``S`` may differ between tensors only if
            ``keep_index`` is valid for all of them.
        keep_index: ``[S']`` int64 positions to keep, on the tensors' device;
            every entry in ``[0, S)``.

    Returns:
        New tensors ``[B, H, S', D]``, ``out[t][..., j, :] = cache_tensors[t][..., keep_index[j], :]``;
        the inputs are not modified.

    Example:
        >>> import torch
        >>> k = torch.arange(5.0).reshape(1, 1, 5, 1)
        >>> compact_kv_reference([k], torch.tensor([0, 1, 3]))[0].flatten().tolist()
        [0.0, 1.0, 3.0]
    """
    if keep_index.dim() != 1 or keep_index.dtype != torch.int64:
        raise ValueError(f"keep_index must be a 1-D int64 tensor, got {keep_index.dtype} {tuple(keep_index.shape)}")
    out = []
    for t in cache_tensors:
        if t.dim() != 4:
            raise ValueError(f"cache tensors must be [B, H, S, D], got shape {tuple(t.shape)}")
        out.append(t.index_select(-2, keep_index))
    return out


def compact_kv_inplace(
    cache_tensors: Sequence[torch.Tensor], keep_index: torch.Tensor, *, first_moved: int | None = None
) -> list[torch.Tensor]:
    """:func:`compact_kv_reference`'s result, computed in place.

    Positions ``j`` with ``keep_index[j] == j`` (the committed prefix) stay
    where they are; only the rest (root and accepted path: a handful of
    positions) is gathered and written over positions ``j0 .. S'-1``, where
    ``j0`` is the first ``j`` with ``keep_index[j] != j``.

    Args:
        cache_tensors: as for :func:`compact_kv_reference`; **modified in place**.
        keep_index: ``[S']`` int64 positions, every entry in ``[0, S)``.
        first_moved: the first ``i`` with ``keep_index[i] != i`` (``S'`` if
            none), when the caller knows it; otherwise it is read from
            ``keep_index`` (a device-to-host copy on CUDA).

    Returns:
        Views ``t[..., :S', :]`` of the input tensors (sharing their storage).

    Example:
        >>> import torch
        >>> k = torch.arange(6.0).reshape(1, 1, 6, 1)
        >>> compact_kv_inplace([k], torch.tensor([0, 1, 3, 5]))[0].flatten().tolist()
        [0.0, 1.0, 3.0, 5.0]
    """
    if keep_index.dim() != 1 or keep_index.dtype != torch.int64:
        raise ValueError(f"keep_index must be a 1-D int64 tensor, got {keep_index.dtype} {tuple(keep_index.shape)}")
    n = keep_index.numel()
    if first_moved is None:
        moved = torch.nonzero(keep_index.cpu() != torch.arange(n)).flatten()
        start = int(moved[0]) if moved.numel() else n
    else:
        start = first_moved
    source = keep_index[start:]
    out = []
    for t in cache_tensors:
        if t.dim() != 4:
            raise ValueError(f"cache tensors must be [B, H, S, D], got shape {tuple(t.shape)}")
        if start < n:
            t[..., start:n, :] = t.index_select(-2, source)
        out.append(t[..., :n, :])
    return out
