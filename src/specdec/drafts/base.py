"""The draft model interface.

A draft model proposes; it never verifies. Builders talk to it through
:meth:`DraftModel.root_distribution` and :meth:`DraftModel.expand`, which
return the *processed* draft law ``q`` (same :func:`~specdec.sampling.process_logits`
and the same :class:`~specdec.sampling.SamplingConfig` as the target).

Contract (the bug behind several lossy releases elsewhere): the ``q`` a
builder receives is exactly the law it samples from and records in the tree.
Implementations provide raw logits only (:meth:`root_logits`,
:meth:`tree_logits`); the processing is done once, here, and is not to be
overridden.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, final

import torch

from specdec.draft_request import DraftRequest
from specdec.errors import InvalidConfigError, InvalidDistributionError, VocabMismatchError
from specdec.regions import model_call
from specdec.sampling import SamplingConfig, law_is_bad, process_logits, row_is_bad

__all__ = ["DraftModel", "laws_and_flags"]



class DraftModel(ABC):
    """Proposes next-token logits for a committed context and a growing draft tree.

    Lifecycle of one generation: :meth:`begin` with the prompt; then per step,
    :meth:`root_logits` (the law after the committed context, whose last token
    is the tree's root), any number of :meth:`tree_logits` calls adding tree
    nodes level by level, then :meth:`commit` with the tokens the verifier
    emitted (which discards the step's tree).

    Draft-tree node ids inside a step: the root is 0; nodes get ids 1, 2, ...
    in the order they are passed to :meth:`tree_logits`.
    """

    registry_name: ClassVar[str] = "?"
    supports_rows: ClassVar[bool] = False
    """Declared: the draft has a rows mode (:meth:`begin_rows`, :meth:`commit_rows`,
    :meth:`keep_rows` and the ``*_rows_logits`` methods serve several rows); the loop refuses
    several rows otherwise, before any forward."""
    needs_target_hidden: ClassVar[bool] = False
    """A feature-level draft (EAGLE) reads the target's hidden states: the
    generator asks the target to capture :attr:`target_layers`, and passes
    them to :meth:`begin` (``target_hidden=``) and :meth:`commit`."""

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

        A draft with a reduced vocabulary (EAGLE-3) returns ``-inf`` outside it
        from :meth:`root_logits` / :meth:`tree_logits`, and the same logits
        restricted to it, ``[..., Vd]``, from :meth:`root_proposal_logits` /
        :meth:`tree_proposal_logits`. The level-wise builders then rank, draw
        and process ``q`` over ``Vd`` columns and map ids to the target's once
        per level; the law is the same (processing gives 0 outside the
        vocabulary either way)."""
        return None

    def root_proposal_logits(self) -> torch.Tensor:
        """``[Vd]`` :meth:`root_logits` over the proposal vocabulary (default: :meth:`root_logits`)."""
        return self.root_logits()

    def tree_proposal_logits(
        self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor
    ) -> torch.Tensor:
        """``[k, Vd]`` :meth:`tree_logits` over the proposal vocabulary (default: :meth:`tree_logits`)."""
        return self.tree_logits(parents, tokens)

    def reserve(self, positions: int) -> None:
        """A hint before :meth:`begin`: the coming sequence needs at most
        ``positions`` cached positions (prompt, new tokens and the deepest
        tree). A model with a preallocated cache sizes it once from this;
        the default does nothing."""

    @property
    def max_length(self) -> int | None:
        """Longest sequence (committed tokens + tree) the draft can attend over; None = unbounded."""
        return None

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

    @final
    def root_distribution_flagged(
        self, sampling: SamplingConfig, *, proposal: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`root_distribution` for the step path: ``(q [V], bad [])``.
        A row of NaN / +inf / all -inf logits does not raise here (no host
        read); ``bad`` flags it and its ``q`` is not a law. The level-wise
        builders carry the flag to the step's single read
        (:attr:`~specdec.tree_batch.TreeBatch.draft_bad`), which raises.
        ``proposal=True``: over the proposal vocabulary (``q [Vd]``, :attr:`proposal_ids`)."""
        with model_call():
            logits = self._checked(self.root_proposal_logits() if proposal else self.root_logits(), 1, proposal)
        return process_logits(logits, sampling, check=False), row_is_bad(logits)

    @final
    def expand_flagged(
        self, parents: Sequence[int], tokens: Sequence[int], sampling: SamplingConfig, *, proposal: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`expand` for the step path: ``(q [k, V], bad [k])``, as
        :meth:`root_distribution_flagged` (``proposal=True``: ``q [k, Vd]``)."""
        logits = self._tree_logits_checked(parents, tokens, proposal)
        return process_logits(logits, sampling, check=False), row_is_bad(logits)

    # ------------------------------------------------ rows: what the loop calls
    # The generation loop (specdec.engine.loop) drives every draft through these, for
    # B rows; B = 1 is a batch of one. The defaults serve one row with the one-row
    # methods (begin, commit); a draft with a rows mode overrides all three.
    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: torch.Tensor | None = None) -> None:
        """Start ``B`` rows, row ``b`` with ``prompts[b]``.

        Args:
            target_hidden: feature-level drafts: ``[B, q, L, H]`` the target's features of
                the cached prompt tokens (:meth:`TargetModel.hidden_rows
                <specdec.targets.base.TargetModel.hidden_rows>`).

        The default serves one row (:meth:`begin`).

        Raises:
            InvalidConfigError: several rows for a draft without a rows mode.
        """
        if len(prompts) != 1:
            raise InvalidConfigError(
                f"batched speculative generation needs a draft with a rows mode (the EAGLE heads, HFDraft, "
                f"CallableLM, NgramDraft); {type(self).__name__} has none (begin_rows got {len(prompts)} prompts)"
            )
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
        """After a step: row ``b`` appends ``emitted[b]`` (accepted tokens, then the bonus).

        Args:
            target_hidden: feature-level drafts: ``[B, D + 1, L, H]`` the target's features at
                each row's root and accepted nodes (the first ``len(emitted[b])`` are row ``b``'s).
            device_tokens: ``[B, D + 1]`` the emitted tokens as the verifier left them on the
                device (``-1`` padded), for drafts that avoid a host-to-device copy.
            device_counts: ``[B]`` the number of emitted tokens per row, on the device.

        The default serves one row (:meth:`commit`).
        """
        if len(emitted) != 1:
            raise InvalidConfigError(f"{type(self).__name__} has no rows mode: commit_rows got {len(emitted)} rows")
        hidden = None if target_hidden is None else target_hidden[0, : len(emitted[0])]
        self.commit(emitted[0], target_hidden=hidden)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only the rows ``rows`` (rows that stopped leave the batch), renumbered in
        order. The loop calls it only with several rows; the default has none to keep."""
        raise InvalidConfigError(f"{type(self).__name__} has no rows mode: keep_rows({list(rows)})")

    @property
    def rows_mode(self) -> bool:
        """Whether the draft holds several rows (a batch mode such as
        :meth:`~specdec.drafts.eagle.EagleDraft.begin_rows`); False by default."""
        return False

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        """Rows mode: ``[B, V]`` (``proposal``: ``[B, Vd]``) logits after every row's committed context."""
        raise NotImplementedError(f"{type(self).__name__} has no batch mode")

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        """Rows mode: add ``k`` nodes to every row's tree (``parents``, ``tokens``
        ``[B, k]``) and return their ``[B, k, V]`` (``[B, k, Vd]``) logits, in one forward."""
        raise NotImplementedError(f"{type(self).__name__} has no batch mode")

    @final
    def root_rows_flagged(self, sampling: SamplingConfig, *, proposal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The level-wise builders' root laws, one row per tree: ``(q [B, V], bad [B])``
        (:meth:`root_distribution_flagged` as one row outside rows mode)."""
        (q,), bad = self.root_rows_laws((sampling,), proposal=proposal)
        return q, bad

    @final
    def expand_rows_flagged(
        self, parents: torch.Tensor, tokens: torch.Tensor, sampling: SamplingConfig, *, proposal: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The level-wise builders' expansion of ``k`` nodes per tree (``[B, k]``):
        ``(q [B, k, V], bad [B, k])`` (:meth:`expand_flagged` as one row outside rows mode)."""
        (q,), bad = self.expand_rows_laws(parents, tokens, (sampling,), proposal=proposal)
        return q, bad

    @final
    def root_rows_laws(
        self, samplings: Sequence[SamplingConfig], *, proposal: bool = False
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """:meth:`root_rows_flagged` under each of ``samplings`` from one draft forward:
        ``([q [B, V] per config], bad [B])``."""
        return laws_and_flags(self._root_rows(proposal), samplings)

    @final
    def expand_rows_laws(
        self, parents: torch.Tensor, tokens: torch.Tensor, samplings: Sequence[SamplingConfig], *, proposal: bool = False
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """:meth:`expand_rows_flagged` under each of ``samplings`` from one draft forward:
        ``([q [B, k, V] per config], bad [B, k])``."""
        return laws_and_flags(self._tree_rows(parents, tokens, proposal), samplings)

    @final
    def request_logits(self, request: DraftRequest) -> torch.Tensor:
        """Answer a builder's :class:`~specdec.draft_request.DraftRequest` (caller-driven
        building, :func:`specdec.trees.feed.drive`): ``[B, W]`` logits at level 0 (after every
        row's committed context), ``[B, k, W]`` at the request's new nodes after, checked."""
        if request.level == 0:
            return self._root_rows(request.proposal)
        assert request.parents is not None and request.tokens is not None
        return self._tree_rows(request.parents, request.tokens, request.proposal)

    def _root_rows(self, proposal: bool) -> torch.Tensor:
        """``[B, W]`` checked root logits (one row outside rows mode)."""
        with model_call():
            if self.rows_mode:
                return self._checked(self.root_rows_logits(proposal), 2, proposal)
            logits = self._checked(self.root_proposal_logits() if proposal else self.root_logits(), 1, proposal)
            return logits.unsqueeze(0)  # [1, W]

    def _tree_rows(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool) -> torch.Tensor:
        """``[B, k, W]`` checked logits at ``k`` new nodes per row (one row outside rows mode)."""
        if self.rows_mode:
            with model_call():
                return self._checked(self.tree_rows_logits(parents, tokens, proposal), 3, proposal, tuple(parents.shape))
        return self._tree_logits_checked(parents[0], tokens[0], proposal).unsqueeze(0)  # [1, k, W]

    def _tree_logits_checked(
        self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor, proposal: bool = False
    ) -> torch.Tensor:
        if len(parents) != len(tokens):
            raise ValueError(f"expand: {len(parents)} parents but {len(tokens)} tokens")
        with model_call():
            logits = self.tree_proposal_logits(parents, tokens) if proposal else self.tree_logits(parents, tokens)
        return self._checked(logits, 2, proposal, (len(parents),))

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


def laws_and_flags(logits: torch.Tensor, samplings: Sequence[SamplingConfig]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``([q [..., V] per config], bad [...])``: the processed laws of ``logits`` and the rows
    :func:`~specdec.sampling.row_is_bad` flags, read from a sampled law's first column where
    there is one (:func:`~specdec.sampling.law_is_bad`; a pass over the vocabulary otherwise)."""
    qs = [process_logits(logits, s, check=False) for s in samplings]
    for q, s in zip(qs, samplings):
        if not s.greedy:
            return qs, law_is_bad(q)
    return qs, row_is_bad(logits)
