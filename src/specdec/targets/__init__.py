"""Target models, registered under role ``"target"``."""

from specdec.targets.base import OneRowTarget, TargetModel
from specdec.targets.hf import HFTarget

__all__ = ["HFTarget", "OneRowTarget", "TargetModel"]
