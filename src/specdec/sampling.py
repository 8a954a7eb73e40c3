"""Sampling configuration and THE function that turns logits into a distribution.

Losslessness needs the target law ``p`` and the draft law ``q`` to be processed
by exactly the same rule (temperature, then top-k, then top-p). Both the target
and every draft model go through :func:`process_logits`; nothing else in
specdec turns logits into probabilities.
"""

from __future__ import annotations

import math

import attrs
import torch

from specdec.errors import InvalidConfigError, InvalidDistributionError

__all__ = ["SamplingConfig", "process_logits", "check_distribution", "construction_config", "row_is_bad"]


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


@attrs.frozen
class SamplingConfig:
    """How next-token distributions are formed, for target and draft alike.

    Processing order (as in Hugging Face ``generate``): divide logits by
    ``temperature``, keep the ``top_k`` largest logits (ties with the k-th are
    kept), then keep the smallest set of most probable tokens whose mass
    reaches ``top_p``, and renormalise.

    Attributes:
        temperature: ``>= 0``. ``0`` means greedy: the distribution is one-hot on
            the first index of the maximal logit.
        top_k: ``>= 0``; ``0`` disables top-k.
        top_p: in ``(0, 1]``; ``1`` disables top-p.

    Example:
        >>> cfg = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9)
        >>> cfg.greedy
        False
    """

    temperature: float = attrs.field(default=1.0, validator=_check_temperature)
    top_k: int = attrs.field(default=0, validator=_check_top_k)
    top_p: float = attrs.field(default=1.0, validator=_check_top_p)

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
        SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)
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


def process_logits(
    logits: torch.Tensor, config: SamplingConfig, *, check: bool = True, source: str | None = None
) -> torch.Tensor:
    """Turn raw logits into the processed next-token distribution.

    This is the single definition of ``p`` and ``q`` in specdec
    (docs/concepts.md, glossary): temperature, then top-k, then top-p.

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
    """
    if check:
        _check_logits(logits, source)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if config.greedy:
        index = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits).scatter_(-1, index, 1.0)
    vocab = logits.shape[-1]
    if 0 < config.top_k < vocab:
        # dividing by temperature > 0 keeps the order, so the top-k set is taken
        # on the raw logits (exact; dividing first could round ties together)
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.temperature == 1.0:
        # softmax shifts by the row maximum itself, so this is bit for bit the
        # shifted form below, without two passes over [..., V]
        probs = torch.softmax(logits, dim=-1)
    else:
        # shift by the row maximum BEFORE dividing, so that a tiny temperature or
        # huge logits cannot overflow to +inf (which softmax would turn into NaN)
        scaled = (logits - logits.amax(dim=-1, keepdim=True)) / config.temperature
        probs = torch.softmax(scaled, dim=-1)
    if config.top_p < 1.0:
        keep = top_p_keep(probs.reshape(-1, vocab), config.top_p).reshape(probs.shape)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


_TOP_P_CANDIDATES = 1024


def _top_p_keep_sorted(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep mask over probabilities sorted in decreasing order: a token is kept
    iff the mass strictly before it is below ``top_p`` (the first always)."""
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep = mass_before < top_p
    keep[..., 0] = True
    return keep


def _top_p_keep_full(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    keep_sorted = _top_p_keep_sorted(sorted_probs, top_p)
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def top_p_keep(probs: torch.Tensor, top_p: float, *, sync_free: bool | None = None) -> torch.Tensor:
    """``[R, V]`` bool mask of the top-p (nucleus) set of each row of ``probs``.

    The set is the shortest prefix of the row sorted by (probability
    descending, token id ascending) whose mass reaches ``top_p``. A full sort of
    ``V`` entries per row dominates a CPU step, so each row's candidates are
    first narrowed to its 1024 largest entries: when the entries strictly above
    the candidates' smallest value already hold ``top_p`` of the mass, every
    token outside them is dropped and sorting the candidates alone gives the
    same set. Rows where that does not hold are sorted in full, which costs
    one host read (is every row settled?).

    Args:
        probs: ``[R, V]`` probabilities.
        top_p: in ``(0, 1)``.
        sync_free: sort every row in full, with no host read (the same set).
            Default: on CUDA tensors, where the read would stall the stream
            and a full sort is cheap; the narrowing elsewhere.
    """
    k = _TOP_P_CANDIDATES
    if sync_free is None:
        sync_free = probs.is_cuda
    if sync_free or k >= probs.shape[-1]:
        return _top_p_keep_full(probs, top_p)
    values, index = torch.topk(probs, k, dim=-1)
    # order the candidates by (value desc, index asc), as the stable full sort does
    index_sorted, perm = torch.sort(index, dim=-1)
    values_sorted, order = torch.sort(values.gather(-1, perm), dim=-1, descending=True, stable=True)
    index_sorted = index_sorted.gather(-1, order)
    keep_sorted = _top_p_keep_sorted(values_sorted, top_p)
    # a row is settled iff its first candidate equal to the smallest candidate value is dropped
    first_tie = (values_sorted > values_sorted[..., -1:]).sum(dim=-1, keepdim=True)
    settled = ~keep_sorted.gather(-1, first_tie).squeeze(-1)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, index_sorted, keep_sorted)
    if not bool(settled.all()):
        rows = torch.nonzero(~settled).flatten()
        keep[rows] = _top_p_keep_full(probs[rows], top_p)
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
