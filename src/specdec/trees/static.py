"""Static trees (SpecInfer, Miao et al. 2024): a fixed shape, sampled children.

The shape is given either as children per depth, ``(k1, k2, ...)`` (SpecInfer's
"expansion configuration": every node at depth ``i - 1`` gets ``k_i``
children), or as an explicit list of child-slot paths (Medusa/Sequoia style,
e.g. ``[(0,), (1,), (0, 0)]``). The children of a node are drawn from its
processed draft law ``q``:

- ``mode="iid"``: independent draws (tokens may repeat); verified by rule 3
  (verifier ``"rejection-iid"``, SpecInfer's multi-step speculative sampling);
- ``mode="wor"``: without replacement, i.e. sequential draws with the drawn
  tokens zeroed and the rest renormalised; verified by rule 4 (verifier
  ``"rejection-wor"``). If ``q`` has fewer tokens than a node's slots, every
  token is drawn and the missing slots (and their subtrees) are left out.

Child slot ``i`` of a node is its ``i``-th draw (``draw_order = i``). The law
recorded for all of a node's children is the base ``q`` (restricted to its
support) with the mode; the verifier itself performs the renormalisations of
rule 4. Construction weights are ``q(x)`` (unused by the verifiers).
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel, OneRowDraft, laws_and_flags
from specdec.errors import InvalidConfigError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig, construction_config
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.tree_batch import PAD, TreeBatch
from specdec.trees._common import check_int, check_mode, check_paths, draw_children, draw_rows, normalised_law
from specdec.trees.base import TreeBuilder
from specdec.trees.feed import Build, DraftSpec, drive
from specdec.methods import Method, register_method

__all__ = ["StaticTreeBuilder", "ShapedTreeBuilder", "StaticLayout", "expansion_to_paths", "build_static_tree", "grow_static", "static_build", "static_reference", "truncate_proposal", "MAX_STATIC_NODES"]

MAX_STATIC_NODES = 1 << 16
"""Largest static shape accepted (draft nodes); larger shapes raise InvalidConfigError."""


def expansion_to_paths(expansion: Sequence[int] | Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Normalise a static shape to child-slot paths, breadth first.

    Args:
        expansion: children per depth ``(k1, ..., kd)`` (ints ``>= 1``), or an
            explicit, prefix-closed list of child-slot paths.

    Returns:
        The paths, sorted by length then lexicographically.

    Raises:
        InvalidConfigError: malformed shapes, or more than
            :data:`MAX_STATIC_NODES` nodes.

    Example:
        >>> expansion_to_paths((2, 1))
        ((0,), (1,), (0, 0), (1, 0))
    """
    if isinstance(expansion, (str, bytes)) or not isinstance(expansion, Sequence) or len(expansion) == 0:
        raise InvalidConfigError(
            f"expansion must be children per depth (e.g. (3, 2, 1)) or a list of paths, got {expansion!r}"
        )
    counts = [k for k in expansion if isinstance(k, int) and not isinstance(k, bool)]
    if len(counts) == len(expansion):  # children per depth
        total, width = 0, 1
        for k in counts:
            if k < 1:
                raise InvalidConfigError(f"children per depth must be ints >= 1, got {tuple(expansion)!r}")
            width *= k
            total += width
            if total > MAX_STATIC_NODES:
                raise InvalidConfigError(
                    f"expansion {tuple(expansion)!r} has more than {MAX_STATIC_NODES} nodes"
                )
        level: list[tuple[int, ...]] = [()]
        paths: list[tuple[int, ...]] = []
        for k in counts:
            level = [parent + (slot,) for parent in level for slot in range(k)]
            paths.extend(level)
        return tuple(paths)
    paths_t = check_paths(expansion)  # type: ignore[arg-type]  # not all ints: check_paths rejects what is not a path
    if len(paths_t) > MAX_STATIC_NODES:
        raise InvalidConfigError(f"a static tree may have at most {MAX_STATIC_NODES} nodes, got {len(paths_t)}")
    return paths_t


def truncate_proposal(q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A proposal law truncated to its ``k`` most likely tokens and renormalised: the sparse
    law a static tree draws from and records with ``proposal_top_k = k`` (docs/trees.md,
    "Sparse proposals"). The one definition, for the host reference and the tensor build.

    The kept set is the ``k`` largest entries, ties broken by the lower column (a stable
    descending sort); the kept columns are returned in ascending order, so that the draws'
    cumulative sums read them as a full row with zeros elsewhere would be read.

    Args:
        q: ``[..., W]`` a normalised law over ``W`` columns.
        k: how many columns to keep, ``1 <= k``; ``k >= W`` keeps every column.

    Returns:
        ``(cols [..., k'], probs [..., k'])`` with ``k' = min(k, W)``: int64 ascending columns
        (``-1`` where the kept entry is 0) and float64 probabilities summing to 1 (0 there).

    Example:
        >>> import torch
        >>> cols, probs = truncate_proposal(torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64), 2)
        >>> cols.tolist(), [round(p, 4) for p in probs.tolist()]
        ([1, 3], [0.5714, 0.4286])
    """
    k = min(int(k), q.shape[-1])
    order = torch.sort(q, dim=-1, descending=True, stable=True).indices[..., :k]  # [..., k]
    cols = torch.sort(order, dim=-1).values  # ascending columns
    probs = q.gather(-1, cols).to(torch.float64)
    probs = probs / probs.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return torch.where(probs > 0, cols, -1), probs


def _truncated_sparse(q: torch.Tensor, k: int, mode: SampleMode) -> SparseLaw:
    """The host reference's :class:`~specdec.tree.SparseLaw` of :func:`truncate_proposal` of a ``[V]`` law."""
    cols, probs = truncate_proposal(q.unsqueeze(0), k)
    keep = cols[0] >= 0
    return SparseLaw(cols[0][keep], probs[0][keep], mode)


def build_static_tree(
    paths: Sequence[tuple[int, ...]],
    mode: SampleMode,
    root_token: int,
    draft: OneRowDraft,
    sampling: SamplingConfig,
    rng: RandomSource,
    *,
    proposal_top_k: int = 0,
) -> DraftTree:
    """Draft a static tree of the given shape, one draft call per level.

    Args:
        paths: normalised child-slot paths (:func:`expansion_to_paths`).
        mode: how each node's children are drawn from its ``q``.
        root_token: the last committed token.
        draft: the draft model (begun/committed up to ``root_token``).
        sampling: the target's processing; children are drawn from the draft
            law processed by :func:`~specdec.sampling.construction_config`
            (the same processing at ``T > 0``, the untempered draft law at ``T = 0``).
        rng: the source of every draw.
        proposal_top_k: ``k > 0``: each node's children are drawn from, and record, its law
            truncated to its top ``k`` (:func:`truncate_proposal`); 0: the full law.

    Returns:
        The tree; node ``i``'s children are its slot draws in draw order.
    """
    sampling = construction_config(sampling)  # the draft's untempered law at T = 0 (not one-hot)
    slots: dict[tuple[int, ...], int] = {}
    for path in paths:
        parent = path[:-1]
        slots[parent] = max(slots.get(parent, 0), path[-1] + 1)
    asm = TreeAssembler(root_token, draft.vocab_size)
    node_of: dict[tuple[int, ...], int] = {(): 0}
    draft_id: dict[tuple[int, ...], int] = {(): 0}
    token_of: dict[tuple[int, ...], int] = {}
    q_of: dict[tuple[int, ...], torch.Tensor] = {(): normalised_law(draft.root_distribution(sampling))}
    parents: list[tuple[int, ...]] = [()]
    next_draft_id = 1
    while parents:
        laws = {parent: (_truncated_sparse(q_of.pop(parent), proposal_top_k, mode) if proposal_top_k
                         else SparseLaw.from_dense(q_of.pop(parent), mode)) for parent in parents}
        drawn: dict[tuple[int, ...], list[int]] = {parent: [] for parent in parents}
        for slot in range(max(slots[parent] for parent in parents)):  # slot j of every node before slot j + 1 of any
            for parent in parents:
                if slot < slots[parent] and len(drawn[parent]) == slot:
                    drawn[parent].extend(draw_children(laws[parent].probs, 1, mode, rng, exclude=drawn[parent]))
        created: list[tuple[int, ...]] = []
        for parent in parents:  # nodes are added breadth first, each node's children in slot order
            law = laws[parent]
            for slot, index in enumerate(drawn[parent]):
                path = parent + (slot,)
                token_of[path] = int(law.indices[index])
                node_of[path] = asm.add_sampled(node_of[parent], token_of[path], law, weight=float(law.probs[index]))
                created.append(path)
        parents = [path for path in created if path in slots]
        if parents:  # one draft call for the whole next level
            q = normalised_law(
                draft.expand([draft_id[p[:-1]] for p in parents], [token_of[p] for p in parents], sampling)
            )
            for row, path in enumerate(parents):
                draft_id[path] = next_draft_id
                next_draft_id += 1
                q_of[path] = q[row]
    return asm.build()


@attrs.frozen(eq=False)
class StaticLayout:
    """A static shape as index tensors, computed once per builder (host work,
    off the step path). Node ``i >= 1`` is ``paths[i - 1]`` (breadth first, so
    parents come before children and siblings are in slot order).

    Attributes:
        paths: the shape's child-slot paths.
        parents: ``[n]`` parent of each node (root ``-1``).
        slots: ``[n]`` child slot of each node (its draw order; root 0).
        depths: ``[n]`` depth of each node.
        levels: per depth ``d = 1..D``, ``(expanded, counts, nodes,
            child_rows, child_slots)``: the nodes at depth ``d - 1`` with
            children (in node order) and their numbers of children; the nodes
            at depth ``d``, the row of each one's parent among ``expanded`` and its slot.
        max_counts: per depth, the most children of one node (host ints: loop bounds).
    """

    paths: tuple[tuple[int, ...], ...]
    parents: torch.Tensor
    slots: torch.Tensor
    depths: torch.Tensor
    levels: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], ...]
    max_counts: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])

    @classmethod
    def of(cls, paths: Sequence[tuple[int, ...]]) -> StaticLayout:
        index = {(): 0} | {p: i + 1 for i, p in enumerate(paths)}
        parents = [-1] + [index[p[:-1]] for p in paths]
        slots = [0] + [p[-1] for p in paths]
        depths = [0] + [len(p) for p in paths]
        as_t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
        levels: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        max_counts: list[int] = []
        for d in range(1, max(depths) + 1):
            nodes = [i for i in range(len(parents)) if depths[i] == d]
            expanded = sorted({parents[i] for i in nodes})
            row = {e: r for r, e in enumerate(expanded)}
            counts = [sum(1 for i in nodes if parents[i] == e) for e in expanded]
            child_rows, child_slots = [row[parents[i]] for i in nodes], [slots[i] for i in nodes]
            levels.append((as_t(expanded), as_t(counts), as_t(nodes), as_t(child_rows), as_t(child_slots)))
            max_counts.append(max(counts))
        return cls(
            paths=tuple(tuple(p) for p in paths), parents=as_t(parents), slots=as_t(slots), depths=as_t(depths), levels=tuple(levels),
            max_counts=tuple(max_counts),
        )

    def to(self, device: torch.device) -> StaticLayout:
        return StaticLayout(
            paths=self.paths, parents=self.parents.to(device), slots=self.slots.to(device), depths=self.depths.to(device),
            levels=tuple(tuple(t.to(device) for t in lv) for lv in self.levels),  # type: ignore[misc]
            max_counts=self.max_counts,
        )


@functools.lru_cache(maxsize=64)
def static_layout(paths: tuple[tuple[int, ...], ...], device: str = "cpu") -> StaticLayout:
    """The :class:`StaticLayout` of ``paths`` on ``device``, built once and cached."""
    layout = StaticLayout.of(paths)
    return layout if device == "cpu" else layout.to(torch.device(device))


def grow_static(
    layout: StaticLayout,
    mode: SampleMode,
    root_token: int | torch.Tensor,
    draft: DraftModel,
    sampling: SamplingConfig,
    rng: RandomSource,
    *,
    construction: bool = True,
) -> TreeBatch:
    """:func:`static_build` driven by ``draft`` (:func:`~specdec.trees.feed.drive`)."""
    return drive(static_build(layout, mode, root_token, DraftSpec.of(draft), sampling, rng, construction=construction),
                 draft)


def static_build(
    layout: StaticLayout,
    mode: SampleMode,
    root_token: int | torch.Tensor,
    spec: DraftSpec,
    sampling: SamplingConfig,
    rng: RandomSource,
    *,
    construction: bool = True,
    proposal_top_k: int = 0,
) -> Build:
    """The tensor form of :func:`build_static_tree`, as a build (:mod:`specdec.trees.feed`:
    it asks for the root's draft logits, then for each level's expanded nodes, ``[B, V]``
    columns): the same tree (for the same draws), as a :class:`~specdec.tree_batch.TreeBatch`
    on the logits' device,
    with no host read: one tree, or, for a draft in rows mode and ``root_token``
    ``[B]`` (batched generation), ``B`` trees of the shape grown together (one
    draft call per level for every row; row ``b`` draws from its own stream of a
    :class:`~specdec.rng.RowStreams` what it draws alone).

    Each level is one draft call for every node of the previous level that has
    children, then ``max(counts)`` batched draws (:func:`~specdec.trees._common.draw_rows`,
    slot ``j`` of every node before slot ``j + 1`` of any). Without
    replacement a node whose law runs out of tokens draws no more; its missing
    children and their subtrees are dropped and the kept nodes packed in
    breadth-first order, as :func:`build_static_tree` leaves them out.

    ``construction=False`` draws from the draft law processed by ``sampling``
    itself, also at ``T = 0`` (the chain's one-hot draft); the default draws
    from :func:`~specdec.sampling.construction_config`'s law, as
    :func:`build_static_tree` does.
    """
    config = construction_config(sampling) if construction else sampling
    rows = torch.as_tensor(root_token).numel()
    logits = yield DraftRequest(0, rows, spec.vocab_size, False)  # [B, V]: one row per tree
    (q,), bad = laws_and_flags(logits, (config,))  # [B, V], [B]
    q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(q, on_device=True))  # [B, V]
    dev, (B, vocab), n = q.device, q.shape, layout.num_nodes
    lay = layout if layout.parents.device == dev else static_layout(layout.paths, str(dev))
    root = torch.as_tensor(root_token, dtype=torch.int64, device=dev).reshape(-1)  # [B]
    if root.shape[0] != B:
        raise ValueError(f"grow_static: {root.shape[0]} roots for a draft of {B} rows")
    draft_bad = bad.reshape(B)  # [B]
    tokens = root.unsqueeze(1).expand(B, n).clone()  # [B, n] full layout
    valid = torch.zeros(B, n, dtype=torch.bool, device=dev)
    valid[:, 0] = True
    weights = torch.ones(B, n, dtype=torch.float64, device=dev)
    # the laws are kept, and the children drawn, over the draft's proposal vocabulary when it declares one
    # (EAGLE-3: Vd of V columns), so the draws and the verifier's residual work are [., Vd], not [., V]. The
    # trees are those of the full-width law, draw for draw: the Vd columns are ascending and every other column
    # is 0, so the left-to-right cumulative sums the draws read (row_mass, inverse_cdf_rows) are the same bits.
    # A law with mass outside the declared vocabulary is flagged like a bad draft row: never silently cut.
    cols = spec.proposal_ids  # [Vd] ascending target ids, or None (all V)
    inside: torch.Tensor | None = None  # [V] bool, True in the proposal vocabulary
    if cols is not None:
        cols = cols.to(dev)
        inside = torch.zeros(vocab, dtype=torch.bool, device=dev).index_fill_(0, cols, True)
    law_width = vocab if cols is None else int(cols.shape[0])
    law_tokens: torch.Tensor | None = None  # [B, n, L] the kept tokens of each node's law (proposal_top_k only)
    if proposal_top_k:  # sparse laws: each node keeps its law's top k (truncate_proposal): [B, n, k], not [B, n, V]
        law_width = min(int(proposal_top_k), law_width)
        law_tokens = torch.full((B, n, law_width), -1, dtype=torch.int64, device=dev)
    law_probs = torch.zeros(B, n, law_width, dtype=torch.float64, device=dev)  # [B, n, L] q of each node's children
    draft_id = torch.zeros(n, dtype=torch.int64, device=dev)  # draft-model node id of each expanded node (every row alike)
    next_id = 1
    earlier: list[torch.Tensor] = []  # the parents of each earlier request (the draft tree, for DraftRequest)
    q = q.unsqueeze(1)  # [B, 1, V]: the root is the one node expanded at depth 1
    for d, ((expanded, counts, nodes, child_rows, child_slots), width) in enumerate(
        zip(lay.levels, lay.max_counts), start=1
    ):
        R = expanded.shape[0]
        alive = valid[:, expanded]  # [B, R]
        if d > 1:  # one draft call for the whole level of every row (dead rows carry the root token; their q is unused)
            ids_in = draft_id[lay.parents[expanded]].expand(B, R)
            logits = yield DraftRequest(d - 1, B, vocab, False, ids_in,
                                        torch.where(alive, tokens[:, expanded], root.unsqueeze(1)), alive,
                                        next_id, tuple(earlier))  # [B, R, V]
            earlier.append(ids_in)
            (q,), bad = laws_and_flags(logits, (config,))
            q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(q, on_device=True))  # [B, R, V]
            draft_bad = draft_bad | (bad & alive).any(dim=1)
            draft_id[expanded] = torch.arange(next_id, next_id + R, device=dev)
            next_id += R
        if cols is None or inside is None:  # (set together)
            q_law = q  # [B, R, L] with L = V
        else:
            q_law = q.index_select(-1, cols)  # [B, R, L] with L = Vd
            leak = (q.masked_fill(inside, 0.0) > 0).any(dim=-1)  # [B, R] mass outside the proposal vocabulary
            draft_bad = draft_bad | (leak & alive).any(dim=1)
        level_tokens: torch.Tensor | None = None  # [B, R, L] token of each law column (proposal_top_k only)
        if law_tokens is not None:
            kept, q_law = truncate_proposal(q_law, law_width)  # [B, R, k] ascending columns of the W-wide law
            level_tokens = kept if cols is None else torch.where(kept >= 0, cols[kept.clamp_min(0)], -1)
            law_tokens[:, expanded] = level_tokens
        law_probs[:, expanded] = q_law
        # R consecutive rows per tree: a RowStreams source draws its tree's rows, as the tree would alone
        drawn = draw_rows(q_law.reshape(B * R, law_width), width, mode, rng, alive.reshape(B * R),
                          counts=counts.repeat(B)).reshape(B, R, width)  # law columns, -1 = none
        col = drawn[:, child_rows, child_slots]  # [B, k] law column of each child, -1 = none
        if level_tokens is not None:
            tok = torch.where(col >= 0, level_tokens[:, child_rows].gather(-1, col.clamp_min(0).unsqueeze(-1)).squeeze(-1), -1)
        else:
            tok = col if cols is None else torch.where(col >= 0, cols[col.clamp_min(0)], -1)  # [B, k] token ids
        valid[:, nodes] = col >= 0
        tokens[:, nodes] = torch.where(col >= 0, tok, root.unsqueeze(1))
        q_child = q_law[:, child_rows].gather(-1, col.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # [B, k]
        weights[:, nodes] = torch.where(col >= 0, q_child, 0.0)
    # pack each tree's kept nodes first, breadth first (the order build_static_tree adds them in)
    index = torch.arange(n, device=dev).expand(B, n)
    order = torch.sort(torch.where(valid, index, index + n), dim=1).values
    order = torch.where(order >= n, order - n, order)  # [B, n] full-layout node of each packed slot
    live = valid.gather(1, order)
    position = torch.empty(B, n, dtype=torch.int64, device=dev).scatter_(1, order, index)  # [B, n]
    full_par = lay.parents[order]  # [B, n]
    parents = torch.where(live & (full_par >= 0), position.gather(1, full_par.clamp_min(0)), -1)
    kinds = torch.where(live, int(NodeKind.SAMPLED), PAD)
    kinds[:, 0] = int(NodeKind.ROOT)
    kids = torch.zeros(B, n, dtype=torch.int64, device=dev).scatter_add(1, parents.clamp_min(0), (parents >= 0).long())
    has_kids = kids > 0  # [B, n] the node's law is recorded only where it has children
    probs = torch.where(has_kids.unsqueeze(-1), law_probs.gather(1, order.unsqueeze(-1).expand(B, n, law_width)), 0.0)
    if law_tokens is not None:
        ids = torch.where(probs > 0, law_tokens.gather(1, order.unsqueeze(-1).expand(B, n, law_width)), -1)  # [B, n, k]
    else:
        ids = torch.where(probs > 0, torch.arange(vocab, device=dev) if cols is None else cols, -1)  # [B, n, L]
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    anc = eye.expand(B, n, n)
    up = parents.clamp_min(0).unsqueeze(-1).expand(B, n, n)
    for _ in range(len(lay.levels)):
        anc = eye | torch.where((parents >= 0).unsqueeze(-1), anc.gather(1, up), False)
    counts_max = max(lay.max_counts)
    return TreeBatch(
        tokens=torch.where(live, tokens.gather(1, order), root.unsqueeze(1)), parents=parents,
        depths=torch.where(live, lay.depths[order], 0), kinds=kinds,
        draw_order=torch.where(live, lay.slots[order], 0),
        weights=torch.where(live, weights.gather(1, order), 0.0), num_nodes=live.sum(dim=1),
        law_ids=ids, law_probs=probs,
        law_wor=has_kids & (mode == SampleMode.WITHOUT_REPLACEMENT), ancestors=anc,
        vocab_size=vocab, max_children=counts_max, max_depth=len(lay.levels), draft_bad=draft_bad,
        max_sampled=counts_max,
    )


class ShapedTreeBuilder(TreeBuilder):
    """A builder whose trees have a fixed shape (chain, static, Sequoia), grown by
    :func:`static_build` (tensor ops, no host read). Subclasses give :meth:`shape` (and
    :attr:`construction`)."""

    batch_form = True

    construction: ClassVar[bool] = True
    """Draw from the :func:`~specdec.sampling.construction_config` law (False: the target's processing)."""

    @abstractmethod
    def shape(self) -> tuple[tuple[tuple[int, ...], ...], SampleMode]:
        """``(paths, mode)``: the child-slot paths and how children are drawn."""

    @property
    def sibling_modes(self) -> frozenset[SampleMode] | None:
        """Read from :meth:`shape`: its mode when some node has several children, else none."""
        paths, mode = self.shape()
        parents = [tuple(path[:-1]) for path in paths]
        several = len(parents) != len(set(parents))
        return frozenset({mode}) if several else frozenset()

    def feed_build(self, roots: Any, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """The build (:func:`static_build` of :meth:`shape`): the root's draft logits, then one
        request per level for that level's expanded nodes (``compiler`` is not used)."""
        paths, mode = self.shape()
        return static_build(static_layout(paths), mode, roots, spec, sampling, rng, construction=self.construction,
                            proposal_top_k=self.law_top_k())

    def law_top_k(self) -> int:
        """``k > 0``: each node's children are drawn from, and record, its law truncated to its
        top ``k`` (:func:`truncate_proposal`; sparse laws, docs/trees.md "Sparse proposals");
        0 (the default): the full law."""
        return 0


def static_reference(builder: ShapedTreeBuilder, root_token: int, draft: OneRowDraft, sampling: SamplingConfig,
                     rng: RandomSource) -> DraftTree:
    """The per-node reference of a static or Sequoia builder's build (:func:`build_static_tree` of
    its :meth:`~ShapedTreeBuilder.shape`); the tests compare it with the tensor build
    (:func:`static_build`). The chain's is :func:`specdec.trees.chain.chain_reference`."""
    paths, mode = builder.shape()
    return build_static_tree(paths, mode, root_token, draft, sampling, rng, proposal_top_k=builder.law_top_k())


def check_top_k(_inst: object, _attr: object, value: object) -> None:
    """``proposal_top_k``: an int, 0 (the full law) or at least 1."""
    check_int("proposal_top_k", value, 0, 1 << 31)


def _convert_expansion(value: object) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidConfigError(
            f"expansion must be children per depth (e.g. (3, 2, 1)) or a list of paths, got {value!r}"
        )
    return tuple(tuple(v) if isinstance(v, Sequence) and not isinstance(v, (str, bytes)) else v for v in value)


@register("tree", "static")
@attrs.frozen
class StaticTreeBuilder(ShapedTreeBuilder):
    """A static tree of sampled children (SpecInfer).

    Args:
        expansion: children per depth ``(k1, ..., kd)`` or explicit child-slot
            paths. Default ``(4, 2, 2, 1)`` (the ``specinfer`` method's default).
        mode: ``"iid"`` (verify with ``"rejection-iid"``, SpecInfer's MSS) or
            ``"wor"`` (without replacement, verify with ``"rejection-wor"``).
        proposal_top_k: ``k > 0``: children drawn from, and recorded as, each node's law
            truncated to its top ``k`` (:func:`truncate_proposal`; sparse laws: ``[n, k]``
            per tree instead of ``[n, V]``); 0 (default): the full law.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> from specdec.trees import build_tree
        >>> draft = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)
        >>> draft.begin([0, 1])
        >>> builder = StaticTreeBuilder(expansion=[(0,), (1,), (0, 0)], mode="wor")
        >>> tree = build_tree(builder, 1, draft, SamplingConfig(), TorchRandom.seeded(0))
        >>> tree.parents.tolist()
        [-1, 0, 0, 1]
    """

    expansion: tuple = attrs.field(default=(4, 2, 2, 1), converter=_convert_expansion)
    mode: SampleMode = attrs.field(default=SampleMode.IID, converter=check_mode)
    proposal_top_k: int = attrs.field(default=0, validator=check_top_k)
    paths: tuple[tuple[int, ...], ...] = attrs.field(init=False)

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.SAMPLED})
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"expansion": (2, 1), "mode": "iid"},
        {"expansion": (2, 1), "mode": "wor"},
        {"expansion": ((0,), (1,), (0, 0)), "mode": "wor"},
        {"expansion": (2, 1), "mode": "wor", "proposal_top_k": 2},
    )

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "paths", expansion_to_paths(self.expansion))

    @property
    def default_verifier(self) -> str:  # type: ignore[override]  # per instance (by mode); the base declares a ClassVar
        """``"rejection-iid"`` or ``"rejection-wor"``, by :attr:`mode`."""
        return "rejection-iid" if self.mode == SampleMode.IID else "rejection-wor"

    @property
    def max_nodes(self) -> int:
        return len(self.paths) + 1

    @property
    def max_depth(self) -> int:
        return max(len(p) for p in self.paths)

    def shape(self) -> tuple[tuple[tuple[int, ...], ...], SampleMode]:
        return self.paths, self.mode

    def law_top_k(self) -> int:
        return self.proposal_top_k


# the method(s) this builder serves (docs/methods.md); the defaults typed as Method.defaults (its ``dict``
# converter gives mypy no usable parameter type for a literal)
_SPECINFER_DEFAULTS: Mapping[str, Any] = {"expansion": (4, 2, 2, 1), "mode": "iid"}
register_method(Method("specinfer", "static", "rejection-iid", _SPECINFER_DEFAULTS,
                "SpecInfer: static tree of i.i.d. sampled children, multi-step rejection (rule 3)"))
