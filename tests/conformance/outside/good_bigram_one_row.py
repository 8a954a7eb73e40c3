"""A correct outside draft without a rows mode: the bigram draft serving one row at a time. The
conformance command proves its laws and the methods using it, and reports its rows and batch cases
as SKIP (it has no rows mode); the batch case runs it through one copy per row (specdec.adapters)."""

from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.registry import register

from good_bigram import OutsideBigram


def make(setting):
    return OneRowBigram(setting.vocab_size, device=setting.device)


@register("draft", "outside-bigram-one-row", factory=make)
class OneRowBigram(OutsideBigram):
    supports_rows = False
    begin_rows = OneRowDraft.begin_rows
    commit_rows = OneRowDraft.commit_rows
    keep_rows = DraftModel.keep_rows
    root_rows_logits = OneRowDraft.root_rows_logits
    tree_rows_logits = OneRowDraft.tree_rows_logits
    rows_mode = OneRowDraft.rows_mode
