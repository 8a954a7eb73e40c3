"""The preallocated storage behind :class:`~specdec.models.hf_cache.KVCache`.

A :class:`KVSlab` is one buffer holding the keys and values of several
decoder layers on one device; each layer of the transformers cache object is
replaced by a slab layer (:func:`slab_layer_class`, a ``DynamicLayer``
subclass, transformers >= 4.56) that writes a forward's new positions into its
slab slot in place and hands back views of it. Part of the plumbing gathered
in :mod:`specdec.models.hf_common`.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch

__all__ = ["MIN_CAPACITY", "KVSlab", "SlabPool", "SlabSlot", "slab_layer_class"]

MIN_CAPACITY = 256
"""Positions a cache slab holds at least when it is first allocated."""


class SlabSlot(Protocol):
    """A cache layer that lives in a :class:`KVSlab` slot (what :func:`slab_layer_class` makes)."""

    slab: KVSlab | None
    slot: int
    length: int
    """Positions cached (the first ``length`` of the slot)."""
    keys: torch.Tensor | None
    values: torch.Tensor | None


class SlabPool(Protocol):
    """What a slab layer asks of the cache that owns its slabs (:class:`~specdec.models.hf_cache.KVCache`)."""

    _offsets: torch.Tensor | None
    _span: int

    def _attach(self, layer: Any, like: torch.Tensor) -> None:
        """Give ``layer`` a slot in a slab of ``like``'s device, shape and dtype."""

    def _row_index(self, like: torch.Tensor) -> torch.Tensor:
        """``[B, H, q, D]`` scatter index of the current forward's new positions."""


class KVSlab:
    """One preallocated buffer for the KV cache of several layers on one device.

    ``buf`` is ``[slots, 2, B, H, capacity, D]`` (slot ``s``: one layer's keys
    ``buf[s, 0]`` and values ``buf[s, 1]``). Compacting every layer of the
    slab is one gather and one copy (:meth:`~specdec.models.hf_cache.KVCache.compact`). The buffer
    grows (to twice its capacity, or to what is needed) only when a forward
    writes past its end: one copy of the cache, made rare by sizing the
    first allocation with the generation's bound (:meth:`~specdec.models.hf_cache.KVCache.reserve`).
    """

    def __init__(self, like: torch.Tensor, slots: int, capacity: int) -> None:
        b, h, _, d = like.shape
        self.buf = torch.zeros(slots, 2, b, h, capacity, d, dtype=like.dtype, device=like.device)
        self.shape = (b, h, d)
        self.dtype, self.device = like.dtype, like.device
        self.layers: list[SlabSlot] = []

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


@functools.cache
def slab_layer_class() -> type[Any]:
    """The transformers cache layer backed by a :class:`KVSlab` (made on first use:
    ``DynamicLayer`` exists from transformers 4.56 on); its instances are
    :class:`SlabSlot` s, made with the :class:`SlabPool` that owns the slabs."""
    from transformers.cache_utils import DynamicLayer

    class SlabLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values live in a :class:`KVSlab`
        slot: a forward writes its new positions in place and gets views of
        the first ``length`` positions back (no concatenation)."""

        def __init__(self, pool: SlabPool) -> None:
            self.pool = pool
            self.slab: KVSlab | None = None
            self.slot = 0
            self.length = 0
            super().__init__()

        # keys / values are views of the slab, made when asked for
        @property
        def keys(self) -> torch.Tensor | None:  # a plain attribute in DynamicLayer, a slab view here
            return None if self.slab is None else self.slab.buf[self.slot, 0, :, :, : self.length]

        @keys.setter
        def keys(self, value: torch.Tensor | None) -> None:
            if value is not None:
                self._store(value, 0)

        @property
        def values(self) -> torch.Tensor | None:  # a plain attribute in DynamicLayer, a slab view here
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

    return SlabLayer
