"""Traversal verification of a tree batch as tensors: every row at once, no host read.

The torch reference is :class:`specdec.verify.traversal.TraversalVerifier` (rule 7, the
post-order walk of the host tree). This is the same rule in the form the engine's step
runs (:attr:`Verifier.path_rule <specdec.verify.base.Verifier.path_rule>` with form
``"traversal"``). Words as in docs/verifiers.md, rule 7 (``w`` a node's sequence weight,
``P`` its residual, ``q'`` the law its sampled children were drawn from).

The walk's outcome, read as a function of the uniforms:

- The weights and residuals the walk meets do not depend on the draws: a node's
  state after its first ``k`` children were rejected is a function of its entry
  weight, its row of ``p`` and the first ``k`` children's laws, and a child's entry
  weight ``min(1, w P(x) / q'(x))`` reads its parent's state at the child's draw
  position. So every node's entry weight and final weight (after all its children are
  rejected, the one its test uses) are computed top-down, one depth at a time, each
  depth's children one draw position at a time, for every node of every row at once.
- A node *passes* when its uniform is below its final weight (``u[b, v, 0] < w``);
  the walk visits the nodes in post-order and stops at the first that passes, so a
  child's subtree is accepted into the path iff it holds a passing node and no earlier
  sibling's subtree does. The path is the chain of such children from the root; its
  deepest node ``t`` (the root when nothing passes) draws the bonus from its final
  residual with ``u[b, t, 1]`` (``u[b, 0, 0]`` at the root), as the walk does from a
  source that replays the table (``tests/verify/test_traversal_tensor.py``).

The residual is never made dense per node: it differs from ``p`` (up to its mass) only
on the support of ``q'`` (``L`` entries), where it is kept unnormalised as ``A``, its
mass ``Z = sum(A) + p(off the support)``. A rejection at weight ``w`` with the child's
law ``q'`` is ``A <- [A - (Z / w) q']+`` (``[w P - q']+`` up to the factor ``w / Z``), so
``rho = w Z' / Z`` and the new weight ``rho / (rho + 1 - w)``; without replacement the
token's entry of ``q'`` is zeroed and its mass subtracted. A node of weight 0 (a token
the target gives probability 0, such as one a grammar refuses) is never accepted and
its subtree is never entered: its row is not read, and a bad row there is not flagged.

Cost per step: ``D * S`` rounds (``D`` the depth bound, ``S`` the most sampled children
of a node) of a few ``[B, n, L]`` operations, the ``[B, n, n]`` ancestor tables for the
path, and one ``[B, V]`` bonus row; no host read.
"""

from __future__ import annotations

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


def traversal_weights(tree: TreeBatch, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every node's entry and final sequence weights and final residual (the module docstring's first point).

    Args:
        tree: ``B`` trees of sampled children.
        p: ``[B, n, V]`` the target's laws at every node, up to a positive factor per row (finite).

    Returns:
        ``(w_in [B, n], w_final [B, n], A [B, n, L], Z [B, n])`` float64: the weight each node
        enters with (root 1; 0 for padding), the weight its test uses, and its final residual
        ``A / Z`` on the support of its law (``p(x) / (total Z)`` off it, ``total`` the row's sum).
    """
    B, n, V = p.shape
    C, D = tree.max_children, tree.max_depth
    S = min(C if tree.max_sampled is None else tree.max_sampled, C)
    dev = p.device
    tiny = torch.finfo(F64).tiny
    table, child, cell = _children(tree)
    has = table >= 0  # [B, n, C]
    tok = tree.tokens.gather(1, table.clamp_min(0).view(B, n * C)).view(B, n, C)
    ids = tree.law_ids
    on = ids >= 0  # [B, n, L]
    safe_ids = ids.clamp_min(0)
    total = p.sum(dim=-1, dtype=F64).clamp_min(tiny)  # [B, n]
    A = torch.where(on, p.gather(2, safe_ids).to(F64) / total.unsqueeze(-1), 0.0)  # [B, n, L] p normalised on q's support
    support = torch.zeros(B, n, V + 1, dtype=torch.bool, device=dev)
    support.scatter_(2, torch.where(on, ids, V), True)  # padding to the discard column V
    off = torch.where(support[..., :V], 0.0, p).sum(dim=-1, dtype=F64) / total  # [B, n] p's mass off the support
    Z = A.sum(dim=-1) + off  # [B, n] the residual's mass (1 up to rounding until a rejection)
    q = torch.where(on, tree.law_probs.to(F64), 0.0)  # [B, n, L] q', rows zeroed as tokens leave (without replacement)
    mass = q.sum(dim=-1)  # [B, n] what remains of q' (its divisor after a removal)
    pos = torch.stack([(ids == tok[..., k : k + 1]).long().argmax(dim=-1) for k in range(S)], -1) if S else \
        torch.zeros(B, n, 0, dtype=torch.int64, device=dev)  # [B, n, S] each child's column of the support
    wor = tree.law_wor
    depth = tree.depths
    w_in = torch.zeros(B, n, dtype=F64, device=dev)
    w_in[:, 0] = 1.0
    w_final = w_in.clone()
    parent_node = has.any(dim=-1)  # [B, n]
    for d in range(D):
        level = parent_node & (depth == d)  # [B, n] the nodes deciding their children now
        w = torch.where(level, w_in, 0.0)
        m = torch.ones(B, n, dtype=F64, device=dev)  # q''s divisor: 1 until a token is removed
        child_w = torch.zeros(B, n, C, dtype=F64, device=dev)
        for k in range(S):
            active = level & has[..., k]  # [B, n]
            at = pos[..., k : k + 1]  # [B, n, 1]
            q_raw = q.gather(2, at).squeeze(-1)  # [B, n]
            P_x = A.gather(2, at).squeeze(-1) / Z.clamp_min(tiny)
            q_x = q_raw / m
            ratio = torch.where(q_x > 0, P_x / q_x.clamp_min(tiny), 0.0)
            child_w[..., k] = torch.where(active, torch.clamp_max(w * ratio, 1.0), 0.0)
            # the child (and its subtree) rejected: A <- [A - (Z / (m w)) q]+, nodes not rejecting untouched
            rejecting = active & (w > 0)
            coef = torch.where(rejecting, Z / (m * w).clamp_min(tiny), 0.0)
            R = torch.addcmul(A, q, coef.unsqueeze(-1), value=-1.0).clamp_min_(0.0)
            Z_next = R.sum(dim=-1) + off
            empty = rejecting & ~(Z_next > 0)  # rho = 0: the residual is kept (a branch of probability 0)
            rho = w * Z_next / Z.clamp_min(tiny)
            w = torch.where(rejecting, stop_probabilities(rho, w), w)
            A = torch.where(empty.unsqueeze(-1), A, R)
            Z = torch.where(rejecting & ~empty, Z_next, Z)
            leave = active & wor  # without replacement: the token leaves q' before the next child
            q = q.scatter(2, at, torch.where(leave, 0.0, q_raw).unsqueeze(-1))
            mass = torch.where(leave, mass - q_raw, mass)
            m = torch.where(leave, mass.clamp_min(tiny), m)
        w_final = torch.where(level, w, w_final)
        entering = child & (depth == d + 1)
        w_in = torch.where(entering, child_w.view(B, n * C).gather(1, cell.clamp_max(n * C - 1)), w_in)
    w_final = torch.where(parent_node, w_final, w_in)
    return w_in, w_final, A, Z


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
    C, D = tree.max_children, tree.max_depth
    dev = p.device
    w_in, w_final, A, Z = traversal_weights(tree, p)
    table, child, cell = _children(tree)
    has = table >= 0
    nodes = torch.arange(n, device=dev)
    anc = tree.ancestors  # [B, n, n]: [b, i, j] iff j is i or an ancestor of i
    passes = child & (u[..., 0].to(F64) < w_final)  # [B, n]
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
    # the bonus: t's final residual, A / Z on its law's support and p / (total Z) off it
    row = p[rows, stop].to(F64)  # [B, V]
    row = row / row.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(F64).tiny)
    ids_t, A_t, Z_t = tree.law_ids[rows, stop], A[rows, stop], Z[rows, stop].unsqueeze(-1)
    delta = torch.where(ids_t >= 0, A_t - row.gather(1, ids_t.clamp_min(0)), 0.0)
    law = row.scatter_add(1, ids_t.clamp_min(0), delta) / Z_t.clamp_min(torch.finfo(F64).tiny)
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
        bad = (bad_rows.to(dev) & _read_rows(tree, anc, child, stop, w_in, parent_node)).any(dim=1)
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
    (:func:`~specdec.sampling.process_logits`; bad rows flagged, never raised here)."""
    bad = row_is_bad(logits)
    p = process_logits(torch.where(bad.unsqueeze(-1), torch.zeros_like(logits), logits), sampling, check=False)
    return decide_traversal_batch(tree, p, u, bad)
