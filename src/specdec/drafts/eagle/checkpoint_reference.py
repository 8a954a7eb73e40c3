"""EAGLE heads in the public reference layouts: SafeAILab EAGLE / SpecForge, and ``speculators``.

:func:`load_reference_head` tells the layout and the EAGLE version from the
config and the keys, maps the reference config (a LLaMA config, or
``speculators``' ``transformer_layer_config``) to an
:class:`~specdec.drafts.eagle.head.EagleConfig`, reads EAGLE-3's feature
layers in vLLM's or SGLang's numbering (:data:`AUX_LAYER_CONVENTIONS`), and
renames the tensors to the head's keys; :func:`reference_state_dict` is the
inverse renaming. See :mod:`specdec.drafts.eagle.checkpoints` for the layouts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from specdec.drafts.eagle.checkpoint_config import (
    CheckpointError, _check_layers, _depth, _field, _raise_position_limit, _read_config,
)
from specdec.drafts.eagle.checkpoint_speculators import (
    _SPECULATORS_PREFIX, _check_verifier, _is_speculators, _speculators_fields, _verifier_text,
)
from specdec.drafts.eagle.checkpoint_weights import _build, _load_into, _renamed, _targets_tensors, read_state_dict
from specdec.drafts.eagle.head import EagleConfig, EagleHead, eagle3_target_layers
from specdec.errors import InvalidConfigError, VocabMismatchError

__all__ = ["AUX_LAYER_CONVENTIONS", "load_reference_head", "reference_state_dict"]

_LAYER_PREFIX = {2: "layers.0.", 3: "midlayer."}


AUX_LAYER_CONVENTIONS: dict[str, int] = {"vllm": 0, "sglang": 1}
"""How an engine reads a recorded ``eagle_aux_hidden_state_layer_ids`` entry ``l``: the offset from
``l`` to specdec's ``hidden_states`` index. vLLM (and its ``speculators`` format) takes the *input*
of layer ``l`` (``hidden_states[l]``, offset 0); SGLang (and SpecForge, which trains for it) adds 1:
the *output* of layer ``l`` (``hidden_states[l + 1]``)."""


def reference_state_dict(head: EagleHead) -> dict[str, torch.Tensor]:
    """``head``'s tensors renamed to the reference layout of its version (the
    inverse of the mapping :func:`load_reference_head` applies); used to write
    synthetic reference checkpoints in tests and to export heads."""
    return _renamed(head, _LAYER_PREFIX[head.config.version])


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
