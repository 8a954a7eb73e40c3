"""A correct outside verifier: recursive rejection sampling for i.i.d. sampled children, from scratch.

At a node with sampled children ``x_1, x_2, ...`` drawn i.i.d. from the recorded law ``q``:
the residual ``P`` starts as ``p``; child ``x_i`` is accepted with probability
``min(1, P(x_i) / q(x_i))``; on rejection ``P = norm(max(P - q, 0))``; when every child is
rejected the bonus is drawn from ``P``. This is done at every node of the tree.
"""

import torch

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


def residual(P, q):
    """norm(max(P - q, 0)); when its mass rounds to 0 the rejection had probability 0: keep P."""
    rest = torch.clamp_min(P - q, 0.0)
    mass = rest.sum()
    return rest / mass if float(mass) > 0 else P


@register("verifier", "outside-rejection")
class OutsideRejection(Verifier):
    """Recursive rejection (rule 3) for children drawn i.i.d. from the recorded law."""

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
                P = residual(P, q)
        return NodeOutcome(bonus_token=rng.categorical(P))
