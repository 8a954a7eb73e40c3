"""Target models, registered under role ``"target"``."""

from specdec.targets.base import TargetModel

__all__ = ["TargetModel"]
