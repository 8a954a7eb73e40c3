"""Bad plug-in: registers a name specdec already owns ("rejection-iid")."""

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "rejection-iid")
class Clash(Verifier):
    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree, node, p_node, rng):
        return NodeOutcome(bonus_token=rng.categorical(p_node))
