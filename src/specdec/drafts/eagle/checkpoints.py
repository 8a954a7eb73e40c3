"""EAGLE head checkpoints: specdec's own format and the public reference layouts.

Own format (a folder)::

    config.json         {"format": "specdec-eagle", "format_version": 1, "config": {EagleConfig fields}, "meta": {...}}
    model.safetensors   the head's trainable tensors (EagleHead.trainable_state_dict()),
                        never the target's frozen embedding / LM head

Reference layouts (read only; files are read with safetensors, or with
``torch.load(weights_only=True)``: never unpickled):

* EAGLE-2 (SafeAILab/EAGLE ``cnets1.py``, e.g. ``yuhuili/EAGLE-LLaMA3-Instruct-8B``):
  ``config.json`` is a LLaMA config (``hidden_size``, ``intermediate_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``num_hidden_layers`` = 1,
  ``rms_norm_eps``, ``rope_theta``, ``vocab_size``); weights ``fc.weight``,
  ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.0.mlp.{gate,up,down}_proj.weight``,
  ``layers.0.post_attention_layernorm.weight`` and optionally
  ``embed_tokens.weight`` (the target's, ignored: the target's own is used).
* EAGLE-3 (SafeAILab/EAGLE ``cnets.py``, SpecForge, e.g.
  ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``): config adds ``draft_vocab_size``
  (and optionally ``target_hidden_size``); weights ``fc.weight``,
  ``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.*``,
  ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
  ``norm.weight``, ``lm_head.weight``, buffers ``d2t`` (int64 offsets, target
  id = draft id + d2t) and ``t2d`` (bool mask over the target vocabulary), and
  optionally ``embed_tokens.weight``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from specdec.drafts.eagle.head import EagleConfig, EagleHead, eagle3_target_layers, target_embeddings
from specdec.errors import InvalidConfigError, SpecDecError, VocabMismatchError

if TYPE_CHECKING:
    from specdec.drafts.eagle.draft import EagleDraft

__all__ = [
    "CheckpointError",
    "save_head",
    "load_head",
    "load_reference_head",
    "reference_state_dict",
    "read_state_dict",
    "shipped_head_path",
    "SHIPPED_DIR",
    "export_draft_lm",
    "load_draft_lm",
    "shipped_draft_lm_path",
    "load_shipped",
]

FORMAT = "specdec-eagle"
FORMAT_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets"


class CheckpointError(SpecDecError, ValueError):
    """A checkpoint is missing, malformed, or does not match its model."""


def _targets_tensors(target: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(target, tuple):
        return target
    return target_embeddings(target)


def save_head(head: EagleHead, path: str | os.PathLike, *, meta: dict[str, Any] | None = None,
              dtype: torch.dtype | None = None) -> Path:
    """Write ``head`` in specdec's own format to the folder ``path``.

    Args:
        head: the head to save.
        path: the folder (created).
        meta: free-form provenance (training data, steps...) stored in config.json.
        dtype: store floating tensors in this dtype (e.g. ``torch.float16`` for shipping).
    """
    from safetensors.torch import save_file

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
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "config": config, "meta": meta or {}}
    (out / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out


def _read_config(path: Path) -> dict[str, Any]:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"no config.json in {path}")
    try:
        return json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not valid JSON: {exc}") from None


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint folder or file: ``*.safetensors`` (all shards) or,
    failing that, ``pytorch_model*.bin`` read with ``torch.load(weights_only=True)``."""
    from safetensors.torch import load_file

    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if files and all(f.suffix == ".safetensors" for f in files):
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(str(f)))
        return sd
    bins = [p] if p.is_file() else sorted(p.glob("pytorch_model*.bin"))
    if not bins:
        raise CheckpointError(f"no *.safetensors or pytorch_model*.bin weights in {p}")
    sd = {}
    for f in bins:
        loaded = torch.load(str(f), map_location="cpu", weights_only=True)
        if not isinstance(loaded, dict):
            raise CheckpointError(f"{f} does not hold a state dict")
        sd.update(loaded)
    return sd


def _load_into(head: EagleHead, sd: dict[str, torch.Tensor], source: str) -> None:
    own = head.trainable_state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{source}: missing keys {missing}, unexpected keys {unexpected}")
    for k, v in own.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{source}: {k} has shape {tuple(sd[k].shape)}, the head expects {tuple(v.shape)}")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(sd[k].to(v.dtype))


def load_head(path: str | os.PathLike, target: Any, *, dtype: torch.dtype | None = None,
              device: Any = None) -> EagleHead:
    """Load a head saved by :func:`save_head`, wired to ``target``.

    Args:
        path: the checkpoint folder.
        target: the Hugging Face target model, or a tuple ``(embed [V, H], lm_head [V, H])``.
        dtype: the head's compute dtype (default: the target embedding's, so a
            bfloat16 target gets a bfloat16 head).
        device: where to put the head (default: the target embedding's device).
    """
    p = Path(path)
    doc = _read_config(p)
    if doc.get("format") != FORMAT:
        raise CheckpointError(
            f"{p} is not a specdec EAGLE checkpoint (format {doc.get('format')!r}); "
            "use load_reference_head for reference-layout checkpoints"
        )
    if int(doc.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(f"{p}: format_version {doc['format_version']} is newer than this specdec supports")
    config = EagleConfig(**doc["config"])
    embed, lm_head = _targets_tensors(target)
    head = _build(config, embed, lm_head, dtype, device)
    _load_into(head, read_state_dict(p / "model.safetensors"), str(p))
    return head.eval()


def _build(
    config: EagleConfig, embed: torch.Tensor, lm_head: torch.Tensor, dtype: torch.dtype | None, device: Any
) -> EagleHead:
    dtype = dtype or embed.dtype  # the target's dtype unless asked otherwise
    device = embed.device if device is None else device
    head = EagleHead(config, embed.to(device, dtype), lm_head.to(device, dtype) if config.version == 2 else None)
    return head.to(device=device, dtype=dtype)


# ----------------------------------------------------- reference layouts
_LAYER_PREFIX = {2: "layers.0.", 3: "midlayer."}


def reference_state_dict(head: EagleHead) -> dict[str, torch.Tensor]:
    """``head``'s tensors renamed to the reference layout of its version (the
    inverse of the mapping :func:`load_reference_head` applies); used to write
    synthetic reference checkpoints in tests and to export heads."""
    prefix = _LAYER_PREFIX[head.config.version]
    return {(prefix + k[len("layer."):] if k.startswith("layer.") else k): v
            for k, v in head.trainable_state_dict().items()}


def _map_reference(sd: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    prefix = _LAYER_PREFIX[version]
    out = {}
    for k, v in sd.items():
        if k.startswith("model."):  # some exporters prefix every key
            k = k[len("model."):]
        if k == "embed_tokens.weight":
            continue  # the target's embedding; specdec always shares the target's own
        if k.startswith(prefix):
            k = "layer." + k[len(prefix):]
        out[k] = v
    return out


def _guess_version(sd: dict[str, torch.Tensor], cfg: dict[str, Any]) -> int:
    if any(k.startswith(("midlayer.", "model.midlayer.")) for k in sd) or "d2t" in sd or "draft_vocab_size" in cfg:
        return 3
    if any(k.startswith(("layers.0.", "model.layers.0.")) for k in sd):
        return 2
    raise CheckpointError("cannot tell whether this is an EAGLE-2 or EAGLE-3 checkpoint from its keys")


def load_reference_head(path: str | os.PathLike, target: Any, *, version: int | None = None,
                        target_num_layers: int | None = None, dtype: torch.dtype | None = None,
                        device: Any = None) -> EagleHead:
    """Load an EAGLE-2 or EAGLE-3 head saved in the reference layout (see module docs).

    Args:
        path: folder with ``config.json`` and ``*.safetensors`` or ``pytorch_model.bin``.
        target: the Hugging Face target model, or ``(embed, lm_head)`` tensors.
        version: 2 or 3; guessed from the keys when None.
        target_num_layers: the target's layer count (sets EAGLE-3's feature
            layers); read from ``target.config`` when it is a model.
        dtype, device: as in :func:`load_head`.
    """
    p = Path(path)
    cfg = _read_config(p)
    sd = read_state_dict(p)
    version = version or _guess_version(sd, cfg)
    if version not in (2, 3):
        raise InvalidConfigError(f"version must be 2 or 3, got {version}")
    if version == 2 and int(cfg.get("num_hidden_layers", 1)) != 1:
        raise CheckpointError(f"{p}: only single-layer EAGLE-2 heads are supported, got {cfg['num_hidden_layers']} layers")
    embed, lm_head = _targets_tensors(target)
    vocab, hidden = int(cfg.get("vocab_size", embed.shape[0])), int(cfg["hidden_size"])
    if (vocab, hidden) != tuple(embed.shape):
        raise VocabMismatchError(f"{p}: head for vocab {vocab} / hidden {hidden}, target embedding {tuple(embed.shape)}")
    if target_num_layers is None:
        tcfg = getattr(target, "config", None)
        if tcfg is None:
            raise InvalidConfigError("give target_num_layers when the target is a tensor pair")
        target_num_layers = int(tcfg.num_hidden_layers)
    heads = int(cfg["num_attention_heads"])
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise CheckpointError(f"{p}: rope_scaling {scaling!r} is not supported (default RoPE only)")
    config = EagleConfig(
        version=version, hidden_size=hidden, intermediate_size=int(cfg["intermediate_size"]),
        num_attention_heads=heads, num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads), vocab_size=vocab,
        draft_vocab_size=int(cfg.get("draft_vocab_size", vocab)) if version == 3 else vocab,
        target_layers=(target_num_layers,) if version == 2 else eagle3_target_layers(target_num_layers),
        target_hidden_size=int(cfg.get("target_hidden_size") or hidden),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
        fc_bias=("fc.bias" in sd or "model.fc.bias" in sd),
    )
    head = _build(config, embed, lm_head, dtype, device)
    mapped = _map_reference(sd, version)
    if version == 3:
        mapped["d2t"] = mapped.get("d2t", torch.zeros(0)).long()
        mapped["t2d"] = mapped.get("t2d", torch.zeros(0)).bool()
    _load_into(head, mapped, str(p))
    if version == 3:
        ids = head.draft_to_target
        if ids.min() < 0 or ids.max() >= vocab or not torch.equal(head.t2d.nonzero().flatten(), ids.sort().values):
            raise CheckpointError(f"{p}: d2t and t2d buffers disagree")
    return head.eval()


def shipped_head_path(version: int) -> Path:
    """Folder of the EAGLE-``version`` head for SmolLM2-135M-Instruct shipped in ``specdec/assets``."""
    if version not in (2, 3):
        raise InvalidConfigError(f"version must be 2 or 3, got {version!r}")
    p = SHIPPED_DIR / f"eagle{version}-smollm2-135m-instruct"
    if not (p / "config.json").is_file():
        raise CheckpointError(f"no shipped EAGLE-{version} head at {p}")
    return p


# ------------------------------------------------------------ draft LM
_DRAFT_LM_DIR = "draft-lm-smollm2-135m-instruct"
_SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")


def export_draft_lm(src: str | os.PathLike, dst: str | os.PathLike) -> dict[str, int]:
    """Store a distilled draft LM (a Hugging Face folder written by
    :func:`specdec.train.train_draft_lm`) compactly: its own layers and norm in
    float16, *without* the embedding / LM head it shares with its target
    (:func:`load_draft_lm` puts the target's back). Returns file sizes."""
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
    from specdec.drafts.eagle.draft import hf_feature_fn, make_draft

    head = load_head(shipped_head_path(version), target_model, dtype=dtype)
    draft = make_draft(head, feature_fn=hf_feature_fn(target_model, head.config.target_layers))
    return draft
