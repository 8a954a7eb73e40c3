"""Recursive rejection verification (docs/verifiers.md rules 3 and 4).

For the sampled children of a node, in draw order, each drawn from the
recorded proposal law ``q`` (the tree's ``q'``): accept child ``x`` with
probability ``min(1, P(x) / q(x))``; on rejection the *residual* becomes
``P = norm([P - q]+)``, and

- rule 3 (i.i.d. draws, SpecInfer's multi-step speculative sampling): ``q`` is
  unchanged for the next draw;
- rule 4 (draws without replacement, Sequoia / RSD): ``q(x) = 0; q = norm(q)``
  before the next draw, which is the law the next child was drawn from.

If no child is accepted the *bonus* is drawn from the final residual. With a
single child both rules are classic speculative sampling (acceptance
``sum_x min(p(x), q(x))``), so a single sampled child of either mode is
accepted by both verifiers. Deterministic (top-K) children have no proposal
law, and a ``p/q`` ratio on them is not lossless: both verifiers reject such
trees with :class:`~specdec.errors.UnsupportedTreeError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from specdec.registry import register
from specdec.rng import RandomSource
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.verify.base import FusedRule, NodeOutcome, Verifier
from specdec.verify.residual import (
    rejection_accept_prob,
    rejection_residual,
    without_replacement_update,
    working_dtype,
)

__all__ = ["RejectionIIDVerifier", "RejectionWORVerifier", "recursive_rejection"]


def recursive_rejection(
    P: torch.Tensor,
    q: torch.Tensor,
    children: Sequence[int],
    tokens: Sequence[int],
    rng: RandomSource,
    *,
    without_replacement: bool,
) -> tuple[int | None, torch.Tensor]:
    """Rule 3 (``without_replacement=False``) or rule 4 over sampled children.

    Args:
        P: ``[V]`` residual at the node (normalised).
        q: ``[V]`` dense proposal law of the first draw (the recorded ``q'``).
        children: node indices of the sampled children, in draw order.
        tokens: their tokens.
        rng: source of the Bernoulli draws.
        without_replacement: apply the rule-4 update of ``q`` after each rejection.

    Returns:
        ``(accepted child or None, residual)``.
    """
    last = len(children) - 1
    for i, (child, x) in enumerate(zip(children, tokens, strict=True)):
        if rng.bernoulli(rejection_accept_prob(P, q, x)):
            return child, P
        P = rejection_residual(P, q)
        if without_replacement and i < last:
            q = without_replacement_update(q, x)
    return None, P


class _RejectionVerifier(Verifier):
    """Shared walk of rules 3 and 4; subclasses fix the mode."""

    supported_kinds = frozenset({NodeKind.SAMPLED})
    without_replacement: ClassVar[bool] = False

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        dtype = working_dtype(p_node)
        p = p_node.to(dtype)
        P = p / p.sum()
        children = tree.sampled_children(node)
        if children:
            q = tree.law_of(children[0]).dense(tree.vocab_size, dtype=dtype).to(p.device)  # q'
            tokens = [int(tree.tokens[c]) for c in children]
            accepted, P = recursive_rejection(
                P, q, children, tokens, rng, without_replacement=self.without_replacement
            )
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))


@register("verifier", "rejection-iid")
class RejectionIIDVerifier(_RejectionVerifier):
    """Rule 3: recursive rejection for sampled children drawn i.i.d. from ``q'``.

    Example:
        >>> import torch
        >>> from specdec.tree import SparseLaw, TreeAssembler
        >>> from specdec.rng import TorchRandom
        >>> law = SparseLaw(torch.tensor([1, 2]), torch.tensor([0.5, 0.5]), SampleMode.IID)
        >>> asm = TreeAssembler(root_token=0, vocab_size=3)
        >>> _ = asm.add_sampled(0, token=1, law=law, weight=0.5)
        >>> _ = asm.add_sampled(0, token=1, law=law, weight=0.5)
        >>> p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
        >>> RejectionIIDVerifier().verify(asm.build(), p, TorchRandom.seeded(0)).tokens
        (1, 0)
    """

    supported_modes = frozenset({SampleMode.IID})
    without_replacement = False
    fused = FusedRule("rejection-iid", rejection=True, without_replacement=False, match_deterministic=False)


@register("verifier", "rejection-wor")
class RejectionWORVerifier(_RejectionVerifier):
    """Rule 4: recursive rejection for sampled children drawn without replacement.

    Example:
        >>> import torch
        >>> from specdec.tree import SparseLaw, TreeAssembler
        >>> from specdec.rng import TorchRandom
        >>> law = SparseLaw(torch.tensor([1, 2]), torch.tensor([0.5, 0.5]), SampleMode.WITHOUT_REPLACEMENT)
        >>> asm = TreeAssembler(root_token=0, vocab_size=3)
        >>> _ = asm.add_sampled(0, token=1, law=law, weight=0.5)
        >>> _ = asm.add_sampled(0, token=2, law=law, weight=0.5)
        >>> p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
        >>> RejectionWORVerifier().verify(asm.build(), p, TorchRandom.seeded(0)).tokens
        (2, 0)
    """

    supported_modes = frozenset({SampleMode.WITHOUT_REPLACEMENT})
    without_replacement = True
    fused = FusedRule("rejection-wor", rejection=True, without_replacement=True, match_deterministic=False)
