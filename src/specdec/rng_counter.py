"""Counter-based random draws: the stream a fused verification kernel can reproduce.

A :class:`~specdec.rng.TorchRandom` hands out uniforms in sequence, so the
``j``-th draw of a verification depends on every draw before it: a kernel that
decides all tree nodes in parallel cannot know which uniforms "its" node gets.
:class:`CounterRandom` removes that dependency: every uniform is a pure
function of a *key*,

    ``u = U(seed, walk, node, draw)``

where ``walk`` counts the verification walks started (one per speculative
step), ``node`` is the tree node whose rule is drawing and ``draw`` numbers
the draws made at that node (0, 1, ...). Node ``i``'s decision then depends
only on ``p[i]``, its children and its own uniforms, so deciding every node
in parallel and following the accepted children from the root gives exactly
what the sequential walk gives (docs/verifiers.md rules 2-5 walk one node per
depth and never revisit a node).

``U`` is Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy
as 1, 2, 3"; the generator behind ``torch.cuda`` and ``tl.rand``) with key
``(seed_lo, seed_hi)`` and counter ``(draw, node, walk, DOMAIN)``, turned into a
double in ``[0, 1)`` from its first two output words (53 random bits):
``u = ((r0 >> 5) * 2**26 + (r1 >> 6)) / 2**53``. The same arithmetic is
written once here in Python (the reference) and once in Triton
(:mod:`specdec.kernels.verify_triton`); the tests check they agree bit for bit.

Draw semantics (the verifiers' only two kinds of draw, :class:`~specdec.rng.RandomSource`):

- ``bernoulli(prob)``: ``u < prob``. Always consumes one uniform, even when
  ``prob`` is 0 or 1, so the ``t``-th child test at a node is always draw
  ``t`` (TorchRandom skips those; the law is the same).
- ``categorical(probs)``: inverse CDF, ``u * total`` located in the float64
  cumulative sum of ``probs`` (first index whose cumulative sum exceeds it);
  a zero-probability index is never returned.

Both check their input as every source does (:func:`~specdec.rng_sources.check_categorical`,
:func:`~specdec.rng_sources.check_bernoulli`); the table draws
(:meth:`CounterRandom.uniforms`, :meth:`CounterRandom.verify_uniforms`,
:meth:`CounterRandom.categorical_rows`) and :func:`inverse_cdf` do not.
"""

from __future__ import annotations

import os

import torch

from specdec.rng_sources import RandomSource, check_bernoulli, check_categorical, inverse_cdf_rows

__all__ = [
    "AFTER_TABLE_NODE",
    "BUILDER_NODE",
    "DOMAIN",
    "CounterRandom",
    "counter_uniform",
    "counter_uniforms",
    "inverse_cdf",
    "philox4x32",
]

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
    block by block. The bare rule: it does not check ``probs`` (the scalar
    draws do, :func:`~specdec.rng_sources.check_categorical`).

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
    return _locate(probs, cdf, total, u)


def _locate(probs: torch.Tensor, cdf: torch.Tensor, total: float, u: float) -> int:
    """:func:`inverse_cdf` given ``probs``' float64 cumulative sum ``cdf`` and its last entry ``total``."""
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

    draws_tables = True

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
        """``u < prob`` (``prob`` checked first, :func:`~specdec.rng_sources.check_bernoulli`); always consumes one uniform."""
        return self.uniform() < check_bernoulli(self, prob)

    def categorical(self, probs: torch.Tensor) -> int:
        """Inverse-CDF draw (:func:`inverse_cdf`) with the next uniform, of a
        normalised law (:func:`~specdec.rng_sources.check_categorical`)."""
        cdf, total = check_categorical(self, probs)
        return _locate(probs, cdf, total, self.uniform())
