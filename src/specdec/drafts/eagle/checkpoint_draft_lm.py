"""Files of a distilled draft LM: stored without the embedding and LM head it shares with its target.

:func:`export_draft_lm` writes the draft's own layers in float16,
:func:`load_draft_lm` completes them with the target's tensors into a
``transformers`` model, and :func:`draft_lm_proposal_ids` reads the
proposal vocabulary stored beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from specdec._extras import needs_extra
from specdec.drafts.eagle.checkpoint_config import CheckpointError
from specdec.drafts.eagle.checkpoint_weights import _targets_tensors, read_state_dict
from specdec.errors import VocabMismatchError

__all__ = ["PROPOSAL_IDS_FILE", "draft_lm_proposal_ids", "export_draft_lm", "load_draft_lm"]

_SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")


def export_draft_lm(src: str | os.PathLike, dst: str | os.PathLike) -> dict[str, int]:
    """Store a distilled draft LM (a Hugging Face folder written by
    :func:`specdec.train.train_draft_lm`) compactly: its own layers and norm in
    float16, *without* the embedding / LM head it shares with its target
    (:func:`load_draft_lm` puts the target's back). Returns file sizes."""
    with needs_extra("hf", "export_draft_lm"):
        from safetensors.torch import save_file

    s, d = Path(src), Path(dst)
    sd = read_state_dict(s)
    d.mkdir(parents=True, exist_ok=True)
    own = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in sd.items() if k not in _SHARED_KEYS}
    save_file(own, str(d / "model.safetensors"), metadata={"format": "pt", "shared_with_target": ",".join(_SHARED_KEYS)})
    (d / "config.json").write_text((s / "config.json").read_text())
    meta = s / "specdec_meta.json"
    if meta.exists():
        (d / "specdec_meta.json").write_text(meta.read_text())
    return {d.name: (d / "model.safetensors").stat().st_size}


def load_draft_lm(path: str | os.PathLike, target: Any, *, dtype: torch.dtype | None = None) -> Any:
    """A draft LM stored by :func:`export_draft_lm`, completed with ``target``'s
    embedding (and LM head), as a ``transformers`` ``LlamaForCausalLM`` in eval
    mode, in ``dtype`` (default: the target embedding's). ``model.save_pretrained(folder)``
    then writes a normal HF model folder."""
    with needs_extra("hf", "load_draft_lm"):
        from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    model = AutoModelForCausalLM.from_config(config)
    sd = read_state_dict(p / "model.safetensors")
    embed, lm_head = _targets_tensors(target)
    if tuple(embed.shape) != (config.vocab_size, config.hidden_size):
        raise VocabMismatchError(f"draft LM at {p} needs a target embedding ({config.vocab_size}, {config.hidden_size}), "
                                 f"got {tuple(embed.shape)}")
    sd["model.embed_tokens.weight"] = embed.detach().float()
    if not getattr(config, "tie_word_embeddings", False):
        sd["lm_head.weight"] = lm_head.detach().float()
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    missing = [m for m in missing if m != "lm_head.weight" or not getattr(config, "tie_word_embeddings", False)]
    if missing or unexpected:
        raise CheckpointError(f"draft LM at {p}: missing {missing}, unexpected {unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.to(dtype or embed.dtype).eval()


PROPOSAL_IDS_FILE = "proposal_ids.json"
"""A draft LM folder's proposal vocabulary (ascending target ids), when it was distilled over one."""


def draft_lm_proposal_ids(path: str | os.PathLike) -> torch.Tensor | None:
    """``[Vd]`` int64 the proposal vocabulary stored beside a draft LM (:data:`PROPOSAL_IDS_FILE`,
    for :class:`~specdec.drafts.hf.HFDraft`'s ``proposal_ids``), or None when it has none."""
    f = Path(path) / PROPOSAL_IDS_FILE
    if not f.is_file():
        return None
    try:
        ids = json.loads(f.read_text())["ids"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{f}: not a proposal vocabulary ({exc})") from None
    if not isinstance(ids, list):
        raise CheckpointError(f"{f}: \"ids\" must be a list of integer token ids, got {type(ids).__name__}")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):  # 1.7 is not id 1; [[1, 2]] is not [1, 2]
            raise CheckpointError(f"{f}: \"ids\" must be a flat list of integer token ids; entry {i} is {t!r:.40}")
    return torch.tensor(ids, dtype=torch.int64)
