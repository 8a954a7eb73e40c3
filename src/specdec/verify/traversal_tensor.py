"""Traversal verification of a tree batch as tensors: every row at once, one host read per step.

The torch reference is :class:`specdec.verify.traversal.TraversalVerifier` (rule 7, the
post-order walk of the host tree). This is the same rule in the form the engine's step
runs (:attr:`Verifier.path_rule <specdec.verify.base.Verifier.path_rule>` with form
``"traversal"``, :mod:`specdec.verify.path_forms`). Words as in docs/verifiers.md, rule 7
(``w`` a node's sequence weight, ``P`` its residual, ``q'`` the law its sampled children
were drawn from).

The walk's outcome, read as a function of the uniforms:

- The weights and residuals the walk meets do not depend on the draws: a node's
  state after its first ``k`` children were rejected is a function of its entry
  weight, its row of ``p`` and the first ``k`` children's laws, and a child's entry
  weight ``min(1, w P(x) / q'(x))`` reads its parent's state at the child's draw
  position. So every node's entry weight and final weight (after all its children are
  rejected, the one its test uses) are computed top-down, one depth at a time (the
  nodes with children at that depth, every row at once), each depth's children one
  draw position at a time.
- A node *passes* when its uniform is below its final weight (``u[b, v, 0] < w``);
  the walk visits the nodes in post-order and stops at the first that passes, so a
  child's subtree is accepted into the path iff it holds a passing node and no earlier
  sibling's subtree does. The path is the chain of such children from the root; its
  deepest node ``t`` (the root when nothing passes) draws the bonus from its final
  residual with ``u[b, t, 1]`` (``u[b, 0, 0]`` at the root), as the walk does from a
  source that replays the table (``tests/verify/test_traversal_tensor.py``).

The residual is never made dense per node: it differs from ``p`` (up to its mass) only
on the support of ``q'`` (``L`` entries). With ``a0`` the normalised row there and ``q0``
the law, after rejections it is ``[a0 - C q0]+`` up to its mass ``Z`` (``C`` a cumulative
coefficient): a rejection at weight ``w`` adds ``Z / (m w)`` to ``C`` (``m`` the mass left
in ``q'``), which is ``[w P - q']+`` up to a factor, so ``rho = w Z' / Z`` and the new weight
``rho / (rho + 1 - w)``; each rejection costs one pass over the support (its mass, one
reduction), a child's weight only the entries at its token. Without replacement a token
leaves ``q'`` (its entry zeroed, ``m`` reduced) and its residual entry is frozen from then
on. A node of weight 0 (a token the target gives probability 0, such as one a grammar
refuses) is never accepted and its subtree is never entered: its row is not read, and a
bad row there is not flagged.

Cost per step: one host read (the widths of the depths: how many nodes with children each
depth has, and their most children, so that each depth's work covers those nodes only);
the rows of ``p`` of the nodes with children, processed once, all at once (from logits:
only there, and at the stop node), each read once over the vocabulary (its mass in float64,
the walk's normaliser) and once over its law's support; per depth, one pass over its nodes'
supports per child, everything else ``[B, W]`` work (``W`` the depth's width); the
``[B, n, n]`` ancestor tables for the path; one ``[B, V]`` bonus row, drawn by inverse CDF.
On a CPU the rows are read, processed and widened a block at a time that stays in the
core's cache (:data:`CACHE_BYTES`), and the large intermediates (``[B, M, L]``, the
``[B, M, V]`` token-to-column map; ``M`` the nodes with children) live in this thread's
reused buffers (:data:`specdec.verify.fast._WORKSPACE`, freed by
:func:`~specdec.verify.fast.release_workspace`): a new tensor of that size faults its pages
in at every step, which cost more than the work on it (``benchmarks/results/traversal_speed.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from specdec.rng_sources import inverse_cdf_rows
from specdec.sampling import SamplingConfig, greedy_law, law_is_bad, row_is_bad, temperature_scores
from specdec.tree import NodeKind
from specdec.tree_batch import PAD, TreeBatch
from specdec.verify.decision import TreeDecision
from specdec.verify.fast import _WORKSPACE, WORKSPACE_MAX_ENTRIES, WORKSPACE_MIN_ENTRIES, step_scores
from specdec.verify.fast_block import stop_probabilities

__all__ = ["decide_traversal_batch", "decide_traversal_from_logits", "traversal_weights"]

F64 = torch.float64


def _children(tree: TreeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``([B, n, C] child slots in draw order, -1 padded; [B, n] bool valid sampled children;
    [B, n] each node's cell parent * C + draw position, n * C for the others)``."""
    B, n = tree.tokens.shape
    C = tree.max_children
    nodes = torch.arange(n, device=tree.device)
    valid = (nodes < tree.num_nodes.view(B, 1)) & (tree.kinds != PAD)
    child = valid & (tree.parents >= 0) & (tree.kinds == int(NodeKind.SAMPLED)) & (tree.draw_order < C)
    cell = torch.where(child, tree.parents.clamp_min(0) * C + tree.draw_order, n * C)  # [B, n]
    table = torch.full((B, n * C + 1), -1, dtype=torch.int64, device=tree.device)
    table.scatter_(1, cell, nodes.expand(B, n))
    return table[:, : n * C].reshape(B, n, C), child, cell


class TraversalState(NamedTuple):
    """Every node's weights and final residual (:func:`traversal_weights`), ``[B, n]`` float64 unless said.

    The final residual of a node with children, on its law's support (``a0 = p`` normalised there,
    ``q0`` the law), is ``[a0 - C q0]+ / Z``, except at its children's tokens drawn without
    replacement, ``[a0 - C_k q0]+ / Z`` with ``C_k`` (``C_after[..., k]``) the coefficient after the
    ``k``-th child's rejection; off the support it is ``p / (total Z)``.
    """

    w_in: torch.Tensor  # the weight each node enters with (root 1, 0 for padding and unentered nodes)
    w_final: torch.Tensor  # the weight its test uses (after all its children were rejected)
    C: torch.Tensor  # the cumulative rejection coefficient
    Z: torch.Tensor  # the residual's mass in units of the normalised row (1 without rejections)
    C_after: torch.Tensor  # [B, n, C] the coefficient after each child's rejection
    q_children: torch.Tensor  # [B, n, C] q0 at each child's token, in draw order (0 off the support)


class _Levels(NamedTuple):
    """The nodes with children, depth by depth, side by side: depth ``d``'s at the columns
    ``spans[i] = (first, end, most children)`` of ``idx``."""

    idx: torch.Tensor  # [B, M] their node slots (a column past its depth's count in a tree: any slot, not ok)
    ok: torch.Tensor  # [B, M] bool a node with children (not a filler column)
    spans: list[tuple[int, int, int]]  # per depth that has such nodes


def _levels(tree: TreeBatch, parent_node: torch.Tensor, n_children: torch.Tensor) -> _Levels:
    """The nodes with children, depth by depth. The widths (how many such nodes each depth has in
    the widest tree, and their most children) are the step's one host read, so that each depth's
    work covers its own nodes only."""
    B, n = tree.tokens.shape
    D = max(tree.max_depth, 1)
    dev = tree.device
    nodes = torch.arange(n, device=dev)
    depth = tree.depths.clamp(0, D - 1)
    key = torch.where(parent_node, depth * n + nodes, D * n + nodes)
    order = torch.argsort(key, dim=1)  # [B, n] the nodes with children by depth, then slot
    count = torch.zeros(B, D, dtype=torch.int64, device=dev).scatter_add_(1, depth, parent_node.long())
    most = torch.zeros(B, D, dtype=torch.int64, device=dev).scatter_reduce_(
        1, depth, torch.where(parent_node, n_children, 0), "amax")
    start = count.cumsum(1) - count
    shape = torch.stack([count.amax(0), most.amax(0)], 1).tolist()  # the one host read: [D, 2]
    idx, ok, spans, at = [], [], [], 0
    for d, (W, K) in enumerate(shape):
        if W == 0 or K == 0:
            continue
        j = torch.arange(W, device=dev).view(1, W)
        ok.append(j < count[:, d : d + 1])
        idx.append(order.gather(1, (start[:, d : d + 1] + j).clamp_max(n - 1)))
        spans.append((at, at + W, K))
        at += W
    if not spans:
        empty = torch.zeros(B, 0, dtype=torch.int64, device=dev)
        return _Levels(empty, empty.bool(), [])
    return _Levels(torch.cat(idx, 1), torch.cat(ok, 1), spans)


def _buffer(slot: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised ``shape`` tensor: on a CPU, from ``slot`` of this thread's verification buffers
    (:data:`specdec.verify.fast._WORKSPACE`, within its size bounds; a new large tensor's pages fault
    in at every step, which on this project's CPU cost more than the work on them), else new."""
    numel = math.prod(shape)
    if device.type == "cpu" and WORKSPACE_MIN_ENTRIES <= numel <= WORKSPACE_MAX_ENTRIES:
        return _WORKSPACE.take(slot, torch.empty(shape, dtype=dtype, device="meta"))
    return torch.empty(shape, dtype=dtype, device=device)


def _take(x: torch.Tensor, idx: torch.Tensor, slot: str | None = None) -> torch.Tensor:
    """``x[b, idx[b, j]]`` for ``x`` ``[B, n, ...]`` and ``idx`` ``[B, W]``: ``[B, W, ...]``, a copy (one
    ``index_select`` of whole rows, faster than advanced indexing on a CPU), into :func:`_buffer`
    ``slot`` when given."""
    B, n = x.shape[:2]
    flat = (idx + torch.arange(B, device=idx.device).view(B, 1) * n).view(-1)
    rows = x.reshape(B * n, *x.shape[2:])
    if slot is None:
        return rows.index_select(0, flat).view(*idx.shape, *x.shape[2:])
    out = _buffer(slot, (flat.numel(), *x.shape[2:]), x.dtype, x.device)
    return torch.index_select(rows, 0, flat, out=out).view(*idx.shape, *x.shape[2:])


def traversal_weights(tree: TreeBatch, rows_of: Callable[[torch.Tensor], torch.Tensor]) -> TraversalState:
    """Every node's entry and final sequence weights and final residual (the module docstring's first point).

    Args:
        tree: ``B`` trees of sampled children.
        rows_of: ``[R]`` flat node slots (``b * n + i``) -> ``[R, V]`` the target's laws there, up to a
            positive factor per row (finite; a row that is NaN only spoils its own node's subtree, see
            :func:`decide_traversal_from_logits`); called for the nodes with children, a block of
            them at a time (:func:`_in_float64`).
    """
    table, _, _ = _children(tree)
    return _weights(tree, rows_of, table)


def _weights(tree: TreeBatch, rows_of: Callable[[torch.Tensor], torch.Tensor], table: torch.Tensor) -> TraversalState:
    """:func:`traversal_weights` with the children's table (:func:`_children`) given.

    The module docstring's words, counted in units of each row as ``rows_of`` gives it (``s = p``
    on the support, ``c = C total``, ``Y = Z total``) and normalised at the end. The rows are read
    once, every node with children (``M`` of them) a block at a time; each depth's nodes then cost one pass
    over their supports per draw position (:func:`_residual_mass`), the rest is ``[B, W]`` work.
    """
    B, n = tree.tokens.shape
    C = tree.max_children
    dev = tree.device
    tiny = torch.finfo(F64).tiny
    has = table >= 0  # [B, n, C]
    n_children = has.sum(-1)
    parent_node = n_children > 0
    levels = _levels(tree, parent_node, n_children)
    w_in = torch.zeros(B, n + 1, dtype=F64, device=dev)  # column n: a discard column
    w_in[:, 0] = 1.0
    # per node: w_final, C, Z, C_after [C], q_children [C] (column n: discarded)
    out = torch.zeros(B, n + 1, 3 + 2 * C, dtype=F64, device=dev)
    out[..., 2] = 1.0
    if levels.spans:
        idx, ok = levels.idx, levels.ok  # [B, M]
        M = idx.shape[1]
        ids1 = _take(tree.law_ids, idx, "traversal_ids").add_(1)  # [B, M, L] the supports, 1 + token (padding 0)
        L = ids1.shape[-1]
        kids = _take(table, idx)  # [B, M, C] the children, in draw order
        trying = (kids >= 0) & ok.unsqueeze(-1)
        tok1 = torch.where(trying, tree.tokens.gather(1, kids.clamp_min(0).view(B, M * C)).view(B, M, C) + 1, 0)
        flat = (idx + torch.arange(B, device=dev).view(B, 1) * n).view(-1)  # [B * M] the rows' flat slots
        total, S, s_x, on_support = _in_float64(rows_of, flat, ids1, tok1, tree.vocab_size)
        V = tree.vocab_size
        Q = _take(tree.law_probs, idx, "traversal_q").to(F64)  # [B, M, L] q' (0 on padding), zeroed as tokens leave
        off = (total - on_support).clamp_min_(0.0)  # [B, M] p's mass off the support
        total.clamp_min_(tiny)
        q_mass = Q.sum(dim=-1)  # [B, M]
        column = _buffer("traversal_column", (B, M, V + 1), torch.int32, dev)  # 1 + token -> its column of the support
        column.scatter_(2, ids1, torch.arange(L, dtype=torch.int32, device=dev).expand(B, M, L))
        pos = column.gather(2, tok1).long().clamp_(0, L - 1)  # [B, M, C] each child's column
        hit = trying & (ids1.gather(2, pos) == tok1)  # its token on the support
        q_x = torch.where(hit, Q.gather(2, pos), 0.0)  # [B, M, C] q0 there
        inv_q = torch.where(hit, 1.0 / q_x, 0.0)
        leave = hit & tree.law_wor.gather(1, idx).unsqueeze(-1)  # [B, M, C] the token leaves q' after its rejection
        kept_q = (~leave).to(F64)  # [B, M, C] 1 where q' keeps the token
        finals, afters = [], []
        for first, end, K in levels.spans:
            col, W = slice(first, end), end - first
            S_d, Q_d = S[:, col], Q[:, col]  # [B, W, L]
            scratch = _buffer("traversal_scratch", (B, W, L), F64, dev)
            tries, s_k, q_k, leaves, stays = (t[:, col, :K].unbind(-1) for t in (trying, s_x, q_x, leave, kept_q))
            at = pos[:, col, :K].unsqueeze(-1).unbind(-2)  # K x [B, W, 1]
            w = torch.where(ok[:, col], w_in.gather(1, idx[:, col]), 0.0)  # [B, W] the weight
            c = torch.zeros(B, W, dtype=F64, device=dev)  # the coefficient
            Y = total[:, col]  # the residual's mass
            m = torch.ones(B, W, dtype=F64, device=dev)  # q''s divisor: 1 until a token leaves
            mass = q_mass[:, col]
            base = off[:, col]  # the mass outside the pass: off the support, and the tokens that left q' (frozen)
            residuals, factors, coefs = [], [], []
            for k in range(K):
                residuals.append(torch.addcmul(s_k[k], c, q_k[k], value=-1.0).clamp_min_(0.0))  # the residual at x, times Y
                factors.append(w * m / Y)  # the child's weight is min(1, this * residual / q0)
                # the child (and its subtree) rejected: the residual [s - c q0]+ with c += Y / (m w)
                rejecting = tries[k] & (w > 0)
                c_next = c + Y / (m * w)  # (inf at w = 0: not rejecting, never kept)
                Y_next = _residual_mass(S_d, Q_d, c_next, scratch) + base
                w = torch.where(rejecting, stop_probabilities((w * Y_next / Y).clamp_min_(0.0), w), w)
                moved = rejecting & (Y_next > 0)  # rho = 0: the residual is kept (a branch of probability 0)
                c = torch.where(moved, c_next, c)
                Y = torch.where(moved, Y_next, Y)
                coefs.append(c)
                if k + 1 < K:  # without replacement: the token leaves q' before the next child, its entry frozen
                    base = base - torch.where(leaves[k], torch.minimum(s_k[k], c * q_k[k]), 0.0)  # s - [s - c q0]+
                    Q_d.scatter_(2, at[k], Q_d.gather(2, at[k]).mul_(stays[k].unsqueeze(-1)))
                    mass = mass - q_k[k] * (1.0 - stays[k])
                    m = torch.where(leaves[k], mass.clamp_min(tiny), m)
            child_w = torch.stack(factors, -1).mul_(torch.stack(residuals, -1)).mul_(inv_q[:, col, :K]).clamp_max_(1.0)
            into = torch.where(trying[:, col, :K], kids[:, col, :K], n).view(B, W * K)
            w_in.scatter_(1, into, torch.where(trying[:, col, :K], child_w, 0.0).view(B, W * K))
            finals.append(torch.stack([w, c, Y], -1))
            afters.append(torch.nn.functional.pad(torch.stack(coefs, -1), (0, C - K)))
        fin = torch.cat(finals, 1)  # [B, M, 3]
        fin[..., 1:] /= total.unsqueeze(-1)
        packed = torch.cat([fin, torch.cat(afters, 1) / total.unsqueeze(-1), q_x], -1)  # [B, M, 3 + 2C]
        target = torch.where(ok, idx, n).unsqueeze(-1).expand(B, M, 3 + 2 * C)  # (n: discarded)
        out.scatter_(1, target, packed)
    w_in = w_in[:, :n]
    w_final = torch.where(parent_node, out[:, :n, 0], w_in)
    return TraversalState(w_in, w_final, out[:, :n, 1], out[:, :n, 2], out[:, :n, 3 : 3 + C], out[:, :n, 3 + C :])


CACHE_BYTES = 1 << 20
"""On a CPU the rows are widened to float64 this many bytes at a time (they stay in the core's cache)."""


def _in_float64(rows_of: Callable[[torch.Tensor], torch.Tensor], flat: torch.Tensor, ids1: torch.Tensor,
                tok1: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(total [B, M], s [B, M, L], s_x [B, M, C], s's sum [B, M])`` of the rows ``rows_of(flat)``
    (``[B * M, V]``): each row's mass (in float64, the walk's normaliser), its entries at ``ids1 - 1``
    and ``tok1 - 1`` (0 where those are 0: padding) in float64, and their mass on the support
    (``s`` summed). On a CPU a block of rows at a time
    (:data:`CACHE_BYTES`), read, processed and widened while they stay in the core's cache."""
    B, M, L = ids1.shape
    C = tok1.shape[-1]
    R, dev = B * M, ids1.device
    step = max(1, CACHE_BYTES // (8 * (V + 1))) if dev.type == "cpu" else R
    ext = _buffer("traversal_rows", (min(step, R), V + 1), F64, dev)  # column 1 + x is token x, column 0 is 0
    ext[:, 0] = 0.0
    flat_ids, flat_tok = ids1.view(R, L), tok1.view(R, C)
    total = torch.empty(R, dtype=F64, device=dev)
    on_support = torch.empty(R, dtype=F64, device=dev)
    S = _buffer("traversal_s", (R, L), F64, dev)
    s_x = torch.empty(R, C, dtype=F64, device=dev)
    full, widened = ext, ext[:, 1:]
    for rows, ids_b, tok_b, total_b, on_b, S_b, s_b in zip(*(t.split(step) for t in (flat, flat_ids, flat_tok, total,
                                                                                          on_support, S, s_x))):
        block, wide = (full, widened) if rows.shape[0] == full.shape[0] else (ext[: rows.shape[0]], ext[: rows.shape[0], 1:])
        wide.copy_(rows_of(rows))
        torch.sum(wide, dim=-1, out=total_b)
        torch.sum(torch.gather(block, 1, ids_b, out=S_b), dim=-1, out=on_b)
        torch.gather(block, 1, tok_b, out=s_b)
    return total.view(B, M), S.view(B, M, L), s_x.view(B, M, C), on_support.view(B, M)


def _residual_mass(S: torch.Tensor, Q: torch.Tensor, c: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """``[B, W]`` ``sum [S - c Q]+`` over the support (``S``, ``Q`` ``[B, W, L]``, ``c`` ``[B, W]``;
    ``scratch`` a ``[B, W, L]`` float64 tensor it overwrites)."""
    return torch.addcmul(S, Q, c.unsqueeze(-1), value=-1.0, out=scratch).clamp_min_(0.0).sum(dim=-1)


def decide_traversal_batch(tree: TreeBatch, p: torch.Tensor, u: torch.Tensor,
                           bad_rows: torch.Tensor | None = None) -> TreeDecision:
    """Rule 7 on every tree of ``tree`` (module docstring).

    Args:
        tree: ``B`` trees of sampled children (drawn i.i.d. or without replacement).
        p: ``[B, n, V]`` the target's processed laws at every node (finite; a bad row's
            value is never used unless the row is flagged).
        u: ``[B, n, C + 1]`` float64 uniforms (``C = tree.max_children >= 1``).
        bad_rows: ``[B, n]`` bool rows whose logits were bad (NaN, +inf, all -inf); a row
            is flagged (``bad_visited``) when one of them is a row the walk reads: a node it
            enters (weight above 0, before it stops) that has children, or the stop node.

    Returns:
        The :class:`~specdec.verify.decision.TreeDecision` of every row.
    """
    B, n, V = p.shape
    flat = p.reshape(B * n, V)
    return _decide(tree, lambda rows: flat.index_select(0, rows), u, bad_rows)


def _decide(tree: TreeBatch, rows_of: Callable[[torch.Tensor], torch.Tensor], u: torch.Tensor,
            bad_rows: torch.Tensor | None) -> TreeDecision:
    """:func:`decide_traversal_batch` with the laws read through ``rows_of`` (``[R]`` flat slots ``b * n + i``
    -> ``[R, V]``)."""
    B, n = tree.tokens.shape
    C, D = tree.max_children, tree.max_depth
    dev = tree.device
    table, child, cell = _children(tree)
    state = _weights(tree, rows_of, table)
    has = table >= 0
    nodes = torch.arange(n, device=dev)
    anc = tree.ancestors  # [B, n, n]: [b, i, j] iff j is i or an ancestor of i
    passes = child & (u[..., 0].to(F64) < state.w_final)  # [B, n]
    hit = (anc & passes.unsqueeze(-1)).any(dim=1)  # [B, n] a passing node in the subtree
    hit_cells = hit.gather(1, table.clamp_min(0).view(B, n * C)).view(B, n, C) & has
    hit_before = (hit_cells.long().cumsum(-1) - hit_cells.long()) > 0  # an earlier sibling's subtree holds one
    blocked = hit_before.view(B, n * C).gather(1, cell.clamp_max(n * C - 1))
    off_path = child & ~(hit & ~blocked)
    on_path = child & ~(anc & off_path.unsqueeze(1)).any(dim=-1)  # [B, n] every ancestor-or-self is taken
    depth = tree.depths
    num = torch.where(on_path, depth, 0).amax(dim=1)  # [B]
    stop = torch.where(on_path & (depth == num.view(B, 1)), nodes, 0).amax(dim=1)  # [B] t (the root: 0)
    # the bonus: t's final residual (TraversalState), from t's row up to its factor (inverse_cdf_rows normalises)
    at_stop = stop.view(B, 1)
    row = rows_of(stop + torch.arange(B, device=dev) * n)  # [B, V]
    V = row.shape[-1]
    law = row.new_zeros((B, 1 + V), dtype=F64)  # [B, 1 + V]: column 1 + x is token x, column 0 what padding (-1) reads
    law[:, 1:] = row
    total = law.sum(dim=-1, keepdim=True)  # [B, 1]
    kids = table.gather(1, at_stop.unsqueeze(-1).expand(B, 1, C)).view(B, C)  # its children, in draw order
    tok1 = tree.tokens.gather(1, kids.clamp_min(0)) + 1
    s_tok = law.gather(1, tok1)  # [B, C]
    ids1 = _take(tree.law_ids, at_stop).view(B, -1) + 1  # [B, L] (padding: 0)
    q0 = _take(tree.law_probs, at_stop).view(B, -1).to(F64)  # [B, L] (0 on padding)
    law.scatter_(1, ids1, torch.addcmul(law.gather(1, ids1), q0, state.C.gather(1, at_stop) * total, value=-1.0).clamp_min_(0.0))
    # without replacement its children's tokens left q' one by one, each frozen after its own rejection
    left = (kids >= 0) & tree.law_wor.gather(1, at_stop)
    at_kids = at_stop.unsqueeze(-1).expand(B, 1, C)
    kept = torch.addcmul(s_tok, state.C_after.gather(1, at_kids).view(B, C) * total,
                         state.q_children.gather(1, at_kids).view(B, C), value=-1.0).clamp_min_(0.0)
    law.scatter_(1, torch.where(left, tok1, 0), kept)
    u_bonus = u[torch.arange(B, device=dev), stop, torch.where(stop > 0, 1, 0)].to(F64)
    # (a bad row, flagged, has no law: token 0)
    bonus = inverse_cdf_rows(law[:, 1:], u_bonus, torch.ones(B, dtype=torch.bool, device=dev)).clamp_min_(0)
    accepted = torch.full((B, D + 1), -1, dtype=torch.int64, device=dev)
    accepted.scatter_(1, torch.where(on_path, depth - 1, D), nodes.expand(B, n))  # off-path nodes to the discard column D
    accepted = accepted[:, :D]
    tokens = torch.cat([torch.where(accepted >= 0, tree.tokens.gather(1, accepted.clamp_min(0)), -1),
                        torch.full((B, 1), -1, dtype=torch.int64, device=dev)], 1)
    tokens = tokens.scatter(1, num.view(B, 1), bonus.view(B, 1))
    parent_node = has.any(dim=-1)  # [B, n]
    attempted = parent_node[:, 0].long() + (on_path & parent_node).sum(dim=1)
    if bad_rows is None:
        bad = torch.zeros(B, dtype=torch.bool, device=dev)
    else:
        bad = (bad_rows.to(dev) & _read_rows(tree, anc, child, stop, state.w_in, parent_node)).any(dim=1)
    return TreeDecision(accepted, num, tokens, bonus, attempted, bad, stop)


def _read_rows(tree: TreeBatch, anc: torch.Tensor, child: torch.Tensor, stop: torch.Tensor, w_in: torch.Tensor,
               parent_node: torch.Tensor) -> torch.Tensor:
    """``[B, n]`` the rows the walk reads: nodes it enters (weight above 0) before it stops at
    ``stop`` (in ``stop``'s subtree, an ancestor of it, or in an earlier sibling's subtree of one
    of them) that have children, and ``stop`` itself."""
    B, n = child.shape
    rows = torch.arange(B, device=child.device)
    same_parent = tree.parents.unsqueeze(-1) == tree.parents.unsqueeze(-2)  # [B, n, n]
    earlier = same_parent & (tree.draw_order.unsqueeze(-1) < tree.draw_order.unsqueeze(-2))
    sib_before = (earlier & child.unsqueeze(-1) & child.unsqueeze(-2)).to(F64)  # [a', a]: a' tried before a
    ancf = anc.to(F64)
    stop_chain = ancf[rows, stop]  # [B, n] ancestors-or-self of stop
    branches = torch.bmm(sib_before, stop_chain.unsqueeze(-1))  # [B, n, 1] a' before one of them
    before = torch.bmm(ancf, branches).squeeze(-1) > 0  # [B, n] in such an a''s subtree
    in_subtree = anc[rows, :, stop]  # [B, n] stop is an ancestor-or-self
    nodes = torch.arange(n, device=child.device)
    entered = (w_in > 0) & (before | (stop_chain > 0) | in_subtree)
    return entered & (parent_node | (nodes.view(1, n) == stop.view(B, 1)))


def decide_traversal_from_logits(tree: TreeBatch, logits: torch.Tensor, u: torch.Tensor,
                                 sampling: SamplingConfig) -> TreeDecision:
    """:func:`decide_traversal_batch` on the target's ``[B, n, V]`` logits, processed by ``sampling``
    (:func:`~specdec.sampling.process_logits`) at the rows the rule reads only: the nodes with
    children (all at once) and the stop node's; bad rows among them flagged, never raised here.

    A bad row (NaN, +inf, all -inf) is flagged from its law's first column at ``T > 0``
    (:func:`~specdec.sampling.law_is_bad`, no pass over the vocabulary; one-hot rows at ``T = 0``:
    :func:`~specdec.sampling.row_is_bad`) and left as it is (NaN; a bad stop row draws its bonus
    uniformly): NaN spoils only its own node's weights and its subtree's, which the walk reads
    only after reading that row (flagged), or never."""
    B, n, V = logits.shape
    flat = logits.reshape(B * n, V)
    bad = torch.zeros(B * n, dtype=torch.bool, device=logits.device)

    def rows_of(rows: torch.Tensor) -> torch.Tensor:
        x = flat.index_select(0, rows)  # [R, V] (a copy)
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        if sampling.greedy:  # one-hot rows are never NaN
            flags = row_is_bad(x)
            p = greedy_law(x, out=x)
        else:  # process_logits' ops (the same bits), in place
            scores, temperature = step_scores(x, sampling)  # [R, V]: x itself, or the warped scores at T = 1
            p = torch.softmax(temperature_scores(scores, temperature, out=scores), dim=-1)
            flags = law_is_bad(p)
        bad.scatter_(0, rows, flags)
        return p

    return _decide(tree, rows_of, u, bad.view(B, n))
