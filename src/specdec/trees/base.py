"""The tree builder interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import Build, DraftSpec

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
        """The step path's form of :meth:`build`: the tree as a one-tree
        :class:`~specdec.tree_batch.TreeBatch` on the draft's device. The
        level-wise builders grow it with tensor ops (and compile their levels
        and layout with ``compiler``, a :class:`~specdec.engine.compiler.StepCompiler`); the default stacks :meth:`build`'s tree
        (host work) and ignores ``compiler``. ``draft`` is None only for a builder
        that drafts nothing (:class:`~specdec.trees.root_only.RootOnlyBuilder`);
        the others raise :class:`~specdec.errors.InvalidConfigError` on it."""
        if isinstance(root_token, torch.Tensor):
            root_token = int(root_token.reshape(-1)[0])
        return TreeBatch.from_trees([self.build(root_token, self._require_draft(draft), sampling, rng)])

    def feed_build(self, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """The caller-driven form of :meth:`build_batch` (:mod:`specdec.trees.feed`): a
        generator that yields each level's :class:`~specdec.draft_request.DraftRequest` and
        receives that level's draft logits, then returns the tree batch. The level-wise and
        shaped builders (every built-in one) define it, and their :meth:`build_batch` drives it
        with the draft model. The default: a builder with a host :meth:`build` only has no
        caller-driven form.

        Args:
            roots: ``[B]`` int64 the rows' last committed tokens.
            spec: the drafter's vocabulary (:class:`~specdec.trees.feed.DraftSpec`).

        Raises:
            InvalidConfigError: (the default) the builder has no caller-driven form.
        """
        raise InvalidConfigError(
            f"tree builder {type(self).__name__} has no caller-driven form (it builds host trees from a "
            "DraftModel in build()); wrap the draft runner as a DraftModel, or give the builder a feed_build"
        )

    def _require_draft(self, draft: DraftModel | None) -> DraftModel:
        """``draft``, or :class:`~specdec.errors.InvalidConfigError` for None (a builder that drafts needs one)."""
        if draft is None:
            raise InvalidConfigError(f"the tree builder {type(self).__name__} needs a draft model, got None")
        return draft

    @abstractmethod
    def build(self, root_token: int, draft: DraftModel, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        """Draft a tree whose root is ``root_token`` (the last committed token).

        The draft model has been :meth:`~DraftModel.begin`/committed up to and
        including ``root_token``.
        """
