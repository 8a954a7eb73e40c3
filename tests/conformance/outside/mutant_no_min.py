"""LOSSY mutant: the accept probability is P(x) / q(x) without the min(1, .).

A ratio above 1 is not a probability: the exact random source refuses it (raises), which the
command must report as a FAIL of the case.
"""

import torch

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-mutant-no-min")
class NoMin(Verifier):
    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree, node, p_node, rng):
        P = p_node / p_node.sum()
        children = tree.sampled_children(node)
        if children:
            q = tree.sampled_law_at(node).dense(tree.vocab_size, dtype=P.dtype)
            for child in children:
                x = int(tree.tokens[child])
                if rng.bernoulli(P[x] / q[x]):  # BUG: no min(1, .)
                    return NodeOutcome(accepted_child=child)
                rest = torch.clamp_min(P - q, 0.0)
                P = rest / rest.sum() if float(rest.sum()) > 0 else P
        return NodeOutcome(bonus_token=rng.categorical(P))
