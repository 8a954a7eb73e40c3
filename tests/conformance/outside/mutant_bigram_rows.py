"""Mutant draft: the outside bigram draft whose rows mode answers every row's root with row 0's
context (a batched cache indexed by the wrong row). One row at a time it is correct; the ``rows``
suite must catch it."""

import torch

from good_bigram import OutsideBigram
from specdec.registry import register


def make(setting):
    return RowsMixedUp(setting.vocab_size, device=setting.device)


@register("draft", "outside-mutant-bigram-rows", factory=make)
class RowsMixedUp(OutsideBigram):
    def root_rows_logits(self, proposal=False):
        return self._logits([self._rows[0][0]] * len(self._rows))  # BUG: row 0's context for every row



