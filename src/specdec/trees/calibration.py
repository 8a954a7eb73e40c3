"""The ``"calibrated"`` proxy of Rheo's sampled slots: its bins, its table, its weights.

Below both the per-node builder (:mod:`specdec.trees.rheo`) and the level-wise one
(:mod:`specdec.trees.levelwise`); the table is measured by :func:`specdec.tune.profile_calibration`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from specdec.errors import InvalidConfigError

__all__ = ["CALIBRATION_EDGES", "Calibration", "calibrated_weight", "check_calibration"]


CALIBRATION_EDGES = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
"""Lower edges of the bins of the ``"calibrated"`` proxy: a displaced weight ``w`` falls in
bin ``b``, the last ``b`` with ``CALIBRATION_EDGES[b] <= w`` (the last bin is ``[0.9, 1]``)."""

Calibration = tuple[tuple[float, ...], ...]
"""A ``"calibrated"`` proxy's table: row ``i`` (draws past the last row use it) holds one
weight per bin of :data:`CALIBRATION_EDGES`."""


def check_calibration(value: object) -> Calibration:
    """``value`` as a :data:`Calibration`: rows of ``len(CALIBRATION_EDGES)`` numbers in ``[0, 1]``,
    each row non-decreasing from bin to bin and no row above the one before it in any bin. The
    draws of a node have non-increasing displaced weights, so under these two orders their
    calibrated weights are non-increasing too, and the global top-``N`` (ties broken by creation,
    i.e. draw, order) keeps a prefix of every node's draws, as rule 4 needs: with a table
    violating them a later draw could be kept without an earlier one, and the output law breaks
    (``tests/trees/test_exact_trees.py`` shows it).

    Raises:
        InvalidConfigError: anything else.
    """
    bins = len(CALIBRATION_EDGES)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise InvalidConfigError(f"calibration must be a non-empty sequence of rows of {bins} weights, got {value!r}")
    rows = []
    for i, row in enumerate(value):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != bins:
            raise InvalidConfigError(f"calibration row {i} must hold {bins} weights (one per bin of "
                                     f"CALIBRATION_EDGES), got {row!r}")
        for w in row:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= float(w) <= 1.0:
                raise InvalidConfigError(f"calibration weights must be numbers in [0, 1], row {i} has {w!r}")
        rows.append(tuple(float(w) for w in row))
    for i, row in enumerate(rows):
        if any(a > b for a, b in zip(row, row[1:])):
            raise InvalidConfigError(
                f"calibration row {i} must not decrease from bin to bin, got {row}: the draws of a node have "
                "non-increasing displaced weights, and their calibrated weights must not increase either, or a "
                "later draw could be kept without an earlier one (docs/trees.md, \"Proxies\")")
        if i and any(a > b for a, b in zip(row, rows[i - 1])):
            raise InvalidConfigError(
                f"calibration row {i} must not exceed row {i - 1} in any bin, got {row} after {rows[i - 1]}: a later "
                "draw must never outweigh an earlier one (docs/trees.md, \"Proxies\")")
    return tuple(rows)


def calibrated_weight(displaced: float, draw: int, table: Calibration) -> float:
    """The ``"calibrated"`` proxy of the ``draw``-th sampled child (from 0) whose displaced
    weight (the ranking law's ``q`` at the child's rank) is ``displaced``: ``table``'s entry
    at row ``min(draw, rows - 1)`` and ``displaced``'s bin of :data:`CALIBRATION_EDGES`.

    Example:
        >>> table = (tuple(0.5 for _ in CALIBRATION_EDGES), tuple(0.1 * (b % 2) for b in range(11)))
        >>> calibrated_weight(0.3, 0, table), calibrated_weight(0.001, 1, table), calibrated_weight(0.007, 5, table)
        (0.5, 0.0, 0.1)
    """
    return table[min(draw, len(table) - 1)][_bin(displaced)]


def _bin(weight: float) -> int:
    """The bin of ``weight`` among :data:`CALIBRATION_EDGES` (the last edge ``<= weight``)."""
    return max(0, bisect.bisect_right(CALIBRATION_EDGES, weight) - 1)


def _need_table(calibration: Calibration | None) -> Calibration:
    if calibration is None:
        raise InvalidConfigError("proxy='calibrated' needs a calibration table (specdec.tune.profile_calibration "
                                 "measures one; specdec bench profiles it for rows with proxy=calibrated)")
    return calibration
