"""The draft model interfaces.

A draft model proposes; it never verifies. The engine speaks one contract,
:class:`DraftModel`, the batch form: it begins, commits and keeps ``B`` rows and
answers a builder's :class:`~specdec.draft_request.DraftRequest` over all of them
(:meth:`DraftModel.request_logits`), ten public members in all.

What a researcher writes first, one sequence at a time, is :class:`OneRowDraft`:
``begin``, ``root_logits``, ``tree_logits``, ``commit``. Builders that grow one tree on
the host talk to it through :meth:`OneRowDraft.root_distribution` and
:meth:`OneRowDraft.expand`, which return the *processed* draft law ``q`` (same
:func:`~specdec.sampling.process_logits` and the same
:class:`~specdec.sampling.SamplingConfig` as the target). A one-row draft serves
a batch of one itself and several rows through one copy per row
(:class:`specdec.adapters.DraftRowCopies`); one that declares a rows mode
(:attr:`OneRowDraft.supports_rows`: the shipped drafts) serves them itself.

Contract (the bug behind several lossy releases elsewhere): the ``q`` a
builder receives is exactly the law it samples from and records in the tree.
Implementations provide raw logits only; the processing is done once, here, and
is not to be overridden.

Deprecated: a class that subclasses :class:`DraftModel` directly and writes the
one-row methods (the contract of 0.1.0) keeps working as a :class:`OneRowDraft`,
with a ``DeprecationWarning`` when the class is defined; that alias goes in 0.2.0
(docs/api/public.md, "Deprecation policy").
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, final

import torch

from specdec.draft_request import DraftRequest
from specdec._deprecation import serve_as_form
from specdec.errors import InvalidConfigError, InvalidDistributionError, VocabMismatchError
from specdec.regions import model_call
from specdec.sampling import SamplingConfig, law_is_bad, process_logits, row_is_bad

__all__ = ["DraftModel", "OneRowDraft", "laws_and_flags"]

_ONE_ROW_METHODS = ("begin", "root_logits", "tree_logits", "commit")
"""The one-row methods of 0.1.0's contract (a direct :class:`DraftModel` subclass writing them is
served as a :class:`OneRowDraft`, deprecated)."""


class DraftModel(ABC):
    """The draft contract the engine calls: ``B`` rows, batch-first (module docstring).

    Lifecycle of one generation: :meth:`begin_rows` with the prompts; per step, one
    :meth:`request_logits` per draft call of the builder (level 0: after every row's
    committed context; then the new nodes of every row's tree), then
    :meth:`commit_rows` with each row's emitted tokens (which discards the step's
    trees); rows that stop leave through :meth:`keep_rows`.

    Draft-tree node ids inside a step: each row's root is 0; nodes get ids 1, 2, ...
    in the order they are passed to :meth:`tree_rows_logits`.

    Shapes: ``B`` rows, ``k`` new nodes per row, ``W`` logit columns (``V``, or ``Vd``
    over the :attr:`proposal_ids`).
    """

    registry_name: ClassVar[str] = "?"
    supports_rows: ClassVar[bool] = True
    """Declared: the draft serves several rows itself (True for the batch contract); a
    :class:`OneRowDraft` without a rows mode declares False and is served one copy per row."""
    needs_target_hidden: ClassVar[bool] = False
    """A feature-level draft (EAGLE) reads the target's hidden states: the
    generator asks the target to capture :attr:`target_layers`, and passes
    them to :meth:`begin_rows` and :meth:`commit_rows` (``target_hidden=``)."""
    _one_row_form: ClassVar[bool] = False
    """Declared by :class:`OneRowDraft` (and every subclass): the class writes the one-row form."""
    parallel_form: ClassVar[bool] = False
    """Declared by :class:`specdec.drafts.parallel.ParallelDraft` (docs/drafts.md, "Parallel drafts"):
    one call gives the laws of the next ``block_size`` positions, each conditioned on the committed
    context only; a parallel request (``DraftRequest.block``) to any other draft is refused."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        """0.1.0's contract, deprecated: a direct subclass that writes the one-row methods is
        served as a :class:`OneRowDraft` (the one-row form's methods are given to the class),
        with a ``DeprecationWarning`` naming the replacement."""
        super().__init_subclass__(**kwargs)
        if cls._one_row_form or not any(name in cls.__dict__ for name in _ONE_ROW_METHODS):
            return
        serve_as_form(cls, OneRowDraft, DraftModel, _ONE_ROW_METHODS, "specdec.drafts.OneRowDraft")
        own = cls.__dict__.get("begin_rows")
        if own is not None:  # 0.1.0's begin_rows takes no positions= (its reserve() was called before)
            def begin_rows(self: OneRowDraft, prompts: Sequence[Sequence[int]], target_hidden: torch.Tensor | None = None,
                           *, positions: int | None = None) -> None:
                if positions is not None:
                    with torch.inference_mode(False):
                        self.reserve(positions)
                own(self, prompts, target_hidden)

            setattr(cls, "begin_rows", begin_rows)

    @property
    def target_layers(self) -> tuple[int, ...]:
        """The target's ``hidden_states`` indices a feature-level draft needs (none by default)."""
        return ()

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Size ``V`` of the logits this model returns."""

    @property
    def proposal_ids(self) -> torch.Tensor | None:
        """``[Vd]`` int64 target ids of the draft's *proposal vocabulary*, ascending,
        or None (the default: the full vocabulary).

        A draft with a reduced vocabulary (EAGLE-3) returns ``-inf`` outside it over
        ``V`` columns, and the same logits restricted to it, ``[..., Vd]``, when a request
        asks for the proposal vocabulary (``proposal=True``). The level-wise builders then
        rank, draw and process ``q`` over ``Vd`` columns and map ids to the target's once
        per level; the law is the same (processing gives 0 outside the vocabulary either way)."""
        return None

    @property
    def max_length(self) -> int | None:
        """Longest sequence (committed tokens + tree) the draft can attend over; None = unbounded."""
        return None

    @abstractmethod
    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: torch.Tensor | None = None, *,
                   positions: int | None = None) -> None:
        """Start ``B`` rows, row ``b`` with ``prompts[b]`` (non-empty).

        Args:
            target_hidden: feature-level drafts: ``[B, q, L, H]`` the target's features of
                the cached prompt tokens (:meth:`TargetModel.hidden_rows
                <specdec.targets.base.TargetModel.hidden_rows>`).
            positions: a hint: each row needs at most this many cached positions (prompt,
                new tokens and the deepest tree); a model with a preallocated cache sizes it
                once from this.
        """

    @abstractmethod
    def commit_rows(
        self,
        emitted: Sequence[Sequence[int]],
        target_hidden: torch.Tensor | None = None,
        *,
        device_tokens: torch.Tensor | None = None,
        device_counts: torch.Tensor | None = None,
    ) -> None:
        """After a step: row ``b`` appends ``emitted[b]`` (accepted tokens, then the bonus)
        and drops its tree.

        Args:
            target_hidden: feature-level drafts: ``[B, D + 1, L, H]`` the target's features at
                each row's root and accepted nodes (the first ``len(emitted[b])`` are row ``b``'s).
            device_tokens: ``[B, D + 1]`` the emitted tokens as the verifier left them on the
                device (``-1`` padded), for drafts that avoid a host-to-device copy.
            device_counts: ``[B]`` the number of emitted tokens per row, on the device.
        """

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only the rows ``rows`` (rows that stopped leave the batch), renumbered in
        order. The loop calls it only with several rows; the default has none to keep."""
        raise InvalidConfigError(f"{type(self).__name__} has no rows mode: keep_rows({list(rows)})")

    @abstractmethod
    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        """``[B, V]`` (``proposal``: ``[B, Vd]``) raw logits after every row's committed context."""

    @abstractmethod
    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        """Add ``k`` nodes to every row's tree (``parents``, ``tokens`` ``[B, k]`` int64) and
        return their ``[B, k, V]`` (``[B, k, Vd]``) raw logits, in one forward."""

    def request_logits(self, request: DraftRequest) -> torch.Tensor:
        """Answer a builder's :class:`~specdec.draft_request.DraftRequest` (the engine's one
        draft call, :func:`specdec.trees.feed.drive`): ``[B, W]`` logits at level 0 (after every
        row's committed context), ``[B, k, W]`` at the request's new nodes after, checked
        (shape and width; the laws are checked where they are used); a parallel request
        (``request.block``): ``[B, block, W]``, from the parallel form
        (:class:`~specdec.drafts.parallel.ParallelDraft`)."""
        if request.block:
            return self._answer_block(request)
        with model_call():
            if request.level == 0:
                return self._checked(self.root_rows_logits(request.proposal), 2, request.proposal)
            assert request.parents is not None and request.tokens is not None
            logits = self.tree_rows_logits(request.parents, request.tokens, request.proposal)
        return self._checked(logits, 3, request.proposal, tuple(request.parents.shape))

    def _answer_block(self, request: DraftRequest) -> torch.Tensor:
        """A parallel request (``request.block``): refused here (the parallel form answers it).

        Raises:
            InvalidConfigError: always: this draft has no parallel form.
        """
        raise InvalidConfigError(f"draft {type(self).__name__} has no parallel form (parallel_form = False): "
                                 f"a parallel request of block={request.block} cannot be answered")

    def _checked(
        self, logits: torch.Tensor, dims: int, proposal: bool = False, rows: tuple[int, ...] | None = None
    ) -> torch.Tensor:
        ids = self.proposal_ids if proposal else None
        width = self.vocab_size if ids is None else int(ids.shape[0])
        if logits.dim() != dims or logits.shape[-1] != width:
            name, what = ("V", "V") if ids is None else ("Vd", "Vd (the proposal vocabulary)")
            raise VocabMismatchError(
                f"draft {type(self).__name__} returned logits of shape {tuple(logits.shape)}; "
                f"expected {['[', '[k, ', '[B, k, '][dims - 1]}{name}] with {what} = {width}"
            )
        if rows is not None and tuple(logits.shape[:-1]) != rows:
            expected = ", ".join(map(str, rows))
            raise InvalidDistributionError(
                f"draft {type(self).__name__} returned logits of shape {tuple(logits.shape)} for "
                f"{rows[-1]} added node(s); expected [{expected}, {logits.shape[-1]}]: one row per node, in the order given"
            )
        return logits


class OneRowDraft(DraftModel):
    """A draft written one sequence at a time (per-tree authoring; module docstring).

    Lifecycle of one sequence: :meth:`begin` with the prompt; then per step,
    :meth:`root_logits` (the law after the committed context, whose last token
    is the tree's root), any number of :meth:`tree_logits` calls adding tree
    nodes level by level, then :meth:`commit` with the tokens the verifier
    emitted (which discards the step's tree). Node ids: the root is 0; nodes get
    ids 1, 2, ... in the order they are passed to :meth:`tree_logits`.

    The batch contract's methods serve one row through these (``B = 1``); a class that
    declares :attr:`~DraftModel.supports_rows` overrides them for several rows and says
    which mode it is in (:attr:`rows_mode`). Without a rows mode, several rows are served by
    one copy of the draft per row (:class:`specdec.adapters.DraftRowCopies`).
    """

    supports_rows: ClassVar[bool] = False
    """Declared: the class has its own rows mode (:meth:`begin_rows`, :meth:`commit_rows`,
    :meth:`keep_rows`, :meth:`root_rows_logits`, :meth:`tree_rows_logits` and :attr:`rows_mode`
    serve several rows); else several rows get one copy per row."""
    _one_row_form: ClassVar[bool] = True

    @abstractmethod
    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        """Start a new sequence whose committed context is ``prompt_ids`` (non-empty).

        Args:
            target_hidden: for feature-level drafts (:attr:`needs_target_hidden`), the
                target's ``[len(prompt) - 1, L, H]`` features of the cached prompt tokens;
                token-level drafts are called without it.
        """

    @abstractmethod
    def root_logits(self) -> torch.Tensor:
        """``[V]`` raw logits of the token after the committed context."""

    @abstractmethod
    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Add ``k`` nodes to this step's draft tree and return ``[k, V]`` raw
        logits of the token after each.

        Args:
            parents: ``k`` ids of already added nodes (0 = root): ints, or a 1-D int64
                tensor (the step path's level-wise builders pass device tensors).
            tokens: ``k`` token ids of the new nodes (ints or a 1-D tensor, as ``parents``).
        """

    @abstractmethod
    def commit(self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        """Append the step's emitted tokens (accepted + bonus) to the committed
        context and drop the step's tree.

        Args:
            tokens: the emitted tokens.
            target_hidden: for feature-level drafts (EAGLE), the target's hidden
                features at the step's root and accepted nodes; ignored by
                token-level drafts.
        """

    def reserve(self, positions: int) -> None:
        """A hint before :meth:`begin`: the coming sequence needs at most
        ``positions`` cached positions (prompt, new tokens and the deepest
        tree). A model with a preallocated cache sizes it once from this;
        the default does nothing."""

    def root_proposal_logits(self) -> torch.Tensor:
        """``[Vd]`` :meth:`root_logits` over the proposal vocabulary (default: :meth:`root_logits`)."""
        return self.root_logits()

    def tree_proposal_logits(
        self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor
    ) -> torch.Tensor:
        """``[k, Vd]`` :meth:`tree_logits` over the proposal vocabulary (default: :meth:`tree_logits`)."""
        return self.tree_logits(parents, tokens)

    @property
    def rows_mode(self) -> bool:
        """Whether the draft holds several rows now (begun with :meth:`begin_rows` in a rows
        mode of its own); False by default: :meth:`request_logits` then answers from the
        one-row methods."""
        return False

    # ------------------------------------------------------- final: the law
    @final
    def root_distribution(self, sampling: SamplingConfig) -> torch.Tensor:
        """``[V]`` processed draft law ``q`` after the committed context."""
        return self.root_laws((sampling,))[0]

    @final
    def expand(self, parents: Sequence[int], tokens: Sequence[int], sampling: SamplingConfig) -> torch.Tensor:
        """``[k, V]`` processed draft laws ``q`` after ``k`` newly added nodes."""
        return self.expand_laws(parents, tokens, (sampling,))[0]

    @final
    def root_laws(self, samplings: Sequence[SamplingConfig]) -> list[torch.Tensor]:
        """:meth:`root_distribution` under each of ``samplings``, from one draft forward
        (a builder that ranks by one law and draws by another, docs/trees.md)."""
        with model_call():
            logits = self._checked(self.root_logits(), 1)
        source = f"the draft ({type(self).__name__})"
        return [process_logits(logits, s, source=source) for s in samplings]

    @final
    def expand_laws(
        self, parents: Sequence[int], tokens: Sequence[int], samplings: Sequence[SamplingConfig]
    ) -> list[torch.Tensor]:
        """:meth:`expand` under each of ``samplings``, from one draft forward."""
        logits = self._tree_logits_checked(parents, tokens)
        source = f"the draft ({type(self).__name__})"
        return [process_logits(logits, s, source=source) for s in samplings]

    # ----------------------- 0.1.0's flagged and rows-law helpers (deprecated, go in 0.2.0)
    def root_distribution_flagged(self, sampling: SamplingConfig, *,
                                  proposal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated (0.1.1, goes in 0.2.0): ``laws_and_flags`` of :meth:`request_logits` at level 0, row 0."""
        (q,), bad = self._deprecated_laws("root_distribution_flagged", None, None, (sampling,), proposal)
        return q[0], bad[0]

    def expand_flagged(self, parents: Sequence[int], tokens: Sequence[int], sampling: SamplingConfig, *,
                       proposal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated (0.1.1, goes in 0.2.0): ``laws_and_flags`` of :meth:`request_logits` at new nodes, row 0."""
        p = torch.as_tensor(parents, dtype=torch.int64).view(1, -1)
        t = torch.as_tensor(tokens, dtype=torch.int64).view(1, -1)
        (q,), bad = self._deprecated_laws("expand_flagged", p, t, (sampling,), proposal)
        return q[0], bad[0]

    def root_rows_flagged(self, sampling: SamplingConfig, *, proposal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated (0.1.1, goes in 0.2.0): ``laws_and_flags`` of :meth:`request_logits` at level 0."""
        (q,), bad = self._deprecated_laws("root_rows_flagged", None, None, (sampling,), proposal)
        return q, bad

    def expand_rows_flagged(self, parents: torch.Tensor, tokens: torch.Tensor, sampling: SamplingConfig, *,
                            proposal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Deprecated (0.1.1, goes in 0.2.0): ``laws_and_flags`` of :meth:`request_logits` at new nodes."""
        (q,), bad = self._deprecated_laws("expand_rows_flagged", parents, tokens, (sampling,), proposal)
        return q, bad

    def root_rows_laws(self, samplings: Sequence[SamplingConfig], *,
                       proposal: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Deprecated (0.1.1, goes in 0.2.0): ``laws_and_flags(request_logits(level 0), samplings)``."""
        return self._deprecated_laws("root_rows_laws", None, None, samplings, proposal)

    def expand_rows_laws(self, parents: torch.Tensor, tokens: torch.Tensor, samplings: Sequence[SamplingConfig], *,
                         proposal: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Deprecated (0.1.1, goes in 0.2.0): ``laws_and_flags(request_logits(new nodes), samplings)``."""
        return self._deprecated_laws("expand_rows_laws", parents, tokens, samplings, proposal)

    def _deprecated_laws(self, name: str, parents: torch.Tensor | None, tokens: torch.Tensor | None,
                         samplings: Sequence[SamplingConfig], proposal: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
        warnings.warn(f"{type(self).__name__}.{name} is deprecated since 0.1.1 and goes in 0.2.0: use "
                      "specdec.drafts.base.laws_and_flags(draft.request_logits(request), samplings)",
                      DeprecationWarning, stacklevel=3)
        ids = self.proposal_ids if proposal else None
        width = self.vocab_size if ids is None else int(ids.shape[0])
        if parents is None or tokens is None:
            request = DraftRequest(level=0, rows=1, width=width, proposal=proposal)  # (rows: not read at level 0)
        else:
            request = DraftRequest(level=1, rows=int(parents.shape[0]), width=width, proposal=proposal,
                                   parents=parents, tokens=tokens)
        return laws_and_flags(self.request_logits(request), samplings)

    # ------------------------------------------- the batch contract, one row
    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: torch.Tensor | None = None, *,
                   positions: int | None = None) -> None:
        """One row: :meth:`reserve` and :meth:`begin` (several rows: a copy per row,
        :class:`specdec.adapters.DraftRowCopies`, or the class's own rows mode).

        Raises:
            InvalidConfigError: several rows for a draft without a rows mode.
        """
        if len(prompts) != 1:
            raise InvalidConfigError(
                f"{type(self).__name__} has no rows mode (begin_rows got {len(prompts)} prompts): the engine serves "
                "several rows with one copy per row (specdec.adapters.DraftRowCopies)"
            )
        if positions is not None:  # sizing a cache is not inference: its buffers stay normal tensors
            with torch.inference_mode(False):
                self.reserve(positions)
        if target_hidden is None:
            self.begin(prompts[0])
        else:
            self.begin(prompts[0], target_hidden=target_hidden[0])

    def commit_rows(
        self,
        emitted: Sequence[Sequence[int]],
        target_hidden: torch.Tensor | None = None,
        *,
        device_tokens: torch.Tensor | None = None,
        device_counts: torch.Tensor | None = None,
    ) -> None:
        """One row: :meth:`commit`."""
        if len(emitted) != 1:
            raise InvalidConfigError(f"{type(self).__name__} has no rows mode: commit_rows got {len(emitted)} rows")
        hidden = None if target_hidden is None else target_hidden[0, : len(emitted[0])]
        self.commit(emitted[0], target_hidden=hidden)

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        """One row: ``[1, W]`` :meth:`root_logits` (``proposal``: :meth:`root_proposal_logits`)."""
        return (self.root_proposal_logits() if proposal else self.root_logits()).unsqueeze(0)

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        """One row: ``[1, k, W]`` :meth:`tree_logits` of row 0's nodes."""
        if parents.shape[0] != 1:
            raise InvalidConfigError(f"{type(self).__name__} has no rows mode: tree_rows_logits got {parents.shape[0]} rows")
        return (self.tree_proposal_logits(parents[0], tokens[0]) if proposal
                else self.tree_logits(parents[0], tokens[0])).unsqueeze(0)

    def request_logits(self, request: DraftRequest) -> torch.Tensor:
        """:meth:`DraftModel.request_logits`; out of :attr:`rows_mode` (one row, begun with
        :meth:`begin` or the one-row :meth:`begin_rows`), from the one-row methods."""
        if self.rows_mode or request.block:  # (a parallel request: block_rows_logits serves one row too)
            return DraftModel.request_logits(self, request)  # (not super(): 0.1.0 subclasses get this method)
        if request.level == 0:
            with model_call():  # (the model's region, the batch dimension included, as in 0.1.0's step)
                root = self.root_proposal_logits() if request.proposal else self.root_logits()
                return self._checked(root, 1, request.proposal).unsqueeze(0)  # [1, W]
        assert request.parents is not None and request.tokens is not None
        return self._tree_logits_checked(request.parents[0], request.tokens[0], request.proposal).unsqueeze(0)

    def _tree_logits_checked(
        self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor, proposal: bool = False
    ) -> torch.Tensor:
        if len(parents) != len(tokens):
            raise ValueError(f"expand: {len(parents)} parents but {len(tokens)} tokens")
        with model_call():
            logits = self.tree_proposal_logits(parents, tokens) if proposal else self.tree_logits(parents, tokens)
        return self._checked(logits, 2, proposal, (len(parents),))


def laws_and_flags(logits: torch.Tensor, samplings: Sequence[SamplingConfig]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``([q [..., V] per config], bad [...])``: the processed laws of ``logits`` and the rows
    :func:`~specdec.sampling.row_is_bad` flags, read from a sampled law's first column where
    there is one (:func:`~specdec.sampling.law_is_bad`; a pass over the vocabulary otherwise)."""
    qs = [process_logits(logits, s, check=False) for s in samplings]
    for q, s in zip(qs, samplings):
        if not s.greedy:
            return qs, law_is_bad(q)
    return qs, row_is_bad(logits)
