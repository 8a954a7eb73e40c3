"""A correct outside verifier: sample-and-match (docs/verifiers.md rule 2), written from the docs.

Draw ``z ~ p`` at the node; if a child carries ``z`` descend into it, otherwise ``z`` is the
bonus. Exact for any children (deterministic or sampled, any mode): the emitted token is ``z``.
"""

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-match")
class OutsideMatch(Verifier):
    """Sample-and-match: draw z ~ p; accept the child whose token is z, else z is the bonus."""

    supported_kinds = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})

    def verify_node(self, tree, node, p_node, rng):
        z = rng.categorical(p_node)
        for child in tree.children(node):
            if int(tree.tokens[child]) == z:
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token=z)
