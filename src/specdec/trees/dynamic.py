"""Dynamic trees: EAGLE-2/3's beam-and-rerank construction (Li et al. 2024, 2025).

One generic routine, :func:`grow_dynamic_tree`, parametrised by a per-node
child-proposal function; the ``"eagle"`` builder proposes the top-K tokens
of ``q`` (deterministic children), RheoSampling (:mod:`specdec.trees.rheo`)
proposes top-(K-m) deterministic children plus sampled slots.

The construction (docs/trees.md, ``eagle``):

- *weight* of a node: ``q(x)`` for a deterministic child (a proxy for a
  sampled one); its *score* is the sum of log weights on its path.
- Level 1: the root's proposed children. Each further level: the best ``B``
  nodes of the newest level (a beam over all of that level's nodes, not per
  parent) are sent to the draft in one :meth:`DraftModel.expand` call and
  each gets its proposed children. ``depth`` levels in all.
- Finally the best ``N`` of all created nodes are kept.
- "Best" is the TOTAL order ``(-score, creation index)``; creation indices
  are given level by level, in creation order: beam rank of the parent, then
  the parent's proposal order (sampled children first, in draw order, then
  deterministic children by rank). Python's sort on these tuples is exact;
  ``torch.topk``/``torch.sort`` are never trusted with equal scores. Weights
  are ``<= 1`` so a child never outscores its parent, and on a tie the parent
  (created earlier) ranks first: the kept set is always a tree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch

from specdec.adapters import host_feed
from specdec.drafts.base import OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import UNTEMPERED, SamplingConfig, construction_config
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees._common import MAX_TREE_NODES, check_int, log_weights, normalised_law, top_tokens
from specdec.trees.base import TreeBuilder
from specdec.trees.feed import Build, DraftSpec
from specdec.trees.levelwise import LevelCompiler, LevelFn, eagle_level, levelwise_build
from specdec.methods import Method, register_method

__all__ = [
    "ChildProposal",
    "DynamicNode",
    "ProposeFn",
    "DynamicTreeBuilder",
    "EagleTreeBuilder",
    "DynamicLaws",
    "dynamic_reference",
    "grow_dynamic_tree",
    "rank_key",
    "keep_best",
]


@attrs.frozen
class ChildProposal:
    """One child a proposal function wants created under a node.

    Attributes:
        token: the child's token.
        kind: :attr:`NodeKind.DETERMINISTIC` or :attr:`NodeKind.SAMPLED`.
        weight: construction weight in ``(0, 1]`` (``q(x)``, or a proxy).
        law: for a sampled child, the exact law it was drawn from (one object
            shared by all sampled siblings); None for a deterministic child.
    """

    token: int
    kind: NodeKind
    weight: float
    law: SparseLaw | None = None

    def __attrs_post_init__(self) -> None:
        if (self.kind == NodeKind.SAMPLED) != (self.law is not None):
            raise ValueError("a sampled child needs its law; a deterministic child has none")
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"child weights must lie in (0, 1], got {self.weight!r}")


ProposeFn = Callable[[torch.Tensor, RandomSource], list[list[ChildProposal]]]
"""``propose(q, rng)``: for ``q`` ``[k, V]`` (float64 rows, the processed draft
laws of ``k`` nodes, on the draft's CUDA device or the CPU), the children of
each node in creation order: sampled children first in draw order, then
deterministic children by rank. Recorded laws must live on the CPU."""


class DynamicNode:
    """Bookkeeping for one created node of a dynamic tree (not part of the output)."""

    __slots__ = ("index", "parent", "token", "kind", "weight", "score", "law", "level", "draft_id")

    def __init__(
        self,
        index: int,
        parent: int,
        token: int,
        kind: NodeKind,
        weight: float,
        score: float,
        law: SparseLaw | None,
        level: int,
    ) -> None:
        self.index = index  # creation index (root 0)
        self.parent = parent  # creation index of the parent (-1 for the root)
        self.token = token
        self.kind = kind
        self.weight = weight
        self.score = score  # sum of log weights on the path
        self.law = law
        self.level = level
        self.draft_id: int | None = None  # id inside the draft model's step tree, once expanded

    def __repr__(self) -> str:
        return (
            f"DynamicNode(index={self.index}, parent={self.parent}, token={self.token}, "
            f"kind={NodeKind(self.kind).name}, weight={self.weight:.4g}, score={self.score:.4g})"
        )


RankKey = Callable[[DynamicNode], tuple]


def rank_key(node: DynamicNode) -> tuple[float, int]:
    """The total order of docs/trees.md (``eagle``): higher score first, then earlier creation."""
    return (-node.score, node.index)


def keep_best(nodes: Sequence[DynamicNode], num_keep: int, key: RankKey = rank_key) -> list[DynamicNode]:
    """The best ``num_keep`` draft nodes under ``key`` (the global rerank).

    Raises:
        RuntimeError: if the kept set is not closed under parents (impossible
            with :func:`rank_key`, since ancestors outrank descendants).
    """
    kept = sorted(nodes, key=key)[:num_keep]
    ids = {0} | {n.index for n in kept}
    for n in kept:
        if n.parent not in ids:
            raise RuntimeError(f"dynamic tree: node {n.index} kept without its parent {n.parent}")
    return kept


def _draft_id(node: DynamicNode) -> int:
    """The id of an expanded ``node`` in the draft model's step tree."""
    if node.draft_id is None:
        raise RuntimeError(f"dynamic tree: node {node.index} was not expanded")
    return node.draft_id


def _create_children(
    nodes: list[DynamicNode], parents: Sequence[DynamicNode], proposals: list[list[ChildProposal]]
) -> list[DynamicNode]:
    if len(proposals) != len(parents):
        raise RuntimeError(f"proposal function returned {len(proposals)} rows for {len(parents)} nodes")
    created = []
    logs = iter(log_weights([float(c.weight) for children in proposals for c in children]))
    for parent, children in zip(parents, proposals):
        for child in children:
            node = DynamicNode(
                index=len(nodes),
                parent=parent.index,
                token=int(child.token),
                kind=child.kind,
                weight=float(child.weight),
                score=parent.score + next(logs),
                law=child.law,
                level=parent.level + 1,
            )
            nodes.append(node)
            created.append(node)
    return created


def assemble(nodes: Sequence[DynamicNode], kept: Sequence[DynamicNode], vocab_size: int) -> DraftTree:
    """The :class:`DraftTree` of the root and ``kept`` nodes, in creation order."""
    asm = TreeAssembler(nodes[0].token, vocab_size)
    tree_index = {0: 0}
    for node in sorted(kept, key=lambda n: n.index):
        parent = tree_index[node.parent]
        if node.kind == NodeKind.SAMPLED:
            assert node.law is not None  # a sampled ChildProposal carries its law
            tree_index[node.index] = asm.add_sampled(parent, node.token, node.law, node.weight)
        else:
            tree_index[node.index] = asm.add_deterministic(parent, node.token, node.weight)
    return asm.build()


def grow_dynamic_tree(
    root_token: int,
    draft: OneRowDraft,
    sampling: SamplingConfig,
    rng: RandomSource,
    propose: ProposeFn,
    *,
    beam_width: int,
    depth: int,
    num_keep: int,
    key: RankKey = rank_key,
    keep: Callable[[Sequence[DynamicNode], int, RankKey], list[DynamicNode]] = keep_best,
    draw_sampling: SamplingConfig | None = None,
) -> DraftTree:
    """Grow a dynamic tree level by level, then keep the best ``num_keep`` nodes.

    Args:
        root_token: the last committed token (the root).
        draft: the draft model, committed up to ``root_token``.
        sampling: processing shared with the target (``q`` is processed).
        rng: source of every draw (only ``propose`` draws).
        propose: the per-node child proposal (:data:`ProposeFn`).
        beam_width: ``B``, nodes of the newest level expanded per level.
        depth: number of levels (level 1 = the root's children).
        num_keep: ``N``, draft nodes kept (root excluded).
        key: the node ranking (tests swap in broken ones to show they are caught).
        keep: the final selection (idem).
        draw_sampling: the processing of the law the builder draws by, when it is
            not ``sampling`` (``rank_law="untempered"``): ``propose(q, rng, q_draw)``
            then gets both laws, from the same draft forward.

    Returns:
        The pruned tree; its nodes are in creation order.
    """
    root = DynamicNode(0, -1, int(root_token), NodeKind.ROOT, 1.0, 0.0, None, 0)
    root.draft_id = 0
    nodes = [root]
    configs = (sampling,) if draw_sampling is None else (sampling, draw_sampling)

    def children(laws: list[torch.Tensor]) -> list[list[ChildProposal]]:
        qs = [normalised_law(q, on_device=True) for q in laws]
        return propose(qs[0], rng) if draw_sampling is None else propose(qs[0], rng, qs[1])  # type: ignore[call-arg]

    level = _create_children(nodes, [root], children([q.unsqueeze(0) for q in draft.root_laws(configs)]))
    next_draft_id = 1
    for _ in range(depth - 1):
        if not level:
            break
        beam = sorted(level, key=key)[:beam_width]
        laws = draft.expand_laws([_draft_id(nodes[n.parent]) for n in beam], [n.token for n in beam], configs)
        for n in beam:
            n.draft_id = next_draft_id
            next_draft_id += 1
        level = _create_children(nodes, beam, children(laws))
    kept = keep(nodes[1:], num_keep, key)
    return assemble(nodes, kept, draft.vocab_size)


def _check_positive(_inst: object, attribute: attrs.Attribute, value: object) -> None:
    check_int(attribute.name, value, 1, MAX_TREE_NODES - 1)  # K, depth, N: at most a tree's node bound


def _check_beam(_inst: object, _attr: object, value: int | None) -> None:
    if value is not None:
        check_int("B", value, 1)


RANK_LAWS = ("untempered", "sampling")
"""The draft laws a dynamic builder can rank by (docs/trees.md, "The construction law"):
``"untempered"``, ``softmax`` of the draft's logits at every temperature, as
EAGLE's reference drafting does (the default); ``"sampling"``, ``q`` processed
like the target's ``p`` (temperature, top-k, top-p)."""


def _check_rank_law(_inst: object, _attr: object, value: object) -> None:
    if value not in RANK_LAWS:
        raise InvalidConfigError(f"rank_law must be one of {', '.join(RANK_LAWS)}, got {value!r}")


@attrs.frozen
class DynamicTreeBuilder(TreeBuilder):
    """Common parameters and construction of the EAGLE-style dynamic builders.

    Subclasses implement :meth:`propose`. The ranking (:meth:`rank_key`) and
    the final selection (:meth:`keep`) are methods so that tests can
    demonstrate that broken variants are caught; production code does not
    override them.

    Args:
        K: children per expanded node (``>= 1``).
        B: beam width, nodes of the newest level expanded per level
            (``>= 1``; default ``K``, as EAGLE-2).
        depth: number of levels below the root (``>= 1``).
        N: draft nodes kept after the global rerank (root excluded, ``>= 1``).
        rank_law: keyword only; the draft law the tree is ranked by at ``T > 0``
            (:data:`RANK_LAWS`): ``"untempered"`` (default), the draft's
            ``softmax(logits)`` whatever the temperature, as EAGLE's reference
            drafting; ``"sampling"``, ``q`` processed like ``p`` (the default
            until 2026-12-03: see the changelog). The top-K, the deterministic weights
            and the path scores come from that law; RheoSampling's sampled
            children are drawn (and recorded) by ``q`` processed like ``p``
            either way. At ``T = 0``, and at ``T = 1`` without top-k / top-p,
            the two are the same law. Lossless either way (docs/trees.md,
            "The construction law").
    """

    K: int = attrs.field(default=10, validator=_check_positive)
    B: int | None = attrs.field(default=None, validator=_check_beam)
    depth: int = attrs.field(default=6, validator=_check_positive)
    N: int = attrs.field(default=60, validator=_check_positive)
    rank_law: str = attrs.field(default="untempered", validator=_check_rank_law, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.B is None:
            object.__setattr__(self, "B", self.K)

    # ----------------------------------------------------------- hooks
    def propose(self, q: torch.Tensor, rng: RandomSource) -> list[list[ChildProposal]]:
        """Children of each of ``k`` nodes with draft laws ``q`` ``[k, V]`` (float64)."""
        raise NotImplementedError

    def proposer(self, sampling: SamplingConfig) -> ProposeFn:
        """The child proposal used under ``sampling`` (default: :meth:`propose`)."""
        return self.propose

    def rank_key(self, node: DynamicNode) -> tuple:
        """The total order (-score, creation index) (docs/trees.md, ``eagle``)."""
        return rank_key(node)

    def keep(self, nodes: Sequence[DynamicNode], num_keep: int, key: RankKey) -> list[DynamicNode]:
        """The global rerank: best ``num_keep`` nodes."""
        return keep_best(nodes, num_keep, key)

    # ------------------------------------------------------- TreeBuilder
    @property
    def children_per_node(self) -> int:
        """Most children one expanded node can get."""
        return self.K

    @property
    def max_created(self) -> int:
        """Most draft nodes the construction can create before the rerank."""
        k, b = self.children_per_node, int(self.B)  # type: ignore[arg-type]
        return k + (self.depth - 1) * b * k

    @property
    def max_nodes(self) -> int:
        return min(self.N, self.max_created) + 1

    @property
    def max_depth(self) -> int:
        return self.depth

    def level_fn(self, sampling: SamplingConfig) -> "LevelFn | None":
        """The tensor level function (:mod:`specdec.trees.levelwise`) under
        ``sampling``, or None for a builder with only the per-node form."""
        return None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The tensor form is declared by the class that defines :meth:`level_fn` (its
        :attr:`~specdec.trees.base.TreeBuilder.batch_form` is then True); a subclass that
        overrides a per-node hook (:meth:`propose`, :meth:`proposer`, :meth:`rank_key`,
        :meth:`keep`) without its own :meth:`level_fn` has none, since the tensor form would
        ignore the hook (the tests' mutants are such classes): it builds per node."""
        super().__init_subclass__(**kwargs)
        if "level_fn" in cls.__dict__:
            cls.batch_form = True
        elif any(hook in cls.__dict__ for hook in ("propose", "proposer", "rank_key", "keep")):
            cls.batch_form = False

    def draws_per_node(self, sampling: SamplingConfig) -> int:
        """Batched draws the level function makes per expanded node under ``sampling``."""
        return 0

    def construction(self, sampling: SamplingConfig) -> SamplingConfig:
        """:attr:`DynamicLaws.construction` under ``sampling`` (for callers outside a build: a build
        derives its :class:`DynamicLaws` once)."""
        return DynamicLaws.of(self, sampling).construction

    def draw_config(self, sampling: SamplingConfig) -> SamplingConfig | None:
        """:attr:`DynamicLaws.draw` under ``sampling`` (idem)."""
        return DynamicLaws.of(self, sampling).draw

    def feed_build(self, roots: int | torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: LevelCompiler | None = None) -> Build:
        """The build (:func:`~specdec.trees.levelwise.levelwise_build`, tensor ops, no host read):
        the root's draft logits, then one request per level for the beam's ``B`` nodes of every tree.

        ``compiler`` (a :class:`~specdec.engine.compiler.StepCompiler`), if given, compiles each
        level's work between draft forwards and the final rerank and layout as whole graphs; the
        level's draws then come from a uniform table drawn per level (the same law, another use of
        the stream). A subclass without a tensor form (:attr:`batch_form` False: it redefines a
        per-node hook) grows :func:`dynamic_reference` per row (:func:`specdec.adapters.host_feed`).
        """
        laws = DynamicLaws.of(self, sampling)  # the sampling's processings, derived once per build
        if not self.batch_form:  # the per-node form, row by row (specdec.adapters)
            def per_node(root_token: int, draft: OneRowDraft, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
                return dynamic_reference(self, root_token, draft, sampling, rng, laws)

            per_node.__qualname__ = f"{type(self).__qualname__} (per node)"
            return host_feed(per_node, torch.as_tensor(roots, dtype=torch.int64).reshape(-1), spec, sampling, rng)
        level = self.level_fn(sampling)
        assert level is not None, f"{type(self).__name__} declares a tensor form (level_fn) that returned None"
        return levelwise_build(
            roots, spec, laws.construction, rng, level,
            children=self.children_per_node, beam_width=int(self.B), depth=self.depth, num_keep=self.N,  # type: ignore[arg-type]
            draws_per_node=laws.draws_per_node,
            compiler=compiler, compile_key=(self, sampling),
            draw_sampling=laws.draw,
        )


@attrs.frozen
class DynamicLaws:
    """The processings of the draft law a dynamic builder uses under one sampling configuration,
    derived once per build.

    Attributes:
        construction: the law the builder ranks and draws by (:func:`~specdec.sampling.construction_config`,
            or the untempered law with ``rank_law="untempered"``).
        draws_per_node: the level function's batched draws per expanded node.
        draw: the processing of the law the sampled children are drawn by, when it is not
            ``construction``'s (``rank_law="untempered"`` at ``T > 0`` in a builder that draws,
            unless the two processings are the same); else None.
    """

    construction: SamplingConfig
    draws_per_node: int
    draw: SamplingConfig | None

    @classmethod
    def of(cls, builder: DynamicTreeBuilder, sampling: SamplingConfig) -> DynamicLaws:
        target = construction_config(sampling)
        construction = UNTEMPERED if builder.rank_law == "untempered" else target
        draws = builder.draws_per_node(sampling)
        return cls(construction, draws, None if draws == 0 or target == construction else target)


def dynamic_reference(builder: DynamicTreeBuilder, root_token: int, draft: OneRowDraft, sampling: SamplingConfig,
                      rng: RandomSource, laws: DynamicLaws | None = None) -> DraftTree:
    """The per-node reference of ``builder``'s build: :func:`grow_dynamic_tree` with its per-node
    hooks (:meth:`~DynamicTreeBuilder.proposer`, :meth:`~DynamicTreeBuilder.rank_key`,
    :meth:`~DynamicTreeBuilder.keep`) from the draft law processed by
    :func:`~specdec.sampling.construction_config` (the target's processing at ``T > 0``; the
    draft's untempered law at ``T = 0``). The tests compare it with the tensor build; a builder
    without a tensor form builds by it.

    Args:
        laws: the processings under ``sampling`` (:class:`DynamicLaws`; derived when not given).
    """
    laws = DynamicLaws.of(builder, sampling) if laws is None else laws
    return grow_dynamic_tree(
        root_token,
        draft,
        laws.construction,
        rng,
        builder.proposer(sampling),
        beam_width=int(builder.B),  # type: ignore[arg-type]
        depth=builder.depth,
        num_keep=builder.N,
        key=builder.rank_key,
        keep=builder.keep,
        draw_sampling=laws.draw,
    )


def eagle_proposal(q: torch.Tensor, K: int) -> list[list[ChildProposal]]:
    """EAGLE-2 children: the top-``K`` tokens of each row of ``q``, deterministic,
    weight ``q(x)``; tokens with ``q = 0`` are never children.

    Within one node, equal ``q`` values are ordered by token id (a rule that
    depends on ``q`` only, see :func:`~specdec.trees._common.top_tokens`).

    Args:
        q: ``[k, V]`` float64 draft laws.
        K: children per node.
    """
    return [
        [ChildProposal(token, NodeKind.DETERMINISTIC, prob) for token, prob in row]
        for row in top_tokens(q, K)
    ]


@register("tree", "eagle")
@attrs.frozen
class EagleTreeBuilder(DynamicTreeBuilder):
    """EAGLE-2 dynamic tree (used by the ``eagle2`` and ``eagle3`` methods).

    Every node's children are its top-``K`` draft tokens (deterministic);
    verified by sample-and-match (rule 2, verifier ``"match"``) at ``T > 0``
    and by greedy matching (rule 1, ``"greedy"``) at ``T = 0``.

    Defaults ``K=10, depth=6, N=60`` (B = K) are EAGLE-2's (Li et al. 2024,
    "total tokens 60, depth 6, top-k 10").

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> draft = CallableLM(lambda p: torch.log(torch.tensor([[0.5, 0.3, 0.2]] * len(p))), vocab_size=3)
        >>> from specdec.trees import build_tree
        >>> draft.begin([0])
        >>> tree = build_tree(EagleTreeBuilder(K=2, depth=2, N=4), 0, draft, SamplingConfig(), TorchRandom.seeded(0))
        >>> tree.tokens.tolist(), tree.parents.tolist()
        ([0, 0, 1, 0, 1], [-1, 0, 0, 1, 1])
    """

    batch_form = True

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.DETERMINISTIC})
    default_verifier: ClassVar[str] = "match"

    @property
    def sibling_modes(self) -> frozenset[SampleMode]:
        """Top-K children only: nothing sampled."""
        return frozenset()
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"K": 2, "B": 1, "depth": 3, "N": 3},
        {"K": 3, "B": 2, "depth": 2, "N": 4},
    )

    def propose(self, q: torch.Tensor, rng: RandomSource) -> list[list[ChildProposal]]:
        return eagle_proposal(q, self.K)

    def level_fn(self, sampling: SamplingConfig) -> LevelFn:
        K = self.K
        return lambda q, rng, live: eagle_level(q, K)


# the method(s) this builder serves (docs/methods.md)
register_method(Method("eagle2", "eagle", "match", {},
                "EAGLE-2: dynamic top-K tree with global rerank, sample-and-match (rule 2)"))
register_method(Method("eagle3", "eagle", "match", {},
                "EAGLE-3: the EAGLE-2 tree driven by an EAGLE-3 draft head, sample-and-match (rule 2)"))
