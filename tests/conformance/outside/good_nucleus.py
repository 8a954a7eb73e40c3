"""A correct outside tree builder: "nucleus" trees, written from the docs.

At every node of depth ``d`` it draws ``width[d]`` children i.i.d. from the draft law
restricted to its top-``top_p`` nucleus (the fewest most likely tokens, ties broken by token
id, whose mass reaches ``top_p``) and renormalised, and records THAT law in the tree, so the
recursive rejection verifier ``rejection-iid`` tests each child against the law it was drawn from.
"""

import attrs
import torch

from specdec.registry import register
from specdec.tree import NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees import normalised_law
from specdec.trees.base import OneTreeBuilder


def nucleus(q, top_p):
    """The law of ``q`` restricted to its top-``top_p`` nucleus, renormalised (a SparseLaw, i.i.d.)."""
    q = normalised_law(q)  # float64, sums to 1
    order = sorted(range(q.numel()), key=lambda t: (-float(q[t]), t))
    keep, mass = [], 0.0
    for t in order:
        if float(q[t]) <= 0 or (keep and mass >= top_p):
            break
        keep.append(t)
        mass += float(q[t])
    keep.sort()
    probs = q[keep]
    return SparseLaw(torch.tensor(keep, dtype=torch.int64), probs / probs.sum(), SampleMode.IID)


def _check(instance, attribute, value):
    if not value or any(not isinstance(k, int) or k < 1 for k in value):
        raise ValueError(f"width must be a non-empty tuple of ints >= 1, got {value!r}")


@register("tree", "outside-nucleus")
@attrs.frozen
class NucleusBuilder(OneTreeBuilder):
    """width[d] children per node of depth d, drawn i.i.d. from the draft's top-p nucleus."""

    width: tuple = attrs.field(default=(2, 1), converter=tuple, validator=_check)
    top_p: float = 0.8

    produces = frozenset({NodeKind.SAMPLED})
    default_verifier = "rejection-iid"
    example_options = ({"width": (2, 1), "top_p": 0.8}, {"width": (1, 1, 1), "top_p": 0.6})

    @property
    def sibling_modes(self):
        return frozenset({SampleMode.IID})

    @property
    def max_nodes(self):
        total = level = 1
        for k in self.width:
            level *= k
            total += level
        return total

    @property
    def max_depth(self):
        return len(self.width)

    def build(self, root_token, draft, sampling, rng):
        asm = TreeAssembler(root_token, draft.vocab_size)
        # (tree node, its draft node id, its draft law): the draft numbers nodes in expand order, root 0
        frontier = [(0, 0, draft.root_distribution(sampling))]
        next_id = 1
        for depth, k in enumerate(self.width):
            added = []  # (tree node, token, draft id of the parent)
            for node, draft_id, q in frontier:
                law = nucleus(q, self.top_p)
                for _ in range(k):
                    i = rng.categorical(law.probs)
                    token = int(law.indices[i])
                    added.append((asm.add_sampled(node, token, law, weight=float(law.probs[i])), token, draft_id))
            if depth + 1 == len(self.width):
                break
            rows = draft.expand([parent for _, _, parent in added], [token for _, token, _ in added], sampling)
            frontier = [(node, next_id + i, rows[i]) for i, (node, _, _) in enumerate(added)]
            next_id += len(added)
        return asm.build()
