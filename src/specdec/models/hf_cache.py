"""The KV cache of a Hugging Face model, preallocated and compacted in place.

:class:`KVCache` wraps the transformers cache object (``DynamicCache``) that
the model's forward fills: with per-layer cache objects (transformers >= 4.56)
every layer's keys and values live in preallocated slabs
(:mod:`specdec.models.hf_slab`), rows of a batch can be written at their own
offsets, and the positions a verification drops are compacted away with one
gather per device. Older versions keep the ``key_cache`` / ``value_cache``
lists. Part of the plumbing gathered in :mod:`specdec.models.hf_common`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import torch

from specdec.kernels.kv_compact import compact_kv_inplace
from specdec.models.hf_masks import SlidingWindow, sliding_window
from specdec.models.hf_model import text_config
from specdec.models.hf_slab import MIN_CAPACITY, KVSlab, SlabSlot, slab_layer_class

__all__ = ["KVCache", "KVCompactor"]

KVCompactor = Callable[[Sequence[torch.Tensor], torch.Tensor], list[torch.Tensor]]
"""``fn(cache_tensors, keep_index) -> compacted tensors``; see
:func:`~specdec.kernels.kv_compact.compact_kv_reference` for the contract (an
implementation may overwrite the input tensors, as
:func:`~specdec.kernels.kv_compact.compact_kv_inplace` does: the cache
replaces them with the result)."""


class _LegacyCache(Protocol):
    """A ``DynamicCache`` of transformers 4.46 - 4.55: one list of keys and one of values."""

    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]


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
        self.sliding: SlidingWindow | None = sliding_window(model)  # before DynamicCache(config=...), which fails on some layer types
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
            layer_cls = slab_layer_class()
            num_layers = int(getattr(config, "num_hidden_layers", 0) or len(self.obj.layers))
            self.obj.layers = [layer_cls(self) for _ in range(max(num_layers, len(self.obj.layers)))]
            if getattr(self.obj, "layer_class_to_replicate", None) is not None:  # layers appended lazily
                # transformers types this as a layer class but only calls it with no arguments: a factory of
                # slab layers bound to this cache stands in for it
                self.obj.layer_class_to_replicate = lambda: layer_cls(self)  # type: ignore[assignment]

    def _layers(self) -> list[SlabSlot]:
        """The cache object's layers, every one a slab layer (preallocated layout only: set in
        ``__init__``, and those transformers appends later come from the same factory)."""
        return cast("list[SlabSlot]", self.obj.layers)

    def _legacy(self) -> _LegacyCache:
        """The cache object as transformers < 4.56 made it (not preallocated: no ``layers``)."""
        return cast(_LegacyCache, self.obj)

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
        for layer in self._layers():
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
        if not self.preallocated:
            legacy = self._legacy()
            return [t for pair in zip(legacy.key_cache, legacy.value_cache) for t in pair]
        out = []
        for i, layer in enumerate(self._layers()):
            if layer.keys is None or layer.values is None:
                raise RuntimeError(f"KV cache layer {i} holds nothing while the cache holds {len(self)} positions")
            out += [layer.keys, layer.values]
        return out

    def set_tensors(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace the cached tensors (same flat order as :meth:`tensors`); in a
        slab, a tensor that is already the slot's view is not copied."""
        keys, values = list(tensors[0::2]), list(tensors[1::2])
        if self.preallocated:
            layers = self._layers()
            if len(keys) != len(layers):
                raise ValueError(f"expected {2 * len(layers)} cache tensors, got {len(tensors)}")
            for layer, k, v in zip(layers, keys, values):
                layer.keys, layer.values = k, v
        else:
            legacy = self._legacy()
            if len(keys) != len(legacy.key_cache):
                raise ValueError(f"expected {2 * len(legacy.key_cache)} cache tensors, got {len(tensors)}")
            legacy.key_cache[:] = keys
            legacy.value_cache[:] = values
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
                for layer in self._layers():
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
                for layer in self._layers():
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
