"""Bad plug-in: registers a verifier, then fails in its body while importing."""

from specdec.registry import register
from specdec.tree import NodeKind
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-bad-import")
class HalfDone(Verifier):
    supported_kinds = frozenset({NodeKind.SAMPLED})

    def verify_node(self, tree, node, p_node, rng):
        return NodeOutcome(bonus_token=rng.categorical(p_node))


TABLE = {"a": 1}["b"]  # raises KeyError at import
