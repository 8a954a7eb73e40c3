"""specdec's own EAGLE head format: :func:`save_head` and :func:`load_head`.

A folder with ``config.json`` (``{"format": "specdec-eagle", "format_version": 1,
"config": {EagleConfig fields}, "target": {...}, "meta": {...}}``) and
``model.safetensors`` (the head's trainable tensors, never the target's); see
:mod:`specdec.drafts.eagle.checkpoints` for the layout. Own-format heads are
never read from pickle (``.bin``) files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import torch

from specdec._extras import needs_extra
from specdec.drafts.eagle.checkpoint_config import (
    _MISSING, CheckpointError, _check_layers, _depth, _field, _raise_position_limit, _read_config, _target_depth,
)
from specdec.drafts.eagle.checkpoint_weights import _build, _load_into, _targets_tensors, read_state_dict
from specdec.drafts.eagle.head import EagleConfig, EagleHead
from specdec.errors import InvalidConfigError

__all__ = ["FORMAT", "FORMAT_VERSION", "load_head", "save_head"]

FORMAT = "specdec-eagle"
FORMAT_VERSION = 1


def save_head(head: EagleHead, path: str | os.PathLike, *, meta: dict[str, Any] | None = None,
              dtype: torch.dtype | None = None, target_num_layers: int | None = None) -> Path:
    """Write ``head`` in specdec's own format to the folder ``path``.

    Args:
        head: the head to save.
        path: the folder (created).
        meta: free-form provenance (training data, steps...) stored in config.json.
        dtype: store floating tensors in this dtype (e.g. ``torch.float16`` for shipping).
        target_num_layers: the layer count of the target the head was trained
            for (:func:`~specdec.train.train_students` passes it); recorded so
            that :func:`load_head` refuses a target of another depth.
    """
    with needs_extra("hf", "save_head"):
        from safetensors.torch import save_file

    if target_num_layers is not None:
        target_num_layers = _depth(target_num_layers, "target_num_layers")
        _check_layers(head.config.target_layers, target_num_layers, "save_head", error=InvalidConfigError)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in head.trainable_state_dict().items():
        v = v.detach().cpu()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        tensors[k] = v.contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    config = attrs.asdict(head.config)
    config["target_layers"] = list(config["target_layers"])
    doc: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, "config": config}
    if target_num_layers is not None:
        doc["target"] = {"num_hidden_layers": target_num_layers, "feature_layers": list(config["target_layers"])}
    doc["meta"] = meta or {}
    (out / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out


# own format: the kind and lower bound of each EagleConfig field in config.json's "config"
_CONFIG_FIELDS: dict[str, tuple[str, float | None]] = {
    "version": ("int", None), "hidden_size": ("int", 1), "intermediate_size": ("int", 1),
    "num_attention_heads": ("int", 1), "num_key_value_heads": ("int", 1), "head_dim": ("int", 1),
    "vocab_size": ("int", 1), "draft_vocab_size": ("int", 1), "target_layers": ("int_list", 0),
    "target_hidden_size": ("int", 1), "rms_norm_eps": ("float", None), "rope_theta": ("float", None),
    "fc_bias": ("bool", None), "norm_before_residual": ("bool", None), "max_position_embeddings": ("int", 1),
}
_NULLABLE_FIELDS = {"max_position_embeddings"}


def _own_config(doc: dict[str, Any], cfg_file: Path) -> EagleConfig:
    raw = _field(doc, "config", "dict", cfg_file)
    fields = attrs.fields_dict(EagleConfig)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise CheckpointError(f"{cfg_file}: unknown field(s) {unknown} in 'config' (EagleConfig fields: {list(fields)})")
    values = {}
    for name, a in fields.items():
        default = _MISSING if a.default is attrs.NOTHING else a.default
        if name not in _CONFIG_FIELDS:  # a field this table does not know: EagleConfig checks it
            if name in raw:
                values[name] = raw[name]
            elif default is _MISSING:
                raise CheckpointError(f"{cfg_file}: required field 'config.{name}' is missing")
            continue
        kind, minimum = _CONFIG_FIELDS[name]
        values[name] = _field(raw, name, kind, cfg_file, default=default, minimum=minimum,
                              nullable=name in _NULLABLE_FIELDS, where="config.")
    try:
        return EagleConfig(**values)
    except InvalidConfigError as exc:
        raise CheckpointError(f"{cfg_file}: {exc}") from exc


def _own_weights(p: Path) -> Path:
    """``p/model.safetensors``, or a :class:`CheckpointError` saying what the folder holds instead."""
    f = p / "model.safetensors"
    if f.is_file():
        return f
    bins = sorted(x.name for x in p.glob("*.bin"))
    if bins:
        raise CheckpointError(
            f"{p}: no model.safetensors, but found {', '.join(bins)}: specdec's own format stores the head in "
            "model.safetensors and load_head never reads pickle (.bin) files. A reference-layout (SafeAILab "
            "EAGLE / SpecForge) checkpoint loads with load_reference_head; to convert, write "
            "safetensors.torch.save_file(read_state_dict(folder / name), folder / 'model.safetensors') "
            "(read_state_dict reads a .bin with torch.load(weights_only=True), refusing anything but tensors)"
        )
    others = sorted(x.name for x in p.glob("*.safetensors"))
    hint = f"; found {', '.join(others)}" if others else ""
    raise CheckpointError(f"{p}: no model.safetensors (specdec's own format stores the head there){hint}")


def load_head(path: str | os.PathLike, target: Any, *, dtype: torch.dtype | None = None,
              device: Any = None, target_num_layers: int | None = None,
              target_max_positions: int | None = None) -> EagleHead:
    """Load a head saved by :func:`save_head`, wired to ``target``.

    Args:
        path: the checkpoint folder.
        target: the Hugging Face target model, or a tuple ``(embed [V, H], lm_head [V, H])``.
        dtype: the head's compute dtype (default: the target embedding's, so a
            bfloat16 target gets a bfloat16 head).
        device: where to put the head (default: the target embedding's device).
        target_num_layers: the target's layer count (default: ``target.config.num_hidden_layers``;
            unknown, and not checked, for a tensor pair).
        target_max_positions: the target's context (default: its config's
            ``max_position_embeddings``); a recorded head limit below it is
            raised to it, with a logged warning.

    Raises:
        CheckpointError: a missing, corrupt or malformed file (named in the
            message), or a head recorded for a target of another depth, or
            whose feature layers the target does not have.
    """
    p = Path(path)
    doc = _read_config(p)
    cfg_file = p / "config.json"
    if doc.get("format") != FORMAT:
        raise CheckpointError(
            f"{p} is not a specdec EAGLE checkpoint (format {doc.get('format')!r}); "
            "use load_reference_head for reference-layout checkpoints"
        )
    version = _field(doc, "format_version", "int", cfg_file, default=0)
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{p}: format_version {version} is newer than this specdec supports")
    config = _own_config(doc, cfg_file)
    n = _target_depth(target, target_num_layers)
    recorded = None
    if "target" in doc:  # absent from heads saved before the depth was recorded: those are not depth-checked
        record = _field(doc, "target", "dict", cfg_file)
        recorded = _field(record, "num_hidden_layers", "int", cfg_file, default=None, minimum=1, where="target.")
    if n is not None and recorded is not None and recorded != n:
        raise CheckpointError(
            f"{p}: this EAGLE-{config.version} head was trained for a target with {recorded} layers (feature "
            f"layers {list(config.target_layers)}), but the target has {n} layers: the same hidden_states "
            "indices are other layers there. Load it with the target it was trained for"
        )
    if n is not None:
        _check_layers(config.target_layers, n, p)
    config = _raise_position_limit(config, target, target_max_positions, p)
    embed, lm_head = _targets_tensors(target)
    head = _build(config, embed, lm_head, dtype, device)
    _load_into(head, read_state_dict(_own_weights(p)), str(p), cfg_file=cfg_file)
    return head.eval()
