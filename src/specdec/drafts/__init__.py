"""Draft models, registered under role ``"draft"``."""

from specdec.drafts.base import DraftModel
from specdec.drafts.hf import HFDraft

__all__ = ["DraftModel", "HFDraft"]
