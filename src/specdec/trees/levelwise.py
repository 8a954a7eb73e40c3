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
    q, bad = draft.root_rows_flagged(sampling, proposal=reduced)  # [B, Vd], [B]: one row per tree
    q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(q, on_device=True)).unsqueeze(1)  # [B, 1, Vd]
    B = q.shape[0]
    dev = q.device
    vocab = draft.vocab_size
    if reduced:  # [Vd + 1]: draft id -> target id, and the padding id -1 -> -1 (one gather per map)
        vocab_ids = _padded_map(vocab_ids, dev)
    root = torch.as_tensor(root_token, dtype=torch.int64, device=dev).reshape(B, 1)  # [B, 1]
    start = _root_constants(dev)
    # the created nodes of every tree, level by level (column 0 = the root); each list entry is one level
    tok = [root]
    kind = [start.kind.expand(B, 1)]
    weight = [start.weight.expand(B, 1)]
    score = [start.score.expand(B, 1)]
    laws: list[LevelChildren] = []  # one per expansion, in expansion order, fields [B, R, ...]
    expanded = [start.index.expand(B, 1)]  # creation indices of the expanded nodes, in expansion order
    parent_score = score[0]  # [B, R]
    level_sizes = [1]  # created nodes per level and tree (Python ints: the shapes)
    first_ci = 1  # creation index of the newest level's first node
    rows_first_id, next_id = 0, 1  # draft id of the expanded rows' first node; next free draft id
    live = start.live.expand(B, 1)  # [B, R] the expanded rows that are real nodes
    bad_rows = [bad]  # per expansion: rows whose draft law was not a law (real rows only)
    for d in range(1, depth + 1):
        R = q.shape[1]
        flat_q, flat_live = q.reshape(B * R, -1), live.reshape(B * R)  # the level function sees B * R rows
        if compiled_level is None:
            lv = level(flat_q, rng, flat_live)
        else:
            u = (
                rng.uniforms((B * R, draws_per_node), device=dev)
                if draws_per_node
                else torch.empty(B * R, 0, dtype=torch.float64, device=dev)
            )  # [B * R, draws]
            lv = compiled_level(flat_q, u, flat_live)
        if reduced:  # draft ids -> target ids (padding -1 stays -1)
            lv = lv._replace(
                tokens=vocab_ids[lv.tokens], law_ids=vocab_ids[lv.law_ids] if lv.law_ids.shape[-1] else lv.law_ids
            )
        C = lv.tokens.shape[-1]
        laws.append(lv._replace(  # the rerank reads the laws only, per tree
            law_ids=lv.law_ids.reshape(B, R, lv.law_ids.shape[-1]), law_probs=lv.law_probs.reshape(B, R, lv.law_probs.shape[-1]),
            law_wor=lv.law_wor.reshape(B, R),
        ))
        lv_tok = lv.tokens.reshape(B, R * C)  # [B, R * C]
        lv_score = (parent_score.unsqueeze(-1) + torch.log(lv.weights).reshape(B, R, C)).reshape(B, R * C)  # unused: -inf
        tok.append(lv_tok)
        kind.append(lv.kinds.reshape(B, R * C))
        weight.append(lv.weights.reshape(B, R * C))
        score.append(lv_score)
        level_sizes.append(R * C)
        if d == depth:
            break
        width = min(beam_width, R * C)
        beam = torch.sort(lv_score, dim=-1, descending=True, stable=True).indices[:, :width]  # [B, width] (-score, creation index)
        beam_tok = lv_tok.gather(1, beam)
        parent_draft = beam // C + rows_first_id  # [B, width] draft ids of the beam nodes' parents
        # an unused slot in the beam (fewer than B real nodes) is expanded with the root's token; its children score -inf
        q, bad = draft.expand_rows_flagged(
            parent_draft, torch.where(beam_tok >= 0, beam_tok, root), sampling, proposal=reduced
        )  # [B, width, Vd], [B, width]
        q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(q, on_device=True))
        parent_score = lv_score.gather(1, beam)
        live = parent_score > float("-inf")
        bad_rows.append(bad & live)
        expanded.append(beam + first_ci)  # [B, width] creation indices of the new beam
        first_ci += R * C
        rows_first_id, next_id = next_id, next_id + width
    all_expanded = torch.cat(expanded, dim=1)  # [B, E]
    # level d's nodes are the children of level d - 1's expanded rows, row-major: their parents in one op
    par = torch.cat([start.no_parent.expand(B, 1), all_expanded.repeat_interleave(C, dim=1)], dim=1)
    draft_bad = torch.cat([b.reshape(B, -1) for b in bad_rows], dim=1).any(dim=-1)  # [B] raised by the step's one read
    return _assemble(
        torch.cat(tok, dim=1), par, torch.cat(kind, dim=1), torch.cat(weight, dim=1), torch.cat(score, dim=1),
        _levels(tuple(level_sizes), dev), all_expanded, laws, num_keep=num_keep, vocab=vocab,
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
    """The global rerank and the layout of the kept nodes of every tree (the
    ``[B, T]`` inputs are over each tree's created nodes; ``lvl`` ``[T]`` is
    shared; ``expanded`` ``[B, E]``)."""
    B, T = tok.shape
    dev = tok.device
    keep = min(num_keep, T - 1)
    best = torch.sort(score[:, 1:], dim=-1, descending=True, stable=True).indices[:, :keep] + 1  # [B, keep]
    valid = score.gather(1, best) > float("-inf")  # (-score, creation index)
    slots = torch.sort(torch.where(valid, best, best + T), dim=-1).values  # valid first, creation order
    slots = torch.cat([slots.new_zeros(B, 1), torch.where(slots >= T, slots - T, slots)], dim=1)  # [B, n]
    n = slots.shape[1]
    node_ids = torch.arange(n, device=dev)  # [n]
    live = torch.cat([valid.new_ones(B, 1), node_ids[:keep] < valid.sum(dim=-1, keepdim=True)], dim=1)  # [B, n]
    position = torch.full((B, T), -1, dtype=torch.int64, device=dev).scatter(1, slots, node_ids.expand(B, n))
    node_par = par.gather(1, slots)
    parents = torch.where(live & (node_par >= 0), position.gather(1, node_par.clamp_min(0)), -1)  # [B, n]
    kinds = torch.where(live, kind.gather(1, slots), PAD)
    tokens = torch.where(live, tok.gather(1, slots), tok[:, :1])
    weights = torch.where(live, weight.gather(1, slots), 0.0)
    weights[:, 0] = 1.0
    depths = torch.where(live, lvl[slots], 0)
    # dense ranks among kept siblings of one kind, in creation order
    same = (parents.unsqueeze(1) == parents.unsqueeze(2)) & (kinds.unsqueeze(1) == kinds.unsqueeze(2))  # [B, n, n]
    earlier = torch.ones(n, n, dtype=torch.bool, device=dev).tril(-1)  # [i, j]: j < i
    draw_order = (same & earlier & live.unsqueeze(1)).sum(dim=-1) * live  # [B, n]
    # laws: the expansion row of each kept node, kept where one of its sampled children survived
    L = max(lv.law_ids.shape[-1] for lv in laws)
    all_ids = torch.cat([torch.nn.functional.pad(lv.law_ids, (0, L - lv.law_ids.shape[-1]), value=-1) for lv in laws], dim=1)
    all_probs = torch.cat([torch.nn.functional.pad(lv.law_probs, (0, L - lv.law_probs.shape[-1])) for lv in laws], dim=1)
    all_wor = torch.cat([lv.law_wor for lv in laws], dim=1)  # [B, E]
    E = expanded.shape[1]
    row_of = torch.full((B, T), -1, dtype=torch.int64, device=dev).scatter(
        1, expanded, torch.arange(E, device=dev).expand(B, E)
    ).gather(1, slots)  # [B, n]
    sampled_kid = (parents.unsqueeze(1) == node_ids.view(1, n, 1)) & (kinds == int(NodeKind.SAMPLED)).unsqueeze(1)  # [B, i, j]
    has_law = sampled_kid.any(dim=-1) & (row_of >= 0)  # [B, n]
    row = row_of.clamp_min(0)
    law_ids = torch.where(has_law.unsqueeze(-1), all_ids.gather(1, row.unsqueeze(-1).expand(B, n, L)), -1)  # [B, n, L]
    law_probs = torch.where(has_law.unsqueeze(-1), all_probs.gather(1, row.unsqueeze(-1).expand(B, n, L)), 0.0)
    law_wor = has_law & all_wor.gather(1, row)
    # ancestor mask, grown one level at a time
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    up = torch.where(parents >= 0, parents, node_ids).unsqueeze(-1).expand(B, n, n)  # the root and padding point to themselves
    anc = eye.expand(B, n, n)
    for _ in range(depth):
        anc = eye | anc.gather(1, up)
    return TreeBatch(
        tokens=tokens, parents=parents, depths=depths, kinds=kinds,
        draw_order=draw_order, weights=weights, num_nodes=live.sum(dim=-1),
        law_ids=law_ids, law_probs=law_probs, law_wor=law_wor, ancestors=anc,
        vocab_size=vocab, max_children=children, max_depth=depth, draft_bad=draft_bad, max_sampled=max_sampled,
    )
