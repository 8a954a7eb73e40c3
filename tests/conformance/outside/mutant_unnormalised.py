"""LOSSY mutant: the residual max(P - q, 0) is not renormalised.

In exact mode the random source refuses the unnormalised law (it raises): the conformance
command must report that as a FAIL of the case, never as a pass.
"""

import torch

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-mutant-unnormalised")
class Unnormalised(Verifier):
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
                P = torch.clamp_min(P - q, 0.0)  # BUG: not divided by its sum
        return NodeOutcome(bonus_token=rng.categorical(P))
