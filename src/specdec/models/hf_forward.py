"""One forward of a Hugging Face causal LM over its KV cache.

:func:`forward_tokens` (one row) and :func:`forward_rows` (a batch of rows at
their own cache offsets) run the model's own forward on new tokens at explicit
positions, with a tree's 4D additive mask (or plain causal attention), append
their keys and values to the :class:`~specdec.models.hf_cache.KVCache`, and
return the logits and the hidden states asked for. The ``transformers``
keywords that changed names across versions (``cache`` / ``past_key_values``,
``logits_to_keep`` / ``num_logits_to_keep``) are looked up here. Part of the
plumbing gathered in :mod:`specdec.models.hf_common`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specdec.models.hf_cache import KVCache
from specdec.models.hf_masks import additive_mask
from specdec.models.hf_model import model_device, model_dtype
from specdec.regions import model_call

__all__ = ["forward_rows", "forward_tokens"]


@functools.lru_cache(maxsize=64)
def _forward_kwargs(forward: Callable[..., Any]) -> tuple[str, str | None]:
    """The keywords of a model's ``forward`` that take the cache and restrict the logits (None: no such keyword)."""
    params = inspect.signature(forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
    return cache_kw, logits_kw


def forward_tokens(
    model: Any,
    cache: KVCache,
    tokens: Sequence[int] | torch.Tensor,
    positions: Sequence[int] | torch.Tensor,
    allowed: torch.Tensor | None = None,
    *,
    logits: str = "all",
    hidden_layers: Sequence[int] = (),
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One forward of ``q`` new tokens over the cached positions; the new
    tokens' keys and values are appended to ``cache``.

    Args:
        model: HF causal LM.
        cache: its :class:`KVCache` holding ``S`` positions.
        tokens: ``q`` token ids.
        positions: ``q`` position ids (rotary / absolute positions).
        allowed: ``[q, S + q]`` bool, True where a new token may attend (cache
            positions first, then the new tokens in order); None means plain
            causal attention (and then ``positions`` must be ``S..S+q-1``).
        logits: ``"all"`` (``[q, V]``), ``"last"`` (``[V]``) or ``"none"`` (skips the LM head).
        hidden_layers: indices into the model's ``hidden_states`` tuple to return
            (``i`` = input of decoder layer ``i``; ``num_layers`` = final normed output).
        head: an LM head applied to the final normed states ``[..., H]`` in place of the
            model's own (e.g. its rows of a proposal vocabulary, ``[..., Vd]``); None: the model's.

    Returns:
        ``(logits, hidden)``: logits as requested (model dtype) or None;
        ``hidden`` ``[q, len(hidden_layers), H]`` or None when no layer is asked for.
    """
    device = model_device(model)
    q = len(tokens)
    past = len(cache)
    if isinstance(tokens, torch.Tensor):  # the step path: already a device tensor
        input_ids = tokens.to(device=device, dtype=torch.int64).reshape(1, q)
    else:
        input_ids = torch.tensor([list(tokens)], dtype=torch.int64, device=device)
    position_ids = torch.as_tensor(positions, dtype=torch.int64).reshape(1, q).to(device)
    mask: torch.Tensor | dict[str, torch.Tensor] | None = None
    if allowed is not None:
        if tuple(allowed.shape) != (q, past + q):
            raise ValueError(f"allowed must be [{q}, {past + q}], got {tuple(allowed.shape)}")
        if cache.sliding is None:
            mask = additive_mask(allowed.to(device), model_dtype(model))
    if cache.sliding is not None:  # one mask per layer type (docs/models.md, "Sliding-window attention")
        mask = cache.sliding_masks(
            None if allowed is None else allowed.to(device).unsqueeze(0), position_ids,
            torch.full((1,), past, dtype=torch.int64, device=device), model_dtype(model),
        )
    scores, hidden = _forward(model, cache, input_ids, position_ids, mask, logits, hidden_layers, head)
    if scores is not None:
        scores = scores[0, -1] if logits == "last" else scores[0]
    return scores, None if hidden is None else hidden[0]


def forward_rows(
    model: Any,
    cache: KVCache,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    allowed: torch.Tensor,
    *,
    logits: str = "all",
    hidden_layers: Sequence[int] = (),
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`forward_tokens` for ``B`` rows at once: ``tokens``, ``positions``
    ``[B, q]`` int64 and ``allowed`` ``[B, q, K]`` bool (``K`` = the span of
    keys: the cached positions and the new ones, as :meth:`KVCache.write_rows`
    placed them). Returns ``logits [B, q, V]`` (``"last"``: ``[B, V]``, the
    last column) and ``hidden [B, q, len(hidden_layers), H]``."""
    device = model_device(model)
    b, q = tokens.shape
    if allowed.dim() != 3 or tuple(allowed.shape[:2]) != (b, q):
        raise ValueError(f"allowed must be [{b}, {q}, K], got {tuple(allowed.shape)}")
    mask: torch.Tensor | dict[str, torch.Tensor]
    if cache.sliding is not None:  # one mask per layer type (docs/models.md, "Sliding-window attention")
        offsets = cache._offsets if cache._offsets is not None else torch.full((b,), len(cache), dtype=torch.int64)
        mask = cache.sliding_masks(allowed.to(device), positions.to(device), offsets.to(device), model_dtype(model))
    else:
        mask = additive_mask(allowed.to(device), model_dtype(model))[0, 0].unsqueeze(1)  # [B, 1, q, K]
    scores, hidden = _forward(model, cache, tokens.to(device), positions.to(device), mask, logits, hidden_layers, head)
    if scores is not None and logits == "last":
        scores = scores[:, -1]
    return scores, hidden


def _forward(
    model: Any,
    cache: KVCache,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    mask: torch.Tensor | dict[str, torch.Tensor] | None,
    logits: str,
    hidden_layers: Sequence[int],
    head: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The model call: ``input_ids``/``position_ids`` ``[B, q]``, ``mask`` ``[B or 1, 1, q, K]``
    additive or None (causal). Returns ``logits [B, q, V]`` (``[B, 1, V]`` for ``"last"``; with
    ``head``, ``head`` of the base model's final states) and ``hidden [B, q, L, H]``."""
    kwargs: dict[str, Any] = {"input_ids": input_ids, "position_ids": position_ids, "use_cache": True}
    if mask is not None:
        kwargs["attention_mask"] = mask
    if hidden_layers:
        kwargs["output_hidden_states"] = True
    if logits == "none" or (head is not None and logits in ("all", "last")):
        runner = model.base_model
    elif logits in ("all", "last"):
        runner = model
    else:
        raise ValueError(f"logits must be 'all', 'last' or 'none', got {logits!r}")
    cache_kw, logits_kw = _forward_kwargs(type(runner).forward)
    kwargs[cache_kw] = cache.obj
    if logits == "last" and logits_kw is not None and runner is model:
        kwargs[logits_kw] = 1
    with torch.inference_mode(), model_call():
        out = runner(**kwargs)
        if logits == "none":
            scores = None
        elif head is None:
            scores = out.logits
        else:  # the base model's final (normed) states [B, q, H] through the given head
            final = out.last_hidden_state
            scores = head(final[:, -1:] if logits == "last" else final)
    hidden = None
    if hidden_layers:
        states = out.hidden_states
        # a model split over devices (device_map) has its layers' states on their devices: gather on the first's
        home = states[hidden_layers[0]].device
        hidden = torch.stack([states[i] if states[i].device == home else states[i].to(home) for i in hidden_layers], dim=2)
    return scores, hidden
