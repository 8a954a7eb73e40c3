"""Static trees (SpecInfer, Miao et al. 2024): a fixed shape, sampled children.

The shape is given either as children per depth, ``(k1, k2, ...)`` (SpecInfer's
"expansion configuration": every node at depth ``i - 1`` gets ``k_i``
children), or as an explicit list of child-slot paths (Medusa/Sequoia style,
e.g. ``[(0,), (1,), (0, 0)]``). The children of a node are drawn from its
processed draft law ``q``:

- ``mode="iid"``: independent draws (tokens may repeat); verified by rule 3
  (verifier ``"rejection-iid"``, SpecInfer's multi-step speculative sampling);
- ``mode="wor"``: without replacement, i.e. sequential draws with the drawn
  tokens zeroed and the rest renormalised; verified by rule 4 (verifier
  ``"rejection-wor"``). If ``q`` has fewer tokens than a node's slots, every
  token is drawn and the missing slots (and their subtrees) are left out.

Child slot ``i`` of a node is its ``i``-th draw (``draw_order = i``). The law
recorded for all of a node's children is the base ``q`` (restricted to its
support) with the mode; the verifier itself performs the renormalisations of
rule 4. Construction weights are ``q(x)`` (unused by the verifiers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig, construction_config
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees._common import check_mode, check_paths, draw_children, normalised_law
from specdec.trees.base import TreeBuilder
from specdec.methods import Method, register_method

__all__ = ["StaticTreeBuilder", "expansion_to_paths", "build_static_tree", "MAX_STATIC_NODES"]

MAX_STATIC_NODES = 1 << 16
"""Largest static shape accepted (draft nodes); larger shapes raise InvalidConfigError."""


def expansion_to_paths(expansion: Sequence[int] | Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Normalise a static shape to child-slot paths, breadth first.

    Args:
        expansion: children per depth ``(k1, ..., kd)`` (ints ``>= 1``), or an
            explicit, prefix-closed list of child-slot paths.

    Returns:
        The paths, sorted by length then lexicographically.

    Raises:
        InvalidConfigError: malformed shapes, or more than
            :data:`MAX_STATIC_NODES` nodes.

    Example:
        >>> expansion_to_paths((2, 1))
        ((0,), (1,), (0, 0), (1, 0))
    """
    if isinstance(expansion, (str, bytes)) or not isinstance(expansion, Sequence) or len(expansion) == 0:
        raise InvalidConfigError(
            f"expansion must be children per depth (e.g. (3, 2, 1)) or a list of paths, got {expansion!r}"
        )
    if all(isinstance(k, int) and not isinstance(k, bool) for k in expansion):
        total, width = 0, 1
        for k in expansion:
            if k < 1:
                raise InvalidConfigError(f"children per depth must be ints >= 1, got {tuple(expansion)!r}")
            width *= k
            total += width
            if total > MAX_STATIC_NODES:
                raise InvalidConfigError(
                    f"expansion {tuple(expansion)!r} has more than {MAX_STATIC_NODES} nodes"
                )
        level: list[tuple[int, ...]] = [()]
        paths: list[tuple[int, ...]] = []
        for k in expansion:
            level = [parent + (slot,) for parent in level for slot in range(k)]
            paths.extend(level)
        return tuple(paths)
    paths_t = check_paths(expansion)  # type: ignore[arg-type]
    if len(paths_t) > MAX_STATIC_NODES:
        raise InvalidConfigError(f"a static tree may have at most {MAX_STATIC_NODES} nodes, got {len(paths_t)}")
    return paths_t


def build_static_tree(
    paths: Sequence[tuple[int, ...]],
    mode: SampleMode,
    root_token: int,
    draft: DraftModel,
    sampling: SamplingConfig,
    rng: RandomSource,
) -> DraftTree:
    """Draft a static tree of the given shape, one draft call per level.

    Args:
        paths: normalised child-slot paths (:func:`expansion_to_paths`).
        mode: how each node's children are drawn from its ``q``.
        root_token: the last committed token.
        draft: the draft model (begun/committed up to ``root_token``).
        sampling: the target's processing; children are drawn from the draft
            law processed by :func:`~specdec.sampling.construction_config`
            (the same processing at ``T > 0``, the untempered draft law at ``T = 0``).
        rng: the source of every draw.

    Returns:
        The tree; node ``i``'s children are its slot draws in draw order.
    """
    sampling = construction_config(sampling)  # the draft's untempered law at T = 0 (not one-hot)
    slots: dict[tuple[int, ...], int] = {}
    for path in paths:
        parent = path[:-1]
        slots[parent] = max(slots.get(parent, 0), path[-1] + 1)
    asm = TreeAssembler(root_token, draft.vocab_size)
    node_of: dict[tuple[int, ...], int] = {(): 0}
    draft_id: dict[tuple[int, ...], int] = {(): 0}
    token_of: dict[tuple[int, ...], int] = {}
    q_of = {(): normalised_law(draft.root_distribution(sampling))}
    parents: list[tuple[int, ...]] = [()]
    next_draft_id = 1
    while parents:
        created: list[tuple[int, ...]] = []
        for parent in parents:
            law = SparseLaw.from_dense(q_of.pop(parent), mode)
            for slot, index in enumerate(draw_children(law.probs, slots[parent], mode, rng)):
                path = parent + (slot,)
                token_of[path] = int(law.indices[index])
                node_of[path] = asm.add_sampled(node_of[parent], token_of[path], law, weight=float(law.probs[index]))
                created.append(path)
        parents = [path for path in created if path in slots]
        if parents:  # one draft call for the whole next level
            q = normalised_law(
                draft.expand([draft_id[p[:-1]] for p in parents], [token_of[p] for p in parents], sampling)
            )
            for row, path in enumerate(parents):
                draft_id[path] = next_draft_id
                next_draft_id += 1
                q_of[path] = q[row]
    return asm.build()


def _convert_expansion(value: object) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidConfigError(
            f"expansion must be children per depth (e.g. (3, 2, 1)) or a list of paths, got {value!r}"
        )
    return tuple(tuple(v) if isinstance(v, Sequence) and not isinstance(v, (str, bytes)) else v for v in value)


@register("tree", "static")
@attrs.frozen
class StaticTreeBuilder(TreeBuilder):
    """A static tree of sampled children (SpecInfer).

    Args:
        expansion: children per depth ``(k1, ..., kd)`` or explicit child-slot
            paths. Default ``(4, 2, 2, 1)`` (the ``specinfer`` method's default).
        mode: ``"iid"`` (verify with ``"rejection-iid"``, SpecInfer's MSS) or
            ``"wor"`` (without replacement, verify with ``"rejection-wor"``).

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> draft = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)
        >>> draft.begin([0, 1])
        >>> builder = StaticTreeBuilder(expansion=[(0,), (1,), (0, 0)], mode="wor")
        >>> tree = builder.build(1, draft, SamplingConfig(), TorchRandom.seeded(0))
        >>> tree.parents.tolist()
        [-1, 0, 0, 1]
    """

    expansion: tuple = attrs.field(default=(4, 2, 2, 1), converter=_convert_expansion)
    mode: SampleMode = attrs.field(default=SampleMode.IID, converter=check_mode)
    paths: tuple[tuple[int, ...], ...] = attrs.field(init=False)

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.SAMPLED})
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"expansion": (2, 1), "mode": "iid"},
        {"expansion": (2, 1), "mode": "wor"},
        {"expansion": ((0,), (1,), (0, 0)), "mode": "wor"},
    )

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "paths", expansion_to_paths(self.expansion))

    @property
    def default_verifier(self) -> str:
        """``"rejection-iid"`` or ``"rejection-wor"``, by :attr:`mode`."""
        return "rejection-iid" if self.mode == SampleMode.IID else "rejection-wor"

    @property
    def max_nodes(self) -> int:
        return len(self.paths) + 1

    @property
    def max_depth(self) -> int:
        return max(len(p) for p in self.paths)

    def build(self, root_token: int, draft: DraftModel, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        return build_static_tree(self.paths, self.mode, root_token, draft, sampling, rng)


# the method(s) this builder serves (docs/methods.md)
register_method(Method("specinfer", "static", "rejection-iid", {"expansion": (4, 2, 2, 1), "mode": "iid"},
                "SpecInfer: static tree of i.i.d. sampled children, multi-step rejection (rule 3)"))
