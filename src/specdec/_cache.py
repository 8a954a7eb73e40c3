"""specdec's user cache folder, for the modules below the models (the CPU linear plans, the few-row
kernel's build) as for the model conversions (:mod:`specdec.models.smollm2` re-exports it).

What lives in it (``docs/install.md``, "Caches": how each is keyed and cleared):

- ``ext/specdec_fewrow_<key>/``: the few-row CPU kernel's build (:mod:`specdec.kernels.fewrow`),
  beside its lock ``ext/<name>.lock`` and, while one runs, a build's folder ``ext/<name>.build-*``;
- ``linear-plans.json``: the tuned CPU linear plans (:func:`specdec.kernels.linear.plan_file`);
- ``<gguf stem>-<size>/``: the converted SmolLM2 and Gemma-3 models
  (:func:`specdec.models.smollm2.converted_path`, :func:`specdec.models.gemma3.converted_path`);
- ``heads/``: draft heads and draft LMs trained for Gemma-3-270M and exported there
  (:func:`specdec.models.gemma3.heads_root`): your own training's output, not rebuilt on demand.
"""

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
