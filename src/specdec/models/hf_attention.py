"""Which attention implementations can score a draft tree.

A tree is scored with a 4D additive mask; ``eager`` and ``sdpa``
(:data:`TREE_MASK_ATTENTION`) honour it, FlashAttention, flex and paged
attention are refused with the reason, and any other implementation is
probed once on a small tree (:func:`probe_tree_attention`) by
:func:`check_attention`. Part of the plumbing gathered in
:mod:`specdec.models.hf_common`.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.errors import InvalidConfigError
from specdec.models.hf_cache import KVCache
from specdec.models.hf_forward import forward_tokens
from specdec.models.hf_model import model_dtype, model_vocab_size, text_config

__all__ = ["TREE_MASK_ATTENTION", "check_attention", "probe_tree_attention"]


TREE_MASK_ATTENTION = ("eager", "sdpa")
"""``attn_implementation`` values proven to honour a tree's 4D additive mask
(tests/models/test_attention_check.py: tree logits equal per-path logits).
Any other registered attention is probed once at construction (:func:`check_attention`)."""

_REFUSED_ATTENTION = {
    "flash": "FlashAttention kernels take no arbitrary 4D mask (transformers passes them causal/padding "
             "information only), so tree nodes would attend across branches",
    "flex_attention": "transformers builds flex attention's block mask from causal/padding masks; a tree's "
                      "4D mask makes the compiled kernel index out of bounds",
    "paged": "paged attention keeps its own cache (continuous batching), not the KV cache specdec compacts",
}


def _attention_name(model: Any) -> str | None:
    name = getattr(model.config, "_attn_implementation", None)
    if name is None:
        name = getattr(text_config(model.config), "_attn_implementation", None)
    return None if name is None else str(name)


def probe_tree_attention(model: Any) -> float:
    """Score a small tree (two branches below a root, one of them two deep)
    over a 3-token context with the tree's 4D mask, and compare every node's
    logits with a plain causal forward of that node's own path.

    Returns:
        The largest absolute difference divided by ``max(1, max |logit|)``:
        rounding-sized (about 1e-6 in float32) for an attention that honours
        the mask, order one for one that ignores it (a node then sees its
        sibling branch).
    """
    vocab = model_vocab_size(model)
    ids = [(7 * i + 1) % vocab for i in range(6)]  # context c0 c1 r, then x (child of r), y (child of r), z (child of x)
    ctx, (x, y, z) = ids[:3], ids[3:]
    with torch.inference_mode():
        tree_cache = KVCache(model, 16)
        forward_tokens(model, tree_cache, ctx, [0, 1, 2], logits="none")
        allowed = torch.zeros(3, 6, dtype=torch.bool)
        allowed[:, :3] = True
        allowed[0, 3] = allowed[1, 4] = allowed[2, 5] = True  # every node sees itself
        allowed[2, 3] = True  # z sees its parent x; y sees no other node
        tree, _ = forward_tokens(model, tree_cache, [x, y, z], [3, 3, 4], allowed)
        path_xz, _ = forward_tokens(model, KVCache(model, 16), ctx + [x, z], [0, 1, 2, 3, 4])
        path_y, _ = forward_tokens(model, KVCache(model, 16), ctx + [y], [0, 1, 2, 3], logits="last")
    if tree is None or path_xz is None or path_y is None:  # forward_tokens returns logits unless logits="none"
        raise RuntimeError("probe_tree_attention: a forward returned no logits")
    ref = torch.stack([path_xz[3], path_y, path_xz[4]]).float()
    got = tree.float()
    return float((got - ref).abs().max() / ref.abs().max().clamp(min=1.0))


def check_attention(model: Any, who: str) -> None:
    """Refuse an ``attn_implementation`` that cannot score a tree exactly.

    ``eager`` and ``sdpa`` (:data:`TREE_MASK_ATTENTION`) pass at once;
    FlashAttention, flex attention and paged attention are refused with the
    reason; any other (a custom function registered with transformers'
    ``AttentionInterface``) is probed once (:func:`probe_tree_attention`) and
    refused if a tree node's logits differ from its path's.

    Raises:
        InvalidConfigError: naming the implementation, the reason and the
            supported ones.
    """
    name = _attention_name(model)
    if name in TREE_MASK_ATTENTION:
        return
    fix = (f"specdec scores trees with a 4D mask and supports attn_implementation {' and '.join(map(repr, TREE_MASK_ATTENTION))} "
           "(or a custom attention that passes a probe tree); load the model with attn_implementation='sdpa'")
    for key, why in _REFUSED_ATTENTION.items():
        if name is not None and key in name:
            raise InvalidConfigError(f"{who}: attn_implementation {name!r} is not supported: {why}. {fix}")
    dtype = model_dtype(model)
    tolerance = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
    try:
        err = probe_tree_attention(model)
    except Exception as exc:  # noqa: BLE001 - any failure of an unknown attention is reported, with its cause
        raise InvalidConfigError(
            f"{who}: attn_implementation {name!r} failed on a probe tree ({type(exc).__name__}: {exc}). {fix}"
        ) from exc
    if not err <= tolerance:
        raise InvalidConfigError(
            f"{who}: attn_implementation {name!r} ignores the tree mask: a probe tree's logits differ from its "
            f"paths' by {err:.3g} (relative; at most {tolerance:g} expected). {fix}"
        )
