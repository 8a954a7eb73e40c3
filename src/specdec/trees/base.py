"""The tree builder interfaces.

The engine speaks one contract, :class:`TreeBuilder`, the batch form: ONE build entry,
:meth:`TreeBuilder.feed_build`, a caller-driven build (:mod:`specdec.trees.feed`) that grows the
trees of ``B`` rows, asking for each draft call's logits over all of them; the rest of the class
is metadata (bounds, child kinds, sibling modes, examples, verifier). Every built-in builder
writes it with tensor ops.

What a researcher writes first, one tree at a time, is :class:`OneTreeBuilder`: a host
:meth:`OneTreeBuilder.build` that grows ONE tree from a one-row draft
(:class:`~specdec.drafts.base.OneRowDraft`); its :meth:`~OneTreeBuilder.feed_build` runs that
build row by row (:func:`specdec.adapters.host_feed`, the draft calls merged across rows), so it
runs everywhere a built-in builder runs.

Callers drive a build with :func:`build_trees` (``B`` rows, with the step's draft) or
:func:`build_tree` (one tree, as a :class:`~specdec.tree.DraftTree`; tests and tools).

Deprecated: a class that subclasses :class:`TreeBuilder` (or a built-in builder) and writes the
per-tree ``build`` of 0.1.0 keeps working as a :class:`OneTreeBuilder`, with a
``DeprecationWarning`` when the class is defined; that alias goes in 0.2.0 (docs/api/public.md,
"Deprecation policy").
"""

from __future__ import annotations

import functools
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from specdec._deprecation import serve_as_form
from specdec.adapters import host_feed, one_row
from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import Build, DraftSpec, drive

__all__ = ["OneTreeBuilder", "TreeBuilder", "build_tree", "build_trees"]


class TreeBuilder(ABC):
    """The tree builder contract the engine calls: one build over ``B`` rows (module docstring).

    Contract:

    - :meth:`feed_build` obtains draft laws only from the logits it is sent for its
      requests, processed by ``sampling`` (:func:`~specdec.sampling.process_logits`), and samples
      only through ``rng``; every sampled child records the exact law it was drawn from, every
      top-K child is marked deterministic.
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
    """Declared: :meth:`feed_build` grows the ``B`` trees at once with tensor ops (batched
    generation at full speed); False: it grows them one host tree per row (:class:`OneTreeBuilder`)."""
    _one_tree_form: ClassVar[bool] = False
    """Declared by :class:`OneTreeBuilder` (and 0.1.0's per-tree builders, served as one)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """0.1.0's contract, deprecated: a subclass that writes the per-tree ``build`` (and not
        :meth:`feed_build`) is served as a :class:`OneTreeBuilder` (its ``feed_build`` runs ``build``
        row by row), with a ``DeprecationWarning`` naming the replacement."""
        super().__init_subclass__(**kwargs)
        if cls._one_tree_form or "build" not in cls.__dict__ or "feed_build" in cls.__dict__:
            return
        serve_as_form(cls, OneTreeBuilder, TreeBuilder, ("build",), "specdec.trees.OneTreeBuilder")
        # a subclass of a built-in builder: its own build, not the built-in's tensor build, is the tree
        setattr(cls, "feed_build", OneTreeBuilder.feed_build)
        if "batch_form" not in cls.__dict__:  # (a class that declares one is told it has none: specdec.plugins)
            setattr(cls, "batch_form", False)
        setattr(cls, "_one_tree_form", True)

    if not TYPE_CHECKING:  # type checkers see the one build only
        def __getattr__(self, name: str) -> Any:
            """0.1.0's build entries on a builder that writes the batch form, deprecated:
            ``builder.build(root, draft, sampling, rng)`` is :func:`build_tree` and
            ``builder.build_batch(roots, draft, sampling, rng, compiler=)`` :func:`build_trees`,
            with a ``DeprecationWarning``; removed in 0.2.0."""
            replacement = _DEPRECATED_ENTRIES.get(name)
            if replacement is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            warnings.warn(
                f"{type(self).__name__}.{name} is deprecated since 0.1.1 and will be removed in 0.2.0: a builder has one "
                f"build (feed_build); use specdec.trees.{replacement.__name__}(builder, ...)", DeprecationWarning,
                stacklevel=2)
            return functools.partial(replacement, self)

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
        """Whether :meth:`feed_build` grows ``B`` trees at once with tensor ops under ``sampling``
        (:attr:`batch_form`)."""
        return self.batch_form

    def before_build(self, draft: DraftModel, rows: int) -> None:
        """Called by :func:`build_trees` with the step's draft (``rows`` rows) before each
        :meth:`feed_build`: a builder whose next trees depend on the draft's state beyond the logits
        it asks for reads it here (the heuristic chain schedule, the committed contexts). Default:
        nothing."""

    @abstractmethod
    def feed_build(self, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """The build (:mod:`specdec.trees.feed`): a generator that yields each draft call's
        :class:`~specdec.draft_request.DraftRequest` over the ``B`` rows and receives that call's
        draft logits, then returns the :class:`~specdec.tree_batch.TreeBatch`.

        Args:
            roots: ``[B]`` int64 the rows' last committed tokens.
            spec: the drafter's vocabulary (:class:`~specdec.trees.feed.DraftSpec`).
            sampling: the rows' sampling configuration (the draft laws are processed by it).
            rng: one random source per row (a :class:`~specdec.rng.RowStreams` for ``B > 1``).
            compiler: a :class:`~specdec.engine.compiler.StepCompiler` (optional; the level-wise
                builders compile each level's work with it).
        """


class OneTreeBuilder(TreeBuilder):
    """A builder written one tree at a time (per-tree authoring; module docstring): write
    :meth:`build`; :meth:`feed_build` runs it for every row (:func:`specdec.adapters.host_feed`:
    each row on its own random source, the draft calls merged across rows), so the builder runs
    in batches, per-request sampling, the serving feed and the bench."""

    batch_form = False
    _one_tree_form = True

    @abstractmethod
    def build(self, root_token: int, draft: OneRowDraft, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        """Draft a tree whose root is ``root_token`` (the last committed token).

        The draft has been begun/committed up to and including ``root_token``; ask it for
        laws with :meth:`~specdec.drafts.base.OneRowDraft.root_distribution` and
        :meth:`~specdec.drafts.base.OneRowDraft.expand`.
        """

    def feed_build(self, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """:meth:`build` of every row, as one build (:func:`specdec.adapters.host_feed`; ``compiler``
        is not used)."""
        return host_feed(self.build, torch.as_tensor(roots, dtype=torch.int64).reshape(-1), spec, sampling, rng)


def build_trees(builder: TreeBuilder, roots: int | torch.Tensor, draft: DraftModel | None, sampling: SamplingConfig,
                rng: RandomSource, *, compiler: Any = None) -> TreeBatch:
    """The step's trees: ``builder``'s :meth:`~TreeBuilder.feed_build` over the rows whose roots are
    ``roots`` (``[B]`` int64, or one int), every request answered by ``draft``
    (:func:`specdec.trees.feed.drive`), as a :class:`~specdec.tree_batch.TreeBatch` on the draft's
    device.

    Args:
        draft: the step's draft; None only for a builder that drafts nothing
            (:class:`~specdec.trees.root_only.RootOnlyBuilder`).
        rng: one random source per row (a :class:`~specdec.rng.RowStreams` for ``B > 1``).
        compiler: passed to :meth:`~TreeBuilder.feed_build`.

    Raises:
        InvalidConfigError: ``draft`` is None and the builder asks for draft logits.
    """
    if not isinstance(roots, torch.Tensor):  # (a [B] tensor is passed as it is: no op on the step path)
        roots = torch.tensor([int(roots)], dtype=torch.int64)
    if draft is None:
        build = builder.feed_build(roots, DraftSpec(1), sampling, rng, compiler=compiler)
        try:
            next(build)
        except StopIteration as done:
            return done.value
        build.close()
        raise InvalidConfigError(f"the tree builder {type(builder).__name__} needs a draft model, got None")
    builder.before_build(draft, int(roots.shape[0]))
    return drive(builder.feed_build(roots, DraftSpec.of(draft), sampling, rng, compiler=compiler), draft)


def build_tree(builder: TreeBuilder, root_token: int, draft: DraftModel, sampling: SamplingConfig,
               rng: RandomSource) -> DraftTree:
    """One tree (a validated :class:`~specdec.tree.DraftTree`) after ``draft``'s committed context,
    whose last token is ``root_token``: a :class:`OneTreeBuilder`'s own :meth:`~OneTreeBuilder.build`
    (asked of the draft's one-row form, :func:`specdec.adapters.one_row`), else row 0 of
    :func:`build_trees`."""
    if type(builder)._one_tree_form:
        return cast(OneTreeBuilder, builder).build(int(root_token), one_row(draft), sampling, rng)
    return build_trees(builder, int(root_token), draft, sampling, rng).tree(0)


_DEPRECATED_ENTRIES: dict[str, Any] = {"build": build_tree, "build_batch": build_trees}
"""0.1.0's build entries of a builder (:meth:`TreeBuilder.__getattr__`) and their replacements."""
