"""LOSSY mutant: the accept ratio reads q(x) from the child's construction weight, not its recorded law.

The chain builder happens to set weight = q(x), so this passes there; but a weight is only a
builder's score (1.0, or a proxy), and the verifier must use the law in the tree.
"""

import torch

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-mutant-weight-as-q")
class WeightAsQ(Verifier):
    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree, node, p_node, rng):
        P = p_node / p_node.sum()
        children = tree.sampled_children(node)
        if children:
            q = tree.sampled_law_at(node).dense(tree.vocab_size, dtype=P.dtype)
            for child in children:
                x = int(tree.tokens[child])
                q_x = float(tree.weights[child])  # BUG: the wrong law
                if rng.bernoulli(min(1.0, float(P[x]) / q_x)):
                    return NodeOutcome(accepted_child=child)
                rest = torch.clamp_min(P - q, 0.0)
                P = rest / rest.sum() if float(rest.sum()) > 0 else P
        return NodeOutcome(bonus_token=rng.categorical(P))
