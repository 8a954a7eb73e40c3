"""LOSSY mutant builder: whether a child is kept depends on a LATER sibling.

It draws the children of a node i.i.d. from the nucleus law and drops a draw when the NEXT draw
repeats it ("keep the last of equal siblings"). Dropping a repeat of an EARLIER sibling is safe;
this is the mirror image, and the kept children are no longer i.i.d. draws from the recorded law.
"""

import attrs

from good_nucleus import NucleusBuilder, nucleus
from specdec.registry import register
from specdec.tree import TreeAssembler


@register("tree", "outside-mutant-later-sibling")
@attrs.frozen
class LaterSibling(NucleusBuilder):
    def build(self, root_token, draft, sampling, rng):
        asm = TreeAssembler(root_token, draft.vocab_size)
        frontier = [(0, 0, draft.root_distribution(sampling))]
        next_id = 1
        for depth, k in enumerate(self.width):
            added = []
            for node, draft_id, q in frontier:
                law = nucleus(q, self.top_p)
                draws = [int(law.indices[rng.categorical(law.probs)]) for _ in range(k)]
                kept = [x for i, x in enumerate(draws) if i + 1 == len(draws) or draws[i + 1] != x]  # BUG
                for token in kept:
                    added.append((asm.add_sampled(node, token, law, weight=law.prob_of(token)), token, draft_id))
            if depth + 1 == len(self.width):
                break
            rows = draft.expand([parent for _, _, parent in added], [token for _, token, _ in added], sampling)
            frontier = [(node, next_id + i, rows[i]) for i, (node, _, _) in enumerate(added)]
            next_id += len(added)
        return asm.build()
