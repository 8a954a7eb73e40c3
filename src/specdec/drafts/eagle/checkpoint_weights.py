"""The tensors of an EAGLE checkpoint: reading weight files, building the head, loading tensors into it.

Weights are read with safetensors, or from ``pytorch_model*.bin`` with
``torch.load(weights_only=True)`` (never unpickled); a corrupt, truncated or
refused file raises a :class:`~specdec.drafts.eagle.checkpoint_config.CheckpointError`
naming it. :func:`_load_into` copies a state dict (in the head's key names)
into a head, naming each tensor whose shape disagrees with the config and the
config fields that fix it.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch

from specdec._extras import needs_extra
from specdec.drafts.eagle.checkpoint_config import CheckpointError
from specdec.drafts.eagle.head import EagleConfig, EagleHead, target_embeddings

__all__ = ["read_state_dict"]


def _targets_tensors(target: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(target, tuple):
        return target
    return target_embeddings(target)


def _load_safetensors(f: Path) -> dict[str, torch.Tensor]:
    with needs_extra("hf", "reading an EAGLE checkpoint"):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

    try:
        return load_file(str(f))
    except SafetensorError as exc:
        raise CheckpointError(f"{f} is corrupt or truncated (not a readable safetensors file): {exc}") from exc


def _load_bin(f: Path) -> dict[str, torch.Tensor]:
    # weights_only=True: tensors and plain containers only; any other pickled
    # object (which could run code when unpickled) is refused, never built
    try:
        loaded = torch.load(str(f), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"{f} was refused by torch.load(weights_only=True): it is corrupt or truncated, or it pickles objects "
            f"other than tensors, which specdec never unpickles ({first})"
        ) from exc
    except (RuntimeError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{f} is corrupt or truncated (not a readable PyTorch file): {exc}") from exc
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{f} does not hold a state dict")
    return loaded


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint folder or file: ``*.safetensors`` (all shards) or,
    failing that, ``pytorch_model*.bin`` read with ``torch.load(weights_only=True)``
    (which refuses pickled objects other than tensors). A corrupt, truncated or
    refused file raises a :class:`CheckpointError` naming it."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p} does not exist")
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if files and all(f.suffix == ".safetensors" for f in files):
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(_load_safetensors(f))
        return sd
    bins = [p] if p.is_file() else sorted(p.glob("pytorch_model*.bin"))
    if not bins:
        raise CheckpointError(f"no *.safetensors or pytorch_model*.bin weights in {p}")
    sd = {}
    for f in bins:
        sd.update(_load_bin(f))
    return sd


# what fixes the shape of each tensor, for "the tensors disagree with config.json" errors
_SHAPE_FIELDS = {
    "fc.weight": "hidden_size, target_hidden_size and the number of feature layers",
    "fc.bias": "hidden_size",
    "layer.self_attn.q_proj.weight": "num_attention_heads, head_dim and hidden_size",
    "layer.self_attn.k_proj.weight": "num_key_value_heads, head_dim and hidden_size",
    "layer.self_attn.v_proj.weight": "num_key_value_heads, head_dim and hidden_size",
    "layer.self_attn.o_proj.weight": "num_attention_heads, head_dim and hidden_size",
    "layer.mlp.gate_proj.weight": "intermediate_size and hidden_size",
    "layer.mlp.up_proj.weight": "intermediate_size and hidden_size",
    "layer.mlp.down_proj.weight": "intermediate_size and hidden_size",
    "lm_head.weight": "draft_vocab_size and hidden_size",
    "d2t": "draft_vocab_size",
    "t2d": "vocab_size",
}


def _load_into(head: EagleHead, sd: dict[str, torch.Tensor], source: str, *, cfg_file: Path | None = None,
               origin: dict[str, str] | None = None, prefix: str = "layer.") -> None:
    """Copy ``sd`` (the head's key names) into ``head``; ``origin`` maps them back to the file's
    names and ``prefix`` is the file's name of the layer, for the messages."""
    own = head.trainable_state_dict()

    def name(k: str) -> str:
        if origin and k in origin:
            return origin[k]
        return prefix + k[len("layer."):] if k.startswith("layer.") else k

    missing = sorted(name(k) for k in set(own) - set(sd))
    unexpected = sorted(name(k) for k in set(sd) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{source}: missing keys {missing}, unexpected keys {unexpected}")
    bad = [k for k, v in own.items() if tuple(sd[k].shape) != tuple(v.shape)]
    if bad and cfg_file is None:
        k = bad[0]
        raise CheckpointError(f"{source}: {k} has shape {tuple(sd[k].shape)}, the head expects {tuple(own[k].shape)}")
    if bad:
        each = "; ".join(f"{name(k)} has shape {tuple(sd[k].shape)} where the config "
                         f"({_SHAPE_FIELDS.get(k, 'hidden_size')}) implies {tuple(own[k].shape)}" for k in bad)
        raise CheckpointError(f"{source}: the tensors disagree with {cfg_file}: {each}")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(sd[k].to(v.dtype))


def _build(
    config: EagleConfig, embed: torch.Tensor, lm_head: torch.Tensor, dtype: torch.dtype | None, device: Any
) -> EagleHead:
    dtype = dtype or embed.dtype  # the target's dtype unless asked otherwise
    device = embed.device if device is None else device
    head = EagleHead(config, embed.to(device, dtype), lm_head.to(device, dtype) if config.version == 2 else None)
    return head.to(device=device, dtype=dtype)


def _renamed(head: EagleHead, prefix: str) -> dict[str, torch.Tensor]:
    return {(prefix + k[len("layer."):] if k.startswith("layer.") else k): v
            for k, v in head.trainable_state_dict().items()}
