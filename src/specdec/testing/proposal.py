"""A test draft with a reduced proposal vocabulary (EAGLE-3's draft vocabulary, in miniature)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.models import CallableLM


class ProposalLM(CallableLM):
    """A :class:`~specdec.models.CallableLM` that declares ``keep`` as its
    :attr:`~specdec.drafts.base.DraftModel.proposal_ids`: its proposal logits
    are its full logits at those columns. ``fn`` must give ``-inf`` outside
    ``keep`` (the contract of a proposal vocabulary; a law with mass outside it
    is an error of the draft, which the builders report).

    Example:
        >>> lm = ProposalLM(lambda prefixes: torch.zeros(len(prefixes), 4), vocab_size=4, keep=[0, 2])
        >>> lm.proposal_ids.tolist()
        [0, 2]
    """

    def __init__(self, fn: Callable[[list[list[int]]], torch.Tensor], vocab_size: int, keep: Sequence[int]) -> None:
        super().__init__(fn, vocab_size=vocab_size)
        self.keep = torch.as_tensor(list(keep), dtype=torch.int64)

    @property
    def proposal_ids(self) -> torch.Tensor:
        return self.keep

    def root_proposal_logits(self) -> torch.Tensor:
        return self.root_logits()[self.keep]

    def tree_proposal_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        return self.tree_logits(parents, tokens)[:, self.keep]
