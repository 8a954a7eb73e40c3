"""Model wrappers usable as target or draft (one object, both interfaces)."""

from specdec.models.callable import CallableLM

__all__ = ["CallableLM"]
