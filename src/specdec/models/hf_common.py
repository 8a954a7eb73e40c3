"""Shared plumbing for Hugging Face causal LMs: KV-cache access, tree
attention masks, one-call forwards, vocabulary checks, truncated-layer copies.

Everything version-dependent in the ``transformers`` API that specdec uses is
isolated here, behind :class:`KVCache` and :func:`forward_tokens`:

- the cache object (``DynamicCache``): per-layer ``cache.layers[i].keys/.values``
  (transformers >= 4.56) or the older ``cache.key_cache[i]`` / ``cache.value_cache[i]``
  lists (4.46 - 4.55);
- the keyword that passes it (``cache`` from 5.x on, ``past_key_values`` before);
- the keyword that restricts logits to the last position (``logits_to_keep`` /
  ``num_logits_to_keep``).

The supported range is :data:`SUPPORTED_TRANSFORMERS`; the compatibility test
(``tests/models/test_hf_compat.py``) checks the installed version against it and
exercises every cache access used here. No modeling file is forked: trees are
scored with the model's own forward, a 4D additive float attention mask and
explicit ``position_ids``.

Words: the *committed context* is the token sequence decoding has fixed so
far; a *draft tree* (see :mod:`specdec.tree`) hangs below its last token, the
*root*. A node at depth ``d`` gets position ``len(context) - 1 + d``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from specdec.errors import ContextOverflowError, InvalidConfigError, VocabMismatchError
from specdec.kernels.kv_compact import compact_kv_inplace
from specdec.regions import model_call

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "TREE_MASK_ATTENTION",
    "check_attention",
    "check_eval_mode",
    "probe_tree_attention",
    "KVCache",
    "KVCompactor",
    "SLIDING_LAYER_TYPES",
    "SlidingWindow",
    "additive_mask",
    "check_context",
    "check_prompt",
    "check_tokenizers_match",
    "check_tokens",
    "check_transformers_version",
    "check_vocab_match",
    "forward_rows",
    "forward_tokens",
    "model_max_length",
    "model_vocab_size",
    "sliding_window",
    "text_config",
    "truncated_copy",
]

SUPPORTED_TRANSFORMERS = ">=4.46,<6"
"""The ``transformers`` versions specdec's HF wrappers support (a PEP 440
specifier). Tested on 4.46.3, 4.57.1 and 5.24.0."""

KVCompactor = Callable[[Sequence[torch.Tensor], torch.Tensor], list[torch.Tensor]]
"""``fn(cache_tensors, keep_index) -> compacted tensors``; see
:func:`~specdec.kernels.kv_compact.compact_kv_reference` for the contract (an
implementation may overwrite the input tensors, as
:func:`~specdec.kernels.kv_compact.compact_kv_inplace` does: the cache
replaces them with the result)."""


def check_transformers_version(version: str | None = None) -> None:
    """Raise ``ImportError`` unless ``version`` (default: the installed
    ``transformers``) is in :data:`SUPPORTED_TRANSFORMERS`."""
    from packaging.specifiers import SpecifierSet

    if version is None:
        import transformers

        version = transformers.__version__
    if version not in SpecifierSet(SUPPORTED_TRANSFORMERS):
        raise ImportError(
            f"specdec's Hugging Face wrappers support transformers{SUPPORTED_TRANSFORMERS}, "
            f"found {version}; install a supported version (pip install 'transformers{SUPPORTED_TRANSFORMERS}')"
        )


# ------------------------------------------------------------- model facts
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


def _model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _model_dtype(model: Any) -> torch.dtype:
    for p in model.parameters():
        if torch.is_floating_point(p):
            return p.dtype
    return torch.float32


# ------------------------------------------------------------- input checks
def check_prompt(prompt_ids: Sequence[int], vocab_size: int, max_length: int | None) -> list[int]:
    """Validate a prompt and return it as a list of ints.

    Raises:
        ValueError: empty prompt or a token outside ``[0, vocab_size)``.
        ContextOverflowError: the prompt is longer than ``max_length``.
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt must contain at least one token")
    tokens = check_tokens(prompt_ids, vocab_size, "prompt")
    if max_length is not None and len(tokens) > max_length:
        raise ContextOverflowError(f"the prompt has {len(tokens)} tokens; the model's context is {max_length} positions")
    return tokens


def check_tokens(tokens: Sequence[int] | torch.Tensor, vocab_size: int, what: str = "tokens") -> list[int]:
    """Token ids as a list of ints; ValueError if one lies outside ``[0, vocab_size)``."""
    out = [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    bad = [t for t in out if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{what}: token id {bad[0]} outside the model's vocabulary [0, {vocab_size})")
    return out


def check_context(last_position: int, max_length: int | None, what: str) -> None:
    """ContextOverflowError if position ``last_position`` does not exist (``>= max_length``)."""
    if max_length is not None and last_position >= max_length:
        raise ContextOverflowError(
            f"{what} needs position {last_position}, but the model's context is {max_length} positions "
            f"(0..{max_length - 1}); shorten the prompt, max_new_tokens or the tree depth"
        )


def check_vocab_match(target: Any, draft: Any) -> None:
    """Raise :class:`~specdec.errors.VocabMismatchError` unless the target and
    draft return logits over the same vocabulary size (any objects with a
    ``vocab_size`` attribute: specdec targets/drafts or HF configs).

    Same size is necessary, not sufficient: also compare the tokenizers with
    :func:`check_tokenizers_match` when they are at hand.
    """
    vt, vd = int(target.vocab_size), int(draft.vocab_size)
    if vt != vd:
        raise VocabMismatchError(
            f"target and draft vocabularies differ: target has V = {vt}, draft has V = {vd}; "
            "speculative decoding needs a draft that shares the target's tokenizer"
        )


def check_tokenizers_match(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise :class:`~specdec.errors.VocabMismatchError` unless both HF
    tokenizers map the same strings to the same ids (``get_vocab()``)."""
    a, b = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if a == b:
        return
    diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])
    example = diff[0] if diff else None
    raise VocabMismatchError(
        f"target and draft tokenizers differ ({len(a)} vs {len(b)} entries; first difference: {example!r})"
    )


# ------------------------------------------------------- sliding windows
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
def _takes_mask_mapping(cls: type) -> bool:
    """Whether ``cls.forward`` (a decoder) accepts a per-layer-type dict of masks."""
    try:
        source = inspect.getsource(cls.forward)
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
    if not _takes_mask_mapping(type(model.base_model)):
        raise NotImplementedError(
            f"{name}: full and sliding-window layers, but {type(model.base_model).__name__}.forward takes one "
            "attention mask for all layers (no per-layer-type dict), so a tree cannot be masked exactly"
        )
    return SlidingWindow(window, per_layer_type=True)


# ------------------------------------------------------------ the KV cache
MIN_CAPACITY = 256
"""Positions a cache slab holds at least when it is first allocated."""


class KVSlab:
    """One preallocated buffer for the KV cache of several layers on one device.

    ``buf`` is ``[slots, 2, B, H, capacity, D]`` (slot ``s``: one layer's keys
    ``buf[s, 0]`` and values ``buf[s, 1]``). Compacting every layer of the
    slab is one gather and one copy (:meth:`KVCache.compact`). The buffer
    grows (to twice its capacity, or to what is needed) only when a forward
    writes past its end: one copy of the cache, made rare by sizing the
    first allocation with the generation's bound (:meth:`KVCache.reserve`).
    """

    def __init__(self, like: torch.Tensor, slots: int, capacity: int) -> None:
        b, h, _, d = like.shape
        self.buf = torch.zeros(slots, 2, b, h, capacity, d, dtype=like.dtype, device=like.device)
        self.shape = (b, h, d)
        self.dtype, self.device = like.dtype, like.device
        self.layers: list[_SlabLayer] = []

    @property
    def slots(self) -> int:
        return int(self.buf.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.buf.shape[-2])

    def fits(self, like: torch.Tensor) -> bool:
        b, h, _, d = like.shape
        return (b, h, d) == self.shape and like.dtype == self.dtype and like.device == self.device and len(self.layers) < self.slots

    def grow(self, needed: int) -> None:
        capacity = max(2 * self.capacity, needed)
        grown = self.buf.new_zeros(*self.buf.shape[:-2], capacity, self.buf.shape[-1])
        grown[..., : self.capacity, :] = self.buf
        self.buf = grown


def _slab_layer_class() -> type:
    """The transformers cache layer backed by a :class:`KVSlab` (made on first use:
    ``DynamicLayer`` exists from transformers 4.56 on)."""
    global _SlabLayer
    if "_SlabLayer" in globals():
        return _SlabLayer
    from transformers.cache_utils import DynamicLayer

    class SlabLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values live in a :class:`KVSlab`
        slot: a forward writes its new positions in place and gets views of
        the first ``length`` positions back (no concatenation)."""

        def __init__(self, pool: "KVCache") -> None:
            self.pool = pool
            self.slab: KVSlab | None = None
            self.slot = 0
            self.length = 0
            super().__init__()

        # keys / values are views of the slab, made when asked for
        @property
        def keys(self) -> torch.Tensor | None:  # type: ignore[override]
            return None if self.slab is None else self.slab.buf[self.slot, 0, :, :, : self.length]

        @keys.setter
        def keys(self, value: torch.Tensor | None) -> None:
            if value is not None:
                self._store(value, 0)

        @property
        def values(self) -> torch.Tensor | None:  # type: ignore[override]
            return None if self.slab is None else self.slab.buf[self.slot, 1, :, :, : self.length]

        @values.setter
        def values(self, value: torch.Tensor | None) -> None:
            if value is not None:
                self._store(value, 1)

        def _store(self, value: torch.Tensor, which: int) -> None:
            """Make ``value`` ``[B, H, S, D]`` this layer's keys (0) or values (1)."""
            if self.slab is None:
                self.pool._attach(self, value)
            assert self.slab is not None
            n = value.shape[-2]
            if n > self.slab.capacity:
                self.slab.grow(n)
            target = self.slab.buf[self.slot, which, :, :, :n]
            if value.data_ptr() != target.data_ptr() or value.stride() != target.stride():
                target.copy_(value)
            self.length = n
            self.is_initialized = True

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.pool._attach(self, key_states)
            self.device = key_states.device
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            if self.slab is None:
                self.lazy_initialization(key_states, value_states)
            assert self.slab is not None
            if self.pool._offsets is not None:  # rows of a batch, each at its own offset (KVCache.write_rows)
                span = self.pool._span
                if span > self.slab.capacity:
                    self.slab.grow(span)
                kv = self.slab.buf[self.slot]  # [2, B, H, capacity, D]
                index = self.pool._row_index(key_states)  # [B, H, q, D]
                kv[0].scatter_(2, index, key_states)
                kv[1].scatter_(2, index, value_states)
                self.length = span
                return kv[0, :, :, :span], kv[1, :, :, :span]
            start, q = self.length, key_states.shape[-2]  # q new positions after the cached ones
            if start + q > self.slab.capacity:
                self.slab.grow(start + q)
            kv = self.slab.buf[self.slot]  # [2, B, H, capacity, D]
            kv[0, :, :, start : start + q] = key_states
            kv[1, :, :, start : start + q] = value_states
            self.length = start + q
            return kv[0, :, :, : self.length], kv[1, :, :, : self.length]

        def get_seq_length(self) -> int:
            return self.length

        def get_max_length(self) -> int:
            return -1

        def reset(self) -> None:
            self.length = 0

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError("crop takes the number of positions to remove as a negative int")
            self.length = max(0, self.length + tokens_to_remove)

    _SlabLayer = SlabLayer
    return SlabLayer


class KVCache:
    """The KV cache of one HF model for batch 1, preallocated and compacted in place.

    With transformers >= 4.56 (per-layer cache objects) the keys and values of
    every layer live in one preallocated buffer per device (:class:`KVSlab`):
    a forward writes its new positions in place, and compaction after
    verification is one gather per device, whatever the number of layers.
    The first allocation holds ``max(capacity, MIN_CAPACITY, positions
    needed)`` positions; the owner sizes it with the generation's bound
    (:meth:`reserve`), else the slab doubles when a forward runs past it.
    Older transformers versions keep their ``DynamicCache`` (concatenation
    on every forward; ``preallocated`` is False).

    Args:
        model: the HF causal LM the cache is for.
        capacity: positions to allocate for (a hint; see above).

    Attributes:
        obj: the underlying transformers cache object (pass it to the model).
        preallocated: whether the layers live in slabs.

    Sliding-window models (:func:`sliding_window`) keep every position in
    every layer, like full-attention ones; each forward then masks what a
    sliding layer must not see, which needs the position of every cached key:
    ``key_positions`` (``[B, capacity]``, kept by forwards, :meth:`compact`,
    :meth:`move_rows` and :meth:`keep_rows`; None for other models).

    Raises:
        NotImplementedError: for special cache layers, sliding-window models
            in old transformers versions (before 4.56), or models that take
            no Cache object (GPT-2 before 4.5x).
        InvalidConfigError: a malformed sliding window (:func:`sliding_window`).
    """

    def __init__(self, model: Any, capacity: int | None = None) -> None:
        from transformers import DynamicCache

        if getattr(model, "_supports_cache_class", True) is False:
            raise NotImplementedError(
                f"{type(model).__name__} takes legacy tuple caches in this transformers version; "
                "specdec needs a model that accepts a Cache object (upgrade transformers)"
            )
        self.sliding = sliding_window(model)  # before DynamicCache(config=...), which fails on some layer types
        params = inspect.signature(DynamicCache.__init__).parameters
        self.obj = DynamicCache(config=model.config) if "config" in params else DynamicCache()
        # sliding layers are replaced below by slab layers that keep every position (masks do the window)
        for layer in getattr(self.obj, "layers", ()):
            if type(layer).__name__ not in ("DynamicLayer", "DynamicSlidingWindowLayer"):
                raise NotImplementedError(
                    f"{type(model).__name__}: cache layer {type(layer).__name__} is not supported "
                    "(special caches cannot be compacted); use a full- or sliding-window-attention model"
                )
        config = text_config(model.config)
        self.key_positions: torch.Tensor | None = None
        if self.sliding is not None and not hasattr(self.obj, "layers"):
            raise NotImplementedError(
                f"{type(model).__name__}: sliding-window attention needs transformers >= 4.56 in specdec "
                "(per-layer cache objects)"
            )
        self.capacity = max(int(capacity or 0), MIN_CAPACITY)
        self.slabs: list[KVSlab] = []
        self._offsets: torch.Tensor | None = None  # [B] per-row write offsets of the current forward (write_rows)
        self._span = 0
        self._index: dict[tuple[Any, ...], torch.Tensor] = {}
        self._layers_on = _layers_per_device(model)
        self.preallocated = hasattr(self.obj, "layers")
        if self.preallocated:
            layer_cls = _slab_layer_class()
            num_layers = int(getattr(config, "num_hidden_layers", 0) or len(self.obj.layers))
            self.obj.layers = [layer_cls(self) for _ in range(max(num_layers, len(self.obj.layers)))]
            if getattr(self.obj, "layer_class_to_replicate", None) is not None:  # layers appended lazily
                self.obj.layer_class_to_replicate = lambda: layer_cls(self)

    def reserve(self, positions: int) -> None:
        """Size the slabs for ``positions`` cached positions (allocated slabs grow now, once)."""
        self.capacity = max(self.capacity, int(positions))
        for slab in self.slabs:
            if slab.capacity < positions:
                slab.grow(int(positions))

    # ----------------------------------------------------------- batch rows
    def write_rows(self, offsets: torch.Tensor | None, span: int = 0) -> None:
        """Set up the next forward of ``B`` rows: row ``b``'s ``q`` new
        positions are written at ``offsets[b] .. offsets[b] + q - 1``
        (``[B]`` int64 on the model's device) and attention spans the first
        ``span`` positions of every row (the caller masks, per row, what lies
        beyond its own length). ``None`` restores appending (one length for
        all rows). Needs the preallocated layout."""
        if offsets is not None and not self.preallocated:
            raise NotImplementedError("ragged batch rows need the preallocated KV cache (transformers >= 4.56)")
        self._offsets, self._span, self._index = offsets, int(span), {}

    def _row_index(self, like: torch.Tensor) -> torch.Tensor:
        """``[B, H, q, D]`` scatter index of the current forward's new positions (made once per forward and device)."""
        b, h, q, d = like.shape
        key = (like.device, h, q, d)
        if key not in self._index:
            assert self._offsets is not None
            rows = self._offsets.to(like.device).unsqueeze(-1) + torch.arange(q, device=like.device)  # [B, q]
            self._index[key] = rows[:, None, :, None].expand(b, h, q, d)
        return self._index[key]

    def move_rows(self, source: torch.Tensor, dest: torch.Tensor, span: int) -> None:
        """Per-row compaction: in row ``b`` of every layer, position
        ``source[b, j]`` moves to ``dest[b, j]`` (``[B, A]`` int64; entries
        with ``source == dest`` stay; the ``dest`` of a row are distinct),
        then attention spans ``span`` positions. One gather and one scatter
        per slab (device), whatever the number of layers."""
        with torch.inference_mode():
            for slab in self.slabs:
                slots, _, b, h, _, d = slab.buf.shape
                a = source.shape[-1]
                src = source.to(slab.device)[None, None, :, None, :, None].expand(slots, 2, b, h, a, d)
                dst = dest.to(slab.device)[None, None, :, None, :, None].expand(slots, 2, b, h, a, d)
                slab.buf.scatter_(-2, dst, slab.buf.gather(-2, src))
            if self.key_positions is not None:
                kp = self.key_positions
                kp.scatter_(1, dest.to(kp.device), kp.gather(1, source.to(kp.device)))
        for layer in self.obj.layers:
            layer.length = span

    def keep_rows(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keep only batch rows ``rows`` of every slab, in that order.

        Given as host ints in ascending order (finished rows leaving a batch),
        each kept row that moves is copied down over its used positions only,
        in place, and the slab's batch dimension is narrowed (a view: nothing
        else is copied). Otherwise (``[B']`` int64 tensor, any order) every slab
        is gathered (one ``index_select``)."""
        if self.key_positions is not None:
            index = rows if isinstance(rows, torch.Tensor) else torch.tensor([int(r) for r in rows], dtype=torch.int64)
            with torch.inference_mode():
                self.key_positions = self.key_positions.index_select(0, index.to(self.key_positions.device))
        if not isinstance(rows, torch.Tensor):
            keep = [int(r) for r in rows]
            if keep == sorted(set(keep)):
                span = len(self)
                with torch.inference_mode():  # the slabs are inference tensors (written in forwards)
                    for slab in self.slabs:
                        for i, r in enumerate(keep):  # r >= i: a later source is never overwritten
                            if r != i:
                                slab.buf[:, :, i, :, :span] = slab.buf[:, :, r, :, :span]
                        slab.buf = slab.buf[:, :, : len(keep)]
                        slab.shape = (len(keep), *slab.shape[1:])
                return
            rows = torch.tensor(keep, dtype=torch.int64)
        for slab in self.slabs:
            slab.buf = slab.buf.index_select(2, rows.to(slab.device))
            slab.shape = (int(rows.numel()), *slab.shape[1:])

    def _attach(self, layer: Any, like: torch.Tensor) -> None:
        """Give ``layer`` a slot in a slab of ``like``'s device, shape and dtype."""
        slab = next((s for s in self.slabs if s.fits(like)), None)
        if slab is None:
            slots = self._layers_on.get(str(like.device), len(self.obj.layers))
            slab = KVSlab(like, max(slots - sum(len(s.layers) for s in self.slabs if s.device == like.device), 1),
                          max(self.capacity, like.shape[-2]))
            self.slabs.append(slab)
        layer.slab, layer.slot = slab, len(slab.layers)
        slab.layers.append(layer)

    def sliding_masks(
        self, allowed: torch.Tensor | None, positions: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """Record the positions of a forward's new keys and return its masks
        (sliding-window models only; :meth:`SlidingWindow.masks`).

        Args:
            allowed: ``[B, q, K]`` bool tree pattern, or None for plain causal
                attention over the cached keys and the new ones.
            positions: ``[B, q]`` int64 positions of the new tokens.
            offsets: ``[B]`` int64 slot of each row's first new key (the new
                keys take slots ``offsets[b] .. offsets[b] + q - 1``).
            dtype: the model's dtype.
        """
        assert self.sliding is not None
        b, q = positions.shape
        span = int(allowed.shape[-1]) if allowed is not None else len(self) + q
        kp = self.key_positions
        with torch.inference_mode():  # an inference tensor, like the slabs: updated in and out of inference mode
            if kp is None or kp.shape[0] != b or kp.device != positions.device:
                if kp is not None and len(self) > 0:
                    raise RuntimeError(f"KV cache of {kp.shape[0]} rows used for a forward of {b} rows")
                kp = torch.zeros(b, max(self.capacity, span), dtype=torch.int64, device=positions.device)
            elif kp.shape[1] < span:
                kp = torch.cat([kp, kp.new_zeros(b, max(span, 2 * kp.shape[1]) - kp.shape[1])], dim=1)
            kp.scatter_(1, offsets.to(kp.device).unsqueeze(-1) + torch.arange(q, device=kp.device), positions)
            self.key_positions = kp
            keys = kp[:, :span].clone()  # [B, K]
        if allowed is None:  # causal: every key at a position up to the query's
            allowed = keys.unsqueeze(1) <= positions.unsqueeze(2)
        return self.sliding.masks(allowed.to(positions.device), positions, keys, dtype)

    def __len__(self) -> int:
        return int(self.obj.get_seq_length())

    def tensors(self) -> list[torch.Tensor]:
        """The cache as a flat list ``[k_0, v_0, k_1, v_1, ...]`` of ``[1, H, S, D]`` tensors (empty if nothing cached)."""
        if len(self) == 0:
            return []
        if hasattr(self.obj, "layers"):
            out = []
            for layer in self.obj.layers:
                out += [layer.keys, layer.values]
            return out
        return [t for pair in zip(self.obj.key_cache, self.obj.value_cache) for t in pair]

    def set_tensors(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace the cached tensors (same flat order as :meth:`tensors`); in a
        slab, a tensor that is already the slot's view is not copied."""
        keys, values = list(tensors[0::2]), list(tensors[1::2])
        if hasattr(self.obj, "layers"):
            if len(keys) != len(self.obj.layers):
                raise ValueError(f"expected {2 * len(self.obj.layers)} cache tensors, got {len(tensors)}")
            for layer, k, v in zip(self.obj.layers, keys, values):
                layer.keys, layer.values = k, v
        else:
            if len(keys) != len(self.obj.key_cache):
                raise ValueError(f"expected {2 * len(self.obj.key_cache)} cache tensors, got {len(tensors)}")
            self.obj.key_cache[:] = keys
            self.obj.value_cache[:] = values
            if hasattr(self.obj, "_seen_tokens"):
                self.obj._seen_tokens = int(keys[0].shape[-2])

    def compact(
        self, keep_index: torch.Tensor, compactor: KVCompactor = compact_kv_inplace, first_moved: int | None = None
    ) -> None:
        """Keep only the positions ``keep_index`` (``[S']`` int64, ascending) in every layer.

        With the default compactor and slabs, each slab (all the layers on
        one device) moves its positions with one gather and one copy, on the
        slab's device. ``first_moved``: the first entry with
        ``keep_index[i] != i``, when the caller knows it; otherwise it is
        read back from ``keep_index`` (a device-to-host copy on CUDA).
        """
        if len(self) == 0:
            if keep_index.numel():
                raise ValueError("cannot keep positions of an empty cache")
            return
        with torch.inference_mode():
            if self.key_positions is not None:  # the key positions move with their keys
                self.key_positions[:, : keep_index.numel()] = self.key_positions[:, keep_index.to(self.key_positions.device)]
            if compactor is compact_kv_inplace and self.preallocated and self.slabs:
                n = keep_index.numel()
                if first_moved is None:
                    moved = torch.nonzero(keep_index.cpu() != torch.arange(n)).flatten()
                    first_moved = int(moved[0]) if moved.numel() else n
                if first_moved < n:
                    for slab in self.slabs:
                        source = keep_index[first_moved:].to(slab.device)  # [S' - first_moved]
                        slab.buf[..., first_moved:n, :] = slab.buf.index_select(-2, source)
                for layer in self.obj.layers:
                    layer.length = n
                return
            tensors = self.tensors()
            keep = keep_index.to(tensors[0].device)
            if compactor is compact_kv_inplace and first_moved is not None:
                self.set_tensors(compact_kv_inplace(tensors, keep, first_moved=first_moved))
            else:
                self.set_tensors(compactor(tensors, keep))

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        current = len(self)
        if length > current or length < 0:
            raise ValueError(f"cannot truncate a cache of {current} positions to {length}")
        if length < current:
            if self.preallocated:
                for layer in self.obj.layers:
                    layer.length = min(layer.length, length)
            else:
                self.set_tensors([t[..., :length, :] for t in self.tensors()])


def _layers_per_device(model: Any) -> dict[str, int]:
    """``{device: decoder layers on it}`` from a ``device_map`` model's
    ``hf_device_map`` (entries ``...layers.<i>``); empty otherwise."""
    device_map = getattr(model, "hf_device_map", None) or {}
    counts: dict[str, int] = {}
    for name, where in device_map.items():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in ("layers", "h") and parts[-1].isdigit():
            key = str(torch.device(f"cuda:{where}" if isinstance(where, int) else where))
            counts[key] = counts.get(key, 0) + 1
    return counts


# ------------------------------------------------------------- the forward
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


@functools.lru_cache(maxsize=64)
def _forward_kwargs(cls: type) -> tuple[str, str | None]:
    params = inspect.signature(cls.forward).parameters
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
    device = _model_device(model)
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
            mask = additive_mask(allowed.to(device), _model_dtype(model))
    if cache.sliding is not None:  # one mask per layer type (docs/models.md, "Sliding-window attention")
        mask = cache.sliding_masks(
            None if allowed is None else allowed.to(device).unsqueeze(0), position_ids,
            torch.full((1,), past, dtype=torch.int64, device=device), _model_dtype(model),
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
    device = _model_device(model)
    b, q = tokens.shape
    if allowed.dim() != 3 or tuple(allowed.shape[:2]) != (b, q):
        raise ValueError(f"allowed must be [{b}, {q}, K], got {tuple(allowed.shape)}")
    mask: torch.Tensor | dict[str, torch.Tensor]
    if cache.sliding is not None:  # one mask per layer type (docs/models.md, "Sliding-window attention")
        offsets = cache._offsets if cache._offsets is not None else torch.full((b,), len(cache), dtype=torch.int64)
        mask = cache.sliding_masks(allowed.to(device), positions.to(device), offsets.to(device), _model_dtype(model))
    else:
        mask = additive_mask(allowed.to(device), _model_dtype(model))[0, 0].unsqueeze(1)  # [B, 1, q, K]
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
    cache_kw, logits_kw = _forward_kwargs(type(runner))
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


# ------------------------------------------------------- attention implementations

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
    ref = torch.stack([path_xz[3], path_y, path_xz[4]]).float()
    got = tree.float()
    return float((got - ref).abs().max() / ref.abs().max().clamp(min=1.0))


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
        import warnings

        warnings.warn(
            f"{who}: the model is in training mode (dropout on): its logits are random, so outputs are not "
            "reproducible and not the model's law; call model.eval() first",
            UserWarning,
            stacklevel=3,
        )


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
    dtype = _model_dtype(model)
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


# ------------------------------------------------------- truncated copies
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
    small.to(_model_device(model))
    small.eval()
    return small
