"""The EAGLE heads and the draft LM for SmolLM2-135M-Instruct shipped with specdec.

A clone of the repository holds them in ``src/specdec/assets`` (an editable install reads them
there). The ``specdec-trees`` wheel does not carry them: they are the distribution
``specdec-trees-smollm2`` (``pip install 'specdec-trees[heads]'``), built from
``src/specdec/assets/pyproject.toml``, whose package folder ``specdec_trees_smollm2`` is located
with :func:`importlib.util.find_spec` and never imported (docs/install.md, "The shipped weights").
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from specdec._extras import install_command
from specdec.drafts.eagle.checkpoint_config import CheckpointError
from specdec.drafts.eagle.checkpoint_own import load_head
from specdec.drafts.eagle.draft import EagleDraft, hf_feature_fn, make_draft
from specdec.errors import InvalidConfigError

__all__ = ["SHIPPED_DIR", "load_shipped", "shipped_draft_lm_path", "shipped_head_path"]

_DRAFT_LM_DIR = "draft-lm-smollm2-135m-instruct"
_WEIGHT_DIRS = ("eagle2-smollm2-135m-instruct", "eagle3-smollm2-135m-instruct", _DRAFT_LM_DIR)
_WEIGHTS_PACKAGE = "specdec_trees_smollm2"  # the package folder of the specdec-trees-smollm2 distribution


def _shipped_dir() -> Path:
    """The package's own ``assets`` folder when it holds the weights (a clone), else the folder of
    the installed ``specdec-trees-smollm2`` distribution, else the (empty) ``assets`` folder."""
    own = Path(__file__).resolve().parents[2] / "assets"
    if any((own / d / "config.json").is_file() for d in _WEIGHT_DIRS):
        return own
    try:
        spec = importlib.util.find_spec(_WEIGHTS_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return own


SHIPPED_DIR = _shipped_dir()
"""Where the shipped heads and draft LM are: ``specdec/assets`` in a clone, else the
``specdec-trees-smollm2`` distribution's folder."""
_MISSING = f"not installed ({install_command('heads')}, or run from a clone of the repository)"


def shipped_head_path(version: int) -> Path:
    """Folder of the EAGLE-``version`` head for SmolLM2-135M-Instruct (in :data:`SHIPPED_DIR`)."""
    if version not in (2, 3):
        raise InvalidConfigError(f"version must be 2 or 3, got {version!r}")
    p = SHIPPED_DIR / f"eagle{version}-smollm2-135m-instruct"
    if not (p / "config.json").is_file():
        raise CheckpointError(f"the shipped EAGLE-{version} head for SmolLM2-135M-Instruct is {_MISSING}: no {p}")
    return p


def shipped_draft_lm_path() -> Path:
    """Folder of the distilled 2-layer draft LM for SmolLM2-135M-Instruct (in :data:`SHIPPED_DIR`)."""
    p = SHIPPED_DIR / _DRAFT_LM_DIR
    if not (p / "config.json").is_file():
        raise CheckpointError(f"the shipped draft LM for SmolLM2-135M-Instruct is {_MISSING}: no {p}")
    return p


def load_shipped(version: int, target_model: Any, *, dtype: torch.dtype | None = None) -> EagleDraft:
    """The EAGLE-``version`` head shipped with specdec for SmolLM2-135M-Instruct, as a draft.

    Args:
        version: 2 or 3.
        target_model: the Hugging Face SmolLM2-135M-Instruct model (e.g. from
            :func:`specdec.models.smollm2.load_smollm2`): the head shares its
            embedding / LM head, and ``feature_fn`` falls back on it.
        dtype: compute dtype of the head (default: the target's; weights are stored in float16).
    """
    head = load_head(shipped_head_path(version), target_model, dtype=dtype)
    draft = make_draft(head, feature_fn=hf_feature_fn(target_model, head.config.target_layers))
    return draft
