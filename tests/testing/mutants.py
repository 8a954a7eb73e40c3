"""Lossy rules for the tests of specdec.testing (never registered outside a test)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from specdec.testing.cases import draw_children
from specdec.tree import NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees.base import OneTreeBuilder
from specdec.verify.base import NodeOutcome, Verifier


class DeepBonusFromP(Verifier):
    """LOSSY: rule 3 whose bonus below the root comes from p instead of the residual
    (exact at the root: the per-node suite passes it; the whole-tree suite must not)."""

    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree, node, p_node, rng):
        P = p_node.clone()
        for child in tree.children(node):
            x = int(tree.tokens[child])
            q = tree.law_of(child).dense(tree.vocab_size, P.dtype)
            if rng.bernoulli(min(1.0, float(P[x] / q[x]))):
                return NodeOutcome(accepted_child=child)
            P = (P - q).clamp_min(0)
            P = P / P.sum()
        return NodeOutcome(bonus_token=rng.categorical(P if node == 0 else p_node))


@attrs.frozen
class TopTwoRecordsFullLaw(OneTreeBuilder):
    """LOSSY: a chain that draws each child from the draft law's top two tokens (renormalised)
    but records the full law in the tree."""

    depth: int = 2

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.SAMPLED})
    default_verifier: ClassVar[str] = "rejection-iid"
    example_options: ClassVar[tuple[dict, ...]] = ({"depth": 2},)

    @property
    def max_nodes(self) -> int:
        return self.depth + 1

    @property
    def max_depth(self) -> int:
        return self.depth

    def build(self, root_token, draft, sampling, rng):
        asm = TreeAssembler(root_token, draft.vocab_size)
        q = draft.root_distribution(sampling).double()
        node, token = 0, root_token
        for level in range(self.depth):
            if level:
                q = draft.expand([level - 1], [token], sampling)[0].double()
            q = q / q.sum()
            top = q.clone()
            top[q.argsort(descending=True)[2:]] = 0
            (token,) = draw_children(rng, top / top.sum(), 1, SampleMode.IID)
            node = asm.add_sampled(node, token, SparseLaw.from_dense(q), weight=1.0)
        return asm.build()
