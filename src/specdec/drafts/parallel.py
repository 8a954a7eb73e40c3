"""The parallel draft form: the laws of the next ``k`` positions in one call (docs/drafts.md, "Parallel drafts").

A *parallel draft* proposes every position of a block in one forward (PARD, P-EAGLE, DFlash; Medusa's
heads): one call returns the laws of the next ``k`` positions after each row's committed context, each
conditioned on the context only, never on the drafted tokens before it. It is a form of the draft
contract, as :class:`~specdec.drafts.base.OneRowDraft` is: a class subclasses :class:`ParallelDraft`
(beside :class:`~specdec.drafts.base.DraftModel` or a one-row draft) and writes :attr:`block_size` and
:meth:`block_rows_logits`; the declaration is :attr:`~specdec.drafts.base.DraftModel.parallel_form`.
A class of the form that does not write both is refused when it is defined
(:class:`~specdec.errors.PluginError`, naming what is missing).

The engine asks through its one draft call: a builder yields a
:class:`~specdec.draft_request.DraftRequest` with ``block = depth`` (level 0), and
:meth:`~specdec.drafts.base.DraftModel.request_logits` answers it from :meth:`block_rows_logits`,
checked (the depth against :attr:`block_size`, the shape ``[B, depth, W]``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError, PluginError
from specdec.regions import model_call

__all__ = ["ParallelDraft"]


class ParallelDraft(DraftModel):
    """The parallel form of a draft (module docstring). Shapes: ``B`` rows, ``depth`` positions,
    ``W`` logit columns (``V``, or ``Vd`` over the draft's proposal vocabulary)."""

    parallel_form: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A class of the form that does not write :attr:`block_size` and :meth:`block_rows_logits`
        is refused here, when it is defined (:class:`PluginError` naming the missing members)."""
        super().__init_subclass__(**kwargs)
        written = {"block_size": cls.block_size is not ParallelDraft.block_size,
                   "block_rows_logits": cls.block_rows_logits is not ParallelDraft.block_rows_logits}
        missing = [name for name, done in written.items() if not done]
        if missing:
            raise PluginError(
                f"draft class {cls.__qualname__} has the parallel form (ParallelDraft) but does not implement "
                f"{', '.join(missing)} (docs/drafts.md, 'Parallel drafts')")

    @property
    @abstractmethod
    def block_size(self) -> int:
        """How many next positions one :meth:`block_rows_logits` call can give (``>= 1``)."""

    @abstractmethod
    def block_rows_logits(self, depth: int, proposal: bool = False) -> torch.Tensor:
        """``[B, depth, W]`` raw logits of positions ``1 .. depth`` after every row's committed
        context, in one call (``1 <= depth <= block_size``); position ``d``'s law is a function of
        the context only (its marginal law, or any law that does not read drafted tokens)."""

    def _answer_block(self, request: DraftRequest) -> torch.Tensor:
        """A parallel request: :meth:`block_rows_logits`, checked.

        Raises:
            InvalidConfigError: ``request.block`` outside ``1 .. block_size`` (a block shorter than
                the requested depth).
            VocabMismatchError / InvalidDistributionError: logits of another width / shape than
                ``[B, depth, W]``.
        """
        depth = request.block
        if not 1 <= depth <= self.block_size:
            raise InvalidConfigError(f"draft {type(self).__name__}: a parallel request of block={depth} positions; "
                                     f"its block_size is {self.block_size} (a block shorter than the requested depth)")
        with model_call():
            logits = self.block_rows_logits(depth, request.proposal)
        return self._checked(logits, 3, request.proposal, (request.rows, depth))
