"""Where every random draw in specdec comes from.

Tree builders and verifiers never call ``torch.rand`` themselves: they ask a
:class:`RandomSource` for a Bernoulli or a categorical draw. In normal runs the
source is :class:`TorchRandom`, backed by a caller-seeded ``torch.Generator``;
in the exact losslessness tests it is an enumerating source
(:mod:`specdec.testing.enumerate`) that walks every branch with its
probability, so the test exercises the very code that generation runs.

:class:`CounterRandom` is the counter-based source: every uniform is a pure
function of a key ``(seed, walk, node, draw)``, so that a kernel deciding all
nodes in parallel (:mod:`specdec.kernels`) and the step path's tensor
verifier draw the very same uniforms (see :mod:`specdec.rng_counter`).

This module is the one name to import them from: it re-exports the interface
and the sequential sources (:mod:`specdec.rng_sources`) and the counter-based
draws (:mod:`specdec.rng_counter`), and holds what a batch of rows draws from:
:class:`RowStreams` (one source per row) and :func:`seeded_sources`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.errors import InvalidConfigError
from specdec.rng_counter import (
    AFTER_TABLE_NODE,
    BUILDER_NODE,
    DOMAIN,
    CounterRandom,
    _philox_uniforms,
    counter_uniform,
    counter_uniforms,
    inverse_cdf,
    philox4x32,
)
from specdec.rng_sources import RandomSource, TorchRandom, UniformTable, inverse_cdf_rows

__all__ = [
    "DOMAIN",
    "CounterRandom",
    "RandomSource",
    "RowStreams",
    "TorchRandom",
    "UniformTable",
    "counter_uniform",
    "counter_uniforms",
    "inverse_cdf",
    "inverse_cdf_rows",
    "philox4x32",
    "BUILDER_NODE",
    "AFTER_TABLE_NODE",
    "RANDOM_CHOICES",
    "seeded_sources",
]


class RowStreams(RandomSource):
    """One random source per row of a batch (batched generation): each row
    draws from its own stream exactly what it would draw decoding alone.

    A batched draw over ``B * R`` rows (the level-wise builders'
    :meth:`categorical_rows` and :meth:`uniforms`, rows grouped by tree) takes
    ``R`` consecutive rows from each source in turn; a verification table
    ``[B, n, C + 1]`` takes one tree from each (:meth:`RandomSource.verify_uniforms`
    of the row's source, so :class:`CounterRandom` rows stay keyed on their own
    walks).

    Args:
        sources: one :class:`RandomSource` per row, in row order.

    Example:
        >>> import torch
        >>> streams = RowStreams([TorchRandom.seeded(1), TorchRandom.seeded(2)])
        >>> both = streams.uniforms((4,))
        >>> torch.equal(both[2:], TorchRandom.seeded(2).uniforms((2,)))
        True
    """

    def __init__(self, sources: Sequence[RandomSource]) -> None:
        self.sources = list(sources)
        if not self.sources:
            raise ValueError("RowStreams needs at least one source")
        self._keys: dict[torch.device, torch.Tensor] = {}
        self._subsets: dict[tuple[int, ...], RowStreams] = {}

    def subset(self, rows: Sequence[int]) -> "RowStreams":
        """The streams of rows ``rows`` (the same sources: their draws advance these rows'
        streams), made once per set of rows and kept until rows leave (:meth:`keep`), so a
        caller asking every step (per-request sampling's configuration groups) builds its
        counter keys once, not per step."""
        key = tuple(int(r) for r in rows)
        sub = self._subsets.get(key)
        if sub is None:
            sub = self._subsets[key] = RowStreams([self.sources[r] for r in key])
        return sub

    def _per_row(self, rows: int) -> int:
        B = len(self.sources)
        if rows % B:
            raise ValueError(f"a batched draw over {rows} rows does not split over {B} row streams")
        return rows // B

    @property
    def draws_tables(self) -> bool:
        """Every row's source draws tables."""
        return all(s.draws_tables for s in self.sources)

    def keep(self, rows: Sequence[int], index: torch.Tensor | None = None) -> None:
        """Keep the streams of rows ``rows`` (rows that left the batch stop drawing);
        ``index``, the same rows as an int64 tensor on the device, keeps the
        device's :meth:`counter_keys` without another host-to-device copy."""
        self.sources = [self.sources[int(r)] for r in rows]
        self._subsets = {}
        if index is None:
            self._keys = {}
        else:
            self._keys = {dev: k.index_select(0, index) for dev, k in self._keys.items() if dev == index.device}

    @property
    def counter_based(self) -> bool:
        """Every row draws from a plain :class:`CounterRandom` (a subclass may
        change the draws, so it is served row by row): the batched draws are
        then one set of Philox ops for all rows, keyed per row."""
        return all(type(s) is CounterRandom for s in self.sources)

    def counter_keys(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[B, 2]`` int64 Philox key words ``(k0, k1)`` of each row's seed, on
        ``device`` (made once per device and kept until rows leave)."""
        if not self.counter_based:
            raise ValueError("counter_keys: every row must draw from a CounterRandom")
        dev = torch.device(device)
        keys = self._keys.get(dev)
        if keys is None:
            words = [s.key_words for s in self.sources]  # type: ignore[attr-defined]
            keys = self._keys[dev] = torch.tensor(words, dtype=torch.int64).to(dev)
        return keys

    def begin_walks(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, int | torch.Tensor]:
        """Start every row's next verification walk (:meth:`CounterRandom.begin_table_walk`):
        returns the ``[B, 2]`` keys and the walk, one int when the rows walk in
        step (always, in batched generation: no host-to-device copy), else ``[B]`` int64."""
        keys = self.counter_keys(device)
        return keys, self._row_words([s.begin_table_walk() for s in self.sources], device)  # type: ignore[attr-defined]

    @staticmethod
    def _row_words(words: list[int], device: torch.device | str) -> int | torch.Tensor:
        if all(w == words[0] for w in words):
            return words[0]
        return torch.tensor(words, dtype=torch.int64).to(device)

    def uniforms(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        per = self._per_row(shape[0])
        if self.counter_based:  # one table for all rows: row b's is CounterRandom.uniforms of its source
            B = len(self.sources)
            keys = self.counter_keys(device)
            lead = (B,) + (1,) * len(shape)  # [B, 1, ...]
            walk = self._row_words([s.walk for s in self.sources], device)  # type: ignore[attr-defined]
            node = self._row_words([s._builder_node() for s in self.sources], device)  # type: ignore[attr-defined]
            count = per
            for d in shape[1:]:
                count *= int(d)
            draw = torch.arange(count, dtype=torch.int64, device=device).reshape(1, per, *shape[1:])
            return _philox_uniforms(keys[:, 0].view(lead), keys[:, 1].view(lead),
                                    walk.view(lead) if isinstance(walk, torch.Tensor) else walk,
                                    node.view(lead) if isinstance(node, torch.Tensor) else node, draw).reshape(shape)
        return torch.cat([s.uniforms((per, *shape[1:]), device=device) for s in self.sources])

    def verify_uniforms(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        """``[B, n, C + 1]``: row ``b``'s table is its source's :meth:`~RandomSource.verify_uniforms`;
        for counter-based rows, ``U(seed_b, walk_b, i, t)`` for all rows in one set of ops."""
        per = self._per_row(shape[0])
        if self.counter_based and per == 1:
            B, n, width = (int(d) for d in shape)
            keys, walk = self.begin_walks(device)
            node = torch.arange(n, dtype=torch.int64, device=device).view(1, n, 1)
            draw = torch.arange(width, dtype=torch.int64, device=device).view(1, 1, width)
            return _philox_uniforms(keys[:, 0].view(B, 1, 1), keys[:, 1].view(B, 1, 1),
                                    walk.view(B, 1, 1) if isinstance(walk, torch.Tensor) else walk, node, draw)
        return torch.cat([s.verify_uniforms((per, *shape[1:]), device=device) for s in self.sources])

    def categorical_rows(self, probs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        if self.counter_based:  # inverse CDF is row-wise: one table for all rows draws what each row's source would
            return inverse_cdf_rows(probs, self.uniforms((probs.shape[0],), device=probs.device), active)
        per = self._per_row(probs.shape[0])
        return torch.cat([
            s.categorical_rows(probs[b * per : (b + 1) * per], active[b * per : (b + 1) * per])
            for b, s in enumerate(self.sources)
        ])

    def bernoulli(self, prob: float | torch.Tensor) -> bool:
        raise NotImplementedError("RowStreams serves batched draws only (one stream per row)")

    def categorical(self, probs: torch.Tensor) -> int:
        raise NotImplementedError("RowStreams serves batched draws only (one stream per row)")


RANDOM_CHOICES = ("torch", "counter")
"""The random streams a generation can draw from (``random=``): a seeded ``torch.Generator``
per row (:class:`TorchRandom`), or one :class:`CounterRandom` stream per row."""


def seeded_sources(random: str, seeds: Sequence[int | None]) -> list[RandomSource]:
    """One source per row: ``TorchRandom.seeded(seed)`` or ``CounterRandom.seeded(seed)`` (:data:`RANDOM_CHOICES`)."""
    if random not in RANDOM_CHOICES:
        raise InvalidConfigError(f"random must be one of {', '.join(RANDOM_CHOICES)}, got {random!r}")
    if random == "torch":
        return [TorchRandom.seeded(s) for s in seeds]
    return [CounterRandom.seeded(s) for s in seeds]
