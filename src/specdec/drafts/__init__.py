"""Draft models, registered under role ``"draft"``."""

from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.drafts.eagle import Eagle2Draft, Eagle3Draft
from specdec.drafts.hf import HFDraft
from specdec.drafts.ngram import NgramDraft
from specdec.drafts.processed import ProcessedDraft

__all__ = ["DraftModel", "Eagle2Draft", "Eagle3Draft", "HFDraft", "NgramDraft", "OneRowDraft", "ProcessedDraft"]
