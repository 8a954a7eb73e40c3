"""Bad plug-in: a verifier that declares no supported_kinds (it verifies nothing)."""

from specdec.registry import register
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-bad-no-kinds")
class NoKinds(Verifier):
    def verify_node(self, tree, node, p_node, rng):
        return NodeOutcome(bonus_token=rng.categorical(p_node))
