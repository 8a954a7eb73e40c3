"""A correct outside draft without a rows mode: the bigram draft serving one row at a time. The
conformance command proves its laws and the methods using it, and reports its rows and batch cases
as SKIP (it has no rows mode, so ``generate_batch`` refuses it): never as a pass."""

from specdec.drafts.base import DraftModel
from specdec.registry import register

from good_bigram import OutsideBigram


def make(setting):
    return OneRowBigram(setting.vocab_size, device=setting.device)


@register("draft", "outside-bigram-one-row", factory=make)
class OneRowBigram(OutsideBigram):
    supports_rows = False
    begin_rows = DraftModel.begin_rows
    commit_rows = DraftModel.commit_rows
    keep_rows = DraftModel.keep_rows
    root_rows_logits = DraftModel.root_rows_logits
    tree_rows_logits = DraftModel.tree_rows_logits
    rows_mode = DraftModel.rows_mode
