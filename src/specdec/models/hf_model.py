"""Facts about a Hugging Face causal LM, and copies of it.

The supported ``transformers`` range (:data:`SUPPORTED_TRANSFORMERS`), the
model's vocabulary size, context length, device and dtype read off its
config and parameters (a multimodal config's text part, :func:`text_config`),
the training-mode (dropout) warning, and :func:`truncated_copy`, a smaller
model made of the first layers of another. Part of the plumbing gathered in
:mod:`specdec.models.hf_common`.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

from specdec._extras import needs_extra
from specdec.errors import InvalidConfigError

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "check_eval_mode",
    "check_transformers_version",
    "model_device",
    "model_dtype",
    "model_max_length",
    "model_vocab_size",
    "text_config",
    "truncated_copy",
]

SUPPORTED_TRANSFORMERS = ">=4.46,<6"
"""The ``transformers`` versions specdec's HF wrappers support (a PEP 440
specifier). Tested on 4.46.3, 4.57.1 and 5.24.0."""


def check_transformers_version(version: str | None = None) -> None:
    """Raise ``ImportError`` unless ``version`` (default: the installed
    ``transformers``) is in :data:`SUPPORTED_TRANSFORMERS`."""
    with needs_extra("hf", "specdec's Hugging Face wrappers"):
        from packaging.specifiers import SpecifierSet

    if version is None:
        with needs_extra("hf", "specdec's Hugging Face wrappers"):
            import transformers

        version = transformers.__version__
    if version not in SpecifierSet(SUPPORTED_TRANSFORMERS):
        raise ImportError(
            f"specdec's Hugging Face wrappers support transformers{SUPPORTED_TRANSFORMERS}, "
            f"found {version}; install a supported version (pip install 'transformers{SUPPORTED_TRANSFORMERS}')"
        )


def model_vocab_size(model: Any) -> int:
    """``V``: the number of logits the model's LM head returns."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return int(text_config(model.config).vocab_size)


def model_max_length(model: Any) -> int | None:
    """Number of positions the model supports (``config.max_position_embeddings``), or None."""
    value = getattr(text_config(model.config), "max_position_embeddings", None)
    return int(value) if value else None


def text_config(config: Any) -> Any:
    """The decoder (text) part of a possibly multimodal config."""
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 if none)."""
    for p in model.parameters():
        if torch.is_floating_point(p):
            return p.dtype
    return torch.float32


def check_eval_mode(model: Any, who: str) -> None:
    """Warn when ``model`` is in training mode with a dropout rate above 0
    (a module's or its config's): dropout then makes every
    forward random, so tokens are not reproducible and the law sampled is not
    the model's (call ``model.eval()``)."""
    if not getattr(model, "training", False):
        return
    config = text_config(model.config)
    rates = [float(v) for k, v in vars(config).items()
             if ("dropout" in k or k.endswith("pdrop")) and isinstance(v, (int, float)) and not isinstance(v, bool)]
    modules = getattr(model, "modules", None)
    if modules is not None:
        rates += [float(m.p) for m in modules() if isinstance(m, torch.nn.Dropout)]
    if any(r > 0 for r in rates):  # training mode with every dropout rate 0 changes nothing
        warnings.warn(
            f"{who}: the model is in training mode (dropout on): its logits are random, so outputs are not "
            "reproducible and not the model's law; call model.eval() first",
            UserWarning,
            stacklevel=3,
        )


def truncated_copy(model: Any, num_layers: int) -> Any:
    """A causal LM made of ``model``'s first ``num_layers`` decoder layers, its
    final norm and its LM head, *sharing* their weights (no copy).

    Useful as a small independent draft for ``model`` (same tokenizer, same
    embeddings): its logits are ``lm_head(norm(h_k))`` with ``h_k`` the
    target's hidden state after layer ``k``.

    Args:
        model: an HF causal LM whose config counts layers in ``num_hidden_layers``.
        num_layers: ``k``, ``1 <= k <= num_hidden_layers``.

    Returns:
        A model of the same class, in eval mode, on the same device and dtype.

    Example:
        >>> import transformers
        >>> cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16,
        ...     num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1)
        >>> big = transformers.LlamaForCausalLM(cfg)
        >>> small = truncated_copy(big, 1)
        >>> small.config.num_hidden_layers, small.lm_head.weight.data_ptr() == big.lm_head.weight.data_ptr()
        (1, True)
    """
    config = copy.deepcopy(model.config)
    total = getattr(config, "num_hidden_layers", None)
    if total is None:
        raise InvalidConfigError(f"{type(model).__name__}: config has no num_hidden_layers; cannot truncate")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= total:
        raise InvalidConfigError(f"num_layers must be an int in [1, {total}], got {num_layers!r}")
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:num_layers]
    attn = getattr(model.config, "_attn_implementation", None)
    small = type(model)._from_config(config, attn_implementation=attn) if attn else type(model)._from_config(config)
    source = model.state_dict()
    wanted = small.state_dict()
    missing = [k for k in wanted if k not in source]
    if missing:
        raise InvalidConfigError(f"truncated_copy: cannot map parameters {missing[:3]} of the truncated model")
    small.load_state_dict({k: source[k] for k in wanted}, assign=True)
    small.to(model_device(model))
    small.eval()
    return small
