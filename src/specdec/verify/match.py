"""Sample-and-match verification (docs/verifiers.md rule 2; EAGLE-2/3, OPT-Tree).

Equivalent to drawing ``z ~ p`` and accepting the child equal to ``z`` (the
bonus is ``z`` when no child matches), implemented in the sequential form:
try the children in :meth:`~specdec.tree.DraftTree.children` order, accept
child ``x`` with probability ``P(x)`` (the current *residual*), otherwise set
``P(x) = 0`` and renormalise; if every child is rejected the *bonus* is drawn
from ``P``. The rule never looks at a draft law, so it is lossless for any
children, deterministic or sampled, as long as they were chosen before the
verifier's own draws. A repeated token (i.i.d. sampled siblings) has residual
0 the second time and is never accepted twice.

Acceptance at a node with children tokens ``S``: ``p(S)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.registry import register
from specdec.rng import RandomSource
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.verify.base import FusedRule, NodeOutcome, Verifier
from specdec.verify.residual import match_accept_prob, match_residual, working_dtype

__all__ = ["MatchVerifier", "sample_and_match"]


def sample_and_match(
    P: torch.Tensor, children: Sequence[int], tokens: Sequence[int], rng: RandomSource
) -> tuple[int | None, torch.Tensor]:
    """Rule 2 over ``children`` against the residual ``P``.

    Args:
        P: ``[V]`` residual at the node (normalised).
        children: node indices of the children, in test order.
        tokens: their tokens (same length).
        rng: source of the Bernoulli draws.

    Returns:
        ``(accepted child or None, residual)``; the residual is the law of the
        bonus when no child was accepted.
    """
    for child, x in zip(children, tokens, strict=True):
        if rng.bernoulli(match_accept_prob(P, x)):
            return child, P
        P = match_residual(P, x)
    return None, P


@register("verifier", "match")
class MatchVerifier(Verifier):
    """Rule 2 (sample-and-match) at every node; any children kinds and modes.

    Example:
        >>> import torch
        >>> from specdec.tree import TreeAssembler
        >>> from specdec.rng import TorchRandom
        >>> asm = TreeAssembler(root_token=0, vocab_size=3)
        >>> _ = asm.add_deterministic(0, token=1, weight=0.6)
        >>> p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
        >>> MatchVerifier().verify(asm.build(), p, TorchRandom.seeded(0)).tokens
        (1, 0)
    """

    fused = FusedRule("match", rejection=False, without_replacement=False, match_deterministic=True)
    supported_kinds = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        p = p_node.to(working_dtype(p_node))
        P = p / p.sum()
        children = tree.children(node)
        tokens = [int(tree.tokens[c]) for c in children]
        accepted, P = sample_and_match(P, children, tokens, rng)
        if accepted is not None:
            return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))
