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

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch

from specdec._constants import device_constant
from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel, laws_and_flags
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind, SampleMode
from specdec.tree_batch import PAD, TreeBatch
from specdec.trees.calibration import CALIBRATION_EDGES, _need_table
from specdec.trees.feed import Build, DraftSpec, drive
from specdec.trees._common import (
    DraftLaw, _as_law, draft_law, draw_rows, min_top1_weight, row_mass, slot_residual, top_tokens_fixed,
)

__all__ = [
    "CompiledLevelFn", "LevelChildren", "LevelCompiler", "LevelFn", "LevelStep", "eagle_level", "grow_levelwise",
    "level_step", "levelwise_build", "rheo_level",
]


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


LevelFn = Callable[..., LevelChildren]
"""``level(q, rng, live)``: the children of the nodes whose draft laws are ``q``
``[R, V]`` (float64, or a :class:`~specdec.trees._common.DraftLaw`); rows where ``live`` ``[R]`` is False are beam slots
without a real node (a level with fewer than ``B`` nodes): they must not draw. A builder that ranks by one
law and draws by another (``rank_law="untempered"``) gets the draw law as a fourth argument,
``level(q, rng, live, draw)``."""


class LevelStep(NamedTuple):
    """One level of :func:`grow_levelwise` after its level function (:func:`level_step`):
    the children, scored, and the beam the draft expands next. ``B`` trees, ``R``
    expanded rows per tree, ``C`` child slots per row.

    Attributes:
        children: the level's :class:`LevelChildren` (fields ``[B * R, ...]``), ids in
            the target's vocabulary.
        tokens: ``[B, R * C]`` int64 (``-1`` unused slots).
        kinds: ``[B, R * C]`` int64.
        weights: ``[B, R * C]`` float64.
        scores: ``[B, R * C]`` float64 path scores (``-inf`` unused slots).
        beam: ``[B, W]`` int64 indices into the level of the nodes expanded next (the
            best ``W`` by (-score, creation index)); None at the last level.
        beam_scores: ``[B * W, 1]`` float64 their path scores; None at the last level.
        beam_live: ``[B, W]`` bool: the beam slot holds a real node; None at the last level.
        beam_tokens: ``[B, W]`` int64 their tokens (the root's token where not live); None at the last level.
    """

    children: LevelChildren
    tokens: torch.Tensor
    kinds: torch.Tensor
    weights: torch.Tensor
    scores: torch.Tensor
    beam: torch.Tensor | None
    beam_scores: torch.Tensor | None
    beam_live: torch.Tensor | None
    beam_tokens: torch.Tensor | None


CompiledLevelFn = Callable[..., LevelStep]
"""A level function and :func:`level_step` compiled as one graph
(:meth:`specdec.engine.compiler.StepCompiler.level`): ``fn(q, u, live, draw, parent_score,
vocab_map, root, beam_width)``, the level's draws read from the uniform table ``u``
``[R, draws]`` (:class:`~specdec.rng.UniformTable`), ``draw`` None for a
builder that ranks and draws by one law."""


class LevelCompiler(Protocol):
    """What :func:`grow_levelwise` compiles with (:class:`specdec.engine.compiler.StepCompiler`)."""

    finish: Callable[..., dict[str, torch.Tensor]]
    """:func:`finish_levels` compiled as one graph."""

    def level(self, level: LevelFn, key: object) -> CompiledLevelFn:
        """``level`` and :func:`level_step` compiled as one graph, one per ``key``."""


def eagle_level(q: torch.Tensor | DraftLaw, K: int) -> LevelChildren:
    """EAGLE-2's children: each node's top-``K`` tokens, deterministic, weight ``q(x)``
    (the tensor form of :func:`~specdec.trees.dynamic.eagle_proposal`)."""
    ids, probs = top_tokens_fixed(q, K)  # [R, C]
    kinds = torch.where(ids >= 0, int(NodeKind.DETERMINISTIC), PAD)
    return LevelChildren(ids, probs, kinds, *_no_laws(ids.shape[0], ids.device))


@device_constant(64)
def _no_laws(rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The law fields of ``rows`` nodes without sampled children: ``[R, 0]`` ids and probs,
    ``[R]`` False; made once per size and device (never written to: the driver only reads them)."""
    empty = torch.empty(rows, 0, dtype=torch.int64, device=device)
    return empty, empty.to(torch.float64), torch.zeros(rows, dtype=torch.bool, device=device)


def rheo_level(
    q: torch.Tensor | DraftLaw,
    K: int,
    m: int,
    M: int,
    threshold: float,
    rng: RandomSource,
    proxy: str,
    proxy_scale: float,
    live: torch.Tensor | None = None,
    draw: torch.Tensor | DraftLaw | None = None,
    calibration: tuple[tuple[float, ...], ...] | None = None,
    truncate: bool = False,
) -> LevelChildren:
    """RheoSampling's children (the tensor form of :func:`~specdec.trees.rheo.rheo_proposal`;
    docs/trees.md, "RheoSampling"): per node, ``m`` sampled children drawn from
    ``q'`` (the top-``M`` entries of ``q`` outside the top-``(K - m)``
    deterministic slots, renormalised) with a proxy weight that does not
    depend on the drawn token, then the ``K - m`` deterministic children; a
    node without residual mass (or below ``threshold``) gets EAGLE-2's top-``K``.

    With ``draw`` (``[R, V]``, the law the sampled slot draws by, when it is not
    ``q``: ``rank_law="untempered"``), ``q`` ranks (the slots ``S``, the
    deterministic weights, the displaced proxy) and ``q'`` is the top
    ``M - (K - m)`` entries of ``draw`` outside ``S``, renormalised; the
    residual (slot test, threshold, scaled proxy) is ``draw``'s ``1 - draw(S)``.
    ``calibration``: the ``"calibrated"`` proxy's table (:func:`calibrated_proxy`).
    ``truncate``: the construction reads each law truncated to its top ``M`` and renormalised
    (:func:`~specdec.trees.rheo.rheo_proposal`): weights and residual divide by the top-``M`` mass.
    """
    if draw is not None:
        return _rheo_level_split(q, draw, K, m, M, threshold, rng, proxy, proxy_scale, live, calibration, truncate)
    ids, probs = top_tokens_fixed(q, max(K, M))  # [R, max(K, M)] with R = q.shape[0]
    dev = ids.device
    cand_ids, cand_probs = ids[:, K - m : M], probs[:, K - m : M]  # [R, M - (K - m)]
    if cand_ids.shape[-1] == 0:  # V <= K - m: no token is left for a sampled slot anywhere
        return eagle_level(q, K)
    weigh = probs if not truncate else probs / row_mass(probs[:, :M]).unsqueeze(-1)  # the construction's law
    residual = slot_residual(weigh[:, : K - m])  # [R] 1 - q(S), from S's entries (0 padded)
    has_slot = _has_slot(cand_probs, residual, threshold, live)  # [R]
    law_probs, was_drawn, sampled_tok = _draw_slots(cand_ids, cand_probs, has_slot, m, rng)  # [R, L], [R, m] x 2
    if proxy in ("displaced", "calibrated"):
        n_cand = (cand_ids >= 0).sum(dim=-1)  # [R]
        rank = torch.minimum(torch.arange(m, device=dev), (n_cand - 1).clamp_min(0).unsqueeze(-1))  # [R, m]
        sampled_w = weigh[:, K - m : M].gather(-1, rank)  # [R, m]
        if proxy == "calibrated":
            sampled_w = calibrated_proxy(sampled_w, calibration)
    elif proxy == "min_top1":
        sampled_w = _min_top1_proxy(weigh[:, 0], was_drawn)
    elif m == 1:  # one draw: c * residual (c = 1 for "residual"), the split's bits
        c = 1.0 if proxy == "residual" else proxy_scale
        sampled_w = torch.clamp(c * residual, max=1.0).unsqueeze(-1)  # [R, 1]
    else:
        sampled_w = _split_proxy(residual, was_drawn, proxy, proxy_scale)  # [R, m]
    return _slot_children(has_slot, sampled_tok, torch.where(was_drawn, sampled_w, 0.0), ids[:, :K], weigh[:, :K],
                          cand_ids, law_probs, m, K - m)


def _rheo_level_split(
    q: torch.Tensor | DraftLaw,
    draw: torch.Tensor | DraftLaw,
    K: int,
    m: int,
    M: int,
    threshold: float,
    rng: RandomSource,
    proxy: str,
    proxy_scale: float,
    live: torch.Tensor | None,
    calibration: tuple[tuple[float, ...], ...] | None = None,
    truncate: bool = False,
) -> LevelChildren:
    """:func:`rheo_level` ranking by ``q`` and drawing by ``draw`` (see there)."""
    ids, probs = top_tokens_fixed(q, K)  # [R, K] the ranking law's top K (R = q.shape[0])
    if truncate:  # the ranking law truncated to its top M: its weights divide by that mass
        probs = probs / row_mass(top_tokens_fixed(q, M)[1]).unsqueeze(-1)
    dev = ids.device
    det_ids = ids[:, : K - m]  # [R, K - m] S
    # q' ranks the draw law outside S: S's K - m tokens leave the draw law's top M (order kept), the first L stay
    L = M - (K - m)
    top_ids, top_probs = top_tokens_fixed(draw, M)  # [R, M] (-1 / 0 padded at the end)
    in_s = (top_ids.unsqueeze(-1) == det_ids.unsqueeze(-2)).any(dim=-1) & (top_ids >= 0)  # [R, M]
    keep = torch.sort(in_s.to(torch.int8), dim=-1, stable=True).indices[:, :L]  # [R, L] the others, in rank order
    dropped = in_s.gather(-1, keep)  # [R, L] S's tokens, where fewer than L others are ranked (V < M)
    cand_ids = torch.where(dropped, -1, top_ids.gather(-1, keep))  # [R, L]
    cand_probs = torch.where(dropped, 0.0, top_probs.gather(-1, keep))
    in_s = _law_at(draw, det_ids)  # [R, K - m] draw(S), S's entries
    if truncate:  # the draw law truncated to its top M: its residual divides by that mass
        in_s = in_s / row_mass(top_probs).unsqueeze(-1)
    residual = slot_residual(in_s)  # [R] 1 - draw(S), from S's entries
    has_slot = _has_slot(cand_probs, residual, threshold, live)  # [R]
    law_probs, was_drawn, sampled_tok = _draw_slots(cand_ids, cand_probs, has_slot, m, rng)  # [R, L], [R, m] x 2
    if proxy in ("displaced", "calibrated"):  # the ranking law's q at rank K - m + i, or at its last positive rank
        n_pos = (ids >= 0).sum(dim=-1, keepdim=True)  # [R, 1]
        rank = torch.minimum(torch.arange(K - m, K, device=dev), (n_pos - 1).clamp_min(0))  # [R, m]
        sampled_w = probs.gather(-1, rank)  # [R, m]
        if proxy == "calibrated":
            sampled_w = calibrated_proxy(sampled_w, calibration)
    elif proxy == "min_top1":
        sampled_w = _min_top1_proxy(probs[:, 0], was_drawn)
    else:
        sampled_w = _split_proxy(residual, was_drawn, proxy, proxy_scale)  # [R, m]
    return _slot_children(has_slot, sampled_tok, torch.where(was_drawn, sampled_w, 0.0), ids, probs, cand_ids,
                          law_probs, m, K - m)


@device_constant()
def _calibration_tensors(table: tuple[tuple[float, ...], ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, bins]`` table and ``[bins - 1]`` upper bin edges of the ``"calibrated"`` proxy."""
    return (torch.tensor(table, dtype=torch.float64, device=device),
            torch.tensor(CALIBRATION_EDGES[1:], dtype=torch.float64, device=device))


def calibrated_proxy(displaced: torch.Tensor, calibration: tuple[tuple[float, ...], ...] | None) -> torch.Tensor:
    """``[R, m]`` weights of the ``"calibrated"`` proxy from the displaced ones ``[R, m]``
    (the tensor form of :func:`specdec.trees.calibration.calibrated_weight`): draw ``i`` reads row
    ``min(i, rows - 1)`` of ``calibration`` at its displaced weight's bin of
    :data:`specdec.trees.calibration.CALIBRATION_EDGES`. The table and edges are made once per table and device."""
    dev = displaced.device
    t, upper = _calibration_tensors(_need_table(calibration), dev)  # [rows, bins], [bins - 1]
    m = displaced.shape[-1]
    row = torch.arange(m, device=dev).clamp_max(t.shape[0] - 1)  # [m]
    b = torch.bucketize(displaced.to(torch.float64).contiguous(), upper, right=True)  # [R, m] bin per weight
    return t[row.unsqueeze(0).expand_as(b), b]


def _min_top1_proxy(top1: torch.Tensor, was_drawn: torch.Tensor) -> torch.Tensor:
    """``[R, m]`` weights of the ``"min_top1"`` proxy from ``q(top1)`` ``[R]``: ``min(q(top1), 1 - q(top1))``
    (:func:`~specdec.trees._common.min_top1_weight`) split evenly among the draws made."""
    R, m = was_drawn.shape
    n_drawn = was_drawn.sum(dim=-1, keepdim=True).clamp_min(1)  # [R, 1]
    return torch.clamp(min_top1_weight(top1).unsqueeze(-1) / n_drawn, max=1.0).expand(R, m)


def _split_proxy(residual: torch.Tensor, was_drawn: torch.Tensor, proxy: str, proxy_scale: float) -> torch.Tensor:
    """``[R, m]`` weights of the sampled children from the residual ``r`` ``[R]`` (docs/trees.md, "Proxies"):
    ``"scaled"`` / ``"residual"`` split ``c r`` evenly among the draws made (``c = 1`` for ``"residual"``);
    ``"geometric"`` gives the ``i``-th draw ``c r (1 - c)^i``. Functions of ``q`` alone, never of a drawn token."""
    R, m = was_drawn.shape
    if proxy == "geometric":
        decay = (1.0 - proxy_scale) ** torch.arange(m, dtype=torch.float64, device=residual.device)  # [m]
        return torch.clamp(proxy_scale * residual.unsqueeze(-1) * decay, max=1.0)
    c = proxy_scale if proxy == "scaled" else 1.0
    n_drawn = was_drawn.sum(dim=-1, keepdim=True).clamp_min(1)  # [R, 1]
    return torch.clamp(c * residual.unsqueeze(-1) / n_drawn, max=1.0).expand(R, m)


def _draw_slots(
    cand_ids: torch.Tensor, cand_probs: torch.Tensor, has_slot: torch.Tensor, m: int, rng: RandomSource
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sampled slots of a Rheo level: ``q'`` (``cand_probs`` ``[R, L]`` renormalised, 0 without a
    slot), which draws were made, and the drawn tokens (``[R, m]``, ``-1`` where none)."""
    mass = row_mass(cand_probs)  # [R]
    law_probs = cand_probs / torch.where(has_slot, mass, float("inf")).unsqueeze(-1)  # [R, L]: q' (0 without a slot)
    mode = SampleMode.WITHOUT_REPLACEMENT if m > 1 else SampleMode.IID
    drawn = draw_rows(law_probs, m, mode, rng, has_slot)  # [R, m] columns of q'
    was_drawn = drawn >= 0
    return law_probs, was_drawn, torch.where(was_drawn, cand_ids.gather(-1, drawn.clamp_min(0)), -1)


def _slot_children(
    has_slot: torch.Tensor,
    sampled_tok: torch.Tensor,
    sampled_w: torch.Tensor,
    ids: torch.Tensor,
    probs: torch.Tensor,
    cand_ids: torch.Tensor,
    law_probs: torch.Tensor,
    m: int,
    n_det: int | None = None,
) -> LevelChildren:
    """A Rheo level's children: where a node has a slot (``has_slot`` ``[R]``), its ``m``
    sampled children (``sampled_tok``, ``sampled_w`` ``[R, m]``) then the ``n_det = K - m``
    deterministic ones (the first of ``ids``, ``probs`` ``[R, C]``, the ranking law's top
    ``C = min(K, V)``); else the EAGLE-2 node's top ``C``. Laws: ``cand_ids``, ``law_probs`` ``[R, L]``.

    Each node has ``C`` child slots. Where the vocabulary is smaller than ``K`` (``C < K``), at most
    ``C - n_det`` of the ``m`` draws can be made (the candidates outside ``S`` number ``V - n_det``),
    and draws fill their columns in order, so the first ``C - n_det`` columns hold them all."""
    C = ids.shape[-1]
    n_det = C - m if n_det is None else min(n_det, C)
    kept = C - n_det  # sampled columns that can hold a draw
    use = has_slot.unsqueeze(-1)
    tokens = torch.where(use, torch.cat([sampled_tok[:, :kept], ids[:, :n_det]], dim=-1), ids)  # [R, C]
    weights = torch.where(use, torch.cat([sampled_w[:, :kept], probs[:, :n_det]], dim=-1), probs)
    sampled_slot = use & _first_slots(kept, C, ids.device)  # [R, C]
    kinds = torch.where(tokens >= 0, torch.where(sampled_slot, int(NodeKind.SAMPLED), int(NodeKind.DETERMINISTIC)), PAD)
    return LevelChildren(
        tokens=tokens,
        weights=weights,
        kinds=kinds,
        law_ids=torch.where(use, cand_ids, -1),
        law_probs=law_probs,
        law_wor=has_slot & (m > 1),
    )


def _has_slot(
    cand_probs: torch.Tensor, residual: torch.Tensor, threshold: float, live: torch.Tensor | None
) -> torch.Tensor:
    """``[R]`` the nodes that get sampled slots: a positive entry outside ``S`` (``q'``'s first
    candidate, ``cand_probs`` ``[R, L]``), a residual that passes ``threshold``, a real node."""
    has_slot = (cand_probs[:, 0] > 0) & (residual >= threshold if threshold > 0 else residual > 0)
    return has_slot if live is None else has_slot & live


def _law_at(q: torch.Tensor | DraftLaw, ids: torch.Tensor) -> torch.Tensor:
    """``[R, s]`` float64 ``q`` at ``ids`` ``[R, s]`` (``-1`` padded: 0), :func:`~specdec.trees._common.normalised_law`'s
    bits (0 on a :class:`DraftLaw`'s bad rows)."""
    probs, law = _as_law(q)
    at = probs.gather(-1, ids.clamp_min(0))
    if law is not None:
        at = (at.to(torch.float64) / law.total).masked_fill(law.bad, 0.0)
    return torch.where(ids >= 0, at, 0.0)


@device_constant(64)
def _first_slots(m: int, K: int, device: torch.device) -> torch.Tensor:
    """``[K]`` bool: the first ``m`` slots (a node's sampled ones), once per shape and device (never written to)."""
    return torch.arange(K, device=device) < m


def level_step(
    lv: LevelChildren,
    parent_score: torch.Tensor,
    vocab_map: torch.Tensor | None,
    root: torch.Tensor,
    beam_width: int,
) -> LevelStep:
    """Score one level's children and pick the beam (the driver's work after the level function).

    Args:
        lv: the level function's children of ``B * R`` rows (tree-major), draft ids.
        parent_score: ``[B * R, 1]`` float64 path scores of the expanded rows.
        vocab_map: ``[Vd + 1]`` int64 draft id -> target id (``-1`` -> ``-1``), or None.
        root: ``[B, 1]`` int64 the roots' tokens (a beam slot without a real node is
            expanded with it; its children score ``-inf``).
        beam_width: the beam's width ``B`` (the beam holds ``W = min(B, R * C)`` nodes);
            0 at the last level (no beam).
    """
    B = root.shape[0]
    if vocab_map is not None:  # draft ids -> target ids (padding -1 stays -1)
        lv = lv._replace(
            tokens=vocab_map[lv.tokens], law_ids=vocab_map[lv.law_ids] if lv.law_ids.shape[-1] else lv.law_ids
        )
    tokens = lv.tokens.reshape(B, -1)  # [B, R * C]
    scores = (parent_score + torch.log(lv.weights)).reshape(B, -1)  # path scores; unused slots: -inf
    kinds, weights = lv.kinds.reshape(B, -1), lv.weights.reshape(B, -1)  # [B, R * C]
    if beam_width == 0:
        return LevelStep(lv, tokens, kinds, weights, scores, None, None, None, None)
    width = min(beam_width, tokens.shape[1])
    beam = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :width]  # [B, W] (-score, creation index)
    beam_score = scores.gather(1, beam)  # [B, W]
    beam_live = beam_score > float("-inf")  # a node of finite score is a real node (its token is >= 0)
    beam_tokens = torch.where(beam_live, tokens.gather(1, beam), root)  # [B, W]
    return LevelStep(lv, tokens, kinds, weights, scores, beam, beam_score.reshape(-1, 1), beam_live, beam_tokens)


def grow_levelwise(
    root_token: int | torch.Tensor,
    draft: DraftModel,
    sampling: SamplingConfig,
    rng: RandomSource,
    level: LevelFn,
    **options: Any,
) -> TreeBatch:
    """:func:`levelwise_build` driven by ``draft`` (:func:`~specdec.trees.feed.drive`): the
    tree the draft model grows, committed up to ``root_token`` (options as there)."""
    return drive(levelwise_build(root_token, DraftSpec.of(draft), sampling, rng, level, **options), draft)


def levelwise_build(
    root_token: int | torch.Tensor,
    spec: DraftSpec,
    sampling: SamplingConfig,
    rng: RandomSource,
    level: LevelFn,
    *,
    children: int,
    beam_width: int,
    depth: int,
    num_keep: int,
    draws_per_node: int = 0,
    compiler: LevelCompiler | None = None,
    compile_key: object = None,
    draw_sampling: SamplingConfig | None = None,
) -> Build:
    """Grow a dynamic tree level by level with tensor ops, then keep the best ``num_keep`` nodes:
    a build (:mod:`specdec.trees.feed`) that asks for the root's draft logits, then for each
    level's beam (``beam_width`` nodes per tree), and returns the tree batch.

    Args:
        root_token: the last committed token(s): a Python int, or a ``[B]`` tensor (``B`` trees).
        spec: the drafter's vocabulary (a reduced proposal vocabulary is asked for as ``[.., Vd]``).
        sampling: processing shared with the target (``q`` is processed).
        rng: source of every draw (only ``level`` draws).
        level: the level function (:data:`LevelFn`).
        children: ``C``, the child slots of one node.
        beam_width: ``B``, nodes of the newest level expanded per level.
        depth: number of levels (level 1 = the root's children).
        num_keep: ``N``, draft nodes kept (root excluded).
        draws_per_node: batched draws ``level`` makes per row (RheoSampling:
            ``m``), which is also the most sampled children a node gets.
        compiler: with a :class:`LevelCompiler` (:class:`specdec.engine.compiler.StepCompiler`),
            each level's work between two draft forwards (``level`` and
            :func:`level_step`) runs as one compiled graph (``compiler.level(level,
            compile_key)``), its draws read from a ``[R, draws_per_node]`` table
            drawn from ``rng`` before the call (:class:`~specdec.rng.UniformTable`),
            and the rerank and layout (:func:`finish_levels`) as another.
        compile_key: the key of the compiled level function (builder and sampling).
        draw_sampling: the processing of the law the level draws by, when it is not
            ``sampling`` (``rank_law="untempered"``: ``sampling`` ranks); both laws come
            from the same draft forward and ``level`` gets the draw law as its fourth argument.

    Returns:
        (as the generator's return value) a :class:`~specdec.tree_batch.TreeBatch` of ``B``
        trees, ``min(N, created) + 1`` node slots each: the kept nodes in creation order,
        padding past ``num_nodes``.
    """
    # a draft with a reduced proposal vocabulary (EAGLE-3) is ranked and drawn over its Vd columns;
    # the level's ids are mapped to the target's once, right after the level function
    vocab_ids = spec.proposal_ids  # [Vd] or None
    reduced = vocab_ids is not None
    configs = (sampling,) if draw_sampling is None else (sampling, draw_sampling)
    B = torch.as_tensor(root_token).numel()
    width_vd = spec.vocab_size if vocab_ids is None else int(vocab_ids.shape[0])
    logits = yield DraftRequest(0, B, width_vd, reduced)  # [B, Vd]: one row per tree
    qs, bad = laws_and_flags(logits, configs)  # [B, Vd] per config, [B]
    law, draw = _laws(qs, bad)  # [B * R, Vd], R = 1 row per tree (q = 0 on bad rows); draw law or None
    dev = law.device
    vocab_map = _padded_map(vocab_ids, dev) if vocab_ids is not None else None  # [Vd + 1]: draft -> target id, -1 -> -1
    root = torch.as_tensor(root_token, dtype=torch.int64, device=dev).reshape(B, 1)  # [B, 1]
    start = _root_constants(dev)
    compiled = None if compiler is None else compiler.level(level, compile_key)
    steps: list[LevelStep] = []  # per level
    lives: list[torch.Tensor] = []  # per expansion after the root's: [B, W] the beam rows that are real nodes
    bads: list[torch.Tensor] = [bad]  # per expansion: [B, R] rows whose draft law was not a law
    parent_score = start.score.expand(B, 1)  # [B * R, 1] path scores of the expanded rows
    level_sizes = [1]  # created nodes per level and tree (Python ints: the shapes)
    rows_first_id = 0  # draft id of the expanded rows' first node
    earlier: list[torch.Tensor] = []  # the parents of each earlier request (the draft tree, for DraftRequest)
    live = start.live.expand(B)  # [B * R] the expanded rows that are real nodes
    for d in range(1, depth + 1):
        R = law.shape[0] // B  # the level function sees B * R rows, tree-major
        width = 0 if d == depth else beam_width
        if compiled is None:
            lv = level(law, rng, live) if draw is None else level(law, rng, live, draw)
            step = level_step(lv, parent_score, vocab_map, root, width)
        else:
            u = (
                rng.uniforms((B * R, draws_per_node), device=dev)
                if draws_per_node
                else torch.empty(B * R, 0, dtype=torch.float64, device=dev)
            )  # [B * R, draws]
            step = compiled(law, u, live, draw, parent_score, vocab_map, root, width)
        steps.append(step)
        level_sizes.append(step.tokens.shape[1])
        if d == depth:
            break
        beam, beam_tokens, beam_live, beam_scores = step.beam, step.beam_tokens, step.beam_live, step.beam_scores
        assert beam is not None and beam_tokens is not None and beam_live is not None and beam_scores is not None
        # a beam slot without a real node (fewer than B real nodes) is expanded with the root's token
        parents = beam // step.children.tokens.shape[-1] + rows_first_id  # [B, W] draft ids of the beam's parents
        logits = yield DraftRequest(d, B, width_vd, reduced, parents, beam_tokens, beam_live,
                                    rows_first_id + R, tuple(earlier))  # [B, W, Vd]
        earlier.append(parents)
        qs, bad = laws_and_flags(logits, configs)  # [B, W, Vd] per config, [B, W]
        width = beam.shape[1]
        law, draw = _laws([q.reshape(B * width, -1) for q in qs], bad)
        lives.append(beam_live)
        bads.append(bad)
        parent_score, live = beam_scores, beam_live.reshape(B * width)
        rows_first_id += R  # the next level's rows follow this level's in the draft's tree
    shape = _shape_constants(tuple(level_sizes), tuple(s.beam.shape[1] for s in steps[:-1] if s.beam is not None), dev)
    finish = finish_levels if compiler is None else compiler.finish
    fields = finish(steps, lives, bads, shape, root, num_keep=num_keep, depth=depth)
    return TreeBatch(
        **fields, vocab_size=spec.vocab_size, max_children=children, max_depth=depth,
        max_sampled=draws_per_node, host_trees=None,
    )


def _laws(qs: list[torch.Tensor], bad: torch.Tensor) -> tuple[DraftLaw, DraftLaw | None]:
    """The ranking law and, when there is one, the draw law of one level (``[R, V]`` each)."""
    if len(qs) == 1:
        return draft_law(qs[0], bad), None
    return draft_law(qs[0], bad), draft_law(qs[1], bad)


class _RootConstants(NamedTuple):
    kind: torch.Tensor  # [1] NodeKind.ROOT
    weight: torch.Tensor  # [1] float64 1
    score: torch.Tensor  # [1] float64 0
    creation: torch.Tensor  # [1] int64 0: the root's creation index (not `index`: a tuple method)
    live: torch.Tensor  # [1] bool True


@device_constant(16)
def _root_constants(device: torch.device) -> _RootConstants:
    """The root's entries, made once per device (never written to: every use concatenates or compares)."""
    return _RootConstants(
        kind=torch.full((1,), int(NodeKind.ROOT), dtype=torch.int64, device=device),
        weight=torch.ones(1, dtype=torch.float64, device=device),
        score=torch.zeros(1, dtype=torch.float64, device=device),
        creation=torch.zeros(1, dtype=torch.int64, device=device),
        live=torch.ones(1, dtype=torch.bool, device=device),
    )


class _ShapeConstants(NamedTuple):
    levels: torch.Tensor  # [T] int64 the level of every created node
    first_index: torch.Tensor  # [E] int64 creation index of the first node of each expanded row's level
    root_parent: torch.Tensor  # [1] int64 T: the root's parent column (mapped to -1 by finish_levels)


@device_constant(64)
def _shape_constants(sizes: tuple[int, ...], widths: tuple[int, ...], device: torch.device) -> _ShapeConstants:
    """Index tensors of one tree shape (``sizes[d]`` nodes at level ``d``, ``widths[d - 1]`` of
    them expanded for level ``d + 1``), made once per shape and device (never written to)."""
    firsts = [0, *itertools.accumulate(sizes)]  # creation index of each level's first node
    first_index = [0] + [firsts[d + 1] for d, w in enumerate(widths) for _ in range(w)]
    return _ShapeConstants(
        levels=torch.repeat_interleave(torch.arange(len(sizes), device=device), torch.tensor(sizes, device=device)),
        first_index=torch.tensor(first_index, dtype=torch.int64, device=device),
        root_parent=torch.full((1,), sum(sizes), dtype=torch.int64, device=device),
    )


@device_constant(64)
def _node_constants(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[n]`` node ids, ``[n, n]`` ``j < i`` and ``[n, n]`` identity (bool), once per size and device (never written to)."""
    return (
        torch.arange(n, device=device),
        torch.ones(n, n, dtype=torch.bool, device=device).tril(-1),
        torch.eye(n, dtype=torch.bool, device=device),
    )


@device_constant(16)
def _padded_map(vocab_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``[Vd + 1]`` the draft's proposal ids with ``-1`` appended, so that the padding id ``-1`` maps to ``-1``."""
    return torch.cat([vocab_ids.to(device), torch.full((1,), -1, dtype=vocab_ids.dtype, device=device)])


def finish_levels(
    steps: list[LevelStep],
    lives: list[torch.Tensor],
    bads: list[torch.Tensor],
    shape: "_ShapeConstants",
    root: torch.Tensor,
    *,
    num_keep: int,
    depth: int,
) -> dict[str, torch.Tensor]:
    """The global rerank and the layout of the kept nodes of every tree, from the
    driver's levels (:func:`grow_levelwise`: ``steps`` per level, ``lives`` and
    ``bads`` per expansion, ``bads[0]`` ``[B]`` the roots'): the tensor fields of a
    :class:`~specdec.tree_batch.TreeBatch` by name (a dict, so that it compiles as one graph)."""
    B = root.shape[0]
    start = _root_constants(root.device)
    C = steps[0].children.tokens.shape[-1]
    beams = [s.beam for s in steps[:-1] if s.beam is not None]  # [B, W] per expansion after the root's (all have one)
    # creation indices of the expanded nodes, in expansion order (the root's is 0)
    expanded = torch.cat([start.creation.expand(B, 1), *beams], dim=1) + shape.first_index  # [B, E]
    # level d's nodes are the children of level d - 1's expanded rows, row-major: their parents in one op
    # (the root's parent is the column T, which the layout maps to -1)
    par = torch.cat([shape.root_parent.expand(B, 1), expanded.repeat_interleave(C, dim=1)], dim=1)
    draft_bad = bads[0]  # [B]
    if lives:
        draft_bad = (torch.cat(bads[1:], dim=1) & torch.cat(lives, dim=1)).any(dim=-1) | draft_bad
    tok = torch.cat([root, *(s.tokens for s in steps)], dim=1)  # [B, T]
    kind = torch.cat([start.kind.expand(B, 1), *(s.kinds for s in steps)], dim=1)
    weight = torch.cat([start.weight.expand(B, 1), *(s.weights for s in steps)], dim=1)
    score = torch.cat([start.score.expand(B, 1), *(s.scores for s in steps)], dim=1)
    laws = [(s.children.tokens.shape[0] // B, s.children) for s in steps]
    lvl = shape.levels
    T = tok.shape[1]
    dev = tok.device
    n = min(num_keep, T - 1) + 1
    # (-score, creation index) with the root first: every other score is <= 0 (weights <= 1) and the sort is stable
    best = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :n]  # [B, n]
    valid = score.gather(1, best) > float("-inf")
    slots = torch.sort(torch.where(valid, best, best + T), dim=-1).values.remainder(T)  # valid first, creation order
    node_ids, earlier, eye = _node_constants(n, dev)  # [n], [n, n] j < i, [n, n]
    live = node_ids < valid.sum(dim=-1, keepdim=True)  # [B, n]
    position = torch.full((B, T + 1), -1, dtype=torch.int64, device=dev).scatter(1, slots, node_ids.expand(B, n))
    parents = torch.where(live, position.gather(1, par.gather(1, slots)), -1)  # [B, n]; the root's column T: -1
    kinds = torch.where(live, kind.gather(1, slots), PAD)
    tokens = torch.where(live, tok.gather(1, slots), tok[:, :1])
    weights = torch.where(live, weight.gather(1, slots), 0.0)  # the root's weight is 1
    depths = torch.where(live, lvl[slots], 0)
    # dense ranks among kept siblings of one kind, in creation order (the kept nodes are a prefix of the slots)
    key = torch.add(kinds, parents, alpha=4)  # [B, n] (parent, kind), kinds in {-1, 0, 1, 2}
    draw_order = ((key.unsqueeze(1) == key.unsqueeze(2)) & earlier).sum(dim=-1) * live  # [B, n]
    # laws: the expansion row of each kept node, kept where one of its sampled children survived
    L = max(lv.law_ids.shape[-1] for _, lv in laws)
    if L > 0:
        all_ids = torch.cat([_padded(lv.law_ids.reshape(B, R, -1), L, -1) for R, lv in laws], dim=1)  # [B, E, L]
        all_probs = torch.cat([_padded(lv.law_probs.reshape(B, R, -1), L, 0.0) for R, lv in laws], dim=1)
        all_wor = torch.cat([lv.law_wor.reshape(B, R) for R, lv in laws], dim=1)  # [B, E]
        E = expanded.shape[1]
        row = torch.zeros(B, T, dtype=torch.int64, device=dev).scatter(
            1, expanded, torch.arange(E, device=dev).expand(B, E)
        ).gather(1, slots)  # [B, n] the expansion row of each kept node (0 where not expanded: no law)
        sampled_parent = torch.where(kinds == int(NodeKind.SAMPLED), parents, n)  # [B, n]; n: a discard column
        has_law = torch.zeros(B, n + 1, dtype=torch.bool, device=dev).scatter(1, sampled_parent, True)[:, :n]
        at = row.unsqueeze(-1).expand(B, n, L)
        law_ids = torch.where(has_law.unsqueeze(-1), all_ids.gather(1, at), -1)  # [B, n, L]
        law_probs = torch.where(has_law.unsqueeze(-1), all_probs.gather(1, at), 0.0)
        law_wor = has_law & all_wor.gather(1, row)
    else:  # no node has a sampled-slot law (EAGLE-2)
        law_ids = torch.empty(B, n, 0, dtype=torch.int64, device=dev)
        law_probs = torch.empty(B, n, 0, dtype=torch.float64, device=dev)
        law_wor = torch.zeros(B, n, dtype=torch.bool, device=dev)
    # ancestor mask by pointer doubling: after k rounds, every ancestor less than 2^k levels up
    # (up: the 2^k-th ancestor; the root and padding point to themselves)
    up = torch.where(parents >= 0, parents, node_ids).unsqueeze(-1).expand(B, n, n)
    anc = eye.expand(B, n, n)
    reach = 1
    while reach <= depth:  # the deepest node is depth levels below the root
        anc = anc | anc.gather(1, up)
        reach *= 2
        if reach <= depth:
            up = up.gather(1, up)
    return dict(
        tokens=tokens, parents=parents, depths=depths, kinds=kinds, draw_order=draw_order, weights=weights,
        num_nodes=live.sum(dim=-1), law_ids=law_ids, law_probs=law_probs, law_wor=law_wor, ancestors=anc,
        draft_bad=draft_bad,
    )


def _padded(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """``x`` ``[..., L]`` padded with ``value`` to ``[..., width]`` (``x`` itself where ``L == width``)."""
    return x if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value)
