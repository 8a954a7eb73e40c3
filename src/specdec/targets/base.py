"""The target model interfaces.

The target scores a whole draft tree in one forward. Its KV cache holds the
committed context *except its last token*: that token is the root of the next
tree, and is forwarded together with the tree's nodes, so prefill, tree steps
and plain autoregressive steps (a tree of one node) share one code path.

The engine speaks one contract, :class:`TargetModel`, the batch form: it prefills,
scores, accepts and keeps ``B`` rows (eight public members). What a researcher writes
first, one sequence at a time, is :class:`OneRowTarget` (``prefill``, ``score_tree``,
``accept``): it serves a batch of one itself and several rows through one copy per row
(:class:`specdec.adapters.TargetRowCopies`), unless it declares a batch mode of its own
(:attr:`TargetModel.supports_batch`: :class:`~specdec.targets.hf.HFTarget`,
:class:`~specdec.models.CallableLM`).

Deprecated: a class that subclasses :class:`TargetModel` directly and writes the
one-row methods (the contract of 0.1.0) keeps working as a :class:`OneRowTarget`, with a
``DeprecationWarning`` when the class is defined; that alias goes in 0.2.0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import torch

from specdec._deprecation import serve_as_form
from specdec.errors import InvalidConfigError
from specdec.tree import DraftTree
from specdec.tree_batch import TreeBatch

__all__ = ["OneRowTarget", "TargetModel"]

_ONE_ROW_METHODS = ("prefill", "score_tree", "accept")
"""The one-row methods of 0.1.0's contract (a direct :class:`TargetModel` subclass writing them
is served as a :class:`OneRowTarget`, deprecated)."""


class TargetModel(ABC):
    """The target contract the engine calls: the law ``p`` that speculative decoding must
    reproduce exactly, for ``B`` rows (module docstring).

    Lifecycle: :meth:`prefill_batch` with the prompts; per step :meth:`score_batch` on the
    step's :class:`~specdec.tree_batch.TreeBatch`, then :meth:`accept_rows` with each row's
    accepted path; rows that stop leave through :meth:`keep_rows`. The method names differ
    from :class:`~specdec.drafts.base.DraftModel`'s so that one object (e.g.
    :class:`~specdec.models.CallableLM`) can serve as both, with separate state for each role.
    """

    registry_name: ClassVar[str] = "?"
    capture_layers: tuple[int, ...] = ()
    """The hidden-state layers the target captures at every scored node (:meth:`hidden_rows`),
    for feature-level drafts; none by default."""
    supports_batch: ClassVar[bool] = True
    """Declared: the target serves several rows itself (True for the batch contract); a
    :class:`OneRowTarget` without a batch mode declares False and is served one copy per row."""
    rescores_trees: ClassVar[bool] = False
    """Declared: :meth:`score_batch` may be called again on a one-row batch before :meth:`accept_rows`
    (the previous tree is discarded), so a timing loop prefills once
    (:func:`specdec.bench.forward_timing.time_tree_forwards`); False by default: prefill before each."""
    _one_row_target: ClassVar[bool] = False
    """Declared by :class:`OneRowTarget` (and every subclass): the class writes the one-row form."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        """0.1.0's contract, deprecated: a direct subclass that writes the one-row methods is
        served as a :class:`OneRowTarget`, with a ``DeprecationWarning`` naming the replacement."""
        super().__init_subclass__(**kwargs)
        if cls._one_row_target or not any(name in cls.__dict__ for name in _ONE_ROW_METHODS):
            return
        serve_as_form(cls, OneRowTarget, TargetModel, _ONE_ROW_METHODS, "specdec.targets.OneRowTarget")
        own = cls.__dict__.get("prefill_batch")
        if own is not None:  # 0.1.0's prefill_batch takes no positions= (its reserve() was called before)
            def prefill_batch(self: OneRowTarget, prompts: Sequence[Sequence[int]], *,
                              positions: int | None = None) -> None:
                if positions is not None:
                    with torch.inference_mode(False):
                        self.reserve(positions)
                own(self, prompts)

            setattr(cls, "prefill_batch", prefill_batch)

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Size ``V`` of the logits this model returns."""

    @property
    def max_length(self) -> int | None:
        """Longest sequence (committed tokens + tree) the model can attend over; None = unbounded."""
        return None

    @property
    def device(self) -> torch.device:
        """Where the target's logits live, and where the loop keeps its per-row tensors
        (roots, contexts); the CPU by default."""
        return torch.device("cpu")

    @abstractmethod
    def prefill_batch(self, prompts: Sequence[Sequence[int]], *, positions: int | None = None) -> None:
        """Start ``B`` rows, row ``b`` with the non-empty ``prompts[b]`` (its last token becomes
        the row's first root).

        Args:
            positions: a hint: each row needs at most this many cached positions (prompt, new
                tokens and the deepest tree); a model with a preallocated cache sizes it once
                from this.
        """

    @abstractmethod
    def score_batch(self, tree: TreeBatch) -> torch.Tensor:
        """``[B, n, V]`` raw logits of the token after every node slot of the ``B`` trees
        (slot 0: after the row's committed context, i.e. after the root; padding slots are
        scored like a node that sees only the committed context, and never read)."""

    @abstractmethod
    def accept_rows(
        self,
        accepted: torch.Tensor,
        num_accepted: torch.Tensor,
        emitted: Sequence[Sequence[int]],
        *,
        nodes: Sequence[Sequence[int]],
    ) -> None:
        """After a step: row ``b`` keeps its root and accepted path in its cache and appends
        ``emitted[b]`` (its accepted tokens, then the bonus) to its context.

        Args:
            accepted: ``[B, D]`` int64 accepted node slots, top-down, ``-1`` padded (device).
            num_accepted: ``[B]`` int64 path lengths (device).
            emitted: per row, ``num_accepted[b] + 1`` tokens (host).
            nodes: per row, the accepted node slots (host, from the step's read).
        """

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only the rows ``rows`` (rows that stopped leave the batch), renumbered in order.
        The loop calls it only with several rows; the default has none to keep."""
        raise InvalidConfigError(f"{type(self).__name__} has no batch mode: keep_rows({list(rows)})")

    def hidden_rows(self) -> torch.Tensor | None:
        """``[B, n, L, H]`` the hidden features captured at the last trees' node slots (the
        :attr:`capture_layers`, for feature-level drafts), or None (the default: none captured)."""
        return None


class OneRowTarget(TargetModel):
    """A target written one sequence at a time (per-tree authoring; module docstring).

    Lifecycle: :meth:`prefill` with the prompt; per step :meth:`score_tree` on the step's
    tree, then :meth:`accept` with the accepted nodes of that tree. The batch contract's
    methods serve one row through these; a class that declares
    :attr:`~TargetModel.supports_batch` overrides them for several rows.
    """

    supports_batch: ClassVar[bool] = False
    """Declared: the class has its own batch mode (:meth:`prefill_batch`, :meth:`score_batch`,
    :meth:`accept_rows` and :meth:`keep_rows` serve several rows); else several rows get one
    copy per row."""
    _one_row_target: ClassVar[bool] = True

    def reserve(self, positions: int) -> None:
        """A hint before :meth:`prefill`: the coming sequence needs at most
        ``positions`` cached positions (prompt, new tokens and the deepest
        tree). A model with a preallocated cache sizes it once from this;
        the default does nothing."""

    @abstractmethod
    def prefill(self, prompt_ids: Sequence[int]) -> None:
        """Start a new sequence (non-empty prompt); the prompt's last token becomes the first root."""

    @abstractmethod
    def score_tree(self, tree: DraftTree) -> torch.Tensor:
        """``[n, V]`` raw logits of the token after each node of ``tree``
        (row 0: after the committed context, i.e. after the root)."""

    @abstractmethod
    def accept(self, accepted_nodes: Sequence[int], bonus_token: int) -> None:
        """Keep the root and ``accepted_nodes`` of the last tree in the cache
        (dropping the other nodes); ``bonus_token`` becomes the next root."""

    def hidden_states(self) -> torch.Tensor | None:
        """Hidden features captured at the last tree's nodes, if the model was
        asked to capture any (feature-level drafts); else None."""
        return None

    # ------------------------------------------- the batch contract, one row
    def prefill_batch(self, prompts: Sequence[Sequence[int]], *, positions: int | None = None) -> None:
        """One row: :meth:`reserve` and :meth:`prefill`.

        Raises:
            InvalidConfigError: several rows for a target without a batch mode.
        """
        if len(prompts) != 1:
            raise InvalidConfigError(
                f"{type(self).__name__} has no batch mode (prefill_batch / accept_rows / keep_rows): it decodes one "
                f"row at a time, got {len(prompts)} prompts; the engine serves several rows with one copy per row "
                "(specdec.adapters.TargetRowCopies)"
            )
        if positions is not None:  # sizing a cache is not inference: its buffers stay normal tensors
            with torch.inference_mode(False):
                self.reserve(positions)
        self.prefill(prompts[0])

    def score_batch(self, tree: TreeBatch) -> torch.Tensor:
        """One tree: :meth:`score_tree` of the host view (:meth:`TreeBatch.tree`, host reads),
        the padding slots given a copy of row 0."""
        if tree.batch_size != 1:
            raise NotImplementedError(f"{type(self).__name__} scores one tree per step, got a batch of {tree.batch_size}")
        logits = self.score_tree(tree.tree(0))  # [k, V]
        pad = tree.node_slots - logits.shape[0]
        if pad:
            logits = torch.cat([logits, logits[:1].expand(pad, -1)])
        return logits.unsqueeze(0)

    def accept_rows(
        self,
        accepted: torch.Tensor,
        num_accepted: torch.Tensor,
        emitted: Sequence[Sequence[int]],
        *,
        nodes: Sequence[Sequence[int]],
    ) -> None:
        """One row: :meth:`accept`."""
        if len(emitted) != 1:
            raise InvalidConfigError(f"{type(self).__name__} has no batch mode: accept_rows got {len(emitted)} rows")
        self.accept(nodes[0], emitted[0][-1])

    def hidden_rows(self) -> torch.Tensor | None:
        """One row: :meth:`hidden_states` with a batch dimension."""
        hidden = self.hidden_states()
        return None if hidden is None else hidden.unsqueeze(0)
