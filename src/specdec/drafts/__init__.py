"""Draft models, registered under role ``"draft"``."""

from specdec.drafts.base import DraftModel

__all__ = ["DraftModel"]
