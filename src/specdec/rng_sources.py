"""The random-source interface and the sequential sources.

Tree builders and verifiers never call ``torch.rand`` themselves: they ask a
:class:`RandomSource` for a Bernoulli or a categorical draw (or a table of
uniforms). This module holds that interface, :class:`TorchRandom` (a
caller-seeded ``torch.Generator``: the normal source), :class:`UniformTable`
(a table of uniforms drawn beforehand, for compiled builders) and the
row-wise inverse-CDF rule they share (:func:`inverse_cdf_rows`). The
counter-based source is in :mod:`specdec.rng_counter`; :mod:`specdec.rng`
gathers every source (and the per-row streams of a batch) under one name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from specdec._constants import device_constant

__all__ = ["RandomSource", "TorchRandom", "UniformTable", "inverse_cdf_rows"]


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

    @property
    def draws_tables(self) -> bool:
        """Declared: the source draws uniform tables (:meth:`uniforms`, :meth:`verify_uniforms`),
        as the tensor rule and the fused kernel need. A source that does not (the enumerating
        source of the exact tests) is verified by the verifier's walk
        (:func:`specdec.engine.dispatch.choose_verification`). False here; a source that
        draws tables declares ``draws_tables = True`` (or a property, :class:`~specdec.rng.RowStreams`)."""
        return False

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
        override this and declare :attr:`draws_tables` False."""
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

    draws_tables = True

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

    draws_tables = True

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
