"""The step's decision at ``T = 0`` from the target's logits, with one pass over the vocabulary.

At ``T = 0`` the target's law at every node is one-hot at the row's argmax (the first of tied
maxima, :func:`~specdec.sampling.greedy_law`), so every lossless rule decides the same thing
(docs/verifiers.md, "The step's decision at T = 0"): at each node the first child **that the rule tests**, in test
order (:func:`~specdec.verify.decision.children_table`), whose token is the argmax is accepted,
and the bonus is the stop node's argmax. Which children a rule tests:

- a rule with rejection (rules 3/4) on a tree that records ``q'``: the sampled children
  it tests (the first ``min(C, max_sampled, L)``), then, with ``match_deterministic``, the
  deterministic ones (rule 5's matching);
- otherwise every child when the rule matches (rule 2), none when it only rejects.

The general decision (:func:`~specdec.verify.fast.decide_tree_batch` on the one-hot rows, or
the walk :func:`~specdec.verify.fast.decide_tree_walk`) reaches the same fields through the
rules' arithmetic on ``[B, n, V]`` float64 laws: about twenty passes over the vocabulary per
visited node, 2.1 ms on a 2-node chain of SmolLM2-135M's 49,152-token vocabulary on a 2-core
CPU, against 0.22 ms here (one ``argmax`` and one ``amax``). The two are compared field for field
for every registered rule and tree shape (``tests/verify/test_greedy_decision.py``).
"""

from __future__ import annotations

import torch

from specdec.sampling import row_is_bad
from specdec.tree_batch import TreeBatch
from specdec.verify.base import FusedRule
from specdec.verify.decision import _arange, child_tokens, children_table, emitted_tokens, reached_path

__all__ = ["decide_greedy"]


def decide_greedy(rule: FusedRule, tree: TreeBatch, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The :class:`~specdec.verify.decision.TreeDecision` fields at ``T = 0``, in order.

    Args:
        rule: the verifier's fused rule (which children it tests).
        tree: ``B`` trees of ``n`` node slots.
        logits: ``[B, n, V]`` the target's logits at every node (raw: only their argmax and
            whether the row is bad, :func:`~specdec.sampling.row_is_bad`, are read).

    Returns:
        ``accepted, num_accepted, tokens, bonus, attempted, bad_visited, stop`` on ``logits``' device.
    """
    B, n, _ = logits.shape
    C = tree.max_children
    dev = logits.device
    table, n_sampled = children_table(tree, rule)  # [B, n, C], [B, n]
    has = table >= 0
    child_tok = child_tokens(tree, table, has)  # [B, n, C]
    slots = _arange(C, dev)  # [C]
    L = tree.law_ids.shape[-1]
    if rule.rejection and L > 0:  # rules 3/4 test the first S sampled children, then rule 5 matches the others
        S = min(C if tree.max_sampled is None else tree.max_sampled, L)
        sampled = slots < n_sampled.unsqueeze(-1)  # [B, n, C]
        tested = (sampled & (slots < S)) | (~sampled if rule.match_deterministic else torch.zeros_like(sampled))
    elif rule.match_deterministic or not rule.rejection:  # rule 2 on every child
        tested = torch.ones_like(has)
    else:
        tested = torch.zeros_like(has)
    top = logits.argmax(dim=-1)  # [B, n] the one-hot law's token at every node
    hit = has & tested & (child_tok == top.unsqueeze(-1))  # [B, n, C]
    first = torch.where(hit, slots, C).amin(dim=-1)  # [B, n] the first hit in test order (C: none)
    child = torch.where(first < C, table.gather(-1, first.clamp(max=C - 1).unsqueeze(-1)).squeeze(-1), -1)
    reached, accepted, num_accepted, node = reached_path(tree, child)
    bad = (reached & row_is_bad(logits)).any(dim=-1)  # [B]
    bonus = top.gather(1, node.unsqueeze(-1)).squeeze(-1)  # [B]
    attempted = num_accepted + has.gather(1, node.view(B, 1, 1).expand(B, 1, C)).squeeze(1).any(dim=-1)
    tokens = emitted_tokens(tree, accepted, num_accepted, bonus)  # [B, D + 1]
    return accepted, num_accepted, tokens, bonus, attempted, bad, node
