"""Attention masks for tree forwards of a Hugging Face model.

A draft tree is scored with the model's own forward and a 4D additive float
mask (:func:`additive_mask`) built from a "may attend" pattern. Models with
sliding-window attention (:func:`sliding_window`) get the window applied on
top of that pattern, one mask per layer type when full and sliding layers mix
(:class:`SlidingWindow`; docs/models.md, "Sliding-window attention"). Part of
the plumbing gathered in :mod:`specdec.models.hf_common`.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import attrs
import torch

from specdec.errors import InvalidConfigError
from specdec.models.hf_model import model_max_length, text_config

__all__ = ["SLIDING_LAYER_TYPES", "SlidingWindow", "additive_mask", "sliding_window"]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, q, k]`` additive float mask from a ``[q, k]`` bool "may attend" matrix.

    0 where ``allowed``, ``torch.finfo(dtype).min`` elsewhere. (A boolean 4D
    mask is silently misread by the eager attention path of some transformers
    versions, which add the mask to the scores; a float mask means the same to
    every path.)

    Example:
        >>> import torch
        >>> additive_mask(torch.tensor([[True, False]]), torch.float32)[0, 0].tolist()
        [[0.0, -3.4028234663852886e+38]]
    """
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


SLIDING_LAYER_TYPES = ("full_attention", "sliding_attention")
"""The ``config.layer_types`` entries specdec can mask (docs/models.md, "Sliding-window attention")."""


@attrs.frozen
class SlidingWindow:
    """How a model with sliding-window attention sees its keys.

    A sliding layer's query at position ``t`` sees the keys at positions
    ``s`` with ``t - window < s <= t`` (transformers' ``sliding_window_overlay``:
    ``kv_idx > q_idx - sliding_window``; ``window`` keys, the query's own
    included); a full layer sees every key its tree row allows.

    Attributes:
        window: ``W``, the model's ``config.sliding_window``.
        per_layer_type: True when some layers attend fully (``config.layer_types``
            mixes both kinds): the model is given ``{"full_attention": m_full,
            "sliding_attention": m_sliding}``; False when every layer slides
            (Mistral style): one mask.
    """

    window: int
    per_layer_type: bool

    def masks(
        self, allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The additive masks ``[B, 1, q, K]`` of one forward.

        Args:
            allowed: ``[B, q, K]`` bool, the tree's pattern (True: may attend).
            query_positions: ``[B, q]`` int64 positions of the new tokens.
            key_positions: ``[B, K]`` int64 positions of the keys (cached, then new).
            dtype: the model's dtype.
        """
        near = key_positions.unsqueeze(1) > query_positions.unsqueeze(2) - self.window  # [B, q, K]
        sliding = additive_mask(allowed & near, dtype)[0, 0].unsqueeze(1)
        if not self.per_layer_type:
            return sliding
        return {"full_attention": additive_mask(allowed, dtype)[0, 0].unsqueeze(1), "sliding_attention": sliding}


_MASK_MAPPING = re.compile(r"isinstance\(\s*(?:\w+\s*:=\s*)?attention_mask\s*,\s*dict\s*\)")


@functools.lru_cache(maxsize=64)
def _takes_mask_mapping(forward: Callable[..., Any]) -> bool:
    """Whether ``forward`` (a decoder's) accepts a per-layer-type dict of masks."""
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return _MASK_MAPPING.search(source) is not None


def sliding_window(model: Any) -> SlidingWindow | None:
    """The sliding-window layout of ``model``, or None when no layer slides.

    A layer slides when the (text) config sets ``sliding_window`` (and not
    ``use_sliding_window=False``) and, if the config has ``layer_types``, the
    layer's type is ``"sliding_attention"``; without ``layer_types`` every
    layer slides (Mistral, Phi-3).

    Raises:
        InvalidConfigError: ``sliding_window`` is not a positive int, or exceeds
            the model's context (``max_position_embeddings``).
        NotImplementedError: a layer type other than :data:`SLIDING_LAYER_TYPES`
            (chunked attention, ...), or full and sliding layers in a model whose
            decoder takes a single mask (specdec could not give each kind its own).
    """
    config = text_config(model.config)
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    name = type(model).__name__
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InvalidConfigError(f"{name}: sliding_window must be a positive int, got {window!r}")
    max_length = model_max_length(model)
    if max_length is not None and window > max_length:
        raise InvalidConfigError(
            f"{name}: sliding_window = {window} exceeds the model's context of {max_length} positions "
            "(max_position_embeddings); fix the config (a window as long as the context is full attention: "
            "set sliding_window = None)"
        )
    types = getattr(config, "layer_types", None)
    if types is None:
        return SlidingWindow(window, per_layer_type=False)
    unknown = sorted(set(types) - set(SLIDING_LAYER_TYPES))
    if unknown:
        raise NotImplementedError(
            f"{name}: layer types {unknown} are not supported; specdec masks trees for {list(SLIDING_LAYER_TYPES)}"
        )
    if "sliding_attention" not in types:
        return None
    if "full_attention" not in types:
        return SlidingWindow(window, per_layer_type=False)
    decoder = type(model.base_model)
    if not _takes_mask_mapping(decoder.forward):
        raise NotImplementedError(
            f"{name}: full and sliding-window layers, but {decoder.__name__}.forward takes one "
            "attention mask for all layers (no per-layer-type dict), so a tree cannot be masked exactly"
        )
    return SlidingWindow(window, per_layer_type=True)
