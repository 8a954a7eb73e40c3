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
  at the top or in ``eagle_config``: the target layers whose inputs form the
  feature, as in vLLM; default (2, N//2, N-3)); weights ``fc.weight``,
  ``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.*``,
  ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
  ``norm.weight``, ``lm_head.weight``, buffers ``d2t`` (int64 offsets, target
  id = draft id + d2t) and ``t2d`` (bool mask over the target vocabulary), and
  optionally ``embed_tokens.weight``.
"""

from __future__ import annotations

import json
import os
import pickle
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
    "fc_bias": ("bool", None),
}


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
        values[name] = _field(raw, name, kind, cfg_file, default=default, minimum=minimum, where="config.")
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
              device: Any = None, target_num_layers: int | None = None) -> EagleHead:
    """Load a head saved by :func:`save_head`, wired to ``target``.

    Args:
        path: the checkpoint folder.
        target: the Hugging Face target model, or a tuple ``(embed [V, H], lm_head [V, H])``.
        dtype: the head's compute dtype (default: the target embedding's, so a
            bfloat16 target gets a bfloat16 head).
        device: where to put the head (default: the target embedding's device).
        target_num_layers: the target's layer count (default: ``target.config.num_hidden_layers``;
            unknown, and not checked, for a tensor pair).

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
    embed, lm_head = _targets_tensors(target)
    head = _build(config, embed, lm_head, dtype, device)
    _load_into(head, read_state_dict(_own_weights(p)), str(p))
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


def _guess_version(sd: dict[str, torch.Tensor], cfg: dict[str, Any], source: Any) -> int:
    if any(k.startswith(("midlayer.", "model.midlayer.")) for k in sd) or "d2t" in sd or "draft_vocab_size" in cfg:
        return 3
    if any(k.startswith(("layers.0.", "model.layers.0.")) for k in sd):
        return 2
    raise CheckpointError(f"{source}: cannot tell whether this is an EAGLE-2 or EAGLE-3 checkpoint from its keys "
                          "(pass version=2 or version=3)")


def _aux_layer_ids(cfg: dict[str, Any], f: Path) -> tuple[int, ...] | None:
    """EAGLE-3 feature layers recorded by the checkpoint: ``eagle_aux_hidden_state_layer_ids``
    at the top level (where vLLM reads it) or nested in ``eagle_config``; None if absent (or empty,
    as vLLM treats it). The ids index the target layers whose *input* is taken, i.e.
    ``hidden_states[id]``, as in specdec (and vLLM)."""
    key = "eagle_aux_hidden_state_layer_ids"
    nested = _field(cfg, "eagle_config", "dict", f, default=None, nullable=True) or {}
    for doc, where in ((cfg, ""), (nested, "eagle_config.")):
        if doc.get(key) is not None and doc.get(key) != []:
            return _field(doc, key, "int_list", f, minimum=0, where=where)
    return None


def load_reference_head(path: str | os.PathLike, target: Any, *, version: int | None = None,
                        target_num_layers: int | None = None, dtype: torch.dtype | None = None,
                        device: Any = None) -> EagleHead:
    """Load an EAGLE-2 or EAGLE-3 head saved in the reference layout (see module docs).

    Args:
        path: folder with ``config.json`` and ``*.safetensors`` or ``pytorch_model.bin``.
        target: the Hugging Face target model, or ``(embed, lm_head)`` tensors.
        version: 2 or 3; detected from the keys when None (any other value is an error).
        target_num_layers: the target's layer count (sets EAGLE-3's feature
            layers unless the checkpoint records ``eagle_aux_hidden_state_layer_ids``);
            read from ``target.config`` when it is a model.
        dtype, device: as in :func:`load_head`.

    Raises:
        InvalidConfigError: ``version`` is not 2, 3 or None.
        CheckpointError: a missing, corrupt or malformed file (named in the
            message), or recorded feature layers the target does not have.
    """
    if version is not None and (isinstance(version, bool) or version not in (2, 3)):
        raise InvalidConfigError(
            f"version must be 2 or 3 (or None to detect it from the checkpoint's keys), got {version!r}")
    p = Path(path)
    cfg = _read_config(p)
    f = p / "config.json"
    sd = read_state_dict(p)
    version = _guess_version(sd, cfg, p) if version is None else int(version)
    if version == 2:
        layers = _field(cfg, "num_hidden_layers", "int", f, default=1, minimum=1)
        if layers != 1:
            raise CheckpointError(f"{p}: only single-layer EAGLE-2 heads are supported, got {layers} layers")
    embed, lm_head = _targets_tensors(target)
    vocab = _field(cfg, "vocab_size", "int", f, default=int(embed.shape[0]), minimum=1)
    hidden = _field(cfg, "hidden_size", "int", f, minimum=1)
    if (vocab, hidden) != tuple(embed.shape):
        raise VocabMismatchError(f"{p}: head for vocab {vocab} / hidden {hidden}, target embedding {tuple(embed.shape)}")
    if target_num_layers is None:
        tcfg = getattr(target, "config", None)
        if tcfg is None:
            raise InvalidConfigError("give target_num_layers when the target is a tensor pair")
        target_num_layers = int(tcfg.num_hidden_layers)
    n = _depth(target_num_layers, "target_num_layers")
    heads = _field(cfg, "num_attention_heads", "int", f, minimum=1)
    theta = _field(cfg, "rope_theta", "float", f, default=None, nullable=True)
    if theta is None:
        rope = _field(cfg, "rope_parameters", "dict", f, default=None, nullable=True) or {}
        theta = _field(rope, "rope_theta", "float", f, default=10000.0, where="rope_parameters.")
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise CheckpointError(f"{p}: rope_scaling {scaling!r} is not supported (default RoPE only)")
    # 0 or null mean "absent" for these three, as the reference code reads them
    kv = _field(cfg, "num_key_value_heads", "int", f, default=None, minimum=0, nullable=True) or heads
    head_dim = _field(cfg, "head_dim", "int", f, default=None, minimum=0, nullable=True) or hidden // heads
    target_hidden = _field(cfg, "target_hidden_size", "int", f, default=None, minimum=0, nullable=True) or hidden
    if version == 2:
        feature_layers: tuple[int, ...] = (n,)
    else:
        feature_layers = _aux_layer_ids(cfg, f) or eagle3_target_layers(n)
        _check_layers(feature_layers, n, p)
    try:
        config = EagleConfig(
            version=version, hidden_size=hidden, intermediate_size=_field(cfg, "intermediate_size", "int", f, minimum=1),
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
            draft_vocab_size=_field(cfg, "draft_vocab_size", "int", f, default=vocab, minimum=1) if version == 3 else vocab,
            target_layers=feature_layers, target_hidden_size=target_hidden,
            rms_norm_eps=_field(cfg, "rms_norm_eps", "float", f, default=1e-6), rope_theta=theta,
            fc_bias=("fc.bias" in sd or "model.fc.bias" in sd),
        )
    except InvalidConfigError as exc:
        raise CheckpointError(f"{f}: {exc}") from exc
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
