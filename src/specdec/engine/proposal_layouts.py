"""An engine's proposals in its own layouts, as records, and their conversion to a :class:`~specdec.tree_batch.TreeBatch`.

The records (every tensor's shape on its attribute) and the conversions, on the device with tensor
ops, of :mod:`specdec.engine.proposals` (docs/serving.md, "Verifying an engine's own proposals"):

- :class:`ChainProposals`: vLLM v1's flat ragged chains; :func:`chain_tree_batch`, and
  :func:`chain_target_logits` (``[T + B, V]`` to ``[B, n, V]``);
- :class:`TreeProposals`: SGLang's retrieve arrays; :func:`tree_tree_batch` (the inverse of
  :func:`~specdec.engine.layouts.retrieve_arrays`: parents by pointer jumping over the
  first-child / next-sibling links, ``log2 n`` gathers, no host read);
- :class:`DraftLaws`: a proposal's draft laws, dense or sparse.

With ``validate=True`` every input's values are checked on the device and read back once (with
the bounds left None), before anything is drawn; each bad input raises
:class:`~specdec.errors.InvalidConfigError` or :class:`~specdec.errors.InvalidDistributionError`
naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch

from specdec.errors import InvalidConfigError, InvalidDistributionError
from specdec.tree import NodeKind
from specdec.tree_batch import PAD, TreeBatch

__all__ = ["ChainProposals", "DraftLaws", "TreeProposals", "chain_target_logits", "chain_tree_batch", "tree_tree_batch"]

F64 = torch.float64


@attrs.frozen(eq=False)
class DraftLaws:
    """The draft laws of a batch of proposals (``N`` rows: see the layout records for what a row is).

    Attributes:
        probs: ``[N, V]`` dense probabilities, or ``[N, k]`` the probabilities of ``ids``.
        ids: None (dense), or ``[N, k]`` int token ids of the sparse support (``-1`` padding with probability 0).
    """

    probs: torch.Tensor
    ids: torch.Tensor | None = None


@attrs.frozen(eq=False)
class ChainProposals:
    """vLLM v1's layout: ``B`` chains, flat and ragged (``T`` draft tokens in all).

    Attributes:
        draft_token_ids: ``[T]`` int32 or int64, request after request.
        cu_num_draft_tokens: ``[B]`` int, the cumulative draft counts (``cu[b]`` = drafts of rows ``0..b``).
        laws: the law each draft token was drawn from, ``[T, V]`` or ``[T, k]``; None: deterministic.
        max_spec_len: the most drafts of one row (a host bound); None: read from the offsets (one host read).
        root_tokens: ``[B]`` each row's last committed token (not read by the verifiers; 0 if None).
    """

    draft_token_ids: torch.Tensor
    cu_num_draft_tokens: torch.Tensor
    laws: DraftLaws | None = None
    max_spec_len: int | None = None
    root_tokens: torch.Tensor | None = None

    @property
    def kind(self) -> str:
        """``"chain"`` (sampled children with laws) or ``"deterministic"``."""
        return "deterministic" if self.laws is None else "chain"


@attrs.frozen(eq=False)
class TreeProposals:
    """SGLang's layout: ``B`` trees of ``n`` slots as retrieve arrays; slot 0 is each row's root.

    Attributes:
        draft_tokens: ``[B * n]`` or ``[B, n]`` int, each slot's token (slot 0: the root's).
        retrieve_index: ``[B, n]`` int, ``>= 0`` for a node (the valid slots are a prefix), ``-1`` padding.
        retrieve_next_token: ``[B, n]`` int, the slot of the node's first child, ``-1`` none.
        retrieve_next_sibling: ``[B, n]`` int, the slot of the node's next sibling, ``-1`` none.
            A parent's slot is below its children's.
        laws: per node, the law of its children, ``[B * n, ...]`` or ``[B, n, ...]``; None: deterministic.
        mode: how sampled children were drawn: ``"iid"`` or ``"wor"`` (without replacement).
        draw_order: the draws' order among sampled siblings: ``[B, n]`` int, ``"siblings"`` (the
            sibling chain's order), or None (unknown: the rules that need it are refused).
        max_children, max_depth: host bounds; None: read from the arrays (one host read).
    """

    draft_tokens: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    laws: DraftLaws | None = None
    mode: str = "iid"
    draw_order: torch.Tensor | str | None = None
    max_children: int | None = None
    max_depth: int | None = None

    @property
    def kind(self) -> str:
        """``"deterministic"``, ``"chain"`` (sampled, ``max_children=1`` declared), ``"iid"`` or ``"wor"``."""
        if self.laws is None:
            return "deterministic"
        return "chain" if self.max_children == 1 else self.mode


# ----------------------------------------------------------------- input checks
def as_int_tensor(x: object, what: str, dims: int) -> torch.Tensor:
    """``x`` as an int64 tensor of ``dims`` dimensions, else :class:`~specdec.errors.InvalidConfigError` naming ``what``."""
    if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise InvalidConfigError(f"{what} must be an integer tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() != dims:
        raise InvalidConfigError(f"{what} must have {dims} dimension(s), got shape {tuple(x.shape)}")
    return x.to(torch.int64)


def flat_logits(x: object, rows: int, V: int | None, what: str = "target_logits") -> torch.Tensor:
    """``x`` as ``[rows, V]`` floating-point logits (any leading shape of ``rows`` entries), else
    :class:`~specdec.errors.InvalidConfigError` naming ``what``."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise InvalidConfigError(f"{what} must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    flat = x.reshape(-1, x.shape[-1]) if x.dim() >= 2 else x
    if x.dim() < 2 or flat.shape[0] != rows:
        raise InvalidConfigError(f"{what} must have {rows} rows of logits, got shape {tuple(x.shape)}")
    if V is not None and flat.shape[-1] != V:
        raise InvalidConfigError(f"{what} has vocabulary {flat.shape[-1]}, the draft laws {V}: the vocabularies do not match")
    return flat


def _law_rows(laws: DraftLaws, rows: int, V: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [rows, L], probs [rows, L] float64)`` of the laws (dense: ``L = V``, ids ``0..V-1``), shapes checked."""
    probs = laws.probs
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise InvalidConfigError(f"laws.probs must be a floating-point tensor, got {getattr(probs, 'dtype', type(probs).__name__)}")
    probs = probs.reshape(-1, probs.shape[-1]) if probs.dim() >= 2 else probs
    if probs.dim() != 2 or probs.shape[0] != rows:
        raise InvalidConfigError(f"laws.probs must have {rows} rows, got shape {tuple(laws.probs.shape)}")
    if probs.device != device:
        raise InvalidConfigError(f"laws.probs is on {probs.device}, the proposals on {device}")
    if laws.ids is None:
        if probs.shape[1] != V:
            raise InvalidConfigError(f"laws.probs has vocabulary {probs.shape[1]}, target_logits {V}: the vocabularies do not match")
        return torch.arange(V, device=device).expand(rows, V), probs.to(F64)
    ids = as_int_tensor(laws.ids, "laws.ids", laws.ids.dim() if isinstance(laws.ids, torch.Tensor) else 2)
    ids = ids.reshape(-1, ids.shape[-1]) if ids.dim() >= 2 else ids
    if tuple(ids.shape) != tuple(probs.shape):
        raise InvalidConfigError(f"laws.ids has shape {tuple(laws.ids.shape)}, laws.probs {tuple(laws.probs.shape)}: they must match")
    return ids, probs.to(F64)


def _law_problems(laws: DraftLaws, ids: torch.Tensor, probs: torch.Tensor, used: torch.Tensor, V: int) -> list[torch.Tensor]:
    """Device flags (``[]`` bool each): ids outside the vocabulary, ids repeated, not a distribution, over the
    rows ``used`` (``[N]`` bool) of the laws ``ids, probs [N, L]`` (dense laws: the id checks cannot fail)."""
    tol = 1e-9 if laws.probs.dtype == F64 else 1e-4
    if laws.ids is None:
        outside = repeated = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    else:
        pad = ids < 0
        outside = ((ids >= V) | (pad & (probs != 0))).any(-1)  # [N]
        srt = torch.sort(torch.where(pad, -1 - torch.arange(ids.shape[-1], device=ids.device), ids), dim=-1).values
        repeated = (srt[:, 1:] == srt[:, :-1]).any(-1) if ids.shape[-1] > 1 else torch.zeros_like(outside)
    bad_values = (~torch.isfinite(probs) | (probs < 0)).any(-1)
    not_law = bad_values | ((torch.where(torch.isfinite(probs), probs, 0.0).sum(-1) - 1.0).abs() > tol)
    return [(outside & used).any(), (repeated & used).any(), (not_law & used).any()]


_LAW_MESSAGES = (
    (InvalidConfigError, "laws.ids: a token id is outside [0, {V}) (or a -1 padding entry has a probability)"),
    (InvalidConfigError, "laws.ids: a law repeats a token id"),
    (InvalidDistributionError, "laws.probs: a draft law is not a distribution (NaN, inf, negative, or not summing to 1)"),
    (InvalidDistributionError, "laws: a sampled draft token has probability 0 under the law it was drawn from"),
)


def _raise_first(flags: Sequence[bool], messages: Sequence[tuple[type[Exception], str]], **fmt: object) -> None:
    for hit, (error, message) in zip(flags, messages):
        if hit:
            raise error(message.format(**fmt))


def _prob_of(ids: torch.Tensor, probs: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``[...]`` the probability of ``token [...]`` under the laws ``ids, probs [..., L]``."""
    return torch.where(ids == token.unsqueeze(-1), probs, 0.0).sum(-1)


# ----------------------------------------------------------------- vLLM: flat ragged chains
def _chain_starts(cu: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``[B]`` where each row's drafts start in the flat arrays (``cu`` is inclusive)."""
    return cu - counts


def chain_tree_batch(proposals: ChainProposals, vocab_size: int, *, validate: bool = True) -> TreeBatch:
    """The chains as a :class:`~specdec.tree_batch.TreeBatch` (``n = max_spec_len + 1`` slots), on the device.

    Raises:
        InvalidConfigError: offsets that do not add up, tokens outside the vocabulary, law shapes.
        InvalidDistributionError: a law that is not a distribution or gives its draft token probability 0.
    """
    tokens = as_int_tensor(proposals.draft_token_ids, "draft_token_ids", 1)
    cu = as_int_tensor(proposals.cu_num_draft_tokens, "cu_num_draft_tokens", 1)
    dev, T, B, V = tokens.device, tokens.shape[0], cu.shape[0], vocab_size
    if B == 0:
        raise InvalidConfigError("cu_num_draft_tokens: an empty batch (0 rows)")
    if cu.device != dev:
        raise InvalidConfigError(f"cu_num_draft_tokens is on {cu.device}, draft_token_ids on {dev}")
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # [B]
    laws = None if proposals.laws is None else _law_rows(proposals.laws, T, V, dev)
    roots = torch.zeros(B, dtype=torch.int64, device=dev) if proposals.root_tokens is None else \
        as_int_tensor(proposals.root_tokens, "root_tokens", 1).to(dev)
    if roots.shape[0] != B:
        raise InvalidConfigError(f"root_tokens has {roots.shape[0]} entries for {B} rows")
    S = proposals.max_spec_len
    if S is not None and (isinstance(S, bool) or not isinstance(S, int) or S < 0):
        raise InvalidConfigError(f"max_spec_len must be an integer >= 0 or None, got {S!r}")
    flags: list[torch.Tensor] = []
    if validate:
        flags = [(counts < 0).any() | (cu[-1] != T), ((tokens < 0) | (tokens >= V)).any(), ((roots < 0) | (roots >= V)).any()]
        if S is not None:
            flags.append((counts > S).any())
        if laws is not None and proposals.laws is not None:
            flags += _law_problems(proposals.laws, *laws, torch.ones(T, dtype=torch.bool, device=dev), V)
            flags.append((_prob_of(*laws, tokens.clamp(0, V - 1)) <= 0).any())
    longest = [counts.max().clamp_min(0)] if S is None else []
    values = torch.stack([f.long() for f in flags] + longest).tolist() if flags or longest else []  # the one host read
    read = [bool(v) for v in values[:len(flags)]]
    if S is None:
        S = int(values[-1])
    if read:
        _raise_first(read[:3], [
            (InvalidConfigError, f"cu_num_draft_tokens: the offsets do not add up (non-decreasing, ending at T = {T} "
                                 "draft_token_ids)"),
            (InvalidConfigError, f"draft_token_ids: a token is outside [0, {V})"),
            (InvalidConfigError, f"root_tokens: a token is outside [0, {V})")])
        rest = read[3:]
        if proposals.max_spec_len is not None:
            _raise_first(rest[:1], [(InvalidConfigError, f"cu_num_draft_tokens: a row has more than max_spec_len = {S} drafts")])
            rest = rest[1:]
        _raise_first(rest, _LAW_MESSAGES, V=V)
    return _chain_batch(tokens, counts, _chain_starts(cu, counts), roots, laws, S, V)


def _chain_batch(tokens: torch.Tensor, counts: torch.Tensor, starts: torch.Tensor, roots: torch.Tensor,
                 laws: tuple[torch.Tensor, torch.Tensor] | None, S: int, V: int) -> TreeBatch:
    dev, B, n = tokens.device, counts.shape[0], S + 1
    slot = torch.arange(n, device=dev).view(1, n)  # [1, n]
    valid = slot <= counts.view(B, 1)  # [B, n] the root and the row's drafts
    child = valid & (slot > 0)
    flat = (starts.view(B, 1) + slot - 1).clamp(0, max(tokens.shape[0] - 1, 0))  # [B, n] draft index of slot j
    drawn = tokens[flat] if tokens.shape[0] else torch.zeros(B, n, dtype=torch.int64, device=dev)
    kind = NodeKind.DETERMINISTIC if laws is None else NodeKind.SAMPLED
    if laws is None or tokens.shape[0] == 0:  # deterministic, or no draft at all
        width = 0 if laws is None else laws[0].shape[-1]
        law_ids = torch.full((B, n, width), -1, dtype=torch.int64, device=dev)
        law_probs = torch.zeros(B, n, width, dtype=F64, device=dev)
    else:  # the law slot j's token was drawn from sits at its parent, slot j - 1
        ids, probs = laws
        at_parent = torch.cat([flat[:, 1:], flat[:, -1:]], 1)  # [B, n] the draft index of slot j's child
        has_child = torch.cat([child[:, 1:], torch.zeros_like(child[:, :1])], 1)  # [B, n]
        law_ids = torch.where(has_child.unsqueeze(-1), ids[at_parent], -1)
        law_probs = torch.where(has_child.unsqueeze(-1), probs[at_parent], 0.0)
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=dev))
    both = valid.unsqueeze(2) & valid.unsqueeze(1)
    return TreeBatch(
        tokens=torch.where(child, drawn, roots.view(B, 1)),
        parents=torch.where(child, slot - 1, -1),
        depths=torch.where(valid, slot, 0),
        kinds=torch.where(child, int(kind), torch.where(slot == 0, int(NodeKind.ROOT), PAD)),
        draw_order=torch.zeros(B, n, dtype=torch.int64, device=dev),
        weights=valid.to(F64),
        num_nodes=counts + 1,
        law_ids=law_ids, law_probs=law_probs,
        law_wor=torch.zeros(B, n, dtype=torch.bool, device=dev),
        ancestors=torch.where(both, lower, eye),
        vocab_size=V, max_children=1, max_depth=S, max_sampled=0 if laws is None else 1,
    )


def _chain_logit_rows(counts: torch.Tensor, starts: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, n]`` the row of ``[T + B, V]`` logits scored at each slot (row ``b``'s block starts at
    ``starts[b] + b``; padding slots take the root's row, never read)."""
    slot = torch.arange(n, device=counts.device).view(1, n)
    return starts.view(-1, 1) + torch.arange(counts.shape[0], device=counts.device).view(-1, 1) + \
        torch.where(slot <= counts.view(-1, 1), slot, 0)


def chain_target_logits(tree: TreeBatch, proposals: ChainProposals, target_logits: torch.Tensor) -> torch.Tensor:
    """``[B, n, V]``: the ``[T + B, V]`` logits of ``proposals`` at each slot of their converted ``tree``."""
    cu = proposals.cu_num_draft_tokens.to(torch.int64)
    counts = tree.num_nodes - 1
    return target_logits[_chain_logit_rows(counts, _chain_starts(cu, counts), tree.node_slots)]


# ----------------------------------------------------------------- SGLang: retrieve arrays
def _jumps(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


def _rank_to_head(prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """List ranking by pointer jumping: for ``prev [B, n]`` (``-1`` at a list's head), each slot's
    head and its distance to it (no host read)."""
    n = prev.shape[1]
    self_ = torch.arange(n, device=prev.device).expand_as(prev)
    jump = torch.where(prev >= 0, prev, self_)
    rank = (prev >= 0).long()
    for _ in range(_jumps(n)):
        rank = rank + rank.gather(1, jump)
        jump = jump.gather(1, jump)
    return jump, rank


def _tree_parents(nxt: torch.Tensor, sib: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(parents, sibling rank, incoming pointer count)`` ``[B, n]`` each, from first-child and
    next-sibling arrays (``-1`` none)."""
    B, n = nxt.shape
    slot = torch.arange(n, device=nxt.device).expand(B, n)
    first_of = torch.full((B, n + 1), -1, dtype=torch.int64, device=nxt.device)  # column n: a sink for -1
    first_of.scatter_(1, torch.where(nxt >= 0, nxt, n), slot)
    prev = torch.full((B, n + 1), -1, dtype=torch.int64, device=nxt.device)
    prev.scatter_(1, torch.where(sib >= 0, sib, n), slot)
    incoming = torch.zeros(B, n + 1, dtype=torch.int64, device=nxt.device)
    incoming.scatter_add_(1, torch.where(nxt >= 0, nxt, n), valid.long()).scatter_add_(1, torch.where(sib >= 0, sib, n), valid.long())
    head, rank = _rank_to_head(prev[:, :n])
    parents = first_of[:, :n].gather(1, head)
    return torch.where(valid & (slot > 0), parents, -1), rank, incoming[:, :n]


def _depths_and_ancestors(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(depths [B, n], ancestors [B, n, n])`` by pointer jumping over the parents (padding: itself only)."""
    B, n = parents.shape
    self_ = torch.arange(n, device=parents.device).expand(B, n)
    jump = torch.where(parents >= 0, parents, self_)
    depth = (parents >= 0).long()
    eye = torch.eye(n, dtype=torch.bool, device=parents.device)
    anc = eye.expand(B, n, n) | torch.nn.functional.one_hot(jump, n).bool()
    for _ in range(_jumps(n)):
        depth = depth + depth.gather(1, jump)
        anc = anc | anc.gather(1, jump.unsqueeze(-1).expand(B, n, n))
        jump = jump.gather(1, jump)
    return depth, anc


def tree_tree_batch(proposals: TreeProposals, vocab_size: int, *, validate: bool = True) -> TreeBatch:
    """The retrieve-array trees as a :class:`~specdec.tree_batch.TreeBatch`, on the device (the
    inverse of :func:`~specdec.engine.layouts.retrieve_arrays`).

    Raises:
        InvalidConfigError: arrays that are not a tree (parents after children, a node reached twice or
            never, pointers out of range), tokens outside the vocabulary, shapes, ``mode``, ``draw_order``.
        InvalidDistributionError: a law that is not a distribution or gives its child probability 0.
    """
    index = as_int_tensor(proposals.retrieve_index, "retrieve_index", 2)
    B, n = index.shape
    dev, V = index.device, vocab_size
    if B == 0 or n == 0:
        raise InvalidConfigError(f"retrieve_index: an empty batch (shape {tuple(index.shape)})")
    nxt = as_int_tensor(proposals.retrieve_next_token, "retrieve_next_token", 2)
    sib = as_int_tensor(proposals.retrieve_next_sibling, "retrieve_next_sibling", 2)
    raw = as_int_tensor(proposals.draft_tokens, "draft_tokens", proposals.draft_tokens.dim())
    for name, t in (("retrieve_next_token", nxt), ("retrieve_next_sibling", sib), ("draft_tokens", raw)):
        if t.numel() != B * n or (t.dim() == 2 and tuple(t.shape) != (B, n)) or t.dim() > 2:
            raise InvalidConfigError(f"{name} must be [B, n] = [{B}, {n}] (or [B * n]), got {tuple(t.shape)}")
        if t.device != dev:
            raise InvalidConfigError(f"{name} is on {t.device}, retrieve_index on {dev}")
    if proposals.mode not in ("iid", "wor"):
        raise InvalidConfigError(f"mode must be 'iid' or 'wor', got {proposals.mode!r}")
    tokens = raw.reshape(B, n)
    valid = index >= 0
    slot = torch.arange(n, device=dev).expand(B, n)
    parents, rank, incoming = _tree_parents(nxt, sib, valid)
    order = proposals.draw_order
    if isinstance(order, torch.Tensor):
        order = as_int_tensor(order, "draw_order", 2).to(dev)
        if tuple(order.shape) != (B, n):
            raise InvalidConfigError(f"draw_order must be [B, n] = [{B}, {n}], got {tuple(order.shape)}")
    elif order not in (None, "siblings"):
        raise InvalidConfigError(f"draw_order must be a [B, n] tensor, 'siblings' or None, got {order!r:.40}")
    sampled = proposals.laws is not None
    draw = order if isinstance(order, torch.Tensor) and sampled else rank
    child = valid & (slot > 0)
    laws = None if proposals.laws is None else _law_rows(proposals.laws, B * n, V, dev)
    has_children = valid & (nxt >= 0)  # [B, n]
    safe_par = parents.clamp_min(0)
    same = (parents.unsqueeze(2) == parents.unsqueeze(1)) & child.unsqueeze(1) & child.unsqueeze(2) & ~torch.eye(n, dtype=torch.bool, device=dev)
    n_sib = same.sum(-1) + 1  # [B, n] siblings of each child, itself included
    depths, anc = _depths_and_ancestors(parents)
    flags: list[torch.Tensor] = []
    if validate:
        in_range = lambda t: ((t >= -1) & (t < n)).all()  # noqa: E731
        to_valid = lambda t: (~(t >= 0) | valid.gather(1, t.clamp(0, n - 1))).all() & ~((t >= 0) & ~valid).any()  # noqa: E731
        flags = [
            ~valid[:, 0].all() | (valid[:, 1:] & ~valid[:, :-1]).any(),
            ~in_range(nxt) | ~to_valid(nxt) | ~in_range(sib) | ~to_valid(sib),
            (child & ((parents < 0) | (parents >= slot) | (incoming != 1))).any() | (incoming[:, 0] != 0).any(),
            (valid & ((tokens < 0) | (tokens >= V))).any(),
            (same & (tokens.unsqueeze(2) == tokens.unsqueeze(1))).any() if not sampled or proposals.mode == "wor"
            else torch.zeros((), dtype=torch.bool, device=dev),
        ]
        flags.append((child & (n_sib > (proposals.max_children or n))).any()
                     | (valid & (depths > (n if proposals.max_depth is None else proposals.max_depth))).any())
        if isinstance(order, torch.Tensor) and sampled:
            flags.append((child & ((order < 0) | (order >= n_sib))).any()
                         | (same & (order.unsqueeze(2) == order.unsqueeze(1))).any())
        if laws is not None and proposals.laws is not None:
            flags += _law_problems(proposals.laws, *laws, has_children.reshape(-1), V)
            ids, probs = (t.view(B, n, -1) for t in laws)
            at = safe_par.unsqueeze(-1).expand(B, n, ids.shape[-1])
            flags.append((child & (_prob_of(ids.gather(1, at), probs.gather(1, at), tokens.clamp(0, V - 1)) <= 0)).any())
    bounds = []
    if proposals.max_children is None or proposals.max_depth is None:
        bounds = [torch.where(child, n_sib, 0).max(), torch.where(valid, depths, 0).max()]
    read = torch.stack([f.long() for f in flags] + [b.long() for b in bounds]).tolist() if flags or bounds else []
    if flags:
        checks = [(InvalidConfigError, "retrieve_index: the valid slots (>= 0) must be a prefix of each row, the root at slot 0"),
                  (InvalidConfigError, f"retrieve_next_token / retrieve_next_sibling: a pointer is outside [-1, {n}) or "
                                       "links a padding slot"),
                  (InvalidConfigError, "retrieve_next_token / retrieve_next_sibling: the arrays are not a tree (every "
                                       "node but the root reached exactly once, from a lower slot)"),
                  (InvalidConfigError, f"draft_tokens: a token is outside [0, {V})"),
                  (InvalidConfigError, "draft_tokens: siblings repeat a token (deterministic or drawn without replacement)"),
                  (InvalidConfigError, f"retrieve_next_sibling / retrieve_next_token: a node has more children than "
                                       f"max_children = {proposals.max_children} or is deeper than max_depth = {proposals.max_depth}")]
        if isinstance(order, torch.Tensor) and sampled:
            checks.append((InvalidConfigError, "draw_order: the draw positions of a node's sampled children must be 0..k-1"))
        _raise_first([bool(x) for x in read[:len(flags)]], checks + list(_LAW_MESSAGES), V=V)
    max_children = proposals.max_children if proposals.max_children is not None else max(int(read[len(flags)]), 1)
    max_depth = proposals.max_depth if proposals.max_depth is not None else int(read[len(flags) + 1])
    kind = NodeKind.SAMPLED if sampled else NodeKind.DETERMINISTIC
    if laws is None:
        law_ids = torch.full((B, n, 0), -1, dtype=torch.int64, device=dev)
        law_probs = torch.zeros(B, n, 0, dtype=F64, device=dev)
    else:
        ids, probs = (t.reshape(B, n, -1) for t in laws)
        law_ids = torch.where(has_children.unsqueeze(-1), ids, -1)
        law_probs = torch.where(has_children.unsqueeze(-1), probs, 0.0)
    return TreeBatch(
        tokens=torch.where(valid, tokens, tokens[:, :1]),
        parents=parents, depths=torch.where(valid, depths, 0),
        kinds=torch.where(child, int(kind), torch.where(slot == 0, int(NodeKind.ROOT), PAD)),
        draw_order=torch.where(child, draw, 0), weights=valid.to(F64), num_nodes=valid.sum(1),
        law_ids=law_ids, law_probs=law_probs, law_wor=has_children & (sampled and proposals.mode == "wor"),
        ancestors=anc, vocab_size=V, max_children=max(max_children, 1), max_depth=max_depth,
        max_sampled=max_children if sampled else 0,
    )
