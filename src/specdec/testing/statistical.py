"""Seeded goodness-of-fit tests for end-to-end losslessness checks.

The exact tests (:func:`~specdec.testing.enumerate.exact_law`) prove each
rule; these check the real generation loop by sampling, against a law that is
known exactly (e.g. a :class:`~specdec.models.CallableLM` given by tables).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping

import attrs
import torch

__all__ = ["ChiSquareResult", "chi_square_test", "total_variation"]


@attrs.frozen
class ChiSquareResult:
    """Pearson chi-square goodness of fit.

    Attributes:
        statistic: the chi-square statistic.
        dof: degrees of freedom (bins - 1).
        p_value: upper tail probability of ``statistic`` under the law.
        n: number of samples.
        bins: number of bins after merging small-expectation cells.
        unexpected: samples that fell on outcomes of probability 0.
    """

    statistic: float
    dof: int
    p_value: float
    n: int
    bins: int
    unexpected: int


def chi_square_test(samples: Iterable[Hashable], law: Mapping[Hashable, float], min_expected: float = 5.0) -> ChiSquareResult:
    """Test that ``samples`` are draws from ``law``.

    Cells whose expected count is below ``min_expected`` are pooled into one
    bin (pooled bins below the threshold are merged into the smallest regular
    bin). A sample outside the law's support gives ``p_value = 0``.

    Args:
        samples: the observed outcomes.
        law: ``{outcome: probability}`` summing to 1.
        min_expected: pooling threshold.

    Example:
        >>> import random
        >>> rnd = random.Random(0)
        >>> res = chi_square_test([rnd.random() < 0.3 for _ in range(2000)], {True: 0.3, False: 0.7})
        >>> res.p_value > 0.01
        True
    """
    counts = Counter(samples)
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples")
    unexpected = sum(c for k, c in counts.items() if law.get(k, 0.0) <= 0.0)
    if unexpected:
        return ChiSquareResult(float("inf"), 0, 0.0, n, 0, unexpected)
    cells = sorted(((p * n, counts.get(k, 0)) for k, p in law.items() if p > 0), reverse=True)
    bins: list[list[float]] = []
    pool = [0.0, 0.0]
    for expected, observed in cells:
        if expected >= min_expected:
            bins.append([expected, observed])
        else:
            pool[0] += expected
            pool[1] += observed
    if pool[0] > 0:
        if pool[0] >= min_expected or not bins:
            bins.append(pool)
        else:
            bins[-1][0] += pool[0]
            bins[-1][1] += pool[1]
    statistic = sum((o - e) ** 2 / e for e, o in bins)
    dof = len(bins) - 1
    if dof <= 0:
        return ChiSquareResult(statistic, 0, 1.0, n, len(bins), 0)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return ChiSquareResult(statistic, dof, p_value, n, len(bins), 0)


def total_variation(samples: Iterable[Hashable], law: Mapping[Hashable, float]) -> float:
    """Total-variation distance between the empirical law of ``samples`` and ``law``."""
    counts = Counter(samples)
    n = sum(counts.values())
    keys = set(counts) | set(law)
    return 0.5 * sum(abs(counts.get(k, 0) / n - law.get(k, 0.0)) for k in keys)
