"""LOSSY mutant: the residual is used at the root only; below it the bonus comes from p.

Every per-node case (a root with leaves) passes; only the whole-tree suite, whose trees are
two and three levels deep, can catch it (docs: "Errors below depth 1 show here").
"""

import torch

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-mutant-root-residual")
class RootResidual(Verifier):
    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree, node, p_node, rng):
        p = p_node / p_node.sum()
        P = p
        children = tree.sampled_children(node)
        if children:
            q = tree.sampled_law_at(node).dense(tree.vocab_size, dtype=P.dtype)
            for child in children:
                x = int(tree.tokens[child])
                if rng.bernoulli(torch.clamp(P[x] / q[x], max=1.0)):
                    return NodeOutcome(accepted_child=child)
                rest = torch.clamp_min(P - q, 0.0)
                P = rest / rest.sum() if float(rest.sum()) > 0 else P
        # BUG: "the residual matters at the root only"
        return NodeOutcome(bonus_token=rng.categorical(P if node == 0 else p))
