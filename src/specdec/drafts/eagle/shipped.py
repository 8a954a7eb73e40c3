"""The EAGLE heads and the draft LM for SmolLM2-135M-Instruct shipped in ``specdec/assets``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdec.drafts.eagle.checkpoint_config import CheckpointError
from specdec.drafts.eagle.checkpoint_own import load_head
from specdec.drafts.eagle.draft import EagleDraft, hf_feature_fn, make_draft
from specdec.errors import InvalidConfigError

__all__ = ["SHIPPED_DIR", "load_shipped", "shipped_draft_lm_path", "shipped_head_path"]

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets"
_DRAFT_LM_DIR = "draft-lm-smollm2-135m-instruct"


def shipped_head_path(version: int) -> Path:
    """Folder of the EAGLE-``version`` head for SmolLM2-135M-Instruct shipped in ``specdec/assets``."""
    if version not in (2, 3):
        raise InvalidConfigError(f"version must be 2 or 3, got {version!r}")
    p = SHIPPED_DIR / f"eagle{version}-smollm2-135m-instruct"
    if not (p / "config.json").is_file():
        raise CheckpointError(f"no shipped EAGLE-{version} head at {p}")
    return p


def shipped_draft_lm_path() -> Path:
    """Folder of the distilled 2-layer draft LM for SmolLM2-135M-Instruct in ``specdec/assets``."""
    p = SHIPPED_DIR / _DRAFT_LM_DIR
    if not (p / "config.json").is_file():
        raise CheckpointError(f"no shipped draft LM at {p}")
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
