"""A tree batch in the forms serving engines' attention kernels and KV caches take, built on the device.

Conventions (docs/serving.md, "Layouts"): row ``b`` has ``prefix_lens[b]`` tokens in its
KV cache before the step (everything before the tree's root: the root, the last committed
token, is scored with the tree, as in SGLang's EAGLE worker); its tree has
``num_nodes[b]`` valid slots (``n`` with padding), the root at slot 0. Node ``i`` sits at
position ``prefix_lens[b] + depth[b, i]`` and attends every prefix position, its ancestors
and itself.

- :func:`tree_positions`: ``[B, n]`` position ids;
- :func:`sdpa_mask`: the additive ``[B, 1, n, P + n]`` mask of
  ``torch.nn.functional.scaled_dot_product_attention`` (``P = max(prefix_lens)``; key
  columns ``0 .. P - 1`` hold row ``b``'s prefix in ``0 .. prefix_lens[b] - 1``, the rest
  masked; columns ``P .. P + n - 1`` the tree's slots);
- :func:`flashinfer_mask`: FlashInfer's custom-mask layout for
  ``BatchPrefillWithPagedKVCacheWrapper.plan(..., packed_custom_mask=...)``: queries ragged
  by ``qo_indptr`` (``num_nodes[b]`` per row), each row's boolean ``[num_nodes, prefix +
  num_nodes]`` mask flattened row-major, concatenated, packed 8 per byte, least
  significant bit first (``bitorder="little"``), each row's bytes starting at
  ``mask_indptr[b]`` (``flashinfer.segment_packbits``' layout);
- :func:`retrieve_arrays`: SGLang's EAGLE verification arrays: ``retrieve_index[b, i] = b * n
  + i``, ``next_token[b, i]`` (the first child's slot, ``-1`` for none) and
  ``next_sibling[b, i]`` (the next child of the same parent in slot order, ``-1``);
- :func:`kv_compaction`: after verification, which of each row's tree KV entries to keep
  and where: the accepted node at depth ``d`` moves from ``prefix + slot`` to
  ``prefix + d`` (the root stays at ``prefix``), as ``[B, D]`` padded tensors and, on
  request, flat tensors with ``cu_num_accepted`` offsets (vLLM's ragged form).

Every function here is checked against a plain per-path reference built from each row's
host tree (``tests/engine/test_layouts.py``). :func:`tree_positions`, :func:`sdpa_mask`,
:func:`retrieve_arrays` and :func:`kv_compaction` make no host read;
:func:`flashinfer_mask` makes one (the ragged output's total size), and
:meth:`KVCompaction.flat` one.

Inputs are checked where they enter (:class:`~specdec.errors.InvalidConfigError` naming the
argument): ``prefix_lens`` holds ``B`` integers ``>= 0``; ``max_prefix`` is an integer at
least every ``prefix_lens[b]``; ``num_accepted`` holds ``B`` integers in ``[0, D]``. Shapes
and dtypes are checked always; the *values* of a Python sequence or of a CPU tensor are
checked too (no device read), those of a tensor on an accelerator are not read (these
functions make no host read): keeping them in range is the engine's part.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import attrs
import torch

from specdec.errors import InvalidConfigError
from specdec.tree_batch import TreeBatch

__all__ = ["FlashInferMask", "KVCompaction", "RetrieveArrays", "flashinfer_mask", "kv_compaction", "kv_moves", "pack_bits",
           "retrieve_arrays", "sdpa_mask", "tree_positions"]


def _first_bad(bad: torch.Tensor) -> int | None:
    """The first ``True`` of a ``[B]`` bool CPU tensor, or None; without a read unless one is
    ``True`` (the size of a CPU mask selection is known on the host)."""
    hits = bad.nonzero().view(-1)
    return int(hits[0]) if hits.numel() else None


def _counts(values: torch.Tensor | Sequence[int], what: str, device: torch.device,
            high: int | None = None) -> torch.Tensor:
    """``values`` as ``[B]`` int64 on ``device``: integers in ``[0, high]`` (module docstring:
    values on an accelerator are not read)."""
    if isinstance(values, torch.Tensor):
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise InvalidConfigError(f"{what} must hold integers, got a {values.dtype} tensor")
        out = values.to(torch.int64).reshape(-1)
    else:
        try:
            items = list(values)
        except TypeError:
            raise InvalidConfigError(f"{what} must be a sequence or tensor of integers, got {values!r:.60}") from None
        for b, v in enumerate(items):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidConfigError(f"{what}[{b}] is {v!r} ({type(v).__name__}), not an integer")
        out = torch.tensor([int(v) for v in items], dtype=torch.int64)
    if out.device.type == "cpu":
        row = _first_bad((out < 0) | (out > high) if high is not None else out < 0)
        if row is not None:
            where = f"[0, {high}]" if high is not None else "[0, inf): a length cannot be negative"
            raise InvalidConfigError(f"{what}[{row}] = {int(out[row])} outside {where}")
    return out.to(device)


def _prefix(tree: TreeBatch, prefix_lens: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """``[B]`` int64 prefix lengths on the tree's device, checked (no host read for a tensor)."""
    lens = _counts(prefix_lens, "prefix_lens", tree.device)
    if lens.shape[0] != tree.batch_size:
        raise InvalidConfigError(f"prefix_lens has {lens.shape[0]} entries for a tree batch of {tree.batch_size} rows")
    return lens


def _valid(tree: TreeBatch) -> torch.Tensor:
    """``[B, n]`` bool: the slot holds a node (slot < num_nodes)."""
    n = tree.node_slots
    return torch.arange(n, device=tree.device).view(1, n) < tree.num_nodes.view(-1, 1)


def tree_positions(tree: TreeBatch, prefix_lens: torch.Tensor | list[int]) -> torch.Tensor:
    """``[B, n]`` int64 position ids: ``prefix_lens[b] + depth[b, i]`` (padding slots: the root's).

    Args:
        tree: ``B`` trees of ``n`` slots.
        prefix_lens: ``[B]`` cached tokens before each root.
    """
    return _prefix(tree, prefix_lens).view(-1, 1) + torch.where(_valid(tree), tree.depths, 0)


def _allowed(tree: TreeBatch) -> torch.Tensor:
    """``[B, n, n]`` bool tree-part visibility: ancestors and self; a padding slot sees itself only."""
    n = tree.node_slots
    valid = _valid(tree)
    eye = torch.eye(n, dtype=torch.bool, device=tree.device).unsqueeze(0)
    return torch.where(valid.unsqueeze(-1), tree.ancestors & valid.unsqueeze(1), eye)


def sdpa_mask(tree: TreeBatch, prefix_lens: torch.Tensor | list[int], *, max_prefix: int | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive attention mask of the tree queries over prefix + tree keys (module docstring).

    Args:
        tree: ``B`` trees of ``n`` slots.
        prefix_lens: ``[B]`` cached tokens before each root.
        max_prefix: ``P``, the key columns reserved for the prefix (default: ``max(prefix_lens)``,
            one host read; pass it to avoid the read). Must be at least every ``prefix_lens[b]``
            (checked unless the lengths are on an accelerator; module docstring).
        dtype: the mask's floating dtype (the queries').

    Returns:
        ``[B, 1, n, P + n]``: ``0`` where the query may attend, ``-inf`` elsewhere. A padding
        slot attends to itself only, so no row is all ``-inf`` (its output is to be dropped).
    """
    lens = _prefix(tree, prefix_lens)
    if max_prefix is None:
        P = int(lens.max())
    else:
        if isinstance(max_prefix, bool) or not isinstance(max_prefix, numbers.Integral) or max_prefix < 0:
            raise InvalidConfigError(f"max_prefix must be an integer >= 0 (or None), got {max_prefix!r}")
        P = int(max_prefix)
        if lens.device.type == "cpu":
            b = _first_bad(lens > P)
            if b is not None:
                raise InvalidConfigError(
                    f"max_prefix {P} is below prefix_lens[{b}] = {int(lens[b])}: the mask's {P} prefix columns "
                    f"cannot hold row {b}'s prefix"
                )
    B, n = tree.batch_size, tree.node_slots
    prefix_ok = torch.arange(P, device=tree.device).view(1, 1, P) < lens.view(B, 1, 1)  # [B, 1, P]
    prefix_ok = prefix_ok & _valid(tree).unsqueeze(-1)  # padding queries see no prefix
    allowed = torch.cat([prefix_ok.expand(B, n, P), _allowed(tree)], dim=-1)  # [B, n, P + n]
    return torch.zeros(allowed.shape, dtype=dtype, device=tree.device).masked_fill_(~allowed, float("-inf")).unsqueeze(1)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool -> ``[ceil(N / 8)]`` uint8, bit ``j`` of byte ``k`` = ``bits[8 k + j]``
    (least significant first: numpy's ``packbits(..., bitorder="little")``, FlashInfer's ``packbits``)."""
    N = bits.shape[0]
    padded = torch.zeros((N + 7) // 8 * 8, dtype=torch.uint8, device=bits.device)
    padded[:N] = bits.to(torch.uint8)
    weights = (2 ** torch.arange(8, device=bits.device, dtype=torch.int32)).to(torch.uint8)
    return (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.int32).to(torch.uint8)


@attrs.frozen(eq=False)
class FlashInferMask:
    """FlashInfer's custom-mask inputs for a tree batch (module docstring).

    Attributes:
        qo_indptr: ``[B + 1]`` int32 query offsets (``num_nodes`` per row, valid slots only).
        kv_lens: ``[B]`` int32 keys per row: ``prefix_lens + num_nodes``.
        mask: ``[sum(num_nodes * kv_lens)]`` bool, each row's ``[num_nodes, kv_len]`` mask row-major.
        mask_indptr: ``[B + 1]`` int32 offsets into :attr:`packed` (bytes; every row starts on a byte).
        packed: uint8 the packed mask (``packed_custom_mask``).
        query_slots: ``[sum(num_nodes)]`` int64 the tree slot of each ragged query, row by row.
    """

    qo_indptr: torch.Tensor
    kv_lens: torch.Tensor
    mask: torch.Tensor
    mask_indptr: torch.Tensor
    packed: torch.Tensor
    query_slots: torch.Tensor


def flashinfer_mask(tree: TreeBatch, prefix_lens: torch.Tensor | list[int]) -> FlashInferMask:
    """The tree batch in FlashInfer's ragged custom-mask layout (module docstring); one host read
    (the rows' mask sizes, which size the ragged outputs)."""
    lens = _prefix(tree, prefix_lens)
    B, n = tree.batch_size, tree.node_slots
    dev = tree.device
    nodes = tree.num_nodes.to(torch.int64)
    kv = lens + nodes  # [B]
    sizes = nodes * kv  # [B] mask entries per row
    host = torch.stack([nodes, kv, sizes, lens]).tolist()  # the one read
    node_h, kv_h, size_h, lens_h = host
    P = max(lens_h) if lens_h else 0
    valid = _valid(tree)
    allowed = _allowed(tree)  # [B, n, n]
    cols = torch.arange(P + n, device=dev).view(1, 1, P + n)
    # a row's key column c: prefix if c < prefix_len, else tree slot c - prefix_len
    rel = cols - lens.view(B, 1, 1)  # [B, 1, P + n]
    tree_part = allowed.gather(2, rel.clamp(0, n - 1).expand(B, n, P + n)) & (rel >= 0) & (rel < nodes.view(B, 1, 1))
    full = (rel < 0) | tree_part  # [B, n, P + n]
    in_row = (cols < kv.view(B, 1, 1)) & valid.unsqueeze(-1)  # [B, n, P + n] entries that belong to the row's mask
    mask = full[in_row.expand(B, n, P + n)]  # row-major per row, rows in order
    byte_sizes = [(s + 7) // 8 for s in size_h]
    starts = [0]
    for s in size_h:
        starts.append(starts[-1] + s)
    packed = torch.cat([pack_bits(mask[starts[b]: starts[b + 1]]) for b in range(B)]) if B else torch.zeros(0, dtype=torch.uint8)
    mask_indptr = [0]
    for s in byte_sizes:
        mask_indptr.append(mask_indptr[-1] + s)
    qo = [0]
    for k in node_h:
        qo.append(qo[-1] + k)
    slots = torch.arange(n, device=dev).expand(B, n)[valid]
    return FlashInferMask(
        qo_indptr=torch.tensor(qo, dtype=torch.int32, device=dev), kv_lens=torch.tensor(kv_h, dtype=torch.int32, device=dev),
        mask=mask, mask_indptr=torch.tensor(mask_indptr, dtype=torch.int32, device=dev), packed=packed.to(dev),
        query_slots=slots,
    )


@attrs.frozen(eq=False)
class RetrieveArrays:
    """SGLang's tree verification arrays (module docstring); ``[B, n]`` int64 each, ``-1`` = none.

    Attributes:
        retrieve_index: ``b * n + i`` for a node, ``-1`` for padding.
        next_token: the slot of the node's first child (lowest slot), ``-1`` for a leaf.
        next_sibling: the slot of the next child of the same parent (next higher slot), ``-1`` for the last.
    """

    retrieve_index: torch.Tensor
    next_token: torch.Tensor
    next_sibling: torch.Tensor


def retrieve_arrays(tree: TreeBatch) -> RetrieveArrays:
    """The first-child / next-sibling arrays of every tree (module docstring), no host read."""
    B, n = tree.batch_size, tree.node_slots
    dev = tree.device
    valid = _valid(tree)
    slot = torch.arange(n, device=dev).view(1, n).expand(B, n)
    is_child = valid & (tree.parents >= 0)  # [B, n]
    parent = tree.parents.clamp_min(0)
    big = n  # "none" before mapping to -1
    # first child: the smallest child slot per parent
    first = torch.full((B, n), big, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, parent, torch.where(is_child, slot, big), reduce="amin")
    # next sibling: the smallest slot among children of the same parent with a larger slot
    same = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & is_child.unsqueeze(1) & is_child.unsqueeze(2)  # [B, i, j]
    later = slot.unsqueeze(2) < slot.unsqueeze(1)  # [B, i, j]: j after i
    candidates = torch.where(same & later, slot.unsqueeze(1).expand(B, n, n), big)
    sibling = candidates.amin(dim=2)
    none = torch.full_like(first, -1)
    return RetrieveArrays(
        retrieve_index=torch.where(valid, torch.arange(B, device=dev).view(B, 1) * n + slot, none),
        next_token=torch.where(valid & (first < big), first, none),
        next_sibling=torch.where(is_child & (sibling < big), sibling, none),
    )


@attrs.frozen(eq=False)
class KVCompaction:
    """Which tree KV entries each row keeps after verification (module docstring).

    Attributes:
        src: ``[B, D]`` int64 position in the row's KV sequence of the ``d``-th accepted node
            (``prefix + slot``), ``-1`` padded.
        dst: ``[B, D]`` int64 where it goes: ``prefix + d`` (``d = 1 ..``), ``-1`` padded.
        num_accepted: ``[B]`` int64.
        kv_lens: ``[B]`` int64 the rows' KV lengths after compaction: ``prefix + 1 + num_accepted``
            (the root and the accepted path; the bonus token is not yet in the cache).
    """

    src: torch.Tensor
    dst: torch.Tensor
    num_accepted: torch.Tensor
    kv_lens: torch.Tensor

    def flat(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(src [total], dst [total], cu_num_accepted [B + 1])``: the ragged form, rows in order
        (one host read: the total)."""
        keep = self.src >= 0
        cu = torch.zeros(self.num_accepted.shape[0] + 1, dtype=torch.int64, device=self.src.device)
        cu[1:] = torch.cumsum(self.num_accepted, 0)
        return self.src[keep], self.dst[keep], cu


def kv_compaction(accepted: torch.Tensor, num_accepted: torch.Tensor, prefix_lens: torch.Tensor | list[int]) -> KVCompaction:
    """The KV moves that keep each row's accepted path (module docstring), no host read.

    Args:
        accepted: ``[B, D]`` int64 accepted slots, root's child first, ``-1`` padded (a verifier's
            :class:`~specdec.verify.fast.TreeDecision` ``accepted``).
        num_accepted: ``[B]`` int64, each in ``[0, D]``.
        prefix_lens: ``[B]`` cached tokens before each root.
    """
    if not isinstance(accepted, torch.Tensor) or accepted.dim() != 2 or accepted.is_floating_point() \
            or accepted.is_complex() or accepted.dtype == torch.bool:
        raise InvalidConfigError(f"accepted must be a [B, D] integer tensor, got {getattr(accepted, 'shape', accepted)!r:.60}")
    B, D = accepted.shape
    if not isinstance(num_accepted, torch.Tensor):
        raise InvalidConfigError(f"num_accepted must be a [B] integer tensor, got {type(num_accepted).__name__}")
    num_accepted = _counts(num_accepted, "num_accepted", accepted.device, high=D)
    if num_accepted.shape[0] != B:
        raise InvalidConfigError(f"num_accepted has {num_accepted.shape[0]} entries for {B} verified rows")
    lens = _counts(prefix_lens, "prefix_lens", accepted.device)
    if lens.shape[0] != B:
        raise InvalidConfigError(f"prefix_lens has {lens.shape[0]} entries for {B} verified rows")
    src, dst, kv_lens = kv_moves(accepted, num_accepted, lens)
    return KVCompaction(src, dst, num_accepted, kv_lens)


def kv_moves(accepted: torch.Tensor, num_accepted: torch.Tensor, prefix_lens: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`kv_compaction`'s moves from checked tensors (no check, no host read: a fixed-shape graph's
    form, :mod:`specdec.engine.fixed_step`): ``src`` / ``dst`` ``[B, D]`` int64 (``-1`` padded) and the KV
    lengths after compaction ``[B]`` (``prefix + 1 + num_accepted``). ``prefix_lens``: ``[B]`` int64."""
    B, D = accepted.shape
    taken = torch.arange(D, device=accepted.device).view(1, D) < num_accepted.view(B, 1)
    src = torch.where(taken, prefix_lens.view(B, 1) + accepted, -1)
    dst = torch.where(taken, prefix_lens.view(B, 1) + torch.arange(1, D + 1, device=accepted.device).view(1, D), -1)
    return src, dst, prefix_lens.view(B) + 1 + num_accepted
