"""Mutant that raises: a correct sample-and-match verifier, except that it fails on 4-token vocabularies.

A case that raises is a failing case: the command must report FAIL naming the first V=4 case.
"""

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "outside-mutant-raises")
class RaisesOnV4(Verifier):
    supported_kinds = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})

    def verify_node(self, tree, node, p_node, rng):
        if tree.vocab_size == 4:
            raise IndexError("lookup table built for 2 or 3 tokens only")  # BUG
        z = rng.categorical(p_node)
        for child in tree.children(node):
            if int(tree.tokens[child]) == z:
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token=z)
