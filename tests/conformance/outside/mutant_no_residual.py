"""LOSSY mutant: recursive rejection that draws the bonus from p after a rejection (no residual).

The per-node suite catches it: after rejecting x the bonus must come from norm(max(p - q, 0)).
"""

import torch

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-mutant-no-residual")
class NoResidual(Verifier):
    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree, node, p_node, rng):
        P = p_node / p_node.sum()
        children = tree.sampled_children(node)
        if children:
            q = tree.sampled_law_at(node).dense(tree.vocab_size, dtype=P.dtype)
            for child in children:
                x = int(tree.tokens[child])
                if rng.bernoulli(torch.clamp(P[x] / q[x], max=1.0)):
                    return NodeOutcome(accepted_child=child)
                # BUG: P is never updated to the residual
        return NodeOutcome(bonus_token=rng.categorical(P))
