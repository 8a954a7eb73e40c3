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
``rho / (rho + 1 - w)``; each rejection costs one pass over the support. Without replacement
a token leaves ``q'`` (its entry zeroed, ``m`` reduced) and its residual entry is frozen
from then on. A node of weight 0 (a token the target gives probability 0, such as one a
grammar refuses) is never accepted and its subtree is never entered: its row is not read,
and a bad row there is not flagged.

Cost per step: one host read (the widths of the depths: how many nodes with children each
depth has, and their most children, so that each depth's work covers those nodes only);
per depth, its nodes' rows of ``p`` (from logits: processed only there, and at the stop
node) and one pass over their laws' supports per child; the ``[B, n, n]`` ancestor tables
for the path; one ``[B, V]`` bonus row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from specdec.rng_sources import inverse_cdf_rows
from specdec.sampling import SamplingConfig, process_logits, row_is_bad
from specdec.tree import NodeKind
from specdec.tree_batch import PAD, TreeBatch
from specdec.verify.decision import TreeDecision
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


def _levels(tree: TreeBatch, parent_node: torch.Tensor, n_children: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                             torch.Tensor, list[list[int]]]:
    """The nodes with children, depth by depth: ``(order [B, n] their slots sorted by depth then slot,
    start [B, D] where each depth begins in it, count [B, D], [[width, most children] per depth])``.
    The widths are the step's one host read (so that each depth's work covers its own nodes only)."""
    B, n = tree.tokens.shape
    D = max(tree.max_depth, 1)
    nodes = torch.arange(n, device=tree.device)
    depth = tree.depths.clamp(0, D - 1)
    key = torch.where(parent_node, depth * n + nodes, D * n + nodes)
    order = torch.argsort(key, dim=1)
    count = torch.zeros(B, D, dtype=torch.int64, device=tree.device).scatter_add_(1, depth, parent_node.long())
    most = torch.zeros(B, D, dtype=torch.int64, device=tree.device).scatter_reduce_(
        1, depth, torch.where(parent_node, n_children, 0), "amax")
    start = count.cumsum(1) - count
    shape = torch.stack([count.amax(0), most.amax(0)], 1).tolist()  # the one host read: [D, 2]
    return order, start, count, shape


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[b, idx[b, j]]`` for ``x`` ``[B, n, ...]`` and ``idx`` ``[B, W]``: ``[B, W, ...]``, a copy (one
    ``index_select`` of whole rows, faster than advanced indexing on a CPU)."""
    B, n = x.shape[:2]
    flat = (idx + torch.arange(B, device=idx.device).view(B, 1) * n).view(-1)
    return x.reshape(B * n, *x.shape[2:]).index_select(0, flat).view(*idx.shape, *x.shape[2:])


def traversal_weights(tree: TreeBatch, rows_of: Callable[[torch.Tensor], torch.Tensor]) -> TraversalState:
    """Every node's entry and final sequence weights and final residual (the module docstring's first point).

    Args:
        tree: ``B`` trees of sampled children.
        rows_of: ``idx [B, W]`` node slots -> ``[B, W, V]`` the target's laws there, up to a positive
            factor per row (finite); called once per depth, for the nodes with children at that depth.
    """
    B, n = tree.tokens.shape
    C, D = tree.max_children, tree.max_depth
    dev = tree.device
    tiny = torch.finfo(F64).tiny
    table, child, cell = _children(tree)
    has = table >= 0  # [B, n, C]
    n_children = has.sum(-1)
    parent_node = n_children > 0
    order, start, count, shape = _levels(tree, parent_node, n_children)
    b_rows = torch.arange(B, device=dev).view(B, 1)
    w_in = torch.zeros(B, n + 1, dtype=F64, device=dev)  # column n: a discard column
    w_in[:, 0] = 1.0
    w_final = torch.zeros(B, n + 1, dtype=F64, device=dev)
    C_fin = torch.zeros(B, n + 1, dtype=F64, device=dev)
    Z_fin = torch.ones(B, n + 1, dtype=F64, device=dev)
    C_after = torch.zeros(B, n + 1, C, dtype=F64, device=dev)
    for d in range(min(D, len(shape))):
        W, K = shape[d]
        if W == 0 or K == 0:
            continue
        j = torch.arange(W, device=dev).view(1, W)
        ok = j < count[:, d : d + 1]  # [B, W]
        idx = order.gather(1, (start[:, d : d + 1] + j).clamp_max(n - 1))  # [B, W] the depth's nodes with children
        target = torch.where(ok, idx, n)  # where results go (n: discarded)
        p = rows_of(idx)  # [B, W, V]
        V = p.shape[-1]
        ids = _take(tree.law_ids, idx)  # [B, W, L]
        on = ids >= 0
        cols = torch.where(on, ids, V)  # padding to the discard column V
        total = p.sum(dim=-1, dtype=F64).clamp_min(tiny)  # [B, W]
        a0 = p.gather(2, ids.clamp_min(0)).to(F64).div_(total.unsqueeze(-1)).masked_fill_(~on, 0.0)  # p normalised on q's support
        off = (1.0 - a0.sum(dim=-1)).clamp_min(0.0)  # [B, W] p's mass off the support
        q = _take(tree.law_probs, idx).to(F64)  # [B, W, L] q' (0 on padding; a copy), zeroed as tokens leave
        column = torch.empty((B, W, V + 1), dtype=torch.int32, device=dev)  # token -> its column of the support
        column.scatter_(2, cols, torch.arange(ids.shape[-1], dtype=torch.int32, device=dev).expand_as(ids))
        kids = table[b_rows, idx][..., :K]  # [B, W, K]
        kid_on = kids >= 0
        tok = tree.tokens.gather(1, kids.clamp_min(0).view(B, W * K)).view(B, W, K)
        hit = ids.gather(2, column.gather(2, tok).long().clamp(0, ids.shape[-1] - 1)) == tok  # on the support
        pos = torch.where(hit, column.gather(2, tok).long(), 0).clamp(0, ids.shape[-1] - 1)  # [B, W, K] each child's column
        a0_x, q0_x = a0.gather(2, pos), q.gather(2, pos)  # [B, W, K]
        wor = tree.law_wor[b_rows, idx]  # [B, W]
        w = torch.where(ok, w_in[b_rows, idx], 0.0)
        coef = torch.zeros(B, W, dtype=F64, device=dev)
        Z = a0.sum(dim=-1) + off
        m = torch.ones(B, W, dtype=F64, device=dev)  # q''s divisor: 1 until a token leaves
        mass = q.sum(dim=-1)
        gone_a0 = torch.zeros(B, W, dtype=F64, device=dev)  # sum of a0 over the tokens that left q'
        gone_kept = torch.zeros(B, W, dtype=F64, device=dev)  # their residual entries, frozen when they left
        child_w = torch.zeros(B, W, K, dtype=F64, device=dev)
        after = torch.zeros(B, W, K, dtype=F64, device=dev)
        for k in range(K):
            trying = ok & kid_on[..., k]
            P_x = torch.clamp_min(a0_x[..., k] - coef * q0_x[..., k], 0.0) / Z.clamp_min(tiny)
            q_x = q0_x[..., k] / m
            ratio = torch.where(q_x > 0, P_x / q_x.clamp_min(tiny), 0.0)
            child_w[..., k] = torch.where(trying, torch.clamp_max(w * ratio, 1.0), 0.0)
            # the child (and its subtree) rejected: the residual [a0 - C q0]+ with C += Z / (m w)
            rejecting = trying & (w > 0)
            coef_next = coef + torch.where(rejecting, Z / (m * w).clamp_min(tiny), 0.0)
            F = torch.addcmul(a0, q, coef_next.unsqueeze(-1), value=-1.0).clamp_min_(0.0).sum(dim=-1)
            Z_next = F - gone_a0 + gone_kept + off
            moved = rejecting & (Z_next > 0)  # rho = 0: the residual is kept (a branch of probability 0)
            rho = w * Z_next / Z.clamp_min(tiny)
            w = torch.where(rejecting, stop_probabilities(rho.clamp_min(0.0), w), w)
            coef = torch.where(moved, coef_next, coef)
            Z = torch.where(moved, Z_next, Z)
            after[..., k] = coef
            leave = trying & wor  # without replacement: the token leaves q' before the next child
            kept = torch.clamp_min(a0_x[..., k] - coef * q0_x[..., k], 0.0)
            gone_a0 = gone_a0 + torch.where(leave, a0_x[..., k], 0.0)
            gone_kept = gone_kept + torch.where(leave, kept, 0.0)
            q.scatter_(2, pos[..., k : k + 1], torch.where(leave, 0.0, q0_x[..., k]).unsqueeze(-1))
            mass = torch.where(leave, mass - q0_x[..., k], mass)
            m = torch.where(leave, mass.clamp_min(tiny), m)
        w_final.scatter_(1, target, w)
        C_fin.scatter_(1, target, coef)
        Z_fin.scatter_(1, target, Z)
        C_after[:, :, :K].scatter_(1, target.unsqueeze(-1).expand(B, W, K), after)
        into = torch.where(kid_on & ok.unsqueeze(-1), kids, n).view(B, W * K)
        w_in.scatter_(1, into, child_w.view(B, W * K))
    w_in, w_final = w_in[:, :n], w_final[:, :n]
    w_final = torch.where(parent_node, w_final, w_in)
    return TraversalState(w_in, w_final, C_fin[:, :n], Z_fin[:, :n], C_after[:, :n])


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
    return _decide(tree, lambda idx: _take(p, idx), u, bad_rows)


def _decide(tree: TreeBatch, rows_of: Callable[[torch.Tensor], torch.Tensor], u: torch.Tensor,
            bad_rows: torch.Tensor | None) -> TreeDecision:
    """:func:`decide_traversal_batch` with the laws read through ``rows_of`` (``idx [B, W]`` -> ``[B, W, V]``)."""
    B, n = tree.tokens.shape
    C, D = tree.max_children, tree.max_depth
    dev = tree.device
    tiny = torch.finfo(F64).tiny
    state = traversal_weights(tree, rows_of)
    table, child, cell = _children(tree)
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
    rows = torch.arange(B, device=dev)
    # the bonus: t's final residual (TraversalState), from t's row
    row = rows_of(stop.view(B, 1)).squeeze(1).to(F64)  # [B, V]
    V = row.shape[-1]
    row = row / row.sum(dim=-1, keepdim=True).clamp_min(tiny)
    ids = tree.law_ids[rows, stop]  # [B, L]
    on = ids >= 0
    q0 = torch.where(on, tree.law_probs[rows, stop].to(F64), 0.0)
    a0 = torch.where(on, row.gather(1, ids.clamp_min(0)), 0.0)
    coef = state.C[rows, stop].unsqueeze(-1)
    law = torch.cat([row, row.new_zeros(B, 1)], 1)  # [B, V + 1]: column V discards
    law.scatter_(1, torch.where(on, ids, V), torch.clamp_min(a0 - coef * q0, 0.0))
    kids = table[rows, stop]  # [B, C] its children: their tokens left q' one by one (without replacement)
    tok = tree.tokens.gather(1, kids.clamp_min(0))
    left = (kids >= 0) & tree.law_wor[rows, stop].view(B, 1)
    at = (ids.unsqueeze(1) == tok.unsqueeze(-1)) & on.unsqueeze(1)  # [B, C, L]
    a_tok = (at * a0.unsqueeze(1)).sum(-1)
    q_tok = (at * q0.unsqueeze(1)).sum(-1)
    law.scatter_(1, torch.where(left, tok, V), torch.clamp_min(a_tok - state.C_after[rows, stop] * q_tok, 0.0))
    law = law[:, :V] / state.Z[rows, stop].clamp_min(tiny).unsqueeze(-1)
    u_bonus = u[rows, stop, torch.where(stop > 0, 1, 0)].to(F64)
    bonus = inverse_cdf_rows(law, u_bonus, torch.ones(B, dtype=torch.bool, device=dev))
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
    children, depth by depth, and the stop node's; bad rows among them flagged, never raised here."""
    B, n, V = logits.shape
    bad = torch.zeros(B, n + 1, dtype=torch.bool, device=logits.device)  # column n: discarded

    def rows_of(idx: torch.Tensor) -> torch.Tensor:
        x = _take(logits, idx)  # [B, W, V]
        flags = row_is_bad(x)
        bad.scatter_(1, idx, flags)
        return process_logits(x.masked_fill_(flags.unsqueeze(-1), 0.0), sampling, check=False)  # x: a copy

    return _decide(tree, rows_of, u, bad[:, :n])
