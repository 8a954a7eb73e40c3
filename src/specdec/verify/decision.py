"""The verification's decision and the tree tables every decision form shares (docs/verifiers.md).

:class:`TreeDecision` is what the step's verification returns (device tensors, read with one
copy); :func:`children_table` lists each node's children in the order the rules test them;
:func:`reached_path` turns each node's accepted child into the accepted path. Used by the
general decision (:mod:`specdec.verify.fast`) and the greedy one (:mod:`specdec.verify.greedy_decision`).
"""

from __future__ import annotations

import attrs
import torch

from specdec._constants import device_constant
from specdec.tree import NodeKind
from specdec.tree_batch import TreeBatch
from specdec.verify.base import FusedRule

__all__ = ["TreeDecision", "child_tokens", "children_table", "emitted_tokens", "pack_decision", "reached_path"]


@attrs.frozen(eq=False)
class TreeDecision:
    """What verification decided, as device tensors (read with one copy).

    Attributes:
        accepted: ``[B, D]`` int64 accepted node slots, root's child first, ``-1`` padded.
        num_accepted: ``[B]`` int64.
        tokens: ``[B, D + 1]`` int64 emitted tokens (accepted tokens then the bonus, ``-1`` padded).
        bonus: ``[B]`` int64 the bonus token.
        attempted: ``[B]`` int64 depths at which a draft token was tested.
        bad_visited: ``[B]`` bool: a visited row's logits were NaN, +inf or all -inf.
        stop: ``[B]`` int64 the node where the bonus was drawn.
    """

    accepted: torch.Tensor
    num_accepted: torch.Tensor
    tokens: torch.Tensor
    bonus: torch.Tensor
    attempted: torch.Tensor
    bad_visited: torch.Tensor
    stop: torch.Tensor

    def packed(self) -> torch.Tensor:
        """``[B, 2D + 5]`` int64: ``num_accepted, bonus, attempted, bad, stop, accepted[D], tokens[D + 1]``,
        the step's single device-to-host read (:func:`pack_decision`)."""
        return pack_decision(self.accepted, self.num_accepted, self.tokens, self.bonus, self.attempted,
                             self.bad_visited, self.stop)


def pack_decision(accepted: torch.Tensor, num_accepted: torch.Tensor, tokens: torch.Tensor, bonus: torch.Tensor,
                  attempted: torch.Tensor, bad_visited: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
    """A decision's fields (:class:`TreeDecision`'s order) in one ``[B, 2D + 5]`` int64 tensor:
    ``num_accepted, bonus, attempted, bad, stop, accepted[D], tokens[D + 1]``; a plain function of
    tensors, so a fixed-shape graph packs its decision the same way (:mod:`specdec.engine.fixed_step`)."""
    return torch.cat(
        [torch.stack([num_accepted, bonus, attempted, bad_visited.long(), stop], -1), accepted, tokens], dim=-1)


def children_table(tree: TreeBatch, rule: FusedRule) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, n, C]`` child slots of every node in test order (``-1`` padded) and ``[B, n]`` sampled-children counts."""
    B, n = tree.tokens.shape
    C = tree.max_children
    sampled = tree.kinds == int(NodeKind.SAMPLED)  # [B, n]
    is_child = (tree.kinds == int(NodeKind.DETERMINISTIC)) | sampled
    parent = tree.parents.clamp_min(0)
    n_sampled = torch.zeros(B, n, dtype=torch.int64, device=tree.device).scatter_add_(1, parent, sampled.long())
    # test order: sampled children by draw order first, then deterministic ones by rank
    slot = torch.where(sampled, tree.draw_order, n_sampled.gather(1, parent) + tree.draw_order)  # [B, n]
    flat = torch.where(is_child & (slot < C), parent * C + slot, n * C)  # [B, n]; n * C = a discard column
    table = torch.full((B, n * C + 1), -1, dtype=torch.int64, device=tree.device)
    table.scatter_(1, flat, _arange(n, tree.device).expand(B, n))
    return table[:, : n * C].reshape(B, n, C), n_sampled



@device_constant(64)
def _arange(n: int, device: torch.device) -> torch.Tensor:
    """``[n]`` int64 ``0 .. n - 1``, once per size and device (never written to)."""
    return torch.arange(n, device=device)


@device_constant(64)
def _is_first(n: int, device: torch.device) -> torch.Tensor:
    """``[n]`` bool, True at 0 only (the root), once per size and device (never written to)."""
    return torch.arange(n, device=device) == 0


def reached_path(tree: TreeBatch, child: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The accepted path from each node's accepted child, for all nodes at once.

    Node ``j`` is reached when every node on its path from the root (itself included) is its
    parent's accepted child (:attr:`TreeBatch.ancestors`).

    Args:
        tree: ``B`` trees of ``n`` node slots.
        child: ``[B, n]`` int64 each node's accepted child slot, ``-1`` for none.

    Returns:
        ``reached`` ``[B, n]`` bool, ``accepted`` ``[B, D]`` (one reached node per depth below
        the root, ``-1`` padded), ``num_accepted`` ``[B]`` and ``node`` ``[B]`` (the deepest
        reached node: where the bonus is drawn).
    """
    B, n = child.shape
    D = tree.max_depth
    dev = child.device
    node_ids = _arange(n, dev)  # [n]
    picked = (child.gather(1, tree.parents.clamp_min(0)) == node_ids) | _is_first(n, dev)  # [B, n]; the root counts
    reached = ~(tree.ancestors & ~picked.unsqueeze(1)).any(dim=-1)  # [B, n]
    depth_at = torch.where(reached, tree.depths, D + 1)  # [B, n]; D + 1: a discard column
    by_depth = torch.full((B, D + 2), -1, dtype=torch.int64, device=dev).scatter_(1, depth_at, node_ids.expand(B, n))
    accepted = by_depth[:, 1 : D + 1]  # [B, D]
    num_accepted = reached.sum(dim=-1) - 1  # [B]
    node = torch.where(reached, tree.depths, -1).argmax(dim=-1)  # [B]
    return reached, accepted, num_accepted, node


def child_tokens(tree: TreeBatch, table: torch.Tensor, has: torch.Tensor) -> torch.Tensor:
    """``[B, n, C]`` the tokens of :func:`children_table`'s child slots, ``-1`` where ``has``
    (``table >= 0``, which the callers hold already) is False."""
    B, n, C = table.shape
    return torch.where(has, tree.tokens.gather(1, table.clamp_min(0).reshape(B, -1)).reshape(B, n, C), -1)


def emitted_tokens(tree: TreeBatch, accepted: torch.Tensor, num_accepted: torch.Tensor,
                   bonus: torch.Tensor) -> torch.Tensor:
    """``[B, D + 1]`` the accepted nodes' tokens, then the bonus, ``-1`` padded."""
    path_tok = torch.where(accepted >= 0, tree.tokens.gather(1, accepted.clamp_min(0)), -1)  # [B, D]
    tokens = torch.nn.functional.pad(path_tok, (0, 1), value=-1)
    return tokens.scatter(1, num_accepted.unsqueeze(-1), bonus.unsqueeze(-1))
