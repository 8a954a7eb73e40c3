"""Greedy verification (docs/verifiers.md rule 1), for temperature 0.

At ``T = 0`` the target row ``p`` is one-hot on ``argmax p``: the child whose
token is ``argmax p`` is accepted (the first such child in
:meth:`~specdec.tree.DraftTree.children` order, if sampled children repeat a
token); if there is none, the *bonus* is ``argmax p``. Any kind of child is
fine, since no draft law is used. No randomness is drawn.
"""

from __future__ import annotations

import torch

from specdec.registry import register
from specdec.rng import RandomSource
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.verify.base import FusedRule, NodeOutcome, Verifier

__all__ = ["GreedyVerifier"]


@register("verifier", "greedy")
class GreedyVerifier(Verifier):
    """Rule 1: accept the child equal to ``argmax p``; bonus ``argmax p``.

    Needs one-hot ``p`` (the walk raises
    :class:`~specdec.errors.InvalidDistributionError` otherwise). Acceptance at
    a node is 1 if ``argmax p`` is among its children, else 0.

    Example:
        >>> import torch
        >>> from specdec.tree import TreeAssembler
        >>> from specdec.rng import TorchRandom
        >>> asm = TreeAssembler(root_token=0, vocab_size=3)
        >>> _ = asm.add_deterministic(0, token=2, weight=0.7)
        >>> p = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> GreedyVerifier().verify(asm.build(), p, TorchRandom.seeded(0)).tokens
        (2, 1)
    """

    # on one-hot p, rule 2 accepts exactly the child equal to argmax p and its bonus is argmax p: rule 1
    fused = FusedRule("greedy", rejection=False, without_replacement=False, match_deterministic=True)
    supported_kinds = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})
    requires_greedy = True

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        target = int(torch.argmax(p_node))
        for child in tree.children(node):
            if int(tree.tokens[child]) == target:
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token=target)
