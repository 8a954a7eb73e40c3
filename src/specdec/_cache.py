"""specdec's user cache folder, for the modules below the models (the CPU linear plans, the few-row
kernel's build) as for the model conversions (:mod:`specdec.models.smollm2` re-exports it)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """specdec's user cache folder (``$SPECDEC_CACHE``, ``$XDG_CACHE_HOME/specdec`` or ``~/.cache/specdec``)."""
    if os.environ.get("SPECDEC_CACHE"):
        return Path(os.environ["SPECDEC_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "specdec"
    return Path.home() / ".cache" / "specdec"
