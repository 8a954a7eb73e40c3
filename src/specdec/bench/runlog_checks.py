"""The checks of a ``runs.jsonl`` line (:func:`~specdec.bench.runlog.read_runlog`; docs/bench.md).

Every record is checked field by field before anything reads it: the types
(integers are JSON integers, never booleans; numbers are finite), the ranges
(``steps >= 1``, ``0 <= new_tokens <= max_new_tokens``, ``emitted >=
new_tokens``, times ``>= 0``, token ids ``>= 0``...), the counts that must
agree (``len(tokens) == new_tokens``; per depth ``accepted <= attempted <=
steps``, both non-increasing with the depth, ``attempted <= drafted <= steps`` where
``depth_drafted`` is logged, and with per-depth counts
``emitted == steps + sum(depth_accepted)``: each step emits its accepted drafts
and one bonus token), and the place of the generation in the sweep its header
describes (row, temperature, seed, prompt, and the unit those make). The
header's fields that the checks and the report's rows use are checked first. A failed check is an
:class:`~specdec.errors.InvalidConfigError` naming the file and the line.

Every log that specdec has written passes: these are what its writer does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from specdec.bench.rows import RowSpec
from specdec.bench.sweep import bench_units
from specdec.errors import InvalidConfigError

__all__ = ["SweepShape", "sweep_shape", "check_record", "REQUIRED_KEYS"]

REQUIRED_KEYS = ("sequence", "unit", "prompt_index", "temperature", "seed", "row", "new_tokens", "steps", "emitted",
                 "depth_attempted", "depth_accepted", "time_total", "time_prefill", "time_draft", "time_target",
                 "time_verify", "tokens")
"""Keys every record has (``depth_optimum``, ``optimum_bound``, ``budget_nodes``, ``budget_depth`` and
``depth_drafted`` are optional: logs written before they existed lack them)."""

_INT_KEYS = ("sequence", "unit", "prompt_index", "seed", "new_tokens", "steps", "emitted")
_TIME_KEYS = ("time_total", "time_prefill", "time_draft", "time_target", "time_verify")


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters (a corrupt line may hold a 4,000-digit number)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for str()
        return f"an int of about {value.bit_length() * 30103 // 100000} digits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v: Any) -> float | None:
    """``v`` as a finite float, None when it is not a finite JSON number (bools, NaN,
    infinities and integers too large for a float included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


@attrs.frozen
class SweepShape:
    """What a header says about its sweep (the records are checked against it).

    Attributes:
        rows: the row names.
        temperatures: the temperatures.
        seeds: the seeds.
        num_prompts: prompts used.
        max_new_tokens: the new tokens per generation (None: the header has none).
        units: ``(prompt index, temperature, seed) -> unit index``
            (:func:`~specdec.bench.sweep.bench_units`).
    """

    rows: frozenset[str]
    temperatures: frozenset[float]
    seeds: tuple[int, ...]
    num_prompts: int
    max_new_tokens: int | None
    units: Mapping[tuple[int, float, int], int]


def sweep_shape(header: Mapping[str, Any], where: str) -> SweepShape:
    """The :class:`SweepShape` of a header's ``config`` and ``resolved`` (``where``: ``"file:1"``).

    Raises:
        InvalidConfigError: a field the checks use has the wrong type or range.
    """
    cfg, res = header["config"], header["resolved"]

    def bad(field: str, why: str) -> InvalidConfigError:
        return InvalidConfigError(f"{where}: the header's {field} {why} (corrupt run log)")

    rows = cfg.get("rows") or []
    if not isinstance(rows, list) or not all(isinstance(r, str) for r in rows):
        raise bad("config.rows", f"is not a list of row names ({_short(rows)})")
    described = res.get("rows")
    if described is not None:  # the report builds its rows from these (synthetic logs may leave them out)
        fields = attrs.fields_dict(RowSpec)
        if not isinstance(described, list) or not all(
                isinstance(r, dict) and set(r) <= set(fields) and isinstance(r.get("name"), str)
                and isinstance(r.get("kind"), str) for r in described):
            raise bad("resolved.rows", f"is not a list of rows (objects with {', '.join(fields)}: name and kind "
                                       "strings)")
        if [r["name"] for r in described] != rows:
            raise bad("resolved.rows", f"names {_short([r['name'] for r in described], 80)} are not config.rows "
                                       f"{_short(rows, 80)}")
    temps_raw = cfg.get("temperatures") or []
    temps = [_finite(t) for t in temps_raw] if isinstance(temps_raw, list) else [None]
    if any(t is None or t < 0 for t in temps):
        raise bad("config.temperatures", f"is not a list of temperatures >= 0 ({_short(temps_raw)})")
    seeds = cfg.get("seeds") or []
    if not isinstance(seeds, list) or not all(_is_int(s) for s in seeds):
        raise bad("config.seeds", f"is not a list of integers ({_short(seeds)})")
    max_new = cfg.get("max_new_tokens")
    if max_new is not None and (not _is_int(max_new) or max_new < 1):
        raise bad("config.max_new_tokens", f"is not an integer >= 1 ({_short(max_new)})")
    prompts = res.get("prompts") or {}
    ids = (prompts.get("ids") or []) if isinstance(prompts, Mapping) else None
    if not isinstance(ids, list):
        raise bad("resolved.prompts.ids", f"is not a list ({_short(ids)})")
    expected = res.get("expected_runs")
    if not _is_int(expected) or expected < 0:
        raise bad("resolved.expected_runs", f"is not an integer >= 0 ({_short(expected)})")
    floats = [float(t) for t in temps if t is not None]
    units = {u: i for i, u in enumerate(bench_units(len(ids), floats, seeds))}
    return SweepShape(frozenset(rows), frozenset(floats), tuple(seeds), len(ids), max_new, units)


def _int_list(rec: Mapping[str, Any], key: str, bad: Any) -> list[int]:
    v = rec[key]
    if not isinstance(v, list):
        raise bad(key, f"has the wrong type ({type(v).__name__})")
    for i, x in enumerate(v):
        if not _is_int(x) or x < 0:
            raise bad(key, f"holds {_short(x)} at index {i}: an integer >= 0 was expected")
    return v


def check_record(rec: Any, where: str, shape: SweepShape) -> None:
    """Check one record (a parsed line) field by field (``where``: ``"file:line"``).

    Raises:
        InvalidConfigError: naming ``where``, the field and what is wrong with it.
    """
    if not isinstance(rec, dict):
        raise InvalidConfigError(f"{where}: expected a JSON object (one generation per line)")
    for key in REQUIRED_KEYS:
        if key not in rec:
            raise InvalidConfigError(f"{where}: record without {key!r} (corrupt or foreign run log)")

    def bad(key: str, why: str) -> InvalidConfigError:
        return InvalidConfigError(f"{where}: {key!r} {why} (corrupt run log)")

    # ---- types
    for key in _INT_KEYS:
        if not _is_int(rec[key]):
            raise bad(key, f"has the wrong type ({type(rec[key]).__name__})")
    if not isinstance(rec["row"], str):
        raise bad("row", f"has the wrong type ({type(rec['row']).__name__})")
    temperature = _finite(rec["temperature"])
    if temperature is None:
        t = rec["temperature"]
        raise (bad("temperature", f"has the wrong type ({type(t).__name__})") if not isinstance(t, (int, float))
               or isinstance(t, bool) else bad("temperature", f"is {_short(t)}: not a finite number"))
    for key in _TIME_KEYS:
        v = rec[key]
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad(key, f"has the wrong type ({type(v).__name__})")
        f = _finite(v)
        if f is None or f < 0:
            raise bad(key, f"is {_short(v)}: seconds are a finite number >= 0 (or null)")
    tokens = _int_list(rec, "tokens", bad)
    attempted = _int_list(rec, "depth_attempted", bad)
    accepted = _int_list(rec, "depth_accepted", bad)
    optimum = rec.get("depth_optimum", [])
    if not isinstance(optimum, list):
        raise bad("depth_optimum", f"has the wrong type ({type(optimum).__name__})")
    for i, x in enumerate(optimum):
        f = _finite(x)
        if f is None or f < 0:
            raise bad("depth_optimum", f"holds {_short(x)} at index {i}: a finite number >= 0 was expected")
    if "optimum_bound" in rec and not isinstance(rec["optimum_bound"], bool):
        raise bad("optimum_bound", f"has the wrong type ({type(rec['optimum_bound']).__name__})")
    for key in ("budget_nodes", "budget_depth"):
        v = rec.get(key)
        if v is not None and (not _is_int(v) or v < 1):
            raise bad(key, f"is {_short(v)}: an integer >= 1 (or null) was expected")

    # ---- the generation's place in the sweep
    pi, seed, row = rec["prompt_index"], rec["seed"], rec["row"]
    if row not in shape.rows or temperature not in shape.temperatures or seed not in shape.seeds \
            or not 0 <= pi < shape.num_prompts or (pi, temperature, seed) not in shape.units:
        raise InvalidConfigError(
            f"{where}: generation {_short(row)} T={_short(rec['temperature'])} seed {_short(seed)} prompt {_short(pi)} "
            "is outside the sweep the header describes (foreign or edited run log)"
        )
    unit = shape.units[(pi, temperature, seed)]
    if rec["unit"] != unit:
        raise bad("unit", f"is {_short(rec['unit'])}, but prompt {pi} at T={temperature:g} with seed {seed} is unit "
                          f"{unit} of the sweep")

    # ---- ranges and the counts that must agree
    if rec["sequence"] < 0:
        raise bad("sequence", f"is {_short(rec['sequence'])}: must be >= 0")
    new = rec["new_tokens"]
    if new < 0 or (shape.max_new_tokens is not None and new > shape.max_new_tokens):
        raise bad("new_tokens", f"is {_short(new)}: must be between 0 and max_new_tokens "
                                f"({shape.max_new_tokens})")
    if len(tokens) != new:
        raise bad("tokens", f"holds {len(tokens)} tokens, but new_tokens is {new}")
    steps, emitted = rec["steps"], rec["emitted"]
    if steps < 1:
        raise bad("steps", f"is {_short(steps)}: a generation makes at least one target forward")
    if emitted < new:
        raise bad("emitted", f"is {_short(emitted)}, less than new_tokens ({new}): the new tokens are emitted ones")
    if len(attempted) != len(accepted):
        raise bad("depth_accepted", f"has {len(accepted)} depths, depth_attempted {len(attempted)}")
    for d, (att, acc) in enumerate(zip(attempted, accepted)):
        if not acc <= att <= steps:
            raise bad("depth_accepted", f"at depth {d + 1}: {acc} accepted of {att} attempted in {steps} steps "
                                        "(accepted <= attempted <= steps)")
        if d and (att > attempted[d - 1] or acc > accepted[d - 1]):
            raise bad("depth_attempted", f"at depth {d + 1} exceeds depth {d} (attempted {attempted[d - 1]} -> {att}, "
                                         f"accepted {accepted[d - 1]} -> {acc}): a step reaches a depth through "
                                         "the ones above it")
    if attempted and emitted != steps + sum(accepted):
        raise bad("emitted", f"is {_short(emitted)}, not steps + accepted drafts ({steps} + {sum(accepted)})")
    if "depth_drafted" in rec:  # the per-position counts (optional: older logs lack them)
        drafted = _int_list(rec, "depth_drafted", bad)
        if len(drafted) < len(attempted):
            raise bad("depth_drafted", f"has {len(drafted)} depths, fewer than depth_attempted's {len(attempted)}: "
                                       "a tested depth was drafted")
        for d, n in enumerate(drafted):
            att = attempted[d] if d < len(attempted) else 0
            if not att <= n <= steps:
                raise bad("depth_drafted", f"at depth {d + 1}: {n} drafted, {att} attempted in {steps} steps "
                                           "(attempted <= drafted <= steps)")
            if d and n > drafted[d - 1]:
                raise bad("depth_drafted", f"at depth {d + 1} exceeds depth {d} ({drafted[d - 1]} -> {n}): a tree "
                                           "reaches a depth through the ones above it")
    if len(optimum) > len(attempted):
        raise bad("depth_optimum", f"has {len(optimum)} depths, depth_attempted {len(attempted)}")
