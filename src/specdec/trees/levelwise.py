"""Level-wise tree building as fixed-shape tensor ops: the step path's builders.

EAGLE-2/3 and RheoSampling grow a tree level by level (docs/trees.md,
"Dynamic trees"): every expanded node proposes its children at once, the
best ``B`` nodes of the newest level form the beam the draft expands next,
and the best ``N`` of all created nodes are kept. Here each level is one set
of tensor ops over all of the level's nodes, with no host read:

- a *level function* (:func:`eagle_level`, :func:`rheo_level`) turns the
  draft laws ``q`` ``[R, V]`` of the ``R`` expanded nodes into their children
  (:class:`LevelChildren`, ``C`` child slots per node, unused slots marked
  invalid);
- :func:`grow_levelwise`, the one driver, scores the children (path score =
  sum of log weights; an invalid slot scores ``-inf``), picks the beam, calls
  the draft, and finally keeps the best ``N`` under the total order
  (-score, creation index) with a stable sort, then lays the kept nodes out
  as a :class:`~specdec.tree_batch.TreeBatch` (creation order, ranks
  renumbered densely among kept siblings, laws kept where a sampled child
  survived, ancestor mask grown level by level).

The per-node builders (:func:`specdec.trees.dynamic.grow_dynamic_tree` with
:func:`~specdec.trees.dynamic.eagle_proposal` /
:func:`~specdec.trees.rheo.rheo_proposal`) are the reference: the tests
check that both give the identical tree for the same draws
(``tests/trees/test_levelwise.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from specdec.drafts.base import DraftModel
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind, SampleMode
from specdec.tree_batch import PAD, TreeBatch
from specdec.trees._common import draw_rows, normalised_law, residual_masses, row_mass, top_tokens_fixed

__all__ = ["CompiledLevelFn", "LevelChildren", "LevelFn", "eagle_level", "rheo_level", "grow_levelwise"]


class LevelChildren(NamedTuple):
    """The children of ``R`` expanded nodes, ``C`` slots each, in creation order
    (sampled children first in draw order, then deterministic ones by rank).
    A named tuple, so that a level function compiles as one graph.

    Attributes:
        tokens: ``[R, C]`` int64, ``-1`` for an unused slot.
        weights: ``[R, C]`` float64 construction weights in ``(0, 1]`` (``0`` unused).
        kinds: ``[R, C]`` int64 :class:`~specdec.tree.NodeKind` values (:data:`PAD` unused).
        law_ids: ``[R, L]`` int64 support of each node's sampled-slot law ``q'`` (``-1`` padded; ``L`` may be 0).
        law_probs: ``[R, L]`` float64 its probabilities.
        law_wor: ``[R]`` bool: drawn without replacement.
    """

    tokens: torch.Tensor
    weights: torch.Tensor
    kinds: torch.Tensor
    law_ids: torch.Tensor
    law_probs: torch.Tensor
    law_wor: torch.Tensor


LevelFn = Callable[[torch.Tensor, RandomSource, torch.Tensor], LevelChildren]
CompiledLevelFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], LevelChildren]
"""``level(q, rng, live)``: the children of the nodes whose draft laws are ``q``
``[R, V]`` (float64); rows where ``live`` ``[R]`` is False are beam slots
without a real node (a level with fewer than ``B`` nodes): they must not draw."""


def eagle_level(q: torch.Tensor, K: int) -> LevelChildren:
    """EAGLE-2's children: each node's top-``K`` tokens, deterministic, weight ``q(x)``
    (the tensor form of :func:`~specdec.trees.dynamic.eagle_proposal`)."""
    ids, probs = top_tokens_fixed(q, K)  # [R, C]
    valid = ids >= 0
    kinds = torch.where(valid, int(NodeKind.DETERMINISTIC), PAD)
    empty = torch.empty(q.shape[0], 0, dtype=torch.int64, device=q.device)
    return LevelChildren(ids, probs, kinds, empty, empty.to(torch.float64), torch.zeros_like(valid[:, 0]))


def rheo_level(
    q: torch.Tensor,
    K: int,
    m: int,
    M: int,
    threshold: float,
    rng: RandomSource,
    proxy: str,
    proxy_scale: float,
    live: torch.Tensor | None = None,
) -> LevelChildren:
    """RheoSampling's children (the tensor form of :func:`~specdec.trees.rheo.rheo_proposal`;
    docs/trees.md, "RheoSampling"): per node, ``m`` sampled children drawn from
    ``q'`` (the top-``M`` entries of ``q`` outside the top-``(K - m)``
    deterministic slots, renormalised) with a proxy weight that does not
    depend on the drawn token, then the ``K - m`` deterministic children; a
    node without residual mass (or below ``threshold``) gets EAGLE-2's top-``K``.
    """
    R = q.shape[0]
    ids, probs = top_tokens_fixed(q, max(K, M))  # [R, max(K, M)]
    det_ids, det_probs = ids[:, : K - m], probs[:, : K - m]  # [R, K - m]
    cand_ids, cand_probs = ids[:, K - m : M], probs[:, K - m : M]  # [R, M - (K - m)]
    if cand_ids.shape[-1] == 0:  # V <= K - m: no token is left for a sampled slot anywhere
        return eagle_level(q, K)
    residual = residual_masses(q, det_ids)  # [R]
    n_cand = (cand_ids >= 0).sum(dim=-1)  # [R]
    has_slot = (n_cand > 0) & (residual > 0) & (residual >= threshold)  # [R]
    if live is not None:
        has_slot = has_slot & live
    mass = row_mass(cand_probs)  # [R]
    law_probs = cand_probs / torch.where(has_slot, mass, 1.0).unsqueeze(-1)  # [R, L]: q'
    mode = SampleMode.WITHOUT_REPLACEMENT if m > 1 else SampleMode.IID
    drawn = draw_rows(law_probs, m, mode, rng, has_slot)  # [R, m] columns of q'
    was_drawn = drawn >= 0
    sampled_tok = torch.where(was_drawn, cand_ids.gather(-1, drawn.clamp_min(0)), -1)  # [R, m]
    if proxy == "displaced":
        rank = torch.minimum(torch.arange(m, device=q.device), (n_cand - 1).clamp_min(0).unsqueeze(-1))  # [R, m]
        sampled_w = cand_probs.gather(-1, rank)
    else:
        c = proxy_scale if proxy == "scaled" else 1.0
        n_drawn = was_drawn.sum(dim=-1, keepdim=True).clamp_min(1)  # [R, 1]
        sampled_w = torch.clamp(c * residual.unsqueeze(-1) / n_drawn, max=1.0).expand(R, m)
    sampled_w = torch.where(was_drawn, sampled_w, 0.0)
    det_kind = torch.where(det_ids >= 0, int(NodeKind.DETERMINISTIC), PAD)
    slot_tokens = torch.cat([sampled_tok, det_ids], dim=-1)  # [R, K]
    slot_weights = torch.cat([sampled_w, det_probs], dim=-1)
    slot_kinds = torch.cat([torch.where(was_drawn, int(NodeKind.SAMPLED), PAD), det_kind], dim=-1)
    top_ids, top_probs = ids[:, :K], probs[:, :K]  # the EAGLE-2 node
    top_kinds = torch.where(top_ids >= 0, int(NodeKind.DETERMINISTIC), PAD)
    use = has_slot.unsqueeze(-1)
    return LevelChildren(
        tokens=torch.where(use, slot_tokens, top_ids),
        weights=torch.where(use, slot_weights, top_probs),
        kinds=torch.where(use, slot_kinds, top_kinds),
        law_ids=torch.where(use, cand_ids, -1),
        law_probs=torch.where(use, law_probs, 0.0),
        law_wor=has_slot & (m > 1),
    )


def grow_levelwise(
    root_token: int | torch.Tensor,
    draft: DraftModel,
    sampling: SamplingConfig,
    rng: RandomSource,
    level: LevelFn,
    *,
    children: int,
    beam_width: int,
    depth: int,
    num_keep: int,
    draws_per_node: int = 0,
    compiled_level: CompiledLevelFn | None = None,
) -> TreeBatch:
    """Grow a dynamic tree level by level with tensor ops, then keep the best ``num_keep`` nodes.

    Args:
        root_token: the last committed token (a Python int or a ``[]``/``[1]`` tensor).
        draft: the draft model, committed up to ``root_token``.
        sampling: processing shared with the target (``q`` is processed).
        rng: source of every draw (only ``level`` draws).
        level: the level function (:data:`LevelFn`).
        children: ``C``, the child slots of one node.
        beam_width: ``B``, nodes of the newest level expanded per level.
        depth: number of levels (level 1 = the root's children).
        num_keep: ``N``, draft nodes kept (root excluded).
        draws_per_node: batched draws ``level`` makes per row (RheoSampling:
            ``m``), which is also the most sampled children a node gets.
        compiled_level: ``level`` compiled as ``fn(q, u, live)``, its draws read
            from a ``[R, draws_per_node]`` table ``u`` drawn from ``rng`` before the
            call (:class:`~specdec.rng.UniformTable`; see :class:`specdec.step.StepCompiler`).

    Returns:
        A one-tree :class:`~specdec.tree_batch.TreeBatch` of ``min(N, created) + 1``
        node slots: the kept nodes in creation order, padding past ``num_nodes``.
    """
    # a draft with a reduced proposal vocabulary (EAGLE-3) is ranked and drawn over its Vd columns;
    # the level's ids are mapped to the target's once, right after the level function
    vocab_ids = draft.proposal_ids  # [Vd] or None
    reduced = vocab_ids is not None
    q, bad = draft.root_distribution_flagged(sampling, proposal=reduced)  # [Vd], []
    q = torch.where(bad, 0.0, normalised_law(q, on_device=True)).unsqueeze(0)  # [1, Vd]; a bad row proposes nothing
    dev = q.device
    vocab = draft.vocab_size
    if reduced:  # [Vd + 1]: draft id -> target id, and the padding id -1 -> -1 (one gather per map)
        vocab_ids = _padded_map(vocab_ids, dev)
    root = torch.as_tensor(root_token, dtype=torch.int64, device=dev).reshape(1)  # [1]
    start = _root_constants(dev)
    # the created nodes, level by level (index 0 = the root); each list entry is one level, flat
    tok = [root]
    kind = [start.kind]
    weight = [start.weight]
    score = [start.score]
    laws: list[LevelChildren] = []  # one per expansion, in expansion order
    expanded = [start.index]  # creation indices of the expanded nodes, in expansion order
    parent_score = start.score  # [R]
    level_sizes = [1]  # created nodes per level (Python ints: the shapes)
    first_ci = 1  # creation index of the newest level's first node
    rows_first_id, next_id = 0, 1  # draft id of the expanded rows' first node; next free draft id
    live = start.live  # [R] the expanded rows that are real nodes
    bad_rows = [bad.reshape(1)]  # per expansion: rows whose draft law was not a law (real rows only)
    for d in range(1, depth + 1):
        if compiled_level is None:
            lv = level(q, rng, live)
        else:
            u = (
                rng.uniforms((q.shape[0], draws_per_node), device=q.device)
                if draws_per_node
                else torch.empty(q.shape[0], 0, dtype=torch.float64, device=q.device)
            )  # [R, draws]
            lv = compiled_level(q, u, live)
        if reduced:  # draft ids -> target ids (padding -1 stays -1)
            lv = lv._replace(
                tokens=vocab_ids[lv.tokens], law_ids=vocab_ids[lv.law_ids] if lv.law_ids.shape[-1] else lv.law_ids
            )
        R, C = lv.tokens.shape
        laws.append(lv)
        lv_tok = lv.tokens.reshape(-1)  # [R * C]
        lv_score = (parent_score.unsqueeze(-1) + torch.log(lv.weights)).reshape(-1)  # [R * C]; unused: -inf
        tok.append(lv_tok)
        kind.append(lv.kinds.reshape(-1))
        weight.append(lv.weights.reshape(-1))
        score.append(lv_score)
        level_sizes.append(R * C)
        if d == depth:
            break
        width = min(beam_width, R * C)
        beam = torch.sort(lv_score, descending=True, stable=True).indices[:width]  # [width] (-score, creation index)
        beam_tok = lv_tok[beam]
        parent_draft = beam // C + rows_first_id  # [width] draft ids of the beam nodes' parents
        # an unused slot in the beam (fewer than B real nodes) is expanded with the root's token; its children score -inf
        q, bad = draft.expand_flagged(
            parent_draft, torch.where(beam_tok >= 0, beam_tok, root), sampling, proposal=reduced
        )  # [width, Vd]
        q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(q, on_device=True))
        parent_score = lv_score[beam]
        live = parent_score > float("-inf")
        bad_rows.append(bad & live)
        expanded.append(beam + first_ci)  # [width] creation indices of the new beam
        first_ci += R * C
        rows_first_id, next_id = next_id, next_id + width
    all_expanded = torch.cat(expanded)  # [E]
    # level d's nodes are the children of level d - 1's expanded rows, row-major: their parents in one op
    par = torch.cat([start.no_parent, all_expanded.repeat_interleave(C)])
    draft_bad = torch.cat(bad_rows).any().reshape(1)  # [1] raised by the step's one read
    return _assemble(
        torch.cat(tok), par, torch.cat(kind), torch.cat(weight), torch.cat(score), _levels(tuple(level_sizes), dev),
        all_expanded, laws, num_keep=num_keep, vocab=vocab,
        children=children, depth=depth, draft_bad=draft_bad, max_sampled=draws_per_node,
    )


class _RootConstants(NamedTuple):
    kind: torch.Tensor  # [1] NodeKind.ROOT
    weight: torch.Tensor  # [1] float64 1
    score: torch.Tensor  # [1] float64 0
    index: torch.Tensor  # [1] int64 0: the root's creation index
    no_parent: torch.Tensor  # [1] int64 -1
    live: torch.Tensor  # [1] bool True


@functools.lru_cache(maxsize=16)
def _root_constants(device: torch.device) -> _RootConstants:
    """The root's entries, made once per device (never written to: every use concatenates or compares)."""
    return _RootConstants(
        kind=torch.full((1,), int(NodeKind.ROOT), dtype=torch.int64, device=device),
        weight=torch.ones(1, dtype=torch.float64, device=device),
        score=torch.zeros(1, dtype=torch.float64, device=device),
        index=torch.zeros(1, dtype=torch.int64, device=device),
        no_parent=torch.full((1,), -1, dtype=torch.int64, device=device),
        live=torch.ones(1, dtype=torch.bool, device=device),
    )


@functools.lru_cache(maxsize=64)
def _levels(sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``[sum(sizes)]`` int64: the level of every created node (``sizes[d]`` nodes at level ``d``), once per shape."""
    return torch.repeat_interleave(torch.arange(len(sizes), device=device), torch.tensor(sizes, device=device))


@functools.lru_cache(maxsize=16)
def _padded_map(vocab_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``[Vd + 1]`` the draft's proposal ids with ``-1`` appended, so that the padding id ``-1`` maps to ``-1``."""
    return torch.cat([vocab_ids.to(device), torch.full((1,), -1, dtype=vocab_ids.dtype, device=device)])


def _assemble(
    tok: torch.Tensor,
    par: torch.Tensor,
    kind: torch.Tensor,
    weight: torch.Tensor,
    score: torch.Tensor,
    lvl: torch.Tensor,
    expanded: torch.Tensor,
    laws: list[LevelChildren],
    *,
    num_keep: int,
    vocab: int,
    children: int,
    depth: int,
    draft_bad: torch.Tensor,
    max_sampled: int,
) -> TreeBatch:
    """The global rerank and the layout of the kept nodes (all ``[T]`` inputs are over created nodes)."""
    T = tok.shape[0]
    dev = tok.device
    keep = min(num_keep, T - 1)
    best = torch.sort(score[1:], descending=True, stable=True).indices[:keep] + 1  # [keep] (-score, creation index)
    valid = score[best] > float("-inf")
    slots = torch.sort(torch.where(valid, best, best + T)).values  # valid first, creation order
    slots = torch.cat([slots.new_zeros(1), torch.where(slots >= T, slots - T, slots)])  # [n]
    n = slots.shape[0]
    live = torch.cat([valid.new_ones(1), torch.arange(keep, device=dev) < valid.sum()])  # [n] valid slots come first
    position = torch.full((T,), -1, dtype=torch.int64, device=dev).index_copy(0, slots, torch.arange(n, device=dev))
    node_par = par[slots]
    parents = torch.where(live & (node_par >= 0), position[node_par.clamp_min(0)], -1)  # [n]
    kinds = torch.where(live, kind[slots], PAD)
    tokens = torch.where(live, tok[slots], tok[0])
    weights = torch.where(live, weight[slots], 0.0)
    weights[0] = 1.0
    depths = torch.where(live, lvl[slots], 0)
    # dense ranks among kept siblings of one kind, in creation order
    same = (parents.unsqueeze(0) == parents.unsqueeze(1)) & (kinds.unsqueeze(0) == kinds.unsqueeze(1))  # [n, n]
    earlier = torch.ones(n, n, dtype=torch.bool, device=dev).tril(-1)  # [i, j]: j < i
    draw_order = (same & earlier & live.unsqueeze(0)).sum(dim=-1) * live  # [n]
    # laws: the expansion row of each kept node, kept where one of its sampled children survived
    L = max(lv.law_ids.shape[-1] for lv in laws)
    all_ids = torch.cat([torch.nn.functional.pad(lv.law_ids, (0, L - lv.law_ids.shape[-1]), value=-1) for lv in laws])
    all_probs = torch.cat([torch.nn.functional.pad(lv.law_probs, (0, L - lv.law_probs.shape[-1])) for lv in laws])
    all_wor = torch.cat([lv.law_wor for lv in laws])  # [E]
    row_of = torch.full((T,), -1, dtype=torch.int64, device=dev).index_copy(
        0, expanded, torch.arange(expanded.shape[0], device=dev)
    )[slots]  # [n]
    sampled_kid = (parents.unsqueeze(0) == torch.arange(n, device=dev).unsqueeze(1)) & (
        kinds == int(NodeKind.SAMPLED)
    ).unsqueeze(0)  # [i, j]: j is a sampled child of i
    has_law = sampled_kid.any(dim=-1) & (row_of >= 0)  # [n]
    law_ids = torch.where(has_law.unsqueeze(-1), all_ids[row_of.clamp_min(0)], -1)  # [n, L]
    law_probs = torch.where(has_law.unsqueeze(-1), all_probs[row_of.clamp_min(0)], 0.0)
    law_wor = has_law & all_wor[row_of.clamp_min(0)]
    # ancestor mask, grown one level at a time
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    up = torch.where(parents >= 0, parents, torch.arange(n, device=dev))  # [n]; the root and padding point to themselves
    anc = eye
    for _ in range(depth):
        anc = eye | anc[up]
    return TreeBatch(
        tokens=tokens[None], parents=parents[None], depths=depths[None], kinds=kinds[None],
        draw_order=draw_order[None], weights=weights[None], num_nodes=live.sum().reshape(1),
        law_ids=law_ids[None], law_probs=law_probs[None], law_wor=law_wor[None], ancestors=anc[None],
        vocab_size=vocab, max_children=children, max_depth=depth, draft_bad=draft_bad, max_sampled=max_sampled,
    )
