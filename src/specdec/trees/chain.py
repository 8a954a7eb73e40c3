"""The chain builder: classic speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

One sampled child per node, drawn from the full draft law ``q`` of the node,
``depth`` levels deep. Verified by recursive rejection (docs/verifiers.md rule 3,
verifier ``"rejection-iid"``): on a chain it is the classic
``min(1, p/q)`` test with the ``norm([p - q]+)`` residual. At temperature 0
``q`` is one-hot, so the chain is the draft's greedy continuation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from specdec.drafts.base import DraftModel
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees._common import MAX_TREE_NODES, check_int, draw_children, normalised_law
from specdec.trees.static import ShapedTreeBuilder
from specdec.methods import Method, register_method

__all__ = ["ChainTreeBuilder"]


def _check_depth(_inst: object, _attr: object, value: object) -> None:
    check_int("depth", value, 1, MAX_TREE_NODES - 1)  # a chain of depth d has d + 1 nodes


@register("tree", "chain")
@attrs.frozen
class ChainTreeBuilder(ShapedTreeBuilder):
    """A chain of ``depth`` sampled drafts (classic speculative sampling).

    Each node's one child is drawn from the node's processed draft law ``q``;
    the tree records ``q`` (restricted to its support) as the child's law,
    mode i.i.d., and ``q(x)`` as its construction weight. One draft call per
    level: :meth:`DraftModel.root_distribution`, then one
    :meth:`DraftModel.expand` per further level.

    Args:
        depth: number of draft tokens (``1 .. 65535``; default 4, the ``gamma`` range
            3-5 of Leviathan et al. 2023).

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> draft = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)
        >>> draft.begin([0, 1])
        >>> tree = ChainTreeBuilder(depth=3).build(1, draft, SamplingConfig(), TorchRandom.seeded(0))
        >>> tree.num_draft_nodes, int(tree.depths.max())
        (3, 3)
    """

    depth: int = attrs.field(default=4, validator=_check_depth)

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.SAMPLED})
    default_verifier: ClassVar[str] = "rejection-iid"
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = ({"depth": 2}, {"depth": 3})

    @property
    def max_nodes(self) -> int:
        return self.depth + 1

    @property
    def max_depth(self) -> int:
        return self.depth

    construction: ClassVar[bool] = False  # the chain drafts from q as the target processes it (one-hot at T = 0)

    def shape(self) -> tuple[tuple[tuple[int, ...], ...], SampleMode]:
        return tuple((0,) * d for d in range(1, self.depth + 1)), SampleMode.IID

    def build_reference(
        self, root_token: int, draft: DraftModel, sampling: SamplingConfig, rng: RandomSource
    ) -> DraftTree:
        """The per-node reference: one draw per level from the full draft law."""
        asm = TreeAssembler(root_token, draft.vocab_size)
        q = normalised_law(draft.root_distribution(sampling))
        node, token = 0, root_token
        for level in range(self.depth):
            if level > 0:
                # the node just added gets draft id `level` (root 0, then 1, 2, ...)
                q = normalised_law(draft.expand([level - 1], [token], sampling))[0]
            law = SparseLaw.from_dense(q, SampleMode.IID)
            (index,) = draw_children(law.probs, 1, SampleMode.IID, rng)
            token = int(law.indices[index])
            node = asm.add_sampled(node, token, law, weight=float(law.probs[index]))
        return asm.build()


# the method(s) this builder serves (docs/methods.md); the defaults typed as Method.defaults (its ``dict``
# converter gives mypy no usable parameter type for a literal)
_SD_DEFAULTS: Mapping[str, Any] = {"depth": 4}
register_method(Method("sd", "chain", "rejection-iid", _SD_DEFAULTS,
                "classic speculative sampling: a chain of sampled drafts, rule 3"))
