"""Draft models, registered under role ``"draft"``."""

from specdec.drafts.base import DraftModel
from specdec.drafts.eagle import Eagle2Draft, Eagle3Draft
from specdec.drafts.hf import HFDraft
from specdec.drafts.ngram import NgramDraft

__all__ = ["DraftModel", "Eagle2Draft", "Eagle3Draft", "HFDraft", "NgramDraft"]
