"""Why the speedup is bounded: the hardware-aware speedup bound of each row (issue 48).

Sequoia's model (Chen et al. 2024, "hardware-aware" tree sizes): a step that emits ``tau``
tokens on average costs the draft's forwards plus one target forward over the ``n`` tree
tokens, where autoregressive decoding pays one one-token target forward per token. So no
implementation of the method can beat:

    bound = tau * t_target(1) / (t_draft_step + t_target(n))

Every other cost of a step (verification, masks, cache compaction, Python) only lowers the
speedup below the bound. The bench reads the three costs from its own measurements: the
baseline's time per token (``t_target(1)`` and its loop), each row's draft and target time
per step (the engine's split), and the forward-cost curve ``t_target(n)`` that ``--budget
auto`` measures (:func:`~specdec.trees.sequoia.measure_forward_times`). Written as
``bound = tau / (d + r(n))`` with ``d`` the draft's cost per step and ``r(n) = t(n) / t(1)``
in units of a one-token target forward, it says what would change it: on a CPU where a
135M-parameter target costs ``r(n) = 1.3-1.7`` for ``n = 2-5`` and a draft forward
``d = 0.1-0.2`` of it per level, a tau of 1.4-1.8 leaves little; a GPU (``r(n) ~ 1`` up to
tens of tokens) or a larger target beside the same draft (smaller ``d``) lets the bound
approach tau.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from specdec.errors import InvalidConfigError

__all__ = ["bound_lines", "forward_curve", "speedup_bound", "tree_forward_time"]


def speedup_bound(tau: float, t_one: float, t_draft_step: float, t_tree: float) -> float:
    """``tau * t_one / (t_draft_step + t_tree)`` (module docstring).

    Raises:
        InvalidConfigError: a cost that is not a finite number (``t_one`` and ``t_tree`` > 0,
            ``t_draft_step`` >= 0) or ``tau < 1``.

    Example:
        >>> round(speedup_bound(1.4, 0.036, 0.010, 0.045), 3)
        0.916
    """
    for name, value, low in (("t_one", t_one, 0.0), ("t_tree", t_tree, 0.0)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low:
            raise InvalidConfigError(f"speedup bound: {name} must be a positive finite time, got {value!r}")
    if not isinstance(t_draft_step, (int, float)) or not math.isfinite(t_draft_step) or t_draft_step < 0:
        raise InvalidConfigError(f"speedup bound: t_draft_step must be a finite time >= 0, got {t_draft_step!r}")
    if not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau < 1.0:
        raise InvalidConfigError(f"speedup bound: tau must be a finite number >= 1, got {tau!r}")
    return float(tau) * float(t_one) / (float(t_draft_step) + float(t_tree))


def forward_curve(times: Mapping[Any, Any]) -> dict[int, float]:
    """The forward-cost curve ``{tokens: seconds}`` from a mapping with int or string keys (a
    ``results.json`` / run-log copy of ``forward_time_s``), checked.

    Raises:
        InvalidConfigError: an empty curve, no one-token forward, a size that is not a positive
            int, or a time that is not a positive finite number (a forward that failed or was
            never measured is never replaced by a guess).
    """
    curve: dict[int, float] = {}
    for key, value in times.items():
        try:
            n = int(key)
        except (TypeError, ValueError):
            raise InvalidConfigError(f"forward-cost curve: size {key!r} is not an int") from None
        if n < 1:
            raise InvalidConfigError(f"forward-cost curve: size {n} < 1")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InvalidConfigError(f"forward-cost curve: the forward of {n} tokens has no valid time ({value!r}); "
                                     "it could not be measured, so no bound is computed from it")
        curve[n] = float(value)
    if 1 not in curve:
        raise InvalidConfigError(f"forward-cost curve: no one-token forward among sizes {sorted(curve)}")
    return dict(sorted(curve.items()))


def tree_forward_time(curve: Mapping[int, float], n: float) -> float:
    """``t_target(n)`` interpolated linearly between the measured sizes around ``n``.

    Raises:
        InvalidConfigError: ``n`` outside the measured sizes (no extrapolation).

    Example:
        >>> tree_forward_time({1: 0.030, 3: 0.040, 5: 0.050}, 4)
        0.045
    """
    sizes = sorted(curve)
    if not sizes or not sizes[0] <= n <= sizes[-1]:
        raise InvalidConfigError(f"a tree of {n:g} tokens is outside the measured forward sizes {sizes}")
    lo = max(s for s in sizes if s <= n)
    hi = min(s for s in sizes if s >= n)
    if lo == hi:
        return curve[lo]
    return round(curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo), 12)


def bound_lines(records: Sequence[Mapping[str, Any]], curve_times: Mapping[Any, Any] | None) -> list[str]:
    """The summary's lines on the speedup bound: per speculative row and temperature, tau, the
    draft's and the target's cost per step in one-token target forwards, the bound and the
    measured speedup; then the forward-cost curve (when ``--budget auto`` measured it).

    ``t(1)`` is the baseline's measured time per token at the temperature (its own loop
    included), so the measured speedup cannot exceed the bound; rows without the engine's
    time split (the transformers peer) are named, not estimated.

    Raises:
        InvalidConfigError: a curve that is not a valid measurement (:func:`forward_curve`).
    """
    curve = forward_curve(curve_times) if curve_times is not None else None
    lines = ["speedup bound (Sequoia's hardware-aware model: tau * t(1) / (draft per step + target forward "
             "per step), t(1) = the baseline's time per token; docs/bench.md 'Why the speedup is bounded'):"]
    base = {r["temperature"]: r for r in records if r.get("kind") == "autoregressive"}
    peers: list[str] = []
    unsplit: list[str] = []
    for r in records:
        if r.get("kind") != "speculative":
            if r.get("kind") == "peer":
                peers.append(str(r["method"]))
            continue
        b = base.get(r["temperature"])
        steps, new = r.get("target_forwards") or 0, (b or {}).get("new_tokens") or 0
        if b is None or not steps or not new or not b.get("time_total"):
            continue
        t_one = float(b["time_total"]) / new
        split = [r.get("time_draft"), r.get("time_target")]
        times = [float(x) for x in split if x is not None]
        if len(times) != 2 or not all(math.isfinite(x) for x in times) or not times[1] > 0 or not r["tau"] >= 1:
            unsplit.append(f"T={r['temperature']:g} {r['method']}")  # batched runs record no time split
            continue
        draft, target = times[0] / steps, times[1] / steps
        bound = speedup_bound(float(r["tau"]), t_one, draft, target)
        lines.append(f"  T={r['temperature']:g} {r['method']}: tau {r['tau']:.2f}, draft {draft / t_one:.2f} + target "
                     f"{target / t_one:.2f} of t(1) per step -> bound {bound:.2f}x (measured {r['speedup']:.2f}x)")
    if unsplit:
        lines.append(f"  ({', '.join(unsplit)}: no time split recorded (batched runs record none), no bound)")
    if peers:
        lines.append(f"  ({', '.join(peers)}: transformers' loop has no time split here; "
                     "benchmarks/step_split.py splits it)")
    if curve is not None:
        one = curve[1]
        lines.append("  target forward cost t(n)/t(1) on this machine: "
                     + ", ".join(f"n={n}: {t / one:.2f}" for n, t in curve.items())
                     + f" (t(1) = {1e3 * one:.1f} ms). The bound is tau / (draft + t(n)/t(1)): where t(n)/t(1) "
                     "stays near 1 for tens of tokens (a GPU) and the draft is a small share of a target "
                     "forward (a larger target), it approaches tau.")
    else:
        lines.append("  (no forward-cost curve: it is measured with --budget auto)")
    return lines
