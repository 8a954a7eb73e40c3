"""Caller-driven tree building: the builder asks for each level's draft logits, the caller answers.

Every registered builder grows its trees as a *build*: a generator that yields a
:class:`~specdec.draft_request.DraftRequest` (which nodes to draft: parent ids, tokens,
depths, attention over the draft tree) and receives that level's draft logits, until it
returns the :class:`~specdec.tree_batch.TreeBatch` (:meth:`TreeBuilder.feed_build
<specdec.trees.base.TreeBuilder.feed_build>`). Two clients drive a build:

- :func:`drive`: specdec's own drafts (:class:`~specdec.drafts.base.DraftModel`, HF LMs,
  EAGLE heads, callables, n-grams) answer through
  :meth:`~specdec.drafts.base.DraftModel.request_logits`; this is what
  :func:`~specdec.trees.base.build_trees` runs, so
  the engine's step takes this path;
- :class:`TreeFeed`: a serving engine's own draft runner, tensors in and out, each answer
  checked before the build goes on (docs/serving.md).

Per-request sampling (rows with their own :class:`~specdec.sampling.SamplingConfig`): rows
that share a configuration form a *group*; :func:`group_build` runs the builder's build once
per group, under the group's configuration and from its rows' random sources, and is itself a
build: each level it yields ONE request over all ``B`` rows (each group's new nodes numbered
after the draft ids already given; a group that asks fewer nodes, or has finished, gets filler
slots: the root's token under the root, not live), receives that level's logits for all rows and
hands each group its rows; the groups' trees are stacked in row order
(:meth:`TreeBatch.scatter_rows <specdec.tree_batch.TreeBatch.scatter_rows>`). A row takes exactly
the draws it takes in a batch of its own configuration, and one draft forward per level serves
every row. :class:`TreeFeed` runs it when given one configuration per row; specdec's step drives
it with its own draft (:func:`specdec.engine.row_sampling.build_groups`).
"""

from __future__ import annotations

import numbers
from collections.abc import Generator, Sequence
from typing import Any, Protocol, cast

import attrs
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel
from specdec.drafts.parallel import ParallelDraft
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch

__all__ = ["Build", "DraftSpec", "FeedBuilder", "TreeFeed", "config_groups", "drive", "group_build", "group_sources",
           "merged_build"]

Build = Generator[DraftRequest, torch.Tensor, TreeBatch]
"""A tree build: yields :class:`~specdec.draft_request.DraftRequest`, receives ``[B, W]`` /
``[B, k, W]`` draft logits, returns the :class:`~specdec.tree_batch.TreeBatch`."""


@attrs.frozen(eq=False)
class DraftSpec:
    """What a build needs to know of the drafter, without the drafter.

    Attributes:
        vocab_size: ``V``, the target's vocabulary (the draft's logits are over it), a
            positive integer.
        proposal_ids: ``[Vd]`` int64 ascending target ids of the draft's proposal vocabulary
            (EAGLE-3's reduced vocabulary), or None: the builder then asks for ``[.., V]``
            logits; otherwise the level-wise builders ask for ``[.., Vd]``.
        block_size: the drafter's parallel form (:attr:`ParallelDraft.block_size
            <specdec.drafts.parallel.ParallelDraft.block_size>`): a builder may ask for the laws of up to
            this many next positions in one parallel request (``DraftRequest.block``); 0: none.

    Raises:
        InvalidConfigError: ``vocab_size`` is not a positive integer; ``proposal_ids`` is not a
            1-D integer tensor of ``1 .. V`` ids. (Their values, distinct ascending ids in
            ``[0, V)``, are checked by :class:`TreeFeed`, which reads them only on the CPU.)
    """

    vocab_size: int
    proposal_ids: torch.Tensor | None = None
    block_size: int = 0

    def __attrs_post_init__(self) -> None:  # metadata only: DraftSpec.of runs on every build
        V = self.vocab_size
        if isinstance(V, bool) or not isinstance(V, numbers.Integral) or V < 1:
            raise InvalidConfigError(f"DraftSpec vocab_size must be a positive integer, got {V!r}")
        ids = self.proposal_ids
        if ids is None:
            return
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() \
                or ids.dtype == torch.bool or not 1 <= ids.numel() <= V:
            raise InvalidConfigError(
                f"DraftSpec proposal_ids must be a [Vd] integer tensor with 1 <= Vd <= vocab_size ({V}), got "
                f"{getattr(ids, 'dtype', type(ids).__name__)} {list(getattr(ids, 'shape', []))}"
            )

    @classmethod
    def of(cls, draft: DraftModel) -> "DraftSpec":
        """The spec of one of specdec's drafts."""
        block = cast(ParallelDraft, draft).block_size if draft.parallel_form else 0
        return cls(draft.vocab_size, draft.proposal_ids, block)


class FeedBuilder(Protocol):
    """What :class:`TreeFeed` needs of a builder: :meth:`TreeBuilder.feed_build
    <specdec.trees.base.TreeBuilder.feed_build>` (declared on the ABC)."""

    def feed_build(self, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        ...


def drive(build: Build, draft: DraftModel) -> TreeBatch:
    """Run ``build`` to its tree, answering every request with ``draft``'s logits."""
    request = next(build)
    while True:
        logits = draft.request_logits(request)
        try:
            request = build.send(logits)
        except StopIteration as done:
            return done.value


class TreeFeed:
    """A build driven by the caller's draft runner (module docstring).

    Args:
        builder: any registered tree builder with a feed form (every built-in one).
        roots: ``[B]`` int64 the rows' last committed tokens, on the device the runner's
            logits will be on.
        sampling: the generation's sampling configuration (the draft laws are processed by it),
            or one per row (``B`` configurations: the rows are built in configuration groups,
            each request still covering all rows; :func:`group_build`).
        rng: the build's random source (a :class:`~specdec.rng.RowStreams` for ``B > 1``).
        spec: :class:`DraftSpec` (the vocabulary; the proposal vocabulary if any).
        compiler: a :class:`~specdec.engine.compiler.StepCompiler` (optional, level-wise builders).

    Raises:
        InvalidConfigError: an empty batch; ``rng`` is not one source per row (a
            :class:`~specdec.rng.RowStreams` of ``B`` sources, or one source for one row);
            ``roots`` is not a ``[B]`` int64 tensor, or (on the CPU) holds an id
            outside ``[0, V)``; ``spec.proposal_ids`` (on the CPU) are not distinct ascending ids
            in ``[0, V)``. Values on an accelerator are not read (no host read): keeping them in
            range is the engine's part.

    Example (a chain, drafted by a toy runner that reads only each new node's token):
        >>> import torch
        >>> from specdec import SamplingConfig
        >>> from specdec.rng import TorchRandom
        >>> from specdec.trees.chain import ChainTreeBuilder
        >>> table = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
        >>> feed = TreeFeed(ChainTreeBuilder(depth=2), torch.tensor([3]), SamplingConfig(temperature=1.0),
        ...                 TorchRandom.seeded(0), DraftSpec(vocab_size=5))
        >>> while feed.request is not None:
        ...     r = feed.request
        ...     feed.give(r.level, table[torch.tensor([3])] if r.level == 0 else table[r.tokens])
        >>> feed.tree.num_nodes.tolist()
        [3]
    """

    def __init__(self, builder: FeedBuilder, roots: torch.Tensor,
                 sampling: SamplingConfig | Sequence[SamplingConfig], rng: RandomSource,
                 spec: DraftSpec, *, compiler: Any = None) -> None:
        if not isinstance(roots, torch.Tensor) or roots.dim() != 1 or roots.dtype != torch.int64:
            raise InvalidConfigError(f"roots must be a [B] int64 tensor, got {getattr(roots, 'shape', roots)!r}")
        if roots.numel() == 0:
            raise InvalidConfigError("roots: an empty batch (0 rows); a feed builds at least one tree")
        _check_ids(roots, spec)
        B = int(roots.numel())
        sources = len(rng.sources) if isinstance(rng, RowStreams) else 1
        if sources != B:
            raise InvalidConfigError(
                f"rng: {sources} random source(s) for {B} rows; give one random source per row (a RowStreams of {B} sources)")
        self.device = roots.device
        if isinstance(sampling, SamplingConfig):
            self._build = builder.feed_build(roots, spec, sampling, rng, compiler=compiler)
        else:  # one configuration per row: the merged build of the configuration groups
            if isinstance(sampling, (str, bytes)) or not isinstance(sampling, Sequence) or len(sampling) != roots.numel():
                raise InvalidConfigError(
                    f"sampling must be a SamplingConfig or one per row ({roots.numel()} rows), got {sampling!r:.80}")
            groups = config_groups(sampling)
            if len(groups) == 1:
                self._build = builder.feed_build(roots, spec, groups[0][0], rng, compiler=compiler)
            else:
                rngs = group_sources(rng, [rows for _, rows in groups])
                self._build = group_build(builder, roots, spec, [
                    (config, torch.tensor(rows, dtype=torch.int64, device=roots.device)) for config, rows in groups
                ], rngs)
        self._request: DraftRequest | None = None
        self._tree: TreeBatch | None = None
        self._advance(None)

    def _advance(self, logits: torch.Tensor | None) -> None:
        try:  # the runner's logits are read as values (a tensor that requires grad is not differentiated)
            with torch.no_grad():
                self._request = next(self._build) if logits is None else self._build.send(logits)
        except StopIteration as done:
            self._request, self._tree = None, done.value

    @property
    def request(self) -> DraftRequest | None:
        """The level the builder waits for, or None once the tree is built."""
        return self._request

    @property
    def tree(self) -> TreeBatch:
        """The built tree batch.

        Raises:
            InvalidConfigError: levels are still to be fed.
        """
        if self._tree is None:
            assert self._request is not None
            raise InvalidConfigError(f"the tree is not built yet: level {self._request.level} is still to be fed")
        return self._tree

    def give(self, level: int, logits: torch.Tensor) -> DraftRequest | None:
        """Feed level ``level``'s draft logits; returns the next request (None when the tree is built).

        Args:
            level: the request's :attr:`~specdec.draft_request.DraftRequest.level` (fed in order, once).
            logits: ``[B, W]`` at level 0, ``[B, k, W]`` after (``request.expected_shape``), floating
                point, on the roots' device.

        Raises:
            InvalidConfigError: the tree is already built; a level fed twice or out of order;
                logits of the wrong shape, dtype or device. Nothing is changed when it raises.
        """
        request = self._request
        if request is None:
            raise InvalidConfigError(f"level {level} fed after the tree was built (no level is waiting)")
        if level != request.level:
            what = "fed twice" if level < request.level else "fed out of order"
            raise InvalidConfigError(f"level {level} {what}: the builder waits for level {request.level}")
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != request.expected_shape:
            raise InvalidConfigError(
                f"level {level}: logits must have shape {list(request.expected_shape)} "
                f"({'[B, block, W]: a parallel request' if request.block else '[B, W]' if level == 0 else '[B, k, W]'}"
                f", W = {request.width}"
                f"{' (the proposal vocabulary)' if request.proposal else ''}), got {list(getattr(logits, 'shape', []))}"
            )
        if not logits.is_floating_point():
            raise InvalidConfigError(f"level {level}: logits must be floating point, got {logits.dtype}")
        if logits.device != self.device:
            raise InvalidConfigError(f"level {level}: logits are on {logits.device}, the roots on {self.device}")
        self._advance(logits)
        return self._request


def _first(bad: torch.Tensor) -> int | None:
    """The first ``True`` of a 1-D bool CPU tensor, or None (no read unless one is ``True``)."""
    hits = bad.nonzero().view(-1)
    return int(hits[0]) if hits.numel() else None


def _check_ids(roots: torch.Tensor, spec: DraftSpec) -> None:
    """``roots`` and ``spec.proposal_ids`` in ``[0, V)`` (the ids ascending), where they are on
    the CPU: a CPU selection's size is known without a read; an accelerator's values are not read."""
    V = spec.vocab_size
    if roots.device.type == "cpu":
        b = _first((roots < 0) | (roots >= V))
        if b is not None:
            raise InvalidConfigError(f"roots[{b}] = {int(roots[b])} outside the vocabulary [0, {V}) (DraftSpec vocab_size)")
    ids = spec.proposal_ids
    if ids is not None and ids.device.type == "cpu":
        i = _first(torch.cat([(ids[:1] < 0) | (ids[:1] >= V), (ids[1:] <= ids[:-1]) | (ids[1:] >= V)]))
        if i is not None:
            raise InvalidConfigError(
                f"DraftSpec proposal_ids must be distinct ascending ids in [0, {V}); entry {i} is {int(ids[i])}"
                + (f" after {int(ids[i - 1])}" if i else "")
            )


# ------------------------------------------------------------ per-row sampling: configuration groups
def config_groups(configs: Sequence[SamplingConfig]) -> list[tuple[SamplingConfig, list[int]]]:
    """The distinct configurations and their rows (host ints), in order of first appearance.

    Raises:
        InvalidConfigError: an entry is not a :class:`~specdec.sampling.SamplingConfig`.
    """
    order: dict[SamplingConfig, list[int]] = {}
    for b, c in enumerate(configs):
        if not isinstance(c, SamplingConfig):
            raise InvalidConfigError(f"row {b}: sampling must be a SamplingConfig, got {type(c).__name__}")
        order.setdefault(c, []).append(b)
    return list(order.items())


def group_sources(rng: RandomSource, groups: Sequence[Sequence[int]]) -> list[RandomSource]:
    """Each group's random source: the :class:`~specdec.rng.RowStreams` of its rows' sources
    (the sources themselves, so their draws advance as in a batch of that group alone).

    Raises:
        InvalidConfigError: ``rng`` is not one source per row.
    """
    if not isinstance(rng, RowStreams):
        raise InvalidConfigError("per-row sampling needs one random source per row (RowStreams)")
    return [rng.subset(rows) for rows in groups]


def group_build(
    builder: FeedBuilder,
    roots: torch.Tensor,
    spec: DraftSpec,
    groups: Sequence[tuple[SamplingConfig, torch.Tensor]],
    rngs: Sequence[RandomSource],
) -> Build:
    """The merged build of ``B`` rows in groups (module docstring).

    Args:
        roots: ``[B]`` int64 the rows' last committed tokens.
        spec: the drafter's vocabulary.
        groups: each configuration with its rows (``[k]`` int64 on the roots' device); the groups
            partition ``0 .. B - 1``.
        rngs: one source per group (:func:`group_sources`).

    Raises:
        InvalidConfigError: the builder has no caller-driven form, or the groups ask for the
            draft's proposal vocabulary and for the full vocabulary at the same level.
    """
    index = [ix.to(roots.device) for _, ix in groups]
    try:
        builds: list[Build] = [builder.feed_build(roots.index_select(0, ix), spec, cfg, rng)
                               for ix, (cfg, _), rng in zip(index, groups, rngs)]
    except InvalidConfigError as exc:
        raise InvalidConfigError(f"per-row sampling builds each configuration's trees through feed_build: {exc}") from exc
    return (yield from merged_build(builds, index, roots))


def merged_build(parts: Sequence[Build], index: Sequence[torch.Tensor], roots: torch.Tensor) -> Build:
    """One build over ``B`` rows from builds over parts of them: each level yields ONE request over
    all rows (each part's new nodes numbered after the draft ids already given; a part that asks
    fewer nodes, or has finished, gets filler slots), hands each part its rows' logits, and stacks
    the parts' trees in row order. :func:`group_build`'s merge, and the host builds' one
    (:func:`specdec.adapters.host_feed`, one part per row).

    Args:
        parts: the parts' builds (not started).
        index: each part's rows, ``[k]`` int64 on the roots' device; the parts partition ``0 .. B - 1``.
        roots: ``[B]`` int64 the rows' last committed tokens.
    """
    B = int(roots.shape[0])
    builds: list[Build | None] = list(parts)
    trees: list[TreeBatch | None] = [None] * len(builds)
    requests: list[DraftRequest | None] = []
    try:
        for g, build in enumerate(builds):
            assert build is not None
            requests.append(_next(build, None, trees, g))
        merged = _Numbering(len(builds), roots.device)
        while any(r is not None for r in requests):
            logits = yield merged.request(requests, index, roots, B)  # [B, W] at level 0, [B, k, W] after
            for g, (build, asked) in enumerate(zip(builds, requests)):
                if build is None or asked is None:
                    continue
                part = logits.index_select(0, index[g])
                if asked.level > 0 or asked.block:
                    part = part[:, : asked.new_nodes or asked.block]
                builds[g] = None  # (a part that raises is finished)
                requests[g] = _next(build, part, trees, g)
                if requests[g] is not None:
                    builds[g] = build
    finally:  # a part raised, or the merged build was abandoned: the other parts end too
        for build in builds:
            if build is not None:
                build.close()
    done = []
    for ix, tree in zip(index, trees):
        assert tree is not None
        done.append((ix, tree))
    return TreeBatch.scatter_rows(done, B)


def _next(build: Build, logits: torch.Tensor | None, trees: list[TreeBatch | None], g: int) -> DraftRequest | None:
    try:
        return next(build) if logits is None else build.send(logits)
    except StopIteration as done:
        trees[g] = done.value
        return None


class _Numbering:
    """The merged draft numbering: each level's nodes, group after group's padded width, numbered
    on from the previous level's (draft node 0: every row's root). ``ids[g]`` maps group ``g``'s own
    draft ids (contiguous from its root, 0) to the merged ones, on the device: a parent's merged id
    is one gather, with no host-built tensor."""

    def __init__(self, groups: int, device: torch.device) -> None:
        self.ids = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(groups)]
        self.next_id = 1
        self.earlier: list[torch.Tensor] = []

    def request(self, requests: Sequence[DraftRequest | None], index: Sequence[torch.Tensor],
                roots: torch.Tensor, B: int) -> DraftRequest:
        live_requests = [r for r in requests if r is not None]
        proposal = {r.proposal for r in live_requests}
        if len(proposal) > 1:
            raise InvalidConfigError(
                "per-row sampling: the configurations' builds ask for the draft's proposal vocabulary and for the "
                "full vocabulary at the same level; one draft call cannot answer both")
        level = live_requests[0].level
        width = live_requests[0].width
        if level == 0:  # (a parallel request, block > 0, is one level-0 call: each part reads its own block)
            return DraftRequest(level=0, rows=B, width=width, proposal=proposal.pop(),
                                block=max(r.block for r in live_requests))
        k = max(r.new_nodes for r in live_requests)
        first = self.next_id
        device = roots.device
        parents = torch.zeros(B, k, dtype=torch.int64, device=device)  # fillers hang from the root
        tokens = roots.view(B, 1).expand(B, k).clone()  # ... and carry its token
        live = torch.zeros(B, k, dtype=torch.bool, device=device)
        for g, r in enumerate(requests):  # a finished group (None) keeps its numbering; its rows get fillers
            if r is None:
                continue
            assert r.parents is not None and r.tokens is not None
            assert r.first_id == self.ids[g].numel(), "a build numbers its draft nodes contiguously"
            kg, g_rows = r.new_nodes, index[g].numel()
            parents[index[g], :kg] = self.ids[g][r.parents.to(device).expand(g_rows, kg)]
            tokens[index[g], :kg] = r.tokens.to(device).expand(g_rows, kg)
            live[index[g], :kg] = True if r.live is None else r.live.to(device).expand(g_rows, kg)
            self.ids[g] = torch.cat([self.ids[g], torch.arange(first, first + kg, device=device)])
        self.next_id += k
        request = DraftRequest(level=level, rows=B, width=width, proposal=proposal.pop(), parents=parents,
                               tokens=tokens, live=live, first_id=first, earlier=tuple(self.earlier))
        self.earlier.append(parents)
        return request
