"""The per-node math of every verification rule, as small pure functions.

Each function takes and returns tensors over the vocabulary (``[V]``) and does
one algorithmic step of a rule of docs/verifiers.md; the verifiers in this package
only do the bookkeeping (which child is tested next, drawing through the
:class:`~specdec.rng.RandomSource`). Words:

- ``p``: the target's processed distribution at the node, ``[V]``.
- ``q``: the proposal law the node's sampled children were drawn from (the
  recorded ``q'`` of the tree, made dense), ``[V]``.
- *residual* ``P``: what is left of ``p`` after the children tested so far
  were rejected, always kept normalised, ``[V]``; it starts as ``norm(p)``.
- *accept probability*: the probability with which the child under test is
  accepted; on rejection the residual is updated and the next child tested;
  when no child is left the *bonus* token is drawn from the residual.

Numerical care. All functions work in the dtype of their inputs (float64 in
the exact tests, float32 in production). A residual whose mass rounds to zero
can only be reached through a rejection whose exact probability is zero (for
example ``P == q`` up to rounding, where every draw is accepted with
probability ``1 - O(eps)``); there the mathematically undefined residual is
replaced by the current one (``fallback``), never by NaN.

Example (rule 3, one i.i.d. child drawn from ``q``):
    >>> import torch
    >>> p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    >>> float(rejection_accept_prob(p, q, 1))  # min(1, 0.3 / 0.6)
    0.5
    >>> rejection_residual(p, q).tolist()  # norm([p - q]+)
    [1.0, 0.0, 0.0]
"""

from __future__ import annotations

import bisect

import torch

__all__ = [
    "working_dtype",
    "normalise",
    "match_accept_prob",
    "match_residual",
    "rejection_accept_prob",
    "rejection_residual",
    "without_replacement_update",
    "kseq_rho",
    "kseq_beta",
    "kseq_accept_prob",
    "kseq_residual",
]


def working_dtype(p: torch.Tensor) -> torch.dtype:
    """The dtype the rules compute in for a target row ``p``: ``p``'s own
    dtype, except that float16/bfloat16 are promoted to float32."""
    return torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype


def normalise(v: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``norm(v) = v / sum(v)``; if ``sum(v)`` is not positive (the mass
    rounded away, see the module docstring) return ``norm(fallback)``.

    Args:
        v: ``[V]`` non-negative weights.
        fallback: ``[V]`` non-negative weights with positive sum.

    Returns:
        ``[V]`` probabilities summing to 1.
    """
    mass = v.sum()
    if bool(mass > 0):
        return v / mass
    return fallback / fallback.sum()


# ----------------------------------------------------------------- rule 2
def match_accept_prob(P: torch.Tensor, x: int) -> torch.Tensor:
    """Sample-and-match (docs/verifiers.md rule 2, sequential form): the child
    ``x`` is accepted with probability ``P(x)``.

    Args:
        P: ``[V]`` current residual (normalised).
        x: token of the child under test.

    Returns:
        ``[]`` accept probability ``P(x)``.
    """
    return P[x]


def match_residual(P: torch.Tensor, x: int) -> torch.Tensor:
    """Rule 2 after rejecting ``x``: ``P(x) = 0``, renormalise.

    Args:
        P: ``[V]`` current residual (normalised).
        x: token of the rejected child.

    Returns:
        ``[V]`` the new residual ``norm(P with P(x) = 0)``. Rejection has
        probability ``1 - P(x)``; if that is zero (up to rounding) ``P`` is
        returned unchanged (the branch has no probability).
    """
    R = P.clone()
    R[x] = 0
    return normalise(R, fallback=P)


# ------------------------------------------------------------ rules 3 and 4
def rejection_accept_prob(P: torch.Tensor, q: torch.Tensor, x: int) -> torch.Tensor:
    """Recursive rejection (docs/verifiers.md rules 3, 4 and the sampled part of
    rule 5): the child ``x``, drawn from ``q``, is accepted with probability
    ``min(1, P(x) / q(x))``.

    Args:
        P: ``[V]`` current residual (normalised).
        q: ``[V]`` the law ``x`` was drawn from (for rule 4: after the
            without-replacement updates of the earlier draws); ``q(x) > 0``.
        x: token of the child under test.

    Returns:
        ``[]`` accept probability.
    """
    return torch.clamp(P[x] / q[x], max=1.0)


def rejection_residual(P: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Rules 3/4 after a rejection: ``P = norm([P - q]+)``.

    Args:
        P: ``[V]`` current residual (normalised).
        q: ``[V]`` the law of the rejected draw.

    Returns:
        ``[V]`` the new residual. Its exact mass ``sum([P - q]+)`` is the
        rejection probability; if it rounds to zero, ``P`` is returned
        (see the module docstring).
    """
    return normalise(torch.clamp_min(P - q, 0), fallback=P)


def without_replacement_update(q: torch.Tensor, x: int) -> torch.Tensor:
    """Rule 4: the next draw without replacement comes from ``q`` with ``x``
    removed: ``q(x) = 0; q = norm(q)``.

    Args:
        q: ``[V]`` the law of the draw just rejected.
        x: its token.

    Returns:
        ``[V]`` the law of the next draw. Only called when a next draw exists,
        i.e. ``q`` has mass outside ``x``.
    """
    r = q.clone()
    r[x] = 0
    return normalise(r, fallback=q)


# ------------------------------------------------------------ rule 6, K-SEQ
def _g(beta: float, k: int) -> float:
    """``(1 - (1 - beta)^k) / beta = sum_{i<k} (1 - beta)^i``, stable at beta -> 0."""
    a = 1.0 - beta
    return sum(a**i for i in range(k))


def kseq_beta(p_s: torch.Tensor, q_s: torch.Tensor, rho: float) -> float:
    """SpecTr's ``beta(rho) = sum_x min(q(x), p(x) / rho)`` (docs/verifiers.md rule 6).

    Args:
        p_s: ``[M]`` target probabilities on the support of ``q``.
        q_s: ``[M]`` the proposal law on its support.
        rho: the ratio ``rho >= 1``.

    Returns:
        ``beta`` as a Python float.
    """
    return float(torch.minimum(q_s, p_s / rho).sum())


def kseq_rho(p_s: torch.Tensor, q_s: torch.Tensor, k: int) -> float:
    """The K-SEQ ratio (SpecTr, Sun et al. 2023, docs/verifiers.md rule 6): the
    smallest ``rho in [1, k]`` with ``1 - (1 - beta(rho))^k <= rho * beta(rho)``.

    Any ``rho`` satisfying the inequality makes K-SEQ exact as long as the
    acceptance test and the residual use that same ``rho``: the accepted mass
    of ``x`` is ``min(q(x), p(x)/rho) (1 - (1-beta)^k) / beta <= p(x)`` and the
    residual supplies the rest. The smallest such ``rho`` maximises acceptance.
    The search is a bisection over ``[1, k]`` on the piecewise form
    ``beta(rho) = A_m + B_m / rho`` (``m`` = number of tokens with
    ``p/q >= rho``) and returns the upper end of the final bracket, so the
    returned value always satisfies the inequality (``rho = k`` does, by
    Bernoulli's inequality) and is within a few ulps of the smallest one.

    Args:
        p_s: ``[M]`` target probabilities on the support of ``q``.
        q_s: ``[M]`` the proposal law on its support (positive entries).
        k: number of i.i.d. draws tested at the node, ``k >= 1``.

    Returns:
        ``rho`` as a Python float.
    """
    if k <= 1:
        return 1.0
    positive = q_s > 0
    p_s, q_s = p_s[positive], q_s[positive]
    ratio = (p_s / q_s).tolist()
    qs, ps = q_s.tolist(), p_s.tolist()
    order = sorted(range(len(ratio)), key=lambda j: ratio[j])  # ascending ratio
    r_sorted = [ratio[j] for j in order]
    # prefix sums in ascending-ratio order: tokens with ratio < rho contribute p/rho,
    # the others q.
    p_below = [0.0]
    for j in order:
        p_below.append(p_below[-1] + ps[j])
    q_above = [0.0] * (len(order) + 1)
    for i in range(len(order) - 1, -1, -1):
        q_above[i] = q_above[i + 1] + qs[order[i]]

    def beta(rho: float) -> float:
        m = bisect.bisect_left(r_sorted, rho)  # entries with ratio < rho
        return q_above[m] + p_below[m] / rho

    def ok(rho: float) -> bool:
        b = beta(rho)
        return b <= 0.0 or rho >= _g(b, k)

    if ok(1.0):
        return 1.0
    lo, hi = 1.0, float(k)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def kseq_accept_prob(P: torch.Tensor, q: torch.Tensor, x: int, rho: float) -> torch.Tensor:
    """K-SEQ: draw ``x`` is accepted with probability ``min(1, p(x) / (rho q(x)))``.

    Args:
        P: ``[V]`` the target row ``p`` (normalised; K-SEQ does not update it
            between draws).
        q: ``[V]`` the law of the i.i.d. draws; ``q(x) > 0``.
        x: token of the draw under test.
        rho: from :func:`kseq_rho`.

    Returns:
        ``[]`` accept probability.
    """
    return torch.clamp(P[x] / (rho * q[x]), max=1.0)


def kseq_residual(P: torch.Tensor, q: torch.Tensor, rho: float, k: int) -> torch.Tensor:
    """K-SEQ bonus law when all ``k`` draws are rejected:
    ``norm(p - min(q, p/rho) (1 - (1-beta)^k) / beta)`` with ``beta = beta(rho)``.

    Args:
        P: ``[V]`` the target row ``p`` (normalised).
        q: ``[V]`` the law of the draws.
        rho: the same ``rho`` the acceptance tests used.
        k: number of draws.

    Returns:
        ``[V]`` the residual law (mass ``(1 - beta)^k`` before normalising;
        tiny negative rounding is clipped to 0).
    """
    accepted = torch.minimum(q, P / rho)
    beta = float(accepted.sum())
    coeff = _g(beta, k) if beta > 0.0 else float(k)
    return normalise(torch.clamp_min(P - accepted * coeff, 0), fallback=P)
