"""Target models, registered under role ``"target"``."""

from specdec.targets.base import TargetModel
from specdec.targets.hf import HFTarget

__all__ = ["HFTarget", "TargetModel"]
