"""EAGLE head checkpoints: specdec's own format and the public reference layouts.

Own format (a folder)::

    config.json         {"format": "specdec-eagle", "format_version": 1, "config": {EagleConfig fields},
                         "target": {"num_hidden_layers": N, "feature_layers": [...]}, "meta": {...}}
    model.safetensors   the head's trainable tensors (EagleHead.trainable_state_dict()),
                        never the target's frozen embedding / LM head

``"target"`` (optional) records the depth of the target the head was trained
for; :func:`load_head` refuses a target of another depth, whose
``hidden_states`` of the same indices are other layers. Heads saved before it
was recorded have no ``"target"`` and load as before. Own-format heads are
never read from pickle (``.bin``) files.

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
  (and optionally ``target_hidden_size``, and ``eagle_aux_hidden_state_layer_ids``,
  at the top or in ``eagle_config``: the feature layers, numbered as vLLM
  numbers them (id ``l`` = the input of layer ``l``) or as SGLang does (the
  output of layer ``l``), which the file does not say: ``aux_layer_convention=``
  picks one; without ids the default is (2, N//2, N-3)); weights ``fc.weight``,
  ``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.*``,
  ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
  ``norm.weight``, ``lm_head.weight``, buffers ``d2t`` (int64 offsets, target
  id = draft id + d2t) and ``t2d`` (bool mask over the target vocabulary), and
  optionally ``embed_tokens.weight``.
* EAGLE-3 in vLLM's ``speculators`` format (vllm-project/speculators
  ``Eagle3SpeculatorConfig``, e.g. the ``RedHatAI/*speculator.eagle3`` heads):
  ``config.json`` has ``speculators_model_type: "eagle3"``, ``architectures``
  ``["Eagle3DraftModel"]`` (``["Eagle3Speculator"]`` before speculators 0.9), the
  decoder layer's LLaMA fields in ``transformer_layer_config``, and at the top
  ``draft_vocab_size``, ``norm_before_residual``, ``target_hidden_size``,
  ``eagle_aux_hidden_state_layer_ids`` (vLLM's numbering) and a
  ``speculators_config`` block whose ``verifier`` names the target
  (``name_or_path``, ``architectures``); weights as EAGLE-3's with ``layers.0.``
  for ``midlayer.``, ``d2t`` / ``t2d`` only for a reduced draft vocabulary, and
  ``embed_tokens.weight`` (ignored). :func:`save_speculators_head` writes it.

A head's ``max_position_embeddings`` below the target's context is raised to
it (RoPE needs no new weights) with a logged warning.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Sequence
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
    "save_speculators_head",
    "speculators_state_dict",
    "AUX_LAYER_CONVENTIONS",
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
logger = logging.getLogger(__name__)


class CheckpointError(SpecDecError, ValueError):
    """A checkpoint is missing, malformed, or does not match its model."""


def _targets_tensors(target: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(target, tuple):
        return target
    return target_embeddings(target)


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


def _read_config(path: Path) -> dict[str, Any]:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"no config.json in {path}")
    try:
        doc = json.loads(cfg_file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not UTF-8 text (corrupt?): {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CheckpointError(f"{cfg_file} must hold a JSON object, got a JSON {_json_type(doc)}")
    return doc


# --------------------------------------------------- config.json fields
_MISSING: Any = object()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _field(doc: dict[str, Any], key: str, kind: str, cfg_file: Path, *, default: Any = _MISSING,
           minimum: float | None = None, nullable: bool = False, where: str = "") -> Any:
    """``doc[key]`` checked to be of ``kind`` ("int", "float", "bool", "dict",
    "int_list"), or ``default`` when absent (required when no default); a
    :class:`CheckpointError` naming ``cfg_file`` and the field otherwise."""
    name = where + key
    if key not in doc:
        if default is _MISSING:
            raise CheckpointError(f"{cfg_file}: required field {name!r} is missing")
        return default
    value = doc[key]
    if value is None and nullable:
        return None
    if kind == "int_list":
        if (not isinstance(value, list) or not value
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
            raise CheckpointError(f"{cfg_file}: field {name!r} must be a non-empty array of integers, got {value!r}")
        if minimum is not None and min(value) < minimum:
            raise CheckpointError(f"{cfg_file}: field {name!r} must hold integers >= {minimum:g}, got {value!r}")
        return tuple(value)
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "dict": isinstance(value, dict),
    }[kind]
    if not ok:
        what = {"int": "an integer", "float": "a number", "bool": "true or false", "dict": "a JSON object"}[kind]
        raise CheckpointError(f"{cfg_file}: field {name!r} must be {what}, got {_json_type(value)} {value!r}")
    if minimum is not None and value < minimum:
        raise CheckpointError(f"{cfg_file}: field {name!r} must be >= {minimum:g}, got {value!r}")
    return float(value) if kind == "float" else value


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


# ------------------------------------------------------- target depth
def _depth(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidConfigError(f"{what} must be a positive integer, got {n!r}")
    return n


def _target_depth(target: Any, target_num_layers: int | None) -> int | None:
    """The target's layer count: ``target_num_layers``, else ``target.config.num_hidden_layers``; None if unknown."""
    if target_num_layers is not None:
        return _depth(target_num_layers, "target_num_layers")
    n = getattr(getattr(target, "config", None), "num_hidden_layers", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def _check_layers(layers: tuple[int, ...], n: int, source: Any, error: type[Exception] = CheckpointError) -> None:
    """Features are ``hidden_states[l]``, ``0 <= l <= n`` for a target of ``n`` layers."""
    bad = [l for l in layers if not 0 <= l <= n]
    if bad:
        raise error(f"{source}: feature layer(s) {bad} of the head do not exist in a target with {n} layers "
                    f"(its features are hidden_states[0..{n}]); the head was made for another target")


# ------------------------------------------------------------ weights
def _load_safetensors(f: Path) -> dict[str, torch.Tensor]:
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


def _build(
    config: EagleConfig, embed: torch.Tensor, lm_head: torch.Tensor, dtype: torch.dtype | None, device: Any
) -> EagleHead:
    dtype = dtype or embed.dtype  # the target's dtype unless asked otherwise
    device = embed.device if device is None else device
    head = EagleHead(config, embed.to(device, dtype), lm_head.to(device, dtype) if config.version == 2 else None)
    return head.to(device=device, dtype=dtype)


# ----------------------------------------------------- reference layouts
_LAYER_PREFIX = {2: "layers.0.", 3: "midlayer."}
_SPECULATORS_PREFIX = "layers.0."  # speculators' EAGLE-3 layout (a ModuleList of one decoder layer)

AUX_LAYER_CONVENTIONS: dict[str, int] = {"vllm": 0, "sglang": 1}
"""How an engine reads a recorded ``eagle_aux_hidden_state_layer_ids`` entry ``l``: the offset from
``l`` to specdec's ``hidden_states`` index. vLLM (and its ``speculators`` format) takes the *input*
of layer ``l`` (``hidden_states[l]``, offset 0); SGLang (and SpecForge, which trains for it) adds 1:
the *output* of layer ``l`` (``hidden_states[l + 1]``)."""

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


def reference_state_dict(head: EagleHead) -> dict[str, torch.Tensor]:
    """``head``'s tensors renamed to the reference layout of its version (the
    inverse of the mapping :func:`load_reference_head` applies); used to write
    synthetic reference checkpoints in tests and to export heads."""
    return _renamed(head, _LAYER_PREFIX[head.config.version])


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


def _renamed(head: EagleHead, prefix: str) -> dict[str, torch.Tensor]:
    return {(prefix + k[len("layer."):] if k.startswith("layer.") else k): v
            for k, v in head.trainable_state_dict().items()}


def _map_reference(sd: dict[str, torch.Tensor], prefix: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``sd`` renamed to the head's keys, and each new key's name in the file."""
    out, origin = {}, {}
    for key, v in sd.items():
        k = key[len("model."):] if key.startswith("model.") else key  # some exporters prefix every key
        if k == "embed_tokens.weight":
            continue  # the target's embedding; specdec always shares the target's own
        if k.startswith(prefix):
            k = "layer." + k[len(prefix):]
        out[k] = v
        origin[k] = key
    return out, origin


def _is_speculators(cfg: dict[str, Any]) -> bool:
    return any(k in cfg for k in ("speculators_model_type", "speculators_config", "transformer_layer_config"))


def _guess_version(sd: dict[str, torch.Tensor], cfg: dict[str, Any], source: Any) -> int:
    if any(k.startswith(("midlayer.", "model.midlayer.")) for k in sd) or "d2t" in sd or "draft_vocab_size" in cfg:
        return 3
    if any(k.startswith(("layers.0.", "model.layers.0.")) for k in sd):
        return 2
    raise CheckpointError(f"{source}: cannot tell whether this is an EAGLE-2 or EAGLE-3 checkpoint from its keys "
                          "(pass version=2 or version=3)")


def _recorded_aux_ids(cfg: dict[str, Any], f: Path) -> tuple[tuple[int, ...] | None, str]:
    """EAGLE-3 feature layers recorded by the checkpoint, and where: ``eagle_aux_hidden_state_layer_ids``
    at the top level (vLLM, speculators) or nested in ``eagle_config`` (SGLang, SpecForge); None if
    absent (or empty, as both engines treat it)."""
    key = "eagle_aux_hidden_state_layer_ids"
    nested = _field(cfg, "eagle_config", "dict", f, default=None, nullable=True) or {}
    for doc, where in ((cfg, ""), (nested, "eagle_config.")):
        if doc.get(key) is not None and doc.get(key) != []:
            return _field(doc, key, "int_list", f, minimum=0, where=where), where + key
    return None, ""


def _feature_layers(cfg: dict[str, Any], f: Path, n: int, convention: str | None, speculators: bool) -> tuple[int, ...]:
    """``hidden_states`` indices of an EAGLE-3 reference head's features for a target of ``n`` layers."""
    ids, where = _recorded_aux_ids(cfg, f)
    if ids is None:  # both engines then take the inputs of layers (2, N // 2, N - 3)
        return eagle3_target_layers(n)
    if convention is None:
        if not speculators:
            vllm, sglang = list(ids), [i + 1 for i in ids]
            raise CheckpointError(
                f"{f}: {where} = {list(ids)} does not say whose numbering it uses, and the engines differ by one: "
                f"vLLM and speculators read id l as the input of layer l (hidden_states {vllm}), SGLang and "
                f"SpecForge add 1 (the output of layer l: hidden_states {sglang}). Pass "
                "aux_layer_convention='vllm' or 'sglang': the engine the head was trained for"
            )
        convention = "vllm"  # the speculators format is vLLM's
    layers = tuple(i + AUX_LAYER_CONVENTIONS[convention] for i in ids)
    _check_layers(layers, n, f"{f} ({where} {list(ids)} in {convention}'s numbering)")
    return layers


def _target_context(target: Any, target_max_positions: int | None) -> int | None:
    """The target's context (``target_max_positions``, else its config's ``max_position_embeddings``); None if unknown."""
    if target_max_positions is not None:
        return _depth(target_max_positions, "target_max_positions")
    cfg = getattr(target, "config", None)
    getter = getattr(cfg, "get_text_config", None)
    cfg = getter() if getter is not None else cfg
    n = getattr(cfg, "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def _raise_position_limit(config: EagleConfig, target: Any, target_max_positions: int | None, source: Any) -> EagleConfig:
    """``config`` with a position limit below the target's context raised to it, with a logged note."""
    limit, context = config.max_position_embeddings, _target_context(target, target_max_positions)
    if limit is None or context is None or context <= limit:
        return config
    logger.warning(
        "%s: the head's max_position_embeddings (%d) is below the target's context (%d); raised to %d. RoPE "
        "needs no new weights, but the head was trained on shorter contexts: acceptance may be lower beyond %d "
        "positions (the output law is unchanged)", source, limit, context, context, limit)
    return attrs.evolve(config, max_position_embeddings=context)


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


def load_reference_head(path: str | os.PathLike, target: Any, *, version: int | None = None,
                        target_num_layers: int | None = None, aux_layer_convention: str | None = None,
                        target_max_positions: int | None = None, dtype: torch.dtype | None = None,
                        device: Any = None) -> EagleHead:
    """Load an EAGLE-2 or EAGLE-3 head saved in a reference layout (see module docs): SafeAILab
    EAGLE / SpecForge, or vLLM's ``speculators`` format (detected from its config).

    Args:
        path: folder with ``config.json`` and ``*.safetensors`` or ``pytorch_model.bin``.
        target: the Hugging Face target model, or ``(embed, lm_head)`` tensors.
        version: 2 or 3; detected from the keys when None (any other value is an error).
        target_num_layers: the target's layer count (sets EAGLE-3's feature
            layers unless the checkpoint records ``eagle_aux_hidden_state_layer_ids``);
            read from ``target.config`` when it is a model.
        aux_layer_convention: ``"vllm"`` or ``"sglang"``: how the recorded
            ``eagle_aux_hidden_state_layer_ids`` are numbered (see
            :data:`AUX_LAYER_CONVENTIONS`). Default: ``"vllm"`` for a speculators
            config; for another config that records ids, an error (the
            engines differ by one and the file does not say which it was
            trained for). Unused when no ids are recorded.
        target_max_positions: the target's context (default: its config's
            ``max_position_embeddings``); a head limit below it is raised to it,
            with a logged warning.
        dtype, device: as in :func:`load_head`.

    Raises:
        InvalidConfigError: ``version`` is not 2, 3 or None, or an unknown ``aux_layer_convention``.
        VocabMismatchError: the head's vocabulary or width is not the target's.
        CheckpointError: a missing, corrupt or malformed file (named in the
            message), tensors that disagree with the config, recorded feature
            layers the target does not have, ambiguous aux layer ids, a
            speculators head made for another architecture or using options
            specdec's head does not implement.
    """
    if version is not None and (isinstance(version, bool) or version not in (2, 3)):
        raise InvalidConfigError(
            f"version must be 2 or 3 (or None to detect it from the checkpoint's keys), got {version!r}")
    if aux_layer_convention is not None and aux_layer_convention not in AUX_LAYER_CONVENTIONS:
        raise InvalidConfigError(
            f"aux_layer_convention must be one of {sorted(AUX_LAYER_CONVENTIONS)} or None, got {aux_layer_convention!r}")
    p = Path(path)
    cfg = _read_config(p)
    f = p / "config.json"
    speculators = _is_speculators(cfg)
    verifier: dict[str, Any] = {}
    norm_before_residual = False
    if speculators:
        if version == 2:
            raise CheckpointError(f"{p}: a speculators EAGLE-3 checkpoint, not EAGLE-2 (version=2 was given)")
        tl, norm_before_residual, verifier = _speculators_fields(cfg, f)
        at = "transformer_layer_config."
    else:
        tl, at = cfg, ""
    sd = read_state_dict(p)
    if speculators:
        version = 3
    elif version is None:
        version = _guess_version(sd, cfg, p)
    if version == 2:
        layers = _field(cfg, "num_hidden_layers", "int", f, default=1, minimum=1)
        if layers != 1:
            raise CheckpointError(f"{p}: only single-layer EAGLE-2 heads are supported, got {layers} layers")
    embed, lm_head = _targets_tensors(target)
    vocab = _field(tl, "vocab_size", "int", f, default=int(embed.shape[0]), minimum=1, where=at)
    hidden = _field(tl, "hidden_size", "int", f, minimum=1, where=at)
    if (vocab, hidden) != tuple(embed.shape):
        made_for = f"made for {_verifier_text(verifier)}, " if speculators else ""
        raise VocabMismatchError(f"{p}: head {made_for}for vocab {vocab} / hidden {hidden}, target embedding "
                                 f"{tuple(embed.shape)}: another target size")
    if speculators:
        _check_verifier(verifier, target, f)
    if target_num_layers is None:
        tcfg = getattr(target, "config", None)
        if tcfg is None:
            raise InvalidConfigError("give target_num_layers when the target is a tensor pair")
        target_num_layers = int(tcfg.num_hidden_layers)
    n = _depth(target_num_layers, "target_num_layers")
    heads = _field(tl, "num_attention_heads", "int", f, minimum=1, where=at)
    theta = _field(tl, "rope_theta", "float", f, default=None, nullable=True, where=at)
    rope = _field(tl, "rope_parameters", "dict", f, default=None, nullable=True, where=at) or {}
    if theta is None:
        theta = _field(rope, "rope_theta", "float", f, default=10000.0, where=at + "rope_parameters.")
    for key, scaling in (("rope_scaling", tl.get("rope_scaling")), ("rope_parameters", rope)):
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise CheckpointError(f"{p}: {at}{key} {scaling!r} is not supported (default RoPE only)")
    # 0 or null mean "absent" for these three, as the reference code reads them
    kv = _field(tl, "num_key_value_heads", "int", f, default=None, minimum=0, nullable=True, where=at) or heads
    head_dim = _field(tl, "head_dim", "int", f, default=None, minimum=0, nullable=True, where=at) or hidden // heads
    target_hidden = _field(cfg, "target_hidden_size", "int", f, default=None, minimum=0, nullable=True) or hidden
    limit = _field(tl, "max_position_embeddings", "int", f, default=None, minimum=1, nullable=True, where=at)
    if version == 2:
        feature_layers: tuple[int, ...] = (n,)
    else:
        feature_layers = _feature_layers(cfg, f, n, aux_layer_convention, speculators)
    try:
        config = EagleConfig(
            version=version, hidden_size=hidden,
            intermediate_size=_field(tl, "intermediate_size", "int", f, minimum=1, where=at),
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
            draft_vocab_size=_field(cfg, "draft_vocab_size", "int", f, default=vocab, minimum=1) if version == 3 else vocab,
            target_layers=feature_layers, target_hidden_size=target_hidden,
            rms_norm_eps=_field(tl, "rms_norm_eps", "float", f, default=1e-6, where=at), rope_theta=theta,
            fc_bias=("fc.bias" in sd or "model.fc.bias" in sd), norm_before_residual=norm_before_residual,
            max_position_embeddings=limit,
        )
    except InvalidConfigError as exc:
        raise CheckpointError(f"{f}: {exc}") from exc
    config = _raise_position_limit(config, target, target_max_positions, p)
    head = _build(config, embed, lm_head, dtype, device)
    prefix = _SPECULATORS_PREFIX if speculators else _LAYER_PREFIX[version]
    mapped, origin = _map_reference(sd, prefix)
    if version == 3:
        if "d2t" not in mapped and "t2d" not in mapped and config.draft_vocab_size == vocab:
            # a full draft vocabulary: speculators (and vLLM) store no mapping, which is then the identity
            mapped["d2t"], mapped["t2d"] = head.d2t.clone(), head.t2d.clone()
        for k, kind in (("d2t", torch.long), ("t2d", torch.bool)):
            if k in mapped:
                mapped[k] = mapped[k].to(kind)
    _load_into(head, mapped, str(p), cfg_file=f, origin=origin, prefix=prefix)
    if version == 3:
        ids = head.draft_to_target
        if ids.min() < 0 or ids.max() >= vocab or not torch.equal(head.t2d.nonzero().flatten(), ids.sort().values):
            raise CheckpointError(f"{p}: d2t and t2d buffers disagree")
    return head.eval()


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
    return torch.tensor(ids, dtype=torch.int64)


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
