"""Whole-tree cases: a tree builder of a fixed shape, for proving verifiers on every child kind and mode.

:class:`ShapeBuilder` drafts a tree level by level from any draft model: at
every node of level ``d`` its children follow ``levels[d]``, a
:class:`~specdec.testing.cases.Mix` of ``K`` deterministic children (the top-K
of the draft law ``q`` by the order ``(-q, token)``, the set ``S``) and ``k``
sampled children drawn i.i.d. or without replacement from
``q' = norm(q restricted to the complement of S)`` (RheoSampling's law; ``q``
itself when ``K = 0``). Run through :class:`~specdec.testing.laws.ExactLaws`, it
proves a verifier on trees of every kind it declares, below depth 1 too (the
per-node suite checks the root only). :data:`SHAPES` lists the shapes the
conformance suite uses.

Example:
    >>> import specdec
    >>> from specdec.testing import markov_pair
    >>> target, draft = markov_pair(3, seed=0, order=2)
    >>> builder = ShapeBuilder((Mix(2, SampleMode.IID, 0), Mix(1, SampleMode.IID, 0)))
    >>> draft.begin([0, 1])
    >>> tree = specdec.trees.build_tree(builder, 1, draft, specdec.SamplingConfig(temperature=1.0), specdec.TorchRandom.seeded(0))
    >>> tree.num_nodes
    5
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import attrs
import torch

from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.testing.cases import Mix, draw_children, top_tokens
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees.base import OneTreeBuilder
from specdec.verify.base import Verifier

__all__ = ["SHAPES", "Shape", "ShapeBuilder", "shape_supported"]

IID, WOR = SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT


@attrs.frozen
class ShapeBuilder(OneTreeBuilder):
    """A tree builder of a fixed shape (one :class:`Mix` per level), drafting from any draft model.

    Args:
        levels: the children of every node of depth ``d`` (root: ``levels[0]``).
        det_first: add a node's deterministic children before its sampled ones
            (the default adds the sampled ones first); a verifier must be exact
            in either order.
    """

    levels: tuple[Mix, ...] = attrs.field(converter=lambda levels: tuple(levels))
    det_first: bool = False

    default_verifier: ClassVar[str] = ""

    @property
    def produces(self) -> frozenset[NodeKind]:  # type: ignore[override]
        """The child kinds of the shape."""
        kinds = set()
        for mix in self.levels:
            if mix.k:
                kinds.add(NodeKind.SAMPLED)
            if mix.K:
                kinds.add(NodeKind.DETERMINISTIC)
        return frozenset(kinds)

    @property
    def sibling_modes(self) -> frozenset[SampleMode] | None:
        """The modes of the levels that draw several sampled children."""
        return frozenset(mix.mode for mix in self.levels if mix.k > 1)

    @property
    def max_depth(self) -> int:
        return len(self.levels)

    @property
    def max_nodes(self) -> int:
        total = width = 1
        for mix in self.levels:
            width *= mix.k + mix.K
            total += width
        return total

    def build(self, root_token: int, draft: OneRowDraft, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        asm = TreeAssembler(root_token, draft.vocab_size)
        # (tree node, draft node id, q) of the current level; the draft numbers nodes in expand order (root 0)
        frontier: list[tuple[int, int, torch.Tensor]] = [(0, 0, _law(draft.root_distribution(sampling)))]
        next_draft_id = 1
        for depth, mix in enumerate(self.levels):
            added: list[tuple[int, int, int]] = []  # (tree node, token, draft id of its parent)
            for node, draft_id, q in frontier:
                added += [(child, token, draft_id) for child, token in self._children(asm, node, q, mix, rng)]
            if not added or depth + 1 == len(self.levels):
                break
            rows = draft.expand([parent for _, _, parent in added], [token for _, token, _ in added], sampling)
            frontier = [(node, next_draft_id + i, _law(rows[i])) for i, (node, _, _) in enumerate(added)]
            next_draft_id += len(added)
        return asm.build()

    def _children(self, asm: TreeAssembler, node: int, q: torch.Tensor, mix: Mix,
                  rng: RandomSource) -> list[tuple[int, int]]:
        det = top_tokens(q, mix.K)
        sampled: list[int] = []
        law: SparseLaw | None = None
        if mix.k:
            q_prime = q.clone()
            q_prime[det] = 0
            support = int((q_prime > 0).sum())
            if support:  # q concentrated on S: no sampled slot (as in RheoSampling)
                q_prime = q_prime / q_prime.sum()
                k = min(mix.k, support) if mix.mode == WOR else mix.k
                sampled = draw_children(rng, q_prime, k, mix.mode)
                law = SparseLaw.from_dense(q_prime, mix.mode)
        out: list[tuple[int, int]] = []

        def add_det() -> None:
            out.extend((asm.add_deterministic(node, x, weight=1.0), x) for x in det)

        if self.det_first:
            add_det()
        for x in sampled:
            assert law is not None
            out.append((asm.add_sampled(node, x, law, weight=1.0), x))
        if not self.det_first:
            add_det()
        return out


def _law(q: torch.Tensor) -> torch.Tensor:
    """``q`` as a float64 law summing to 1 (the processed draft row, renormalised as it is sampled)."""
    q = q.detach().to("cpu", torch.float64)
    return q / q.sum()


@attrs.frozen
class Shape:
    """A named :class:`ShapeBuilder` configuration of the conformance suite.

    Attributes:
        label: the case id.
        levels: one :class:`Mix` per level.
        vocab_size: the vocabulary the case runs on.
        det_first: :attr:`ShapeBuilder.det_first`.
    """

    label: str
    levels: tuple[Mix, ...]
    vocab_size: int
    det_first: bool = False

    def builder(self) -> ShapeBuilder:
        return ShapeBuilder(self.levels, det_first=self.det_first)


SHAPES: tuple[Shape, ...] = (
    Shape("iid-2x1", (Mix(2, IID, 0), Mix(1, IID, 0)), 4),
    Shape("iid-2x2", (Mix(2, IID, 0), Mix(2, IID, 0)), 3),
    Shape("chain-3", (Mix(1, IID, 0), Mix(1, IID, 0), Mix(1, IID, 0)), 3),
    Shape("wor-2x2", (Mix(2, WOR, 0), Mix(2, WOR, 0)), 3),
    Shape("wor-3x1", (Mix(3, WOR, 0), Mix(1, WOR, 0)), 4),
    Shape("det-2x2", (Mix(0, IID, 2), Mix(0, IID, 2)), 4),
    Shape("det-3x1", (Mix(0, IID, 3), Mix(0, IID, 1)), 4),
    Shape("rheo-1s1d", (Mix(1, IID, 1), Mix(1, IID, 1)), 4),
    Shape("rheo-1s1d-detfirst", (Mix(1, IID, 1), Mix(1, IID, 1)), 4, det_first=True),
    Shape("rheo-1s2d", (Mix(1, WOR, 2), Mix(1, WOR, 1)), 4),
    Shape("mixed-2wor1d", (Mix(2, WOR, 1), Mix(1, WOR, 1)), 4),
    Shape("mixed-2iid1d", (Mix(2, IID, 1), Mix(1, IID, 0)), 3),
)
"""The whole-tree shapes: every child kind, both sampling modes, mixes at one node, three levels."""


def shape_supported(verifier: type[Verifier] | Verifier, levels: Sequence[Mix]) -> bool:
    """Whether ``verifier`` declares support for every level of a shape (mirrors ``Verifier.check_tree``)."""
    kinds, modes = verifier.supported_kinds, verifier.supported_modes
    for mix in levels:
        if (mix.k and NodeKind.SAMPLED not in kinds) or (mix.K and NodeKind.DETERMINISTIC not in kinds):
            return False
        if mix.k > 1 and mix.mode not in modes:
            return False
    return True
