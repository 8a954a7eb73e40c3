"""EAGLE-3 heads in vLLM's ``speculators`` format (vllm-project/speculators ``Eagle3SpeculatorConfig``).

Detecting the format (:func:`_is_speculators`), reading and checking its
config (the decoder layer's ``transformer_layer_config``, the options
specdec's head implements, the verifier it was made for), its tensor names,
and writing it (:func:`save_speculators_head`).
:func:`~specdec.drafts.eagle.checkpoint_reference.load_reference_head` loads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from specdec._extras import needs_extra
from specdec.drafts.eagle.checkpoint_config import CheckpointError, _field
from specdec.drafts.eagle.checkpoint_weights import _renamed
from specdec.drafts.eagle.head import EagleHead
from specdec.errors import InvalidConfigError

__all__ = ["save_speculators_head", "speculators_state_dict"]

_SPECULATORS_PREFIX = "layers.0."  # speculators' EAGLE-3 layout (a ModuleList of one decoder layer)


def speculators_state_dict(head: EagleHead) -> dict[str, torch.Tensor]:
    """An EAGLE-3 ``head``'s tensors in the ``speculators`` layout (vllm-project/speculators
    ``Eagle3DraftModel``): ``fc.weight``, ``layers.0.*``, ``norm.weight``, ``lm_head.weight``,
    and ``d2t`` / ``t2d`` only when the draft vocabulary is smaller than the target's (as
    speculators saves them); never the target's embedding."""
    if head.config.version != 3:
        raise InvalidConfigError(f"the speculators layout holds EAGLE-3 heads, got an EAGLE-{head.config.version} head")
    sd = _renamed(head, _SPECULATORS_PREFIX)
    if head.config.draft_vocab_size == head.config.vocab_size:  # identity mapping: speculators has no buffers then
        del sd["d2t"], sd["t2d"]
    return sd


def _is_speculators(cfg: dict[str, Any]) -> bool:
    return any(k in cfg for k in ("speculators_model_type", "speculators_config", "transformer_layer_config"))


def _speculators_fields(cfg: dict[str, Any], f: Path) -> tuple[dict[str, Any], bool, dict[str, Any]]:
    """The decoder layer's config, ``norm_before_residual`` and the verifier record of a
    ``speculators`` EAGLE-3 config; a :class:`CheckpointError` for what specdec's head cannot run."""
    kind = cfg.get("speculators_model_type")
    if kind != "eagle3":
        raise CheckpointError(f"{f}: speculators_model_type {kind!r}: only speculators' 'eagle3' heads load here")
    tl = _field(cfg, "transformer_layer_config", "dict", f)
    where = "transformer_layer_config."
    if tl.get("model_type") != "llama":
        raise CheckpointError(
            f"{f}: {where}model_type {tl.get('model_type')!r}: only 'llama' decoder layers are supported "
            "(a 'qwen3' layer adds q_norm / k_norm, which specdec's EAGLE head does not have)")
    layers = _field(tl, "num_hidden_layers", "int", f, default=1, minimum=1, where=where)
    if layers != 1:
        raise CheckpointError(f"{f}: {where}num_hidden_layers is {layers}: only single-layer EAGLE-3 heads are supported")
    for doc, flag, at in ((tl, "attention_bias", where), (tl, "mlp_bias", where),
                          (cfg, "norm_before_fc", ""), (cfg, "fc_norm", ""), (cfg, "norm_output", "")):
        if _field(doc, flag, "bool", f, default=False, nullable=True, where=at):
            raise CheckpointError(f"{f}: {at}{flag} is true: specdec's EAGLE-3 head does not implement it")
    if "norm_before_residual" not in cfg:
        raise CheckpointError(
            f"{f}: no norm_before_residual (speculators always writes it): vLLM reads a missing one as true, "
            "speculators' own default is false; add the value the head was trained with")
    norm_before_residual = _field(cfg, "norm_before_residual", "bool", f)
    spec = _field(cfg, "speculators_config", "dict", f, default=None, nullable=True) or {}
    verifier = _field(spec, "verifier", "dict", f, default=None, nullable=True, where="speculators_config.") or {}
    return tl, norm_before_residual, verifier


def _verifier_text(verifier: dict[str, Any]) -> str:
    name, archs = verifier.get("name_or_path"), verifier.get("architectures")
    return f"{name or 'an unnamed verifier'}" + (f" ({', '.join(map(str, archs))})" if isinstance(archs, list) and archs else "")


def _check_verifier(verifier: dict[str, Any], target: Any, f: Path) -> None:
    """A speculators head names the verifier it was made for: refuse a target of another architecture."""
    archs = verifier.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise CheckpointError(f"{f}: field 'speculators_config.verifier.architectures' must be an array of strings, "
                              f"got {archs!r}")
    tcfg = getattr(target, "config", None)
    theirs = getattr(tcfg, "architectures", None) or []
    if archs and theirs and not set(archs) & set(theirs):
        raise CheckpointError(f"{f}: this head was made for {_verifier_text(verifier)}, but the target is a "
                              f"{', '.join(theirs)}: load it with the verifier it was trained for")


def save_speculators_head(head: EagleHead, path: str | os.PathLike, *, verifier_name_or_path: str | None = None,
                          verifier_architectures: Sequence[str] = ("LlamaForCausalLM",), speculative_tokens: int = 3,
                          dtype: torch.dtype | None = None) -> Path:
    """Write an EAGLE-3 ``head`` in vLLM's ``speculators`` format (vllm-project/speculators
    ``Eagle3SpeculatorConfig``), which :func:`load_reference_head` (and vLLM) read.

    ``config.json`` holds ``speculators_model_type: "eagle3"``, a llama
    ``transformer_layer_config`` (one layer), ``draft_vocab_size``,
    ``norm_before_residual``, ``target_hidden_size`` (null when equal to the
    head's width), ``eagle_aux_hidden_state_layer_ids`` (always written, in
    vLLM's numbering: specdec's ``target_layers`` as they are) and a
    ``speculators_config`` block (algorithm, greedy proposal of
    ``speculative_tokens`` tokens, ``verifier`` with ``name_or_path`` and
    ``architectures``); ``model.safetensors`` holds
    :func:`speculators_state_dict`.

    Args:
        head: an EAGLE-3 head without an ``fc`` bias.
        path: the folder (created).
        verifier_name_or_path, verifier_architectures: the target the head is for.
        speculative_tokens: the proposal length recorded for vLLM.
        dtype: store floating tensors in this dtype.
    """
    with needs_extra("hf", "save_speculators_head"):
        from safetensors.torch import save_file

    c = head.config
    if c.version != 3:
        raise InvalidConfigError(f"the speculators layout holds EAGLE-3 heads, got an EAGLE-{c.version} head")
    if c.fc_bias:
        raise InvalidConfigError("speculators' EAGLE-3 fc has no bias, this head's has one")
    if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int) or speculative_tokens < 1:
        raise InvalidConfigError(f"speculative_tokens must be a positive integer, got {speculative_tokens!r}")
    layer: dict[str, Any] = {
        "model_type": "llama", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }
    if c.max_position_embeddings is not None:
        layer["max_position_embeddings"] = c.max_position_embeddings
    doc = {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": None if c.target_hidden_size == c.hidden_size else c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(c.target_layers),
        "norm_before_residual": c.norm_before_residual, "norm_before_fc": False, "fc_norm": False,
        "norm_output": False, "tie_word_embeddings": False, "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier_name_or_path, "architectures": list(verifier_architectures)},
        },
    }
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in speculators_state_dict(head).items():
        v = v.detach().cpu()
        tensors[k] = (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out
