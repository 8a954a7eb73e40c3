"""LOSSY mutant builder: samples from the top-p nucleus but records the FULL draft law in the tree.

The verifier then tests each child against a law it was not drawn from.
"""

import attrs

from good_nucleus import NucleusBuilder, nucleus
from specdec.registry import register
from specdec.tree import SampleMode, SparseLaw, TreeAssembler
from specdec.trees import normalised_law


@register("tree", "outside-mutant-nucleus-full-law")
@attrs.frozen
class FullLawNucleus(NucleusBuilder):
    def build(self, root_token, draft, sampling, rng):
        asm = TreeAssembler(root_token, draft.vocab_size)
        frontier = [(0, 0, draft.root_distribution(sampling))]
        next_id = 1
        for depth, k in enumerate(self.width):
            added = []
            for node, draft_id, q in frontier:
                law = nucleus(q, self.top_p)
                full = SparseLaw.from_dense(normalised_law(q), SampleMode.IID)  # BUG: recorded instead of `law`
                for _ in range(k):
                    i = rng.categorical(law.probs)
                    token = int(law.indices[i])
                    added.append((asm.add_sampled(node, token, full, weight=float(law.probs[i])), token, draft_id))
            if depth + 1 == len(self.width):
                break
            rows = draft.expand([parent for _, _, parent in added], [token for _, token, _ in added], sampling)
            frontier = [(node, next_id + i, rows[i]) for i, (node, _, _) in enumerate(added)]
            next_id += len(added)
        return asm.build()
