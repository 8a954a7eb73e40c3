"""The random-source interface and the sequential sources.

Tree builders and verifiers never call ``torch.rand`` themselves: they ask a
:class:`RandomSource` for a Bernoulli or a categorical draw (or a table of
uniforms). This module holds that interface, :class:`TorchRandom` (a
caller-seeded ``torch.Generator``: the normal source), :class:`UniformTable`
(a table of uniforms drawn beforehand, for compiled builders) and the
row-wise inverse-CDF rule they share (:func:`inverse_cdf_rows`). The
counter-based source is in :mod:`specdec.rng_counter`; :mod:`specdec.rng`
gathers every source (and the per-row streams of a batch) under one name.

The scalar draws' contract (every source: :class:`TorchRandom`,
:class:`~specdec.rng.CounterRandom`, the enumerating source of the exact tests):
``categorical(probs)`` takes a *normalised* law (no negative, NaN or infinite
weight, total mass 1 within :func:`law_tolerance` of its dtype) and
``bernoulli(prob)`` a probability in ``[0, 1]`` (within the same rounding);
anything else raises :class:`~specdec.errors.InvalidDistributionError` naming
the draw and its call site (:func:`check_categorical`, :func:`check_bernoulli`).
No source renormalises silently, so a production draw and the exact law of
the same code agree. The batched tensor draws (:meth:`RandomSource.categorical_rows`,
:func:`inverse_cdf_rows`, :meth:`RandomSource.uniforms`) stay on the device
and do not check.
"""

from __future__ import annotations

import math
import os
import sys
from abc import ABC, abstractmethod
from types import FrameType

import torch

from specdec._constants import device_constant
from specdec.errors import InvalidDistributionError

__all__ = [
    "RandomSource",
    "TorchRandom",
    "UniformTable",
    "check_bernoulli",
    "check_categorical",
    "inverse_cdf_rows",
    "law_tolerance",
]

_DRAW_MODULES = ("specdec.rng", "specdec.rng_sources", "specdec.rng_counter", "specdec.testing")
"""Modules whose frames a draw's error skips to find its caller (the sources themselves and the exact harness)."""


def law_tolerance(dtype: torch.dtype, size: int = 1) -> float:
    """How far from 1 the total mass of a ``dtype`` law of ``size`` weights passed
    to a scalar draw may be (and how far outside ``[0, 1]`` a Bernoulli
    probability): the rounding of a sum of ``size`` terms, ``size * eps``, with a
    floor of ``1e-9`` for float64 (and integer weights) and ``max(1e-5, 4 eps)``
    for the narrower floats (float32 ``1e-5``, float16 ``3.9e-3``, bfloat16 ``3.1e-2``).

    A law normalised in its own dtype (a float32 softmax over 49,152 tokens sums
    to 1 within about ``1e-5``, its terms rounded one by one) is inside; an
    unnormalised residual (mass ``0.77``) is far outside. The exact tests run in
    float64 on a few tokens, where the bound is ``1e-9``.

    Example:
        >>> import torch
        >>> law_tolerance(torch.float64), law_tolerance(torch.float32), law_tolerance(torch.float32, 49152) > 1e-3
        (1e-09, 1e-05, True)
    """
    if dtype == torch.float64 or not dtype.is_floating_point:
        return max(1e-9, size * torch.finfo(torch.float64).eps)
    eps = torch.finfo(dtype).eps
    return max(1e-5, 4.0 * eps, size * eps)


def _caller() -> str:
    """``file:line in function`` of the first frame outside the random sources and specdec.testing."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _is_draw_frame(frame):
        frame = frame.f_back
    path = frame.f_code.co_filename
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    if not relative.startswith(".."):
        path = relative
    return f"{path}:{frame.f_lineno} in {frame.f_code.co_name}"


def _is_draw_frame(frame: FrameType) -> bool:
    """A frame of a source or of the exact harness (a doctest's frame, ``<doctest ...>``, runs in its
    module's globals but is the caller)."""
    module = str(frame.f_globals.get("__name__", ""))
    return module.startswith(_DRAW_MODULES) and not frame.f_code.co_filename.startswith("<")


def check_categorical(source: "RandomSource", probs: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Count a scalar categorical draw of ``source`` and check its law (the
    contract of every source's :meth:`~RandomSource.categorical`).

    ``probs`` must be ``[V]`` weights with no negative, NaN or infinite entry
    whose total is 1 within :func:`law_tolerance` of ``probs``' dtype. One host
    read (the total and the smallest weight together), the read the inverse-CDF
    draw needs anyway.

    Args:
        source: the drawing source (its :attr:`~RandomSource.categorical_draws` is advanced).
        probs: ``[V]`` the law.

    Returns:
        ``(cdf, total)``: the float64 cumulative sum of ``probs`` on its device
        and its last entry, the inverse-CDF rule's inputs (:class:`TorchRandom`,
        :class:`~specdec.rng.CounterRandom`).

    Raises:
        InvalidDistributionError: the law breaks the contract; the message
            names the draw (``categorical draw #n of this ...``), its call site
            (the first frame outside the sources and :mod:`specdec.testing`)
            and the total mass found.

    Example:
        >>> import torch
        >>> rng = TorchRandom.seeded(0)
        >>> check_categorical(rng, torch.tensor([0.25, 0.75], dtype=torch.float64))[1]
        1.0
        >>> check_categorical(rng, torch.tensor([0.25, 0.5], dtype=torch.float64))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        specdec.errors.InvalidDistributionError: categorical draw #2 of this TorchRandom (called from <doctest ...>:1 in <module>): total mass 0.75; ...
    """
    source.categorical_draws += 1
    wide = probs.detach().to(torch.float64)
    cdf = torch.cumsum(wide.clamp_min(0), dim=0)
    if cdf.numel() == 0:
        raise InvalidDistributionError(
            f"{_draw_name(source, 'categorical')} (called from {_caller()}): the law is empty ({tuple(probs.shape)})"
        )
    total, smallest = torch.stack([cdf[-1], wide.min()]).tolist()
    tolerance = law_tolerance(probs.dtype, probs.numel())
    if smallest >= 0.0 and math.isfinite(total) and abs(total - 1.0) <= tolerance:
        return cdf, total
    if math.isnan(total) or math.isnan(smallest) or math.isinf(total):
        problem = "a weight is NaN or infinite"
    elif smallest < 0.0:
        problem = f"a weight is negative ({smallest:.6g})"
    elif total == 0.0:
        problem = "the weights are all zero (an all-zero law)"
    else:
        problem = f"the weights do not sum to 1 (tolerance {tolerance:.1g} for {probs.dtype})"
    raise InvalidDistributionError(
        f"{_draw_name(source, 'categorical')} (called from {_caller()}): total mass {total:.6g}; {problem}. "
        "A categorical draw takes a normalised law: divide the weights by their sum where the law is made "
        "(no source renormalises silently)"
    )


def check_bernoulli(source: "RandomSource", prob: float | torch.Tensor) -> float:
    """Count a Bernoulli draw of ``source`` and check ``prob`` (the contract
    of every source's :meth:`~RandomSource.bernoulli`): a probability in
    ``[0, 1]``, outside by no more than :func:`law_tolerance` (of ``prob``'s
    dtype; a Python number gets float32's, as it often carries a float32
    computation), never NaN. One host read (``float(prob)``).

    Returns:
        ``prob`` as a Python float clamped to ``[0, 1]``.

    Raises:
        InvalidDistributionError: naming the draw and its call site.

    Example:
        >>> check_bernoulli(TorchRandom.seeded(0), 1.0 + 1e-7)
        1.0
    """
    source.bernoulli_draws += 1
    value = float(prob)
    tolerance = law_tolerance(prob.dtype if isinstance(prob, torch.Tensor) else torch.float32)
    if -tolerance <= value <= 1.0 + tolerance:  # False for NaN
        return min(max(value, 0.0), 1.0)
    raise InvalidDistributionError(
        f"{_draw_name(source, 'bernoulli')} (called from {_caller()}): the probability is {value!r}, "
        f"not in [0, 1] (tolerance {tolerance:.1g})"
    )


def _draw_name(source: "RandomSource", kind: str) -> str:
    count = source.categorical_draws if kind == "categorical" else source.bernoulli_draws
    return f"{kind} draw #{count} of {source.run_label}"


def inverse_cdf_rows(probs: torch.Tensor, u: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The column each uniform selects from its row, by inverse CDF, with no host read.

    :meth:`TorchRandom.categorical`'s rule, row-wise: the first index whose
    float64 cumulative sum exceeds ``u * total``, or the last positive index
    if rounding runs past the end. It runs on the device with no host read,
    so unlike the scalar draws it does NOT check its rows
    (:func:`check_categorical`): callers pass normalised laws.

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
    """The two kinds of random draw the algorithms need.

    The scalar draws check their input (:func:`check_categorical`,
    :func:`check_bernoulli`: a normalised law, a probability in ``[0, 1]``,
    else :class:`~specdec.errors.InvalidDistributionError` naming the call);
    the batched tensor draws do not (they never read the device).
    """

    categorical_draws: int = 0
    """Scalar categorical draws made so far (counted by :func:`check_categorical`; numbers the draws in errors)."""

    bernoulli_draws: int = 0
    """Bernoulli draws made so far (counted by :func:`check_bernoulli`)."""

    @property
    def run_label(self) -> str:
        """How a draw's error names the stream it belongs to (``categorical draw #3 of <run_label>``)."""
        return f"this {type(self).__name__}"

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
        """Return True with probability ``prob``.

        Args:
            prob: in ``[0, 1]`` up to rounding (:func:`check_bernoulli`; a
                value within the rounding tolerance is clamped).

        Raises:
            InvalidDistributionError: ``prob`` is NaN or outside ``[0, 1]`` beyond rounding.
        """

    @abstractmethod
    def categorical(self, probs: torch.Tensor) -> int:
        """Draw an index ``i`` with probability ``probs[i]``.

        Args:
            probs: ``[V]`` a normalised law: non-negative, finite weights
                summing to 1 within :func:`law_tolerance` of their dtype
                (:func:`check_categorical`). Callers normalise; no source
                renormalises silently.

        Raises:
            InvalidDistributionError: the law is negative, NaN/inf, all zero
                or does not sum to 1; the message names the draw and its call site.
        """

    def categorical_rows(self, probs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """One independent categorical draw per active row of ``probs``.

        The tensor builders' only draw (:func:`specdec.trees._common.draw_rows`).
        The default draws row by row with :meth:`categorical`, in row order,
        so an enumerating source (:mod:`specdec.testing.enumerate`) walks
        every branch of the tensor code; it reads ``active`` on the host (and
        each row is checked as :meth:`categorical` checks its law).
        :class:`TorchRandom` overrides it with one batched draw and no host
        read, and so does NOT check its rows (no host sync on the device
        path): callers pass normalised rows.

        Args:
            probs: ``[R, L]`` non-negative weights; each active row is a normalised law.
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
        (the tensor verifiers' draws, :mod:`specdec.verify.fast`); nothing to
        check, and nothing is read on the host. Sources that
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
        >>> rng.categorical(torch.tensor([0.0, 0.5, 0.0]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        specdec.errors.InvalidDistributionError: categorical draw #2 of this TorchRandom ...: total mass 0.5; ...

        (An unnormalised law is refused, never renormalised.)
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
        prob_f = check_bernoulli(self, prob)
        if prob_f >= 1.0:
            return True
        if prob_f <= 0.0:
            return False
        u = torch.rand((), generator=self.generator, device=self.generator.device)
        return bool(u.item() < prob_f)

    def categorical(self, probs: torch.Tensor) -> int:
        """Inverse-CDF draw (one uniform, a float64 cumulative sum and a binary
        search): about 20x faster than ``torch.multinomial`` at V = 49152 on
        CPU. A zero-probability index is never returned. ``probs`` must be a
        normalised law (:func:`check_categorical`; the check's one host read
        is the read of the total the draw makes anyway, and the draw's
        arithmetic is unchanged: ``u * total`` located in the cumulative sum)."""
        cdf, total = check_categorical(self, probs)
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
        """Batched inverse-CDF draws (:func:`inverse_cdf_rows`), one uniform per row (inactive rows too), no
        host read, so the rows are NOT checked (callers pass normalised laws; :meth:`categorical` checks)."""
        return inverse_cdf_rows(probs, self.uniforms((probs.shape[0],), device=probs.device), active)


class UniformTable(RandomSource):
    """Batched draws from a table of uniforms drawn beforehand, one column per
    :meth:`categorical_rows` call (unchecked, as every batched draw): the form of the tree builders' draws that
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
