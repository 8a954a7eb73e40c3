"""Sampling configuration and THE function that turns logits into a distribution.

Losslessness needs the target law ``p`` and the draft law ``q`` to be processed
by exactly the same rule (temperature, then top-k, top-p, min-p). Both the target
and every draft model go through :func:`process_logits`; nothing else in
specdec turns logits into probabilities (the fused Triton kernel masks raw
logits at :func:`top_k_logit_threshold`, the same set). The rule keeps the set
transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
``TopPLogitsWarper`` keep (docs/generation.md, "Sampling conventions").
A batch of rows under their own configurations (:class:`RowSampling`, ``[B]``
tensors) is processed in one pass by :func:`process_logits_rows`, each row with
the bits :func:`process_logits` gives it under its own configuration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import attrs
import numpy as np
import torch

from specdec.errors import InvalidConfigError, InvalidDistributionError

__all__ = [
    "SamplingConfig",
    "process_logits",
    "warped_scores",
    "check_distribution",
    "construction_config",
    "row_is_bad",
    "RowSampling",
    "process_logits_rows",
    "warped_scores_rows",
]


def _check_temperature(_inst: object, _attr: object, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidConfigError(f"temperature must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidConfigError(f"temperature must be finite and >= 0 (0 = greedy), got {value!r}")


def _check_top_k(_inst: object, _attr: object, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidConfigError(f"top_k must be an int >= 0 (0 = off), got {value!r}")


def _check_top_p(_inst: object, _attr: object, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidConfigError(f"top_p must be a number, got {value!r}")
    if not (0.0 < value <= 1.0):
        raise InvalidConfigError(f"top_p must lie in (0, 1] (1 = off), got {value!r}")


def _check_min_p(_inst: object, _attr: object, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise InvalidConfigError(f"min_p must be a number, got {value!r}")
    if not (0.0 <= value <= 1.0):
        raise InvalidConfigError(f"min_p must lie in [0, 1] (0 = off), got {value!r}")


@attrs.frozen
class SamplingConfig:
    """How next-token distributions are formed, for target and draft alike.

    Processing order and arithmetic as in transformers' ``generate``
    (``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``;
    docs/generation.md, "Sampling conventions"): float16/bfloat16 logits are
    cast to float32; scores ``s = logits / temperature``; keep the ``top_k``
    largest scores (ties with the k-th are kept); then sort the scores
    ascending, drop the tokens whose cumulative softmax is ``<= 1 - top_p``
    (always keeping the largest; among tokens tied at that cut the highest
    ids are kept); then min-p (transformers' ``MinPLogitsWarper``, after
    top-p as ``generate`` orders them): drop the tokens whose softmax is
    ``< min_p *`` the largest; ``p`` is the softmax of the kept scores.

    Attributes:
        temperature: ``>= 0``. ``0`` means greedy: the distribution is one-hot on
            the first index of the maximal logit.
        top_k: ``>= 0``; ``0`` disables top-k.
        top_p: in ``(0, 1]``; ``1`` disables top-p.
        min_p: in ``[0, 1]``; ``0`` disables min-p.

    Example:
        >>> cfg = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9)
        >>> cfg.greedy
        False
    """

    temperature: float = attrs.field(default=1.0, validator=_check_temperature)
    top_k: int = attrs.field(default=0, validator=_check_top_k)
    top_p: float = attrs.field(default=1.0, validator=_check_top_p)
    min_p: float = attrs.field(default=0.0, validator=_check_min_p)

    @property
    def reads_mass(self) -> bool:
        """True when a filter reads the softmax of the scores (``top_p < 1`` or ``min_p > 0``):
        the law is not temperature and top-k of the logits alone (no fused logits path)."""
        return self.top_p < 1.0 or self.min_p > 0.0

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0`` (argmax decoding)."""
        return self.temperature == 0


UNTEMPERED = SamplingConfig(temperature=1.0)
"""The draft's plain softmax (no temperature, top-k or top-p): the construction law at ``T = 0``."""


def construction_config(sampling: SamplingConfig) -> SamplingConfig:
    """The processing of the draft law ``q`` that branching tree builders rank and draw by.

    At ``T > 0`` this is ``sampling`` itself: ``q`` is processed exactly as the
    target's ``p`` (docs/concepts.md, glossary). At ``T = 0`` the target law is
    one-hot and every verifier reduces to rule 1 (accept the child equal to
    ``argmax p``), which never reads ``q``; a one-hot ``q`` would turn every
    top-K tree into a chain (all mass on one token). So at ``T = 0`` builders
    that branch (static, Sequoia, EAGLE, Rheo) rank and draw by the draft's
    untempered law ``softmax(logits)``, as EAGLE's reference code does. The law
    recorded in the tree is this law, the one actually used, so rules 3 and 4
    stay exact (with a one-hot ``p`` they accept exactly ``argmax p``, for any
    proposal law). The chain builder keeps the greedy draft (its single child is
    the argmax either way).

    Args:
        sampling: the target's sampling configuration.

    Returns:
        ``sampling`` when ``T > 0``, else ``SamplingConfig(temperature=1.0)``.

    Example:
        >>> construction_config(SamplingConfig(temperature=0.0))
        SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
        >>> construction_config(SamplingConfig(temperature=0.7, top_k=5)).top_k
        5
    """
    return UNTEMPERED if sampling.greedy else sampling


def _check_logits(logits: torch.Tensor, source: str | None = None) -> None:
    whose = f"the logits of {source}" if source else "logits"
    if not isinstance(logits, torch.Tensor):
        raise InvalidDistributionError(f"{whose} must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise InvalidDistributionError(f"{whose} must have shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if not torch.is_floating_point(logits):
        raise InvalidDistributionError(f"{whose} must be floating point, got {logits.dtype}")
    if torch.isnan(logits).any():
        raise InvalidDistributionError(f"{whose} contain NaN")
    if torch.isposinf(logits).any():
        raise InvalidDistributionError(f"{whose} contain +inf")
    if torch.isneginf(logits).all(dim=-1).any():
        raise InvalidDistributionError(f"a row of {whose} is entirely -inf: no token can be produced")


def row_is_bad(logits: torch.Tensor) -> torch.Tensor:
    """``[...]`` bool per row of ``logits`` ``[..., V]``: NaN, +inf, or every entry -inf
    (:func:`process_logits` raises on these; the step path flags them
    instead, and raises only where a builder or the verifier uses the row)."""
    return ~torch.isfinite(logits.amax(dim=-1))  # one pass: NaN and +inf propagate to the max, all -inf stays -inf


def law_is_bad(p: torch.Tensor) -> torch.Tensor:
    """``[...]`` bool: :func:`row_is_bad` of the logits a law ``p`` ``[..., V]`` came from,
    read from its first column, for a law of :func:`process_logits` at ``T > 0`` (not
    greedy: a one-hot row is never NaN).

    A softmax ``exp(s - max s) / sum`` of a row whose max is not finite (NaN, ``+inf``,
    all ``-inf``: the rows :func:`row_is_bad` flags, which temperature, top-k and top-p
    keep as they are) has a NaN in ``exp`` and so a NaN sum, which makes every entry NaN;
    a good row has ``1 <= sum <= V`` and no NaN. One column read instead of a pass over
    the vocabulary."""
    return torch.isnan(p[..., 0])


def process_logits(
    logits: torch.Tensor, config: SamplingConfig, *, check: bool = True, source: str | None = None
) -> torch.Tensor:
    """Turn raw logits into the processed next-token distribution.

    This is the single definition of ``p`` and ``q`` in specdec
    (docs/concepts.md, glossary): temperature, then top-k, then top-p, with
    the kept set of transformers' ``TemperatureLogitsWarper``,
    ``TopKLogitsWarper`` and ``TopPLogitsWarper`` applied in that order
    (docs/generation.md, "Sampling conventions"):

    1. scores ``s = logits / T`` (float16/bfloat16 logits are cast to float32
       first, as ``generate`` does; float32 and float64 stay as they are);
    2. top-k: drop ``s < `` the ``k``-th largest ``s`` (ties with it kept);
    3. top-p: sort ``s`` ascending (ties by token id), ``c = cumsum(softmax)``,
       drop ``c <= 1 - top_p``, always keep the largest (so among tokens
       tied at the cut the highest ids are kept);
    4. min-p: drop the tokens whose softmax is ``< min_p *`` the largest
       (:func:`min_p_scores`);
    5. ``p = softmax(s)`` over the kept tokens (0 elsewhere).

    Args:
        logits: ``[..., V]`` float tensor of raw logits. ``-inf`` marks banned
            tokens; NaN, ``+inf`` or an all ``-inf`` row raise
            :class:`~specdec.errors.InvalidDistributionError`.
        config: the sampling configuration.
        check: raise on NaN / ``+inf`` / all ``-inf`` rows (host reads). The
            step path passes False and flags such rows itself
            (:func:`row_is_bad`), raising only where the
            verifier visits them.
        source: who produced ``logits`` (``"the draft"``, ``"the target"``),
            named in the errors.

    Returns:
        ``[..., V]`` probabilities in the dtype of ``logits`` (float16/bfloat16
        inputs are processed in float32), each row summing to 1. At
        ``temperature == 0`` each row is one-hot at the first maximal logit.

    Example:
        >>> import torch
        >>> p = process_logits(torch.tensor([2.0, 1.0, 0.0]), SamplingConfig(temperature=1.0, top_k=2))
        >>> [round(x, 4) for x in p.tolist()]
        [0.7311, 0.2689, 0.0]
        >>> p = process_logits(torch.tensor([0.3, 0.1, 0.1, 0.5]).log(), SamplingConfig(top_p=0.8))
        >>> (p > 0).tolist()  # 0.5 + 0.3 reaches 0.8: two kept, as transformers keeps
        [True, False, False, True]
    """
    if check:
        _check_logits(logits, source)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if config.greedy:
        return greedy_law(logits)
    return torch.softmax(warped_scores(logits, config), dim=-1)


def greedy_law(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The law at ``T = 0``: ``[..., V]`` one-hot rows at each row's argmax (the first of tied
    maxima), in ``logits``' dtype; written into ``out`` (same shape and dtype) when given."""
    index = logits.argmax(dim=-1, keepdim=True)
    law = torch.zeros_like(logits) if out is None else out.zero_()
    return law.scatter_(-1, index, 1.0)


def warped_scores(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """transformers' warped scores: ``[..., V]`` ``logits / T`` with ``-inf`` where
    top-k or top-p drops a token (steps 1-3 of :func:`process_logits`, which
    returns their softmax). The same tensor, bit for bit, as
    ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``
    return on the same device, except that ties at the top-p cut are broken by
    token id (docs/generation.md, "Sampling conventions").

    Args:
        logits: ``[..., V]`` raw logits (no checks; float16/bfloat16 are cast
            to float32).
        config: the sampling configuration, ``temperature > 0``.

    Returns:
        ``[..., V]`` scores in float32 or float64 (``logits`` itself when
        nothing applies: ``T = 1``, no top-k, no top-p).
    """
    if config.greedy:
        raise InvalidConfigError("warped_scores needs temperature > 0 (greedy rows are one-hot, see process_logits)")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    vocab = logits.shape[-1]
    # the candidates (the lane argument is the CPU kernel's); at T = 1 top-k alone is one compare either way
    if (0 < config.top_k < vocab and logits.device.type == "cpu" and logits.numel() > 0
            and (config.temperature != 1.0 or config.top_p < 1.0)):
        narrowed = _top_k_top_p_scores(logits.reshape(-1, vocab), config)
        if narrowed is not None:
            return min_p_scores(narrowed.reshape(logits.shape), config.min_p)
    scores = temperature_scores(logits, config.temperature)
    fresh = scores is not logits  # a new tensor: mask it in place
    if 0 < config.top_k < vocab:
        kth = torch.topk(scores, config.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
        fresh = True
    if config.top_p < 1.0:
        flat = scores.reshape(-1, vocab)
        if config.top_k <= 0 and flat.device.type == "cpu" and vocab > _TOP_P_CANDIDATES:
            remove = _top_p_remove_by_values(flat, config.top_p)  # no top-k: no row is narrow enough to skip the sort
        else:
            remove = ~top_p_keep(flat, config.top_p)
        remove = remove.reshape(scores.shape)
        scores = scores.masked_fill_(remove, float("-inf")) if fresh else scores.masked_fill(remove, float("-inf"))
    return min_p_scores(scores, config.min_p)


def min_p_scores(scores: torch.Tensor, min_p: float | torch.Tensor) -> torch.Tensor:
    """transformers' ``MinPLogitsWarper``: ``[..., V]`` ``scores`` with ``-inf`` where the
    softmax of the row is ``< min_p *`` its largest entry (the largest always kept); ``scores``
    itself at ``min_p == 0``. The same arithmetic as the warper (a softmax of the whole row in
    the scores' dtype, the threshold ``min_p * max`` in that dtype), so the same set bit for bit.

    Args:
        scores: ``[..., V]`` float32 / float64 scores after temperature, top-k and top-p.
        min_p: a number in ``[0, 1]``, or ``[B]`` per-row values (``scores`` ``[B, ..., V]``).
    """
    if isinstance(min_p, torch.Tensor):
        threshold = _row_view(min_p, scores).to(scores.dtype)  # [B, ..., 1]
    elif min_p <= 0.0:
        return scores
    else:
        threshold = torch.tensor(min_p, dtype=scores.dtype, device=scores.device)  # as the warper's scalar
    probs = torch.softmax(scores, dim=-1)  # [..., V]
    remove = probs < threshold * probs.amax(dim=-1, keepdim=True)  # [..., V]; the largest is never below it
    return scores.masked_fill(remove, float("-inf"))


_TOP_K_MARGIN = 64
"""Candidates beyond ``top_k`` taken by :func:`_top_k_top_p_scores` (room for ties at the k-th score)."""

_SOFTMAX_PERIOD = 1024
"""A short softmax layout congruent to ``V`` modulo this sums in the same order (see :func:`_tail_softmax`)."""


def _tail_softmax(tail: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[R, C]``: the last ``C`` entries of ``softmax`` over ``[R, vocab]`` rows
    that hold ``-inf`` everywhere but their last ``C`` entries, ``tail``, bit
    for bit, without the ``[R, vocab]`` row.

    torch's CPU softmax sums a row in vector lanes by position (entry ``i`` in
    lane ``i mod W``, ``W`` at most 64 entries for every vector width). Leading
    ``-inf`` entries add exact zeros, so a row of ``L`` entries with
    ``L = vocab (mod 1024)`` and ``tail`` at its end gives every lane, hence
    the sum, the same bits (tests/test_sampling.py checks it against the full
    layout on this machine's vector width).
    """
    rows, c = tail.shape
    length = c + (vocab - c) % _SOFTMAX_PERIOD
    if length == c:
        return torch.softmax(tail, dim=-1)
    layout = tail.new_full((rows, length), float("-inf"))
    layout[:, length - c:] = tail
    return torch.softmax(layout, dim=-1)[:, length - c:]


def _top_k_top_p_scores(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor | None:
    """:func:`warped_scores` of ``[R, V]`` CPU logits with top-k on, from each
    row's ``top_k + 64`` largest logits; None when top-p is on and a row has
    more than that many tokens tied into the top-k set (the caller takes the
    full path).

    The logits are scored (temperature) and top-k-ed on those candidates:
    ``logits / T`` is monotone, so the candidates are the largest scores, and
    when the smallest candidate scores below the k-th, every token the top-k
    warper keeps is a candidate. Without top-p no host read decides that
    (:func:`_top_k_alone`: the ``top_k`` largest, and the tokens whose logit
    scores the k-th score). With top-p the kept candidates
    are sorted: the ascending sort of the full row is its ``-inf`` entries
    followed by them, so their softmax and cumulative sum are the full row's
    (:func:`_tail_softmax`); one host read (is every row's top-k set among its
    candidates?), as that layout needs every kept token.
    """
    if config.top_p >= 1.0:
        return _top_k_alone(logits, config)
    rows, vocab = logits.shape
    c = min(vocab, config.top_k + _TOP_K_MARGIN)
    values, index = torch.topk(logits, c, dim=-1)  # [R, C] descending, ids [R, C]
    scores = temperature_scores(values, config.temperature)  # [R, C]; the row's max is its first candidate
    kth = scores[:, config.top_k - 1:config.top_k]  # [R, 1] the k-th largest score
    if c < vocab:
        last = scores[:, -1:]  # [R, 1]
        complete = (last < kth) | (last == float("-inf"))  # [R, 1]; NaN rows: False (full path flags them)
        if not bool(complete.all()):
            return None
    scores = scores.masked_fill(scores < kth, float("-inf"))  # [R, C] top-k (ties with the k-th kept)
    # ascending by (score, token id), as the stable full sort orders them
    ids, perm = torch.sort(index, dim=-1)  # [R, C]
    ordered, order = torch.sort(scores.gather(-1, perm), dim=-1, stable=True)  # [R, C] ascending
    cumulative = _tail_softmax(ordered, vocab).cumsum_(dim=-1)  # [R, C]
    remove = cumulative <= (1 - config.top_p)  # [R, C] in sorted order
    remove[:, -1] = False
    scores = scores.scatter(-1, perm.gather(-1, order), ordered.masked_fill(remove, float("-inf")))
    return torch.full_like(logits, float("-inf"), dtype=scores.dtype).scatter_(-1, index, scores)


_SEARCH_MIN_ENTRIES = 1 << 18
"""Fewer logits than this (about 5 rows of 49,152) take the full top-k pass in :func:`_top_k_alone`:
the search's fixed cost (about 100 small ops) would exceed the passes it spares."""

_SEARCH_STEPS = torch.arange(1, 64, dtype=torch.int64)
"""``[63]``: the probes of a round of :func:`_smallest_logit_scoring`, in 64ths of the bracket."""


def _float32_order(x: torch.Tensor) -> torch.Tensor:
    """``[...]`` int64: float32 ``x``'s rank among float32 values (monotone; ``-0.0`` just below ``0.0``)."""
    bits = x.contiguous().view(torch.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).long()


def _float32_of_order(order: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`_float32_order` (int64 ranks of float32 values)."""
    bits = order.int()
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).view(torch.float32)


def _smallest_logit_scoring(kth: torch.Tensor, shift: torch.Tensor, temperature: float,
                            above: torch.Tensor) -> torch.Tensor:
    """``[R, 1]`` float32: the smallest float32 logit ``l`` whose score ``(l - shift) / T``
    (:func:`temperature_scores`' arithmetic) is at least ``kth``, for rows whose logit
    ``above`` scores at least ``kth`` and ``-inf`` scores below it (finite ``kth``).

    The score is monotone in the logit, so a search over the float32 values between ``-inf``
    and ``above`` (their ranks, :func:`_float32_order`) finds it: each round scores 63 evenly
    spaced values and keeps the 64th of the bracket where the score reaches ``kth``; six
    rounds narrow 2**32 ranks to one (no host read, a fixed count)."""
    lo = _float32_order(torch.full_like(kth, float("-inf")))  # [R, 1] scores below kth
    width = _float32_order(above) - lo  # [R, 1] >= 1: ``lo + width`` scores at least kth
    for _ in range(6):  # width <= ceil(width / 64) per round: 2**32 -> 1
        probe = _float32_of_order((width * _SEARCH_STEPS).bitwise_right_shift_(6).add_(lo))  # [R, 63]
        below = ((probe - shift) / temperature < kth).sum(dim=-1, keepdim=True)  # [R, 1] a prefix (monotone)
        step = width * below  # [R, 1]
        lo, width = lo + (step >> 6), ((step + width) >> 6) - (step >> 6)
    return _float32_of_order(lo + width)


def _top_k_alone(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Top-k without top-p of ``[R, V]`` CPU logits from their ``top_k`` largest, with no host
    read: the same scores as the full pass (temperature, then ``scores < kth`` dropped), bit for
    bit but for the sign of a zero score tied with the k-th (equal values, the same softmax).

    A token outside the ``top_k`` largest logits scores at most the k-th score, so it is kept
    only when it ties with it: when its logit is at least the smallest logit that scores
    ``kth`` (:func:`_smallest_logit_scoring`; any number of such ties). Those tokens get
    ``kth``, the ``top_k`` their own scores. A row whose k-th score is NaN (a NaN logit, or an
    all ``-inf`` row, shifted by a NaN or ``-inf`` maximum; or ``+inf`` logits, by ``+inf``)
    keeps every score, as the full pass does: NaN everywhere, or at the ``+inf`` logits."""
    temperature, k = config.temperature, config.top_k
    values, index = torch.topk(logits, k, dim=-1)  # [R, k] descending (NaN first), ids [R, k]
    scores = temperature_scores(values, temperature)  # [R, k]; the row's max is its first
    kth = scores[:, -1:]  # [R, 1] the k-th largest score
    if temperature == 1.0:
        return logits.masked_fill(logits < kth, float("-inf"))  # the full pass itself: no division to spare
    if logits.dtype != torch.float32 or logits.numel() < _SEARCH_MIN_ENTRIES:
        # float64 (no 32-bit search), or so few entries that the search's fixed cost exceeds a pass over
        # them: the full pass, read-free as well
        full = temperature_scores(logits, temperature)
        return full.masked_fill_(full < kth, float("-inf"))
    top = values[:, :1]  # [R, 1] the row's max, as temperature_scores shifts by it
    shift = torch.where(~torch.isfinite(top / temperature), top, torch.zeros_like(top))  # [R, 1]
    finite = torch.isfinite(kth)  # [R, 1]
    zero = kth.new_zeros(())
    limit = _smallest_logit_scoring(torch.where(finite, kth, zero), shift, temperature,
                                    torch.where(finite, values[:, -1:], zero))  # [R, 1]
    inf = torch.full_like(kth, float("inf"))
    limit = torch.where(finite, limit, torch.where(shift == float("inf"), inf, -inf))  # NaN kth: fill all / +inf
    out = torch.where(logits < limit, float("-inf"), kth)  # [R, V] kth at the ties beyond the k largest
    return out.scatter_(-1, index, scores)


def temperature_scores(logits: torch.Tensor, temperature: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' ``TemperatureLogitsWarper``: ``[..., V]`` scores ``logits / T``.

    ``T == 1`` returns ``logits`` itself (``generate`` skips the warper; the
    division would be exact anyway). A row whose largest ``logits / T`` is not
    finite (``+inf`` by overflow at a tiny ``T`` or huge logits, where
    transformers' softmax returns NaN; or all ``-inf``) is divided after
    shifting by its maximum instead: ``(logits - max) / T``. Every other row is
    bit for bit ``logits / T``.

    Args:
        logits: ``[..., V]`` float32 or float64 logits.
        temperature: ``> 0``.
        out: a tensor of ``logits``' shape and dtype to write the scores to
            (the same bits), or None for a new one; ``T == 1`` ignores it.
    """
    if temperature == 1.0:
        return logits
    top = logits.amax(dim=-1, keepdim=True)  # [..., 1]; max(l / T) == max(l) / T (rounding is monotone)
    overflow = ~torch.isfinite(top / temperature)
    # l - 0 == l bit for bit (also for -inf and -0.0): no [..., V] select, no host read
    shift = torch.where(overflow, top, torch.zeros_like(top))  # [..., 1]
    if out is None:
        return (logits - shift) / temperature
    return torch.sub(logits, shift, out=out).div_(temperature)


def top_k_logit_threshold(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """``[R]`` float32: the smallest raw logit that :func:`process_logits` keeps after top-k.

    For kernels that mask raw logits (``logit >= threshold``, then temperature
    and softmax): ``logits / T`` is monotone in the logit, so the top-k set on
    the scores (:func:`temperature_scores`) is exactly the logits at or above
    this threshold. ``-inf`` when top-k is off.

    Args:
        logits: ``[R, V]`` raw logits (float16/bfloat16 are scored in float32).
        config: the sampling configuration (``temperature > 0``).
    """
    rows, vocab = logits.shape
    if not 0 < config.top_k < vocab:
        return torch.full((rows,), float("-inf"), dtype=torch.float32, device=logits.device)
    raw = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    scores = temperature_scores(raw, config.temperature)
    kth = torch.topk(scores, config.top_k, dim=-1).values[:, -1:]  # [R, 1]
    kept = scores >= kth
    return torch.where(kept, raw, torch.full_like(raw, float("inf"))).amin(dim=-1).float()


_TOP_P_CANDIDATES = 1024


def _top_p_remove_sorted(sorted_scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``TopPLogitsWarper`` on scores sorted ascending: True where removed
    (cumulative softmax ``<= 1 - top_p``; the last, largest, never)."""
    cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1] = False
    return remove


def _top_p_keep_full(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p keep mask by a full ascending stable sort of every row
    (ties in ascending token id: the lowest ids are removed first)."""
    sorted_scores, order = torch.sort(scores, dim=-1, stable=True)
    keep_sorted = ~_top_p_remove_sorted(sorted_scores, top_p)
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


_SORT_POOL: ThreadPoolExecutor | None = None


def _sorted_values(scores: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` each CPU row of ``scores`` sorted ascending (values only; NumPy,
    whose sort releases the GIL: rows split over ``torch.get_num_threads()``
    threads)."""
    global _SORT_POOL
    source = scores.contiguous().numpy()
    out = np.empty_like(source)
    rows = source.shape[0]
    parts = min(torch.get_num_threads(), rows, 8)
    if parts <= 1 or source.size < (1 << 16):
        out[...] = np.sort(source, axis=-1)
        return torch.from_numpy(out)
    if _SORT_POOL is None:
        _SORT_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="specdec-sort")
    bounds = [rows * i // parts for i in range(parts + 1)]

    def sort_rows(i: int) -> None:
        out[bounds[i]:bounds[i + 1]] = np.sort(source[bounds[i]:bounds[i + 1]], axis=-1)

    list(_SORT_POOL.map(sort_rows, range(parts)))
    return torch.from_numpy(out)


def _top_p_keep_by_values(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p keep mask of CPU rows from their sorted values alone: ``~``
    :func:`_top_p_remove_by_values`."""
    return _top_p_remove_by_values(scores, top_p).logical_not_()


def _top_p_remove_by_values(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``[R, V]`` bool: the entries top-p removes from CPU rows ``scores``, from their
    sorted values alone (no index sort, no host read).

    The sorted values do not depend on how ties are ordered, so NumPy's
    values-only sort (several times faster on CPU than an index sort) gives
    the layout whose softmax and cumulative sum decide how many entries are
    removed (a prefix: the sums only grow). The removed entries are those
    below the smallest kept value, then the lowest ids among the tokens equal
    to it: what the stable sort removes. That rank among the tied is taken
    for every row (no host read asks whether a row needs it). A row whose
    softmax is NaN (a NaN or ``+inf`` score, or every score ``-inf``) keeps
    every entry, as the full sort's comparisons with NaN do.
    """
    rows, vocab = scores.shape
    ordered = _sorted_values(scores)  # [R, V] ascending
    cumulative = torch.softmax(ordered, dim=-1).cumsum_(dim=-1)  # [R, V] non-decreasing (a running sum of >= 0)
    limit = torch.full((rows, 1), 1 - top_p, dtype=cumulative.dtype)  # [R, 1]; c <= 1 - top_p in the scores' dtype
    removed = torch.searchsorted(cumulative, limit, right=True).clamp_(max=vocab - 1)  # [R, 1] the last never
    cut = ordered.gather(-1, removed)  # [R, 1] the smallest kept value
    below = torch.searchsorted(ordered, cut)  # [R, 1] entries < cut (the first index of cut)
    tied_removed = removed - below  # [R, 1] tokens equal to cut that are removed
    bad = torch.isnan(cumulative[:, -1:])  # [R, 1] NaN softmax: nothing removed
    cut = cut.masked_fill_(bad, float("-inf"))
    tied_removed = tied_removed.masked_fill_(bad, 0).int()
    tie = scores == cut  # [R, V]
    ranked = torch.gt(tie.int().cumsum_(dim=-1), tied_removed)  # [R, V] past the first tied_removed ties (by id)
    kept_ties = tie.logical_and_(ranked)  # [R, V]
    remove = torch.le(scores, cut, out=ranked)  # [R, V] (a buffer reused: a fresh one costs its page faults)
    return remove.logical_xor_(kept_ties)  # below cut, or tied and among the lowest ids (NaN: never)


def _top_p_keep_narrowed(scores: torch.Tensor, top_p: float, k: int) -> torch.Tensor:
    """The top-p keep mask of rows with at most ``k`` finite scores, from their
    ``k`` largest entries.

    The ascending sort of such a row is ``V - k`` entries ``-inf`` followed by
    the ``k`` candidates in ascending order: that row is rebuilt (softmax sums
    over the whole row in a layout-dependent order, so the layout is the
    same, for the same bits), and only its last ``k`` cumulative sums are
    taken (the ``-inf`` entries add exact zeros).
    """
    rows, vocab = scores.shape
    values, index = torch.topk(scores, k, dim=-1)
    # ascending by (value, token id), as the stable full sort orders them; every
    # finite entry is a candidate, so each tie group is complete
    index, perm = torch.sort(index, dim=-1)
    values, order = torch.sort(values.gather(-1, perm), dim=-1, stable=True)
    index = index.gather(-1, order)
    layout = torch.full_like(scores, float("-inf"))
    layout[:, vocab - k:] = values
    cumulative = torch.softmax(layout, dim=-1)[:, vocab - k:].cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[:, -1] = False
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, index, ~remove)


def top_p_keep(scores: torch.Tensor, top_p: float, *, sync_free: bool | None = None) -> torch.Tensor:
    """``[R, V]`` bool mask of the top-p (nucleus) set of each row of ``scores``.

    Exactly transformers' ``TopPLogitsWarper`` (docs/generation.md, "Sampling
    conventions"): sort the scores ascending, ``c = cumsum(softmax)``, remove
    ``c <= 1 - top_p``, keep at least the largest. Ties are sorted by token id
    (a stable sort), so among tokens tied at the cut the highest ids are kept.
    The arithmetic is transformers' own (float32 scores: a float32 softmax
    and cumulative sum on the same device), so even at a cut within rounding
    of ``top_p`` the set is the one transformers keeps.

    The softmax of the sorted row sums the whole row in an order that depends
    on where each value sits, so the sorted layout of every finite score is
    needed for the same bits. An index sort of ``V`` entries dominates a CPU
    step; when top-k has left at most 1024 finite scores (or the row has no
    more), the row's 1024 largest entries give that layout exactly, with no
    full sort. CPU rows with more finite scores sort their values alone
    (NumPy, several times faster than an index sort) and place the ties by
    id; one host read decides which rows go which way.

    Args:
        scores: ``[R, V]`` float32 or float64 scores after temperature and
            top-k (``-inf``: dropped).
        top_p: in ``(0, 1)``.
        sync_free: sort every row in full, with no host read (the same set).
            Default: on CUDA tensors, where the read would stall the stream
            and a full sort is cheap; the narrowing elsewhere.
    """
    k = _TOP_P_CANDIDATES
    if sync_free is None:
        sync_free = scores.is_cuda
    if sync_free or k >= scores.shape[-1]:
        return _top_p_keep_full(scores, top_p)
    full = _top_p_keep_by_values if scores.device.type == "cpu" else _top_p_keep_full
    narrow = (scores > float("-inf")).sum(dim=-1) <= k  # [R]: every finite score is a candidate
    if bool(narrow.all()):
        return _top_p_keep_narrowed(scores, top_p, k)
    if not bool(narrow.any()):
        return full(scores, top_p)
    keep = torch.empty_like(scores, dtype=torch.bool)
    rows = torch.nonzero(narrow).flatten()
    keep[rows] = _top_p_keep_narrowed(scores[rows], top_p, k)
    rows = torch.nonzero(~narrow).flatten()
    keep[rows] = full(scores[rows], top_p)
    return keep


def check_distribution(p: torch.Tensor, name: str = "p", *, atol: float | None = None) -> None:
    """Raise :class:`~specdec.errors.InvalidDistributionError` unless ``p`` is a
    valid probability tensor ``[..., V]``: finite, non-negative, rows summing
    to 1 (within ``atol``; default ``1e-9`` for float64, ``1e-4`` otherwise).
    """
    if not isinstance(p, torch.Tensor) or not torch.is_floating_point(p):
        raise InvalidDistributionError(f"{name} must be a floating-point torch.Tensor")
    if p.dim() < 1 or p.shape[-1] == 0:
        raise InvalidDistributionError(f"{name} must have shape [..., V] with V >= 1, got {tuple(p.shape)}")
    lo, hi = (float(v) for v in torch.aminmax(p))  # one pass; NaN propagates into both
    if math.isnan(lo) or math.isnan(hi) or math.isinf(hi):
        raise InvalidDistributionError(f"{name} contains NaN or inf")
    if lo < 0:
        raise InvalidDistributionError(f"{name} has negative probabilities (min {lo:.3g})")
    if atol is None:
        atol = 1e-9 if p.dtype == torch.float64 else 1e-4
    sums = p.sum(dim=-1)
    worst = (sums - 1).abs().max().item()
    if worst > atol:
        raise InvalidDistributionError(f"{name} rows must sum to 1; worst row is off by {worst:.3g}")


@attrs.frozen(eq=False)
class RowSampling:
    """One sampling configuration per row, with its parameters as ``[B]`` tensors: the
    per-row sampling record that the step processes in one pass (:func:`process_logits_rows`).

    Attributes:
        configs: ``B`` configurations, row order (host values: which passes a step needs).
        temperature: ``[B]`` float64.
        top_k: ``[B]`` int64 (``0``: off).
        top_p: ``[B]`` float64 (``1``: off).
        min_p: ``[B]`` float64 (``0``: off).
        groups: the distinct configurations and their rows (``[k]`` int64 row indices on the
            device), in order of first appearance.
        greedy: ``[B]`` bool, the rows at ``T = 0``.
    """

    configs: tuple[SamplingConfig, ...]
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    groups: tuple[tuple[SamplingConfig, torch.Tensor], ...]
    greedy: torch.Tensor
    min_p: torch.Tensor

    @classmethod
    def of(cls, configs: "SamplingConfig | Sequence[SamplingConfig] | RowSampling", rows: int,
           device: torch.device | str = "cpu") -> "RowSampling":
        """The rows' configurations: one for every row, or one per row (a :class:`RowSampling`
        of ``rows`` rows is returned as it is: made once, it costs no host-to-device copy per step).

        Raises:
            InvalidConfigError: ``configs`` has not ``rows`` entries, or an entry is not a
                :class:`SamplingConfig`.
        """
        if isinstance(configs, RowSampling):
            if len(configs.configs) != rows:
                raise InvalidConfigError(f"per-row sampling: {len(configs.configs)} configurations for {rows} rows")
            return configs
        if isinstance(configs, (str, bytes)) or not isinstance(configs, (SamplingConfig, Sequence)):
            raise InvalidConfigError(
                f"sampling must be a SamplingConfig or one SamplingConfig per row, got {type(configs).__name__}")
        listed = [configs] * rows if isinstance(configs, SamplingConfig) else list(configs)
        if len(listed) != rows:
            raise InvalidConfigError(f"per-row sampling: {len(listed)} configurations for {rows} rows")
        order: dict[SamplingConfig, list[int]] = {}
        for b, c in enumerate(listed):
            if not isinstance(c, SamplingConfig):
                raise InvalidConfigError(f"row {b}: sampling must be a SamplingConfig, got {type(c).__name__}")
            order.setdefault(c, []).append(b)
        # two host-to-device copies in all: the parameters, and every group's rows (split into views)
        params = torch.tensor([[c.temperature for c in listed], [c.top_p for c in listed], [c.top_k for c in listed],
                               [c.min_p for c in listed]], dtype=torch.float64, device=device)  # [4, B] (top-k < 2**53)
        return cls(tuple(listed), params[0], params[2].long(), params[1], _group_tensors(order, device), params[0] == 0,
                   params[3])

    @property
    def uniform(self) -> bool:
        """Every row has the same configuration."""
        return len(self.groups) == 1

    @property
    def rows(self) -> int:
        """``B``."""
        return len(self.configs)

    def keep(self, rows: Sequence[int], index: torch.Tensor | None = None) -> "RowSampling":
        """The configurations of rows ``rows`` (in that order): the batch after rows left it.
        ``index``: ``rows`` as a device tensor already made (the parameters are then taken from
        the device, one host-to-device copy in all: the groups' rows)."""
        if index is None:
            return RowSampling.of([self.configs[int(r)] for r in rows], len(rows), self.temperature.device)
        configs = tuple(self.configs[int(r)] for r in rows)
        order: dict[SamplingConfig, list[int]] = {}
        for b, c in enumerate(configs):
            order.setdefault(c, []).append(b)
        dev = self.temperature.device
        index = index.to(dev)
        return RowSampling(configs, self.temperature.index_select(0, index), self.top_k.index_select(0, index),
                           self.top_p.index_select(0, index), _group_tensors(order, dev),
                           self.greedy.index_select(0, index), self.min_p.index_select(0, index))

    def group_rows(self) -> list[list[int]]:
        """Each group's row indices as host ints (made from the configurations, no device read)."""
        order: dict[SamplingConfig, list[int]] = {}
        for b, c in enumerate(self.configs):
            order.setdefault(c, []).append(b)
        return list(order.values())

    def fused(self) -> torch.Tensor:
        """``[B]`` bool: the rows whose law the fused kernel computes from the logits itself
        (``T > 0``, ``top_p == 1`` and ``min_p == 0``: temperature, top-k and the softmax)."""
        return ~self.greedy & (self.top_p >= 1.0) & (self.min_p <= 0.0)

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """:func:`process_logits_rows` of ``logits``."""
        return process_logits_rows(logits, self)


def _group_tensors(order: dict[SamplingConfig, list[int]],
                   device: torch.device | str) -> tuple[tuple[SamplingConfig, torch.Tensor], ...]:
    """Each group's rows as a ``[k]`` int64 device tensor: views of one tensor (one copy)."""
    flat = torch.tensor([r for rows in order.values() for r in rows], dtype=torch.int64, device=device)
    return tuple(zip(order, torch.split(flat, [len(rows) for rows in order.values()])))


def _row_view(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B]`` -> ``[B, 1, ..., 1]`` broadcast over ``like``'s trailing dims, on its device."""
    return x.to(like.device).view(-1, *([1] * (like.dim() - 1)))


def _row_temperature_scores(x: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """:func:`temperature_scores` with a ``[B]`` temperature (float32/float64 ``x``, ``T > 0``; a
    row at ``T = 1`` is ``x`` itself): each row has the bits it has with its own scalar ``T``."""
    T = _row_view(temperature, x).to(x.dtype)
    top = x.amax(dim=-1, keepdim=True)
    overflow = ~torch.isfinite(top / T) & (T != 1.0)
    shift = torch.where(overflow, top, torch.zeros_like(top))
    return (x - shift) / T


def _row_top_k_kth(scores: torch.Tensor, top_k: torch.Tensor, k_max: int) -> torch.Tensor:
    """``[B, ..., 1]`` each row's ``top_k``-th largest score (``-inf`` where top-k is off);
    ``k_max``: the largest ``top_k`` in force (a host value)."""
    vocab = scores.shape[-1]
    k = _row_view(top_k, scores)
    on = (k > 0) & (k < vocab)
    values = torch.topk(scores, k_max, dim=-1).values  # [B, ..., k_max] descending
    index = torch.where(on, k - 1, 0).clamp(max=k_max - 1).expand(*scores.shape[:-1], 1)
    kth = values.gather(-1, index)
    return torch.where(on, kth, torch.full_like(kth, float("-inf")))


def _in_force(rows: RowSampling, vocab: int) -> tuple[int, bool]:
    """Host values from the configurations: the largest top-k in force (0: none) and whether a
    sampled row has top-p."""
    k_max = max((c.top_k for c in rows.configs if not c.greedy and 0 < c.top_k < vocab), default=0)
    return k_max, any(not c.greedy and c.top_p < 1.0 for c in rows.configs)


def _min_p_in_force(rows: RowSampling) -> bool:
    """Whether a sampled row has min-p (a host value from the configurations)."""
    return any(not c.greedy and c.min_p > 0.0 for c in rows.configs)


def warped_scores_rows(logits: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """:func:`warped_scores` of ``[B, ..., V]`` logits with each row's own temperature, top-k,
    top-p and min-p (the ``[B]`` tensors of ``rows``), in one pass over all rows; a greedy row is scored at
    ``T = 1`` with neither (its law is one-hot, :func:`process_logits_rows`). Each sampled row has
    the bits :func:`warped_scores` gives it alone (``tests/test_sampling_rows.py``)."""
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    vocab = x.shape[-1]
    temperature = torch.where(rows.greedy, torch.ones_like(rows.temperature), rows.temperature)
    scores = _row_temperature_scores(x, temperature)
    k_max, top_p = _in_force(rows, vocab)
    if k_max > 0:
        top_k = torch.where(rows.greedy, torch.zeros_like(rows.top_k), rows.top_k)
        scores = scores.masked_fill(scores < _row_top_k_kth(scores, top_k, k_max), float("-inf"))
    if top_p:
        limit = torch.where(rows.greedy, torch.ones_like(rows.top_p), rows.top_p)
        cut = _row_view(1 - limit, scores).to(scores.dtype)  # [B, ..., 1]: c <= 1 - top_p in the scores' dtype
        ordered, order = torch.sort(scores, dim=-1, stable=True)
        remove = torch.softmax(ordered, dim=-1).cumsum(dim=-1) <= cut
        remove &= _row_view(limit < 1.0, scores)
        remove[..., -1] = False
        keep = torch.zeros_like(remove).scatter_(-1, order, ~remove)
        scores = scores.masked_fill(~keep, float("-inf"))
    if _min_p_in_force(rows):  # a row at min_p == 0 (or greedy) removes nothing: probs < 0 is never true
        scores = min_p_scores(scores, torch.where(rows.greedy, torch.zeros_like(rows.min_p), rows.min_p))
    return scores


def process_logits_rows(logits: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """:func:`process_logits` (``check=False``) of ``[B, ..., V]`` logits with each row under its
    own configuration, from the ``[B]`` tensors of ``rows`` in one pass (no group, no host read):
    per-row temperature, top-k and top-p (:func:`warped_scores_rows`), the softmax, and a greedy
    row one-hot at its argmax. Row ``b`` equals ``process_logits(logits[b], rows.configs[b])`` bit
    for bit (``tests/test_sampling_rows.py``); one configuration for every row is
    :func:`process_logits` itself."""
    if rows.uniform:
        return process_logits(logits, rows.configs[0], check=False)
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if all(c.greedy for c in rows.configs):
        return greedy_law(x)
    p = torch.softmax(warped_scores_rows(x, rows), dim=-1)
    if any(c.greedy for c in rows.configs):
        p = torch.where(_row_view(rows.greedy, p), greedy_law(x), p)
    return p


def top_k_logit_threshold_rows(logits: torch.Tensor, rows: RowSampling, per: int) -> torch.Tensor:
    """``[R]`` float32 :func:`top_k_logit_threshold` of ``[R, V]`` logits whose row ``r`` belongs to
    batch row ``r // per``, under that row's temperature and top-k (``-inf``: top-k off, or a
    greedy row); each the value it has alone."""
    R, vocab = logits.shape
    raw = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    k_max, _ = _in_force(rows, vocab)
    if k_max == 0:
        return torch.full((R,), float("-inf"), dtype=torch.float32, device=logits.device)
    temperature = torch.where(rows.greedy, torch.ones_like(rows.temperature), rows.temperature)
    top_k = torch.where(rows.greedy, torch.zeros_like(rows.top_k), rows.top_k)
    scores = _row_temperature_scores(raw, temperature.repeat_interleave(per))
    kth = _row_top_k_kth(scores, top_k.repeat_interleave(per), k_max)  # [R, 1]
    on = _row_view(top_k.repeat_interleave(per), kth)
    threshold = torch.where(scores >= kth, raw, torch.full_like(raw, float("inf"))).amin(dim=-1, keepdim=True)
    return torch.where((on > 0) & (on < vocab), threshold, torch.full_like(threshold, float("-inf"))).view(R).float()
