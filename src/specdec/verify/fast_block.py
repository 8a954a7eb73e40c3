"""Block verification of a batch of chains as tensors: every row at once, no host read.

The torch reference is :class:`specdec.verify.traversal.BlockVerifier` (rule 8, the
walk from the deepest node up). This is the same rule in the form the engine's step
runs (:attr:`Verifier.path_rule <specdec.verify.base.Verifier.path_rule>`, the
``"tensor"`` path of :func:`specdec.engine.dispatch.choose_verification`). Words as in
docs/verifiers.md, rule 8: for the chain ``v_0 (root), v_1, ..., v_g`` with tokens
``x_i`` drawn from ``q_{i-1}``,

- weights ``w_0 = 1``, ``w_i = min(1, w_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))``
  (a loop over depths, each a ``[B]`` operation);
- residual masses ``rho_i = w_i - sum_x min(w_i p_i(x), q_i(x))`` (``= sum [w_i p_i - q_i]+``),
  read on the support of ``q_i`` only (``[B, D, L]``, never ``[B, D, V]``);
- stop probabilities ``h_i = rho_i / (rho_i + 1 - w_i)`` (``i < g``), ``h_g = w_g``;
- the deepest ``i >= 1`` whose uniform is below ``h_i`` is where the chain stops
  (``tau``; the root if none); the bonus is drawn from ``p_g`` if ``tau = g``, else from
  ``norm([w_tau p_tau - q_tau]+)``: one ``[B, V]`` row rebuilt.

Uniforms, as the walk draws them from a source that replays the table
(``tests/verify/test_verify_block_tensor.py``): node ``v_i``'s test uses ``u[b, v_i, 0]``;
the bonus uses ``u[b, v_tau, 1]`` (``u[b, 0, 0]`` at the root, which makes no test).
Cost per step: ``g`` small ``[B]`` operations for the weights, one gather of the chain's
``g + 1`` rows of ``p``, one ``[B, V]`` bonus row; no host read.
"""

from __future__ import annotations

import torch

from specdec.rng_sources import inverse_cdf_rows
from specdec.sampling import SamplingConfig, process_logits, row_is_bad
from specdec.tree import NodeKind
from specdec.tree_batch import TreeBatch
from specdec.verify.fast import TreeDecision

__all__ = ["chain_slots", "decide_block_batch", "decide_block_from_logits", "stop_probabilities"]

F64 = torch.float64


def chain_slots(tree: TreeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot of each depth's node in each row's chain.

    Args:
        tree: a batch of chains (every node has at most one child; the verifier's batch
            check refuses other trees before this runs).

    Returns:
        ``([B, D + 1] int64 slots, -1 past the row's depth; [B] int64 chain length g)``.
    """
    B, n = tree.tokens.shape
    D = tree.max_depth
    valid = (tree.kinds != -1) & (torch.arange(n, device=tree.device) < tree.num_nodes.view(B, 1))  # [B, n]
    valid &= (tree.kinds == int(NodeKind.SAMPLED)) | (tree.parents < 0)
    depth = torch.where(valid, tree.depths, D + 1)  # [B, n]; D + 1 = a discard column
    slots = torch.full((B, D + 2), -1, dtype=torch.int64, device=tree.device)
    slots.scatter_(1, depth, torch.arange(n, device=tree.device).expand(B, n))
    slots[:, 0] = 0
    g = torch.where(valid, tree.depths, 0).amax(dim=1)  # [B]
    return slots[:, : D + 1], g


def stop_probabilities(rho: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h = min(1, rho / (rho + 1 - w))`` elementwise (``w`` where ``rho + 1 - w = 0``, a branch of
    probability 0): :meth:`BlockVerifier.stop_probability <specdec.verify.traversal.BlockVerifier.stop_probability>`
    as a tensor.

    Args:
        rho: ``[...]`` float64 residual masses ``sum [w p - q]+``.
        w: ``[...]`` float64 sequence weights.
    """
    denominator = rho + (1.0 - w)
    return torch.where(denominator > 0, torch.clamp_max(rho / denominator.clamp_min(torch.finfo(F64).tiny), 1.0), w)


def decide_block_batch(tree: TreeBatch, p: torch.Tensor, u: torch.Tensor,
                       bad_rows: torch.Tensor | None = None) -> TreeDecision:
    """Rule 8 on every chain of ``tree`` (module docstring).

    Args:
        tree: ``B`` chains.
        p: ``[B, n, V]`` the target's processed laws at every node.
        u: ``[B, n, C + 1]`` float64 uniforms (``C = tree.max_children >= 1``).
        bad_rows: ``[B, n]`` bool rows whose logits were bad (NaN, +inf, all -inf); a row
            reading one of its chain's rows gets ``bad_visited``: the rows of the nodes of weight
            above 0 (the walk's; a node of weight 0 and the rows below it are never read).

    Returns:
        The :class:`~specdec.verify.fast.TreeDecision` of every row.
    """
    B, n, V = p.shape
    D = tree.max_depth
    dev = p.device
    slots, g = chain_slots(tree)  # [B, D + 1], [B]
    g = g.to(dev)
    slots = slots.to(dev)
    on_chain = slots >= 0  # [B, D + 1]
    safe = slots.clamp_min(0)
    rows = torch.arange(B, device=dev).view(B, 1)
    P = p[rows, safe].to(F64)  # [B, D + 1, V]
    P = P / P.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(F64).tiny)
    ids = tree.law_ids.to(dev)[rows, safe[:, :D]]  # [B, D, L] support of q_i (the law at v_i)
    q = tree.law_probs.to(dev)[rows, safe[:, :D]].to(F64)  # [B, D, L]
    support = ids >= 0
    Psupp = P[:, :D].gather(2, ids.clamp_min(0))  # [B, D, L]
    child_tokens = tree.tokens.to(dev)[rows, safe[:, 1:]]  # [B, D] x_{i+1}
    # q_i(x_{i+1}) and p_i(x_{i+1}): the child's token is on its parent's support
    at_x = (ids == child_tokens.unsqueeze(-1)) & support  # [B, D, L]
    q_x = (q * at_x).sum(-1)  # [B, D]
    p_x = P[:, :D].gather(2, child_tokens.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # [B, D]
    has_child = on_chain[:, 1:]  # [B, D]
    ratio = torch.where(has_child & (q_x > 0), p_x / q_x.clamp_min(torch.finfo(F64).tiny), 0.0)  # [B, D]
    weights = [torch.ones(B, dtype=F64, device=dev)]
    for i in range(D):  # w_{i+1} = min(1, w_i ratio_i): D small [B] operations
        weights.append(torch.clamp_max(weights[-1] * ratio[:, i], 1.0))
    w = torch.stack(weights, 1)  # [B, D + 1]
    overlap = torch.minimum(w[:, :D].unsqueeze(-1) * Psupp, q) * support  # [B, D, L]
    rho = (w[:, :D] - overlap.sum(-1)).clamp_min(0)  # [B, D] sum [w p - q]+
    h_inner = stop_probabilities(rho, w[:, :D])  # [B, D]
    depth = torch.arange(D + 1, device=dev).view(1, D + 1)
    h = torch.cat([h_inner, torch.zeros(B, 1, dtype=F64, device=dev)], 1)  # [B, D + 1]
    h = torch.where(depth == g.view(B, 1), w, h)
    u_test = u[rows, safe, 0].to(F64)  # [B, D + 1]
    accept = (u_test < h) & on_chain & (depth >= 1) & (depth <= g.view(B, 1))
    tau = torch.where(accept, depth, 0).amax(dim=1)  # [B] the deepest accepted node
    # the bonus law: p_g at the chain's end, else norm([w_tau p_tau - q_tau]+) (p_tau if it is empty)
    stop = slots.gather(1, tau.view(B, 1)).squeeze(1)  # [B]
    P_tau = P[torch.arange(B, device=dev), tau]  # [B, V]
    tau_in = tau.clamp_max(max(D - 1, 0))
    q_dense = torch.zeros(B, V, dtype=F64, device=dev)
    if D > 0:
        q_dense.scatter_add_(1, ids[torch.arange(B, device=dev), tau_in].clamp_min(0),
                             q[torch.arange(B, device=dev), tau_in] * support[torch.arange(B, device=dev), tau_in])
    w_tau = w.gather(1, tau.view(B, 1))  # [B, 1]
    R = torch.clamp_min(w_tau * P_tau - q_dense, 0)  # [B, V]
    rho_R = R.sum(-1, keepdim=True)
    residual = (tau < g).view(B, 1) & (rho_R > 0)
    law = torch.where(residual, R / rho_R.clamp_min(torch.finfo(F64).tiny), P_tau)
    u_bonus = u[torch.arange(B, device=dev), stop, torch.where(tau > 0, 1, 0)].to(F64)
    bonus = inverse_cdf_rows(law, u_bonus, torch.ones(B, dtype=torch.bool, device=dev))
    # outputs: accepted slots v_1 .. v_tau, tokens x_1 .. x_tau then the bonus
    taken = (depth[:, 1:] <= tau.view(B, 1))  # [B, D]
    accepted = torch.where(taken, slots[:, 1:], -1)
    tokens = torch.cat([torch.where(taken, child_tokens, -1), torch.full((B, 1), -1, dtype=torch.int64, device=dev)], 1)
    tokens = tokens.scatter(1, tau.view(B, 1), bonus.view(B, 1))
    attempted = torch.minimum(tau + 1, g)
    if bad_rows is None:
        bad = torch.zeros(B, dtype=torch.bool, device=dev)
    else:
        # the rows the rule reads: down to the first node of weight 0 (never accepted, nor anything below:
        # its row, all -inf under a grammar that refuses its token, is never used)
        bad = (bad_rows.to(dev)[rows, safe] & on_chain & (depth <= g.view(B, 1)) & (w > 0)).any(dim=1)
    return TreeDecision(accepted, tau, tokens, bonus, attempted, bad, stop)


def decide_block_from_logits(tree: TreeBatch, logits: torch.Tensor, u: torch.Tensor,
                             sampling: SamplingConfig) -> TreeDecision:
    """:func:`decide_block_batch` on the target's ``[B, n, V]`` logits, processed by ``sampling``
    (:func:`~specdec.sampling.process_logits`; bad rows flagged, never raised here)."""
    bad = row_is_bad(logits)
    p = process_logits(torch.where(bad.unsqueeze(-1), torch.zeros_like(logits), logits), sampling, check=False)
    return decide_block_batch(tree, p, u, bad)
