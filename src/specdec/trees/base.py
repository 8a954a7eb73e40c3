"""The tree builder interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from specdec.adapters import host_feed
from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import Build, DraftSpec, drive

__all__ = ["TreeBuilder"]


class TreeBuilder(ABC):
    """Builds one step's :class:`~specdec.tree.DraftTree` from a draft model.

    Contract:

    - The builder obtains draft laws only from
      :meth:`DraftModel.root_distribution` / :meth:`DraftModel.expand` and
      samples only through ``rng``; every sampled child records the exact law
      it was drawn from, every top-K child is marked deterministic.
    - Whether a child is kept may depend on the identities of siblings tested
      *before* it at the same node, never on those tested after it
      (docs/trees.md, ``rheo``). Necessary, not sufficient: rule 3 needs every
      i.i.d. draw kept, repeats included (docs/trees.md, "Writing a builder").
    - :attr:`max_nodes` bounds ``n`` (root included) for every call, so the
      generator can check the context budget before it starts.
    - :attr:`produces` names the child kinds the builder can emit, and
      :attr:`sibling_modes` how it draws several sampled children of one node,
      so a method is checked against its verifier when it is composed.
    - :attr:`example_options` gives small option sets (trees of a few nodes)
      that the registry-parametrised exact tests build the builder with, each
      verified by :attr:`default_verifier`: a registered builder is proven
      lossless by whole-tree enumeration the moment it is registered.
    """

    registry_name: ClassVar[str] = "?"
    produces: ClassVar[frozenset[NodeKind]] = frozenset()
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = ()
    default_verifier: ClassVar[str] = ""
    batch_form: ClassVar[bool] = False
    """Declared: the class has a tensor form that grows ``B`` trees at once (batched
    generation); :meth:`grows_batches` says whether an instance uses it under a sampling."""

    @property
    def sibling_modes(self) -> frozenset[SampleMode] | None:
        """The sampling modes in which this builder may draw *several* sampled
        children of one node (the verifier must support each: rules 3/6 need
        i.i.d. siblings, rule 4 siblings without replacement; docs/verifiers.md).
        Default None (undeclared: checked on every tree instead); the shaped builders
        read it from their shape (:class:`~specdec.trees.static.ShapedTreeBuilder`)."""
        return None

    @property
    @abstractmethod
    def max_nodes(self) -> int:
        """Upper bound on the number of nodes (root included) of a built tree."""

    @property
    @abstractmethod
    def max_depth(self) -> int:
        """Upper bound on the depth of a built tree."""

    def grows_batches(self, sampling: SamplingConfig) -> bool:
        """Whether :meth:`build_batch` grows ``B`` trees at once from a draft in rows mode
        (one set of tensor ops per level), as batched generation needs under ``sampling``.
        Default: :attr:`batch_form` (False: the builder builds one host tree per step)."""
        return self.batch_form

    def build_batch(
        self,
        root_token: int | torch.Tensor,
        draft: DraftModel | None,
        sampling: SamplingConfig,
        rng: RandomSource,
        *,
        compiler: Any = None,
    ) -> TreeBatch:
        """The step's build: the trees of the ``B`` rows whose roots are ``root_token`` (``[B]``
        int64, or one int) as a :class:`~specdec.tree_batch.TreeBatch` on the draft's device,
        answering :meth:`feed_build`'s requests with ``draft``
        (:func:`specdec.trees.feed.drive`). ``draft`` is None only for a builder that drafts
        nothing (:class:`~specdec.trees.root_only.RootOnlyBuilder`); the others raise
        :class:`~specdec.errors.InvalidConfigError` on it."""
        if not isinstance(root_token, torch.Tensor):
            root_token = torch.tensor([int(root_token)], dtype=torch.int64)
        draft = self._require_draft(draft)
        return drive(self.feed_build(root_token.reshape(-1), DraftSpec.of(draft), sampling, rng, compiler=compiler),
                     draft)

    def feed_build(self, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """The batch contract (:mod:`specdec.trees.feed`): a generator that yields each draft
        call's :class:`~specdec.draft_request.DraftRequest` over the ``B`` rows and receives that
        call's draft logits, then returns the tree batch. The level-wise and shaped builders
        (every built-in one) grow all rows with tensor ops. The default runs the per-tree
        :meth:`build` of every row through :func:`specdec.adapters.host_feed` (each row on its
        own random source, the draft calls merged across rows), so a builder that only writes
        :meth:`build` runs in batches, per-request sampling, the serving feed and the bench.

        Args:
            roots: ``[B]`` int64 the rows' last committed tokens.
            spec: the drafter's vocabulary (:class:`~specdec.trees.feed.DraftSpec`).
            rng: one random source per row (a :class:`~specdec.rng.RowStreams` for ``B > 1``).
        """
        return host_feed(self.build, roots, spec, sampling, rng)

    def _require_draft(self, draft: DraftModel | None) -> DraftModel:
        """``draft``, or :class:`~specdec.errors.InvalidConfigError` for None (a builder that drafts needs one)."""
        if draft is None:
            raise InvalidConfigError(f"the tree builder {type(self).__name__} needs a draft model, got None")
        return draft

    @abstractmethod
    def build(self, root_token: int, draft: OneRowDraft, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        """Draft a tree whose root is ``root_token`` (the last committed token).

        The draft model has been :meth:`~DraftModel.begin`/committed up to and
        including ``root_token``.
        """
