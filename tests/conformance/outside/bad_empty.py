"""Bad plug-in: defines a verifier but forgets to register it (registers nothing)."""

from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


class Forgotten(Verifier):  # no @register("verifier", ...)
    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree, node, p_node, rng):
        return NodeOutcome(bonus_token=rng.categorical(p_node))
