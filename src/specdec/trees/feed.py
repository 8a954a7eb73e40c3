"""Caller-driven tree building: the builder asks for each level's draft logits, the caller answers.

Every registered builder grows its trees as a *build*: a generator that yields a
:class:`~specdec.draft_request.DraftRequest` (which nodes to draft: parent ids, tokens,
depths, attention over the draft tree) and receives that level's draft logits, until it
returns the :class:`~specdec.tree_batch.TreeBatch` (:meth:`TreeBuilder.feed_build
<specdec.trees.base.TreeBuilder.feed_build>`). Two clients drive a build:

- :func:`drive`: specdec's own drafts (:class:`~specdec.drafts.base.DraftModel`, HF LMs,
  EAGLE heads, callables, n-grams) answer through
  :meth:`~specdec.drafts.base.DraftModel.request_logits`; this is what
  :meth:`TreeBuilder.build_batch <specdec.trees.base.TreeBuilder.build_batch>` runs, so
  the engine's step takes this path;
- :class:`TreeFeed`: a serving engine's own draft runner, tensors in and out, each answer
  checked before the build goes on (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

import attrs
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch

__all__ = ["Build", "DraftSpec", "FeedBuilder", "TreeFeed", "drive"]

Build = Generator[DraftRequest, torch.Tensor, TreeBatch]
"""A tree build: yields :class:`~specdec.draft_request.DraftRequest`, receives ``[B, W]`` /
``[B, k, W]`` draft logits, returns the :class:`~specdec.tree_batch.TreeBatch`."""


@attrs.frozen(eq=False)
class DraftSpec:
    """What a build needs to know of the drafter, without the drafter.

    Attributes:
        vocab_size: ``V``, the target's vocabulary (the draft's logits are over it).
        proposal_ids: ``[Vd]`` int64 ascending target ids of the draft's proposal vocabulary
            (EAGLE-3's reduced vocabulary), or None: the builder then asks for ``[.., V]``
            logits; otherwise the level-wise builders ask for ``[.., Vd]``.
    """

    vocab_size: int
    proposal_ids: torch.Tensor | None = None

    @classmethod
    def of(cls, draft: DraftModel) -> "DraftSpec":
        """The spec of one of specdec's drafts."""
        return cls(draft.vocab_size, draft.proposal_ids)


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
        sampling: the generation's sampling configuration (the draft laws are processed by it).
        rng: the build's random source (a :class:`~specdec.rng.RowStreams` for ``B > 1``).
        spec: :class:`DraftSpec` (the vocabulary; the proposal vocabulary if any).
        compiler: a :class:`~specdec.engine.compiler.StepCompiler` (optional, level-wise builders).

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

    def __init__(self, builder: FeedBuilder, roots: torch.Tensor, sampling: SamplingConfig, rng: RandomSource,
                 spec: DraftSpec, *, compiler: Any = None) -> None:
        if not isinstance(roots, torch.Tensor) or roots.dim() != 1 or roots.dtype != torch.int64:
            raise InvalidConfigError(f"roots must be a [B] int64 tensor, got {getattr(roots, 'shape', roots)!r}")
        self.device = roots.device
        self._build = builder.feed_build(roots, spec, sampling, rng, compiler=compiler)
        self._request: DraftRequest | None = None
        self._tree: TreeBatch | None = None
        self._advance(None)

    def _advance(self, logits: torch.Tensor | None) -> None:
        try:
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
                f"({'[B, W]' if level == 0 else '[B, k, W]'}, W = {request.width}"
                f"{' (the proposal vocabulary)' if request.proposal else ''}), got {list(getattr(logits, 'shape', []))}"
            )
        if not logits.is_floating_point():
            raise InvalidConfigError(f"level {level}: logits must be floating point, got {logits.dtype}")
        if logits.device != self.device:
            raise InvalidConfigError(f"level {level}: logits are on {logits.device}, the roots on {self.device}")
        self._advance(logits)
        return self._request
