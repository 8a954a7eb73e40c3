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
verifier draw the very same uniforms (see "Counter-based draws" below).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import os
from collections.abc import Sequence

import torch

from specdec._constants import device_constant

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
]


def inverse_cdf_rows(probs: torch.Tensor, u: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The column each uniform selects from its row, by inverse CDF, with no host read.

    :meth:`TorchRandom.categorical`'s rule, row-wise: the first index whose
    float64 cumulative sum exceeds ``u * total``, or the last positive index
    if rounding runs past the end.

    Args:
        probs: ``[R, L]`` non-negative weights (need not be normalised).
        u: ``[R]`` float64 uniforms in ``[0, 1)``.
        active: ``[R]`` bool rows to draw for.

    Returns:
        ``[R]`` int64 columns, ``-1`` for inactive rows.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.25, 0.0, 0.75], [1.0, 0.0, 0.0]])
        >>> inverse_cdf_rows(probs, torch.tensor([0.3, 0.9], dtype=torch.float64), torch.tensor([True, False])).tolist()
        [2, -1]
    """
    wide = probs.detach() if probs.requires_grad else probs  # (no op where there is nothing to detach or convert)
    wide = wide if wide.dtype == torch.float64 else wide.to(torch.float64)
    cdf = torch.cumsum(wide.clamp_min(0), dim=-1)  # [R, L]
    x = ((u if u.device == cdf.device else u.to(cdf.device)) * cdf[:, -1]).unsqueeze(-1)  # [R, 1]
    index = torch.searchsorted(cdf, x, right=True).squeeze(-1)  # [R]
    last_positive = torch.where(probs > 0, _columns(probs.shape[-1], probs.device), -1).amax(dim=-1)  # [R]
    return torch.where(active, torch.minimum(index, last_positive), -1)


@device_constant(64)
def _columns(n: int, device: torch.device) -> torch.Tensor:
    """``[n]`` int64 ``0 .. n - 1``, once per size and device (never written to)."""
    return torch.arange(n, device=device)


class RandomSource(ABC):
    """The two kinds of random draw the algorithms need."""

    @abstractmethod
    def bernoulli(self, prob: float | torch.Tensor) -> bool:
        """Return True with probability ``prob`` (clamped to ``[0, 1]``)."""

    @abstractmethod
    def categorical(self, probs: torch.Tensor) -> int:
        """Draw an index ``i`` with probability ``probs[i]``.

        Args:
            probs: ``[V]`` non-negative weights summing to 1 (they are used as
                given; callers normalise).
        """

    def categorical_rows(self, probs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """One independent categorical draw per active row of ``probs``.

        The tensor builders' only draw (:func:`specdec.trees._common.draw_rows`).
        The default draws row by row with :meth:`categorical`, in row order,
        so an enumerating source (:mod:`specdec.testing.enumerate`) walks
        every branch of the tensor code; it reads ``active`` on the host.
        :class:`TorchRandom` overrides it with one batched draw and no host read.

        Args:
            probs: ``[R, L]`` non-negative weights; each active row has positive mass.
            active: ``[R]`` bool, the rows to draw for.

        Returns:
            ``[R]`` int64 drawn column per row, ``-1`` for inactive rows (on ``probs``' device).
        """
        out = torch.full((probs.shape[0],), -1, dtype=torch.int64)
        for r in active.nonzero().flatten().tolist():
            out[r] = self.categorical(probs[r])
        return out.to(probs.device)

    def uniforms(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        """A table of independent float64 uniforms in ``[0, 1)`` on ``device``
        (the tensor verifiers' draws, :mod:`specdec.verify.fast`). Sources that
        cannot make one (the enumerating source of the exact tests) do not
        override this, and the step path is not used with them."""
        raise NotImplementedError(f"{type(self).__name__} does not draw uniform tables")

    def verify_uniforms(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        """The table of one verification's uniforms, ``[B, n, C + 1]``
        (:func:`specdec.verify.fast.verify_tree_batch`: ``u[b, i, t]`` is the
        ``t``-th draw of node ``i``'s rule). The default is :meth:`uniforms`;
        :class:`CounterRandom` keys it on ``(walk, node, draw)``."""
        return self.uniforms(shape, device)

    def begin_node(self, node: int) -> None:
        """Called by :meth:`specdec.verify.base.Verifier.verify` just before the
        rule of ``node`` draws (``node == 0``: a new verification walk starts).

        The default does nothing. Counter-based sources
        (:class:`CounterRandom`) key their next
        draws on ``(walk, node)``, so that a kernel deciding every node in
        parallel can reproduce the same uniforms.
        """


class TorchRandom(RandomSource):
    """A :class:`RandomSource` backed by a ``torch.Generator``.

    Args:
        generator: the generator to draw from; its device must match the
            tensors passed to :meth:`categorical`.

    Example:
        >>> import torch
        >>> rng = TorchRandom(torch.Generator().manual_seed(0))
        >>> rng.categorical(torch.tensor([0.0, 1.0, 0.0]))
        1
    """

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    @classmethod
    def seeded(cls, seed: int | None, device: str | torch.device = "cpu") -> "TorchRandom":
        """A fresh source seeded with ``seed`` (``None``: seeded from entropy)."""
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        return cls(generator)

    def bernoulli(self, prob: float | torch.Tensor) -> bool:
        prob_f = float(prob)
        if prob_f >= 1.0:
            return True
        if prob_f <= 0.0:
            return False
        u = torch.rand((), generator=self.generator, device=self.generator.device)
        return bool(u.item() < prob_f)

    def categorical(self, probs: torch.Tensor) -> int:
        """Inverse-CDF draw (one uniform, a float64 cumulative sum and a binary
        search): about 20x faster than ``torch.multinomial`` at V = 49152 on
        CPU. A zero-probability index is never returned."""
        cdf = torch.cumsum(probs.detach().to(torch.float64).clamp_min(0), dim=0)
        total = float(cdf[-1])
        if not total > 0.0:
            raise ValueError("categorical draw from an all-zero distribution")
        u = torch.rand((), generator=self.generator, device=self.generator.device, dtype=torch.float64)
        x = u.to(cdf.device) * total
        index = int(torch.searchsorted(cdf, x.reshape(1), right=True).item())
        if index >= cdf.numel():  # u * total rounded up to total: take the last positive entry
            index = int(torch.nonzero(probs > 0).flatten()[-1])
        return index

    def uniforms(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        """One ``torch.rand`` call from the generator (moved to ``device`` if the generator lives elsewhere)."""
        u = torch.rand(shape, generator=self.generator, device=self.generator.device, dtype=torch.float64)
        return u if u.device == torch.device(device) else u.to(device, non_blocking=True)

    def categorical_rows(self, probs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """Batched inverse-CDF draws (:func:`inverse_cdf_rows`), one uniform per row (inactive rows too), no host read."""
        return inverse_cdf_rows(probs, self.uniforms((probs.shape[0],), device=probs.device), active)


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

    def _per_row(self, rows: int) -> int:
        B = len(self.sources)
        if rows % B:
            raise ValueError(f"a batched draw over {rows} rows does not split over {B} row streams")
        return rows // B

    def keep(self, rows: Sequence[int], index: torch.Tensor | None = None) -> None:
        """Keep the streams of rows ``rows`` (rows that left the batch stop drawing);
        ``index``, the same rows as an int64 tensor on the device, keeps the
        device's :meth:`counter_keys` without another host-to-device copy."""
        self.sources = [self.sources[int(r)] for r in rows]
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


class UniformTable(RandomSource):
    """Batched draws from a table of uniforms drawn beforehand, one column per
    :meth:`categorical_rows` call: the form of the tree builders' draws that
    compiles into one graph (a ``torch.Generator`` cannot be traced), as
    gpt-fast draws outside its compiled step.

    Args:
        u: ``[R, k]`` float64 uniforms; call ``j`` reads column ``j`` (its first ``R'`` rows).

    Example:
        >>> import torch
        >>> table = UniformTable(torch.tensor([[0.3], [0.9]], dtype=torch.float64))
        >>> table.categorical_rows(torch.tensor([[0.25, 0.75], [0.5, 0.5]]), torch.tensor([True, True])).tolist()
        [1, 1]
    """

    def __init__(self, u: torch.Tensor) -> None:
        self.u = u
        self.column = 0

    def categorical_rows(self, probs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        if self.column >= self.u.shape[1]:
            raise ValueError(f"UniformTable: all {self.u.shape[1]} columns used")
        u = self.u[: probs.shape[0], self.column]
        self.column += 1
        return inverse_cdf_rows(probs, u, active)

    def bernoulli(self, prob: float | torch.Tensor) -> bool:
        raise NotImplementedError("UniformTable serves batched draws only (categorical_rows)")

    def categorical(self, probs: torch.Tensor) -> int:
        raise NotImplementedError("UniformTable serves batched draws only (categorical_rows)")


# ------------------------------------------------------------ counter-based draws
# Counter-based random draws: the stream a fused verification kernel can reproduce.
# 
# A :class:`~specdec.rng.TorchRandom` hands out uniforms in sequence, so the
# ``j``-th draw of a verification depends on every draw before it: a kernel that
# decides all tree nodes in parallel cannot know which uniforms "its" node gets.
# :class:`CounterRandom` removes that dependency: every uniform is a pure
# function of a *key*,
# 
#     ``u = U(seed, walk, node, draw)``
# 
# where ``walk`` counts the verification walks started (one per speculative
# step), ``node`` is the tree node whose rule is drawing and ``draw`` numbers
# the draws made at that node (0, 1, ...). Node ``i``'s decision then depends
# only on ``p[i]``, its children and its own uniforms, so deciding every node
# in parallel and following the accepted children from the root gives exactly
# what the sequential walk gives (docs/verifiers.md rules 2-5 walk one node per
# depth and never revisit a node).
# 
# ``U`` is Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy
# as 1, 2, 3"; the generator behind ``torch.cuda`` and ``tl.rand``) with key
# ``(seed_lo, seed_hi)`` and counter ``(draw, node, walk, DOMAIN)``, turned into a
# double in ``[0, 1)`` from its first two output words (53 random bits):
# ``u = ((r0 >> 5) * 2**26 + (r1 >> 6)) / 2**53``. The same arithmetic is
# written once here in Python (the reference) and once in Triton
# (:mod:`specdec.kernels.verify_triton`); the tests check they agree bit for bit.
# 
# Draw semantics (the verifiers' only two kinds of draw, :class:`~specdec.rng.RandomSource`):
# 
# - ``bernoulli(prob)``: ``u < prob``. Always consumes one uniform, even when
#   ``prob`` is 0 or 1, so the ``t``-th child test at a node is always draw
#   ``t`` (TorchRandom skips those; the law is the same).
# - ``categorical(probs)``: inverse CDF, ``u * total`` located in the float64
#   cumulative sum of ``probs`` (first index whose cumulative sum exceeds it);
#   a zero-probability index is never returned.

_MASK32 = 0xFFFFFFFF
_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
DOMAIN = 0x5EC0DEC0
"""Fourth counter word of every specdec draw (separates specdec's keys from
other users of Philox with the same seed)."""

_TWO26 = 67108864.0
_TWO_M53 = 1.0 / 9007199254740992.0


def philox4x32(c0: int, c1: int, c2: int, c3: int, k0: int, k1: int, rounds: int = 10) -> tuple[int, int, int, int]:
    """Philox4x32 (Random123's ``philox4x32_R``) on 32-bit words.

    Args:
        c0, c1, c2, c3: the counter words (each in ``[0, 2**32)``).
        k0, k1: the key words.
        rounds: number of rounds (10 is the standard, crush-resistant choice).

    Returns:
        The four output words.

    Example (Random123 known-answer vector):
        >>> [hex(w) for w in philox4x32(0, 0, 0, 0, 0, 0)]
        ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    for _ in range(rounds):
        p0 = _PHILOX_M0 * c0
        p1 = _PHILOX_M1 * c2
        c0, c1, c2, c3 = (
            ((p1 >> 32) ^ c1 ^ k0) & _MASK32,
            p1 & _MASK32,
            ((p0 >> 32) ^ c3 ^ k1) & _MASK32,
            p0 & _MASK32,
        )
        k0 = (k0 + _PHILOX_W0) & _MASK32
        k1 = (k1 + _PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


def counter_uniform(seed: int, walk: int, node: int, draw: int) -> float:
    """The uniform ``U(seed, walk, node, draw)`` in ``[0, 1)`` (53 random bits).

    Args:
        seed: ``[0, 2**64)``.
        walk, node, draw: ``[0, 2**32)`` each.

    Example:
        >>> u = counter_uniform(0, 1, 0, 0)
        >>> 0.0 <= u < 1.0 and u == counter_uniform(0, 1, 0, 0)
        True
    """
    r0, r1, _, _ = philox4x32(draw, node, walk, DOMAIN, seed & _MASK32, (seed >> 32) & _MASK32)
    return ((r0 >> 5) * _TWO26 + (r1 >> 6)) * _TWO_M53


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` 32-bit words of ``a * m`` for int64 ``a`` in ``[0, 2**32)``, in 16-bit halves (no int64 overflow)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    m_lo, m_hi = m & 0xFFFF, m >> 16
    mid = a_lo * m_hi + a_hi * m_lo  # < 2**33
    low = a_lo * m_lo + ((mid & 0xFFFF) << 16)  # < 2**33
    return a_hi * m_hi + (mid >> 16) + (low >> 32), low & _MASK32


def counter_uniforms(seed: int, walk: int, node: torch.Tensor | int, draw: torch.Tensor) -> torch.Tensor:
    """:func:`counter_uniform` element-wise, as tensor ops on ``node``'s device:
    ``U(seed, walk, node[...], draw[...])``, bit for bit the Python reference.

    Args:
        seed: ``[0, 2**64)``.
        walk: ``[0, 2**32)``.
        node, draw: int64 tensors (broadcast together) with values in
            ``[0, 2**32)``; ``node`` may be one int (no host-to-device copy).

    Returns:
        float64 uniforms in ``[0, 1)`` of the broadcast shape.

    Example:
        >>> import torch
        >>> u = counter_uniforms(7, 1, torch.tensor([[0], [3]]), torch.tensor([[0, 1]]))
        >>> u[1, 1].item() == counter_uniform(7, 1, 3, 1)
        True
    """
    return _philox_uniforms(seed & _MASK32, (seed >> 32) & _MASK32, walk, node, draw.to(torch.int64))


def _philox_uniforms(
    k0: int | torch.Tensor, k1: int | torch.Tensor, walk: int | torch.Tensor, node: int | torch.Tensor, draw: torch.Tensor
) -> torch.Tensor:
    """``U`` on broadcast int64 tensors (or ints): key words ``k0, k1``, counter
    ``(draw, node, walk, DOMAIN)``. The body of :func:`counter_uniforms`; a
    batch of per-row streams passes ``[B, 1, ...]`` keys and walks
    (:meth:`RowStreams.verify_uniforms`), and gets every row's table from one
    set of ops, bit for bit the per-row tables."""
    shape = torch.broadcast_shapes(*(t.shape for t in (k0, k1, walk, node, draw) if isinstance(t, torch.Tensor)))
    c0 = draw.to(torch.int64).expand(shape)
    c1 = node.to(torch.int64).expand(shape) if isinstance(node, torch.Tensor) else torch.full_like(c0, node)
    if isinstance(walk, torch.Tensor):
        c2 = (walk.to(torch.int64) & _MASK32).expand(shape)
    else:
        c2 = torch.full_like(c0, walk & _MASK32)
    c3 = torch.full_like(c0, DOMAIN)
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, _PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, _PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _PHILOX_W0) & _MASK32
        k1 = (k1 + _PHILOX_W1) & _MASK32
    return ((c0 >> 5).to(torch.float64) * _TWO26 + (c1 >> 6).to(torch.float64)) * _TWO_M53


BUILDER_NODE = 1 << 31
"""Node words from here up key a :class:`CounterRandom`'s batched (tree-builder)
draws: call ``c`` after walk ``w`` uses node ``BUILDER_NODE + c`` (tree nodes stay below)."""

AFTER_TABLE_NODE = BUILDER_NODE - 1
"""The node word of scalar draws made after a verification table (:meth:`CounterRandom.verify_uniforms`)."""


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The index the uniform ``u`` selects from ``probs`` by inverse CDF.

    ``cdf = cumsum(float64(max(probs, 0)))``; the result is the first index
    ``i`` with ``cdf[i] > u * cdf[-1]``. If rounding puts ``u * cdf[-1]`` at
    or past the end, the last positive index is returned. This is also
    :class:`~specdec.rng.TorchRandom`'s rule; the fused kernel follows it
    block by block.

    Args:
        probs: ``[V]`` non-negative weights (need not be normalised).
        u: a uniform in ``[0, 1)``.

    Raises:
        ValueError: all weights are zero.

    Example:
        >>> import torch
        >>> inverse_cdf(torch.tensor([0.25, 0.0, 0.75]), 0.3)
        2
    """
    cdf = torch.cumsum(probs.detach().to(torch.float64).clamp_min(0), dim=0)
    total = float(cdf[-1])
    if not total > 0.0:
        raise ValueError("categorical draw from an all-zero distribution")
    x = torch.tensor([u * total], dtype=torch.float64, device=cdf.device)
    index = int(torch.searchsorted(cdf, x, right=True).item())
    if index >= cdf.numel():
        index = int(torch.nonzero(probs > 0).flatten()[-1])
    return index


def _check_word(name: str, value: int, bits: int = 32) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < (1 << bits):
        raise ValueError(f"{name} must be an int in [0, 2**{bits}), got {value!r}")
    return value


class CounterRandom(RandomSource):
    """A :class:`~specdec.rng.RandomSource` whose uniforms are keyed by
    ``(seed, walk, node, draw)`` (see the module docstring).

    State: ``walk`` (verification walks started), ``node`` (the node drawing
    now) and ``draw`` (draws made at that node). :meth:`begin_node` is called
    by :meth:`Verifier.verify <specdec.verify.base.Verifier.verify>` before
    each node's rule: ``begin_node(0)`` starts a new walk (``walk += 1``), any
    call resets ``draw`` to 0. Draws made outside a walk (before the first, or
    by a tree builder after one) continue the current ``(walk, node)`` counter,
    so no key is ever used twice as long as a walk never revisits a node
    (verification walks never do).

    Args:
        seed: ``[0, 2**64)``.
        walk: initial walk counter (0: no walk started yet).

    Example:
        >>> import torch
        >>> rng = CounterRandom(seed=7)
        >>> rng.begin_node(0)  # walk 1, node 0
        >>> a = rng.bernoulli(0.5); b = rng.categorical(torch.tensor([0.2, 0.8]))
        >>> rng.position
        (1, 0, 2)
        >>> again = CounterRandom(seed=7); again.begin_node(0)
        >>> (again.bernoulli(0.5), again.categorical(torch.tensor([0.2, 0.8]))) == (a, b)
        True
    """

    def __init__(self, seed: int, walk: int = 0) -> None:
        self.seed = _check_word("seed", seed, 64)
        self.walk = _check_word("walk", walk)
        self.node = 0
        self.draw = 0
        self._calls, self._calls_walk = 0, self.walk  # batched builder draws since walk `_calls_walk` began

    @classmethod
    def seeded(cls, seed: int | None) -> "CounterRandom":
        """A source keyed by ``seed`` reduced to 64 bits (``None``: 64 bits of OS entropy)."""
        if seed is None:
            return cls(int.from_bytes(os.urandom(8), "little"))
        return cls(int(seed) & 0xFFFFFFFFFFFFFFFF)

    @property
    def position(self) -> tuple[int, int, int]:
        """``(walk, node, draw)``: the key of the next draw (after the seed)."""
        return (self.walk, self.node, self.draw)

    def uniforms(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        """A table of builder draws (the batched draws of the tensor tree
        builders): the ``c``-th call after walk ``w`` returns
        ``U(seed, w, BUILDER_NODE + c, j)`` for ``j`` over the table, flat."""
        node = self._builder_node()
        count = 1
        for s in shape:
            count *= int(s)
        draw = torch.arange(count, dtype=torch.int64, device=device).reshape(shape)
        return counter_uniforms(self.seed, self.walk, node, draw)

    def _builder_node(self) -> int:
        """The node word of the next builder-draw table (``BUILDER_NODE + c`` for the ``c``-th since the walk began)."""
        if self._calls_walk != self.walk:
            self._calls, self._calls_walk = 0, self.walk
        node = _check_word("node", BUILDER_NODE + self._calls)
        self._calls += 1
        return node

    @property
    def key_words(self) -> tuple[int, int]:
        """``(k0, k1)``: the seed's low and high 32-bit words, Philox's key."""
        return self.seed & _MASK32, self.seed >> 32

    def begin_table_walk(self) -> int:
        """Start the next verification walk for a table of uniforms (or a kernel
        that draws them itself, :func:`specdec.kernels.verify_fused.fused_verify_batch`):
        ``walk += 1``; later scalar draws use node :data:`AFTER_TABLE_NODE`. Returns the walk."""
        self.walk = _check_word("walk", self.walk + 1)
        self.node, self.draw = AFTER_TABLE_NODE, 0
        return self.walk

    def categorical_rows(self, probs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """One inverse-CDF draw per active row with one builder-draw table (:meth:`uniforms`), no host read."""
        return inverse_cdf_rows(probs, self.uniforms((probs.shape[0],), device=probs.device), active)

    def verify_uniforms(self, shape: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
        """The uniforms of one verification walk, for every node at once: starts
        walk ``w + 1`` and returns ``u[0, i, t] = U(seed, w + 1, i, t)``, the
        ``t``-th draw node ``i``'s rule makes in the sequential walk (and in the
        fused kernel). Scalar draws afterwards use node :data:`AFTER_TABLE_NODE`.

        Raises:
            NotImplementedError: a batch of more than one tree (a batch has one
                stream per row: :class:`RowStreams`).
        """
        B, n, width = (int(s) for s in shape)
        if B != 1:
            raise NotImplementedError("CounterRandom verifies one tree per walk; batches need per-row streams")
        walk = self.begin_table_walk()
        node = torch.arange(n, dtype=torch.int64, device=device).unsqueeze(-1)  # [n, 1]
        draw = torch.arange(width, dtype=torch.int64, device=device).unsqueeze(0)  # [1, width]
        return counter_uniforms(self.seed, walk, node, draw).unsqueeze(0)  # [1, n, width]

    def begin_node(self, node: int) -> None:
        if node == 0:
            self.walk = _check_word("walk", self.walk + 1)
        self.node = _check_word("node", int(node))
        self.draw = 0

    def set_position(self, walk: int, node: int, draw: int) -> None:
        """Move to key ``(walk, node, draw)`` (the fused kernel path leaves the
        source exactly where the sequential walk would have)."""
        self.walk = _check_word("walk", walk)
        self.node = _check_word("node", node)
        self.draw = _check_word("draw", draw)

    def uniform(self) -> float:
        """The next uniform of the stream (advances ``draw``)."""
        u = counter_uniform(self.seed, self.walk, self.node, self.draw)
        self.draw = _check_word("draw", self.draw + 1)
        return u

    def bernoulli(self, prob: float | torch.Tensor) -> bool:
        """``u < prob``; always consumes one uniform."""
        return self.uniform() < float(prob)

    def categorical(self, probs: torch.Tensor) -> int:
        """Inverse-CDF draw (:func:`inverse_cdf`) with the next uniform."""
        return inverse_cdf(probs, self.uniform())
