"""Benchmark output: the terminal table, the goal check, ``results.json`` and the output folder.

``results.json`` is a JSON list of the records :func:`specdec.bench.runner.aggregate`
returns (schema in ``docs/bench.md``); ``meta.json`` records how the run was
made; ``runs.jsonl`` holds one line per generate call
(:mod:`specdec.bench.runlog`). :func:`write_report` rebuilds all of it from a
sweep's log, with the plots of :mod:`specdec.bench.plots`; Spec-Bench's own
report is :mod:`specdec.bench.spec_bench`'s.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.bench.bound import bound_lines
from specdec.bench.budget import Budget
from specdec.bench.hashes import HASH_KEY, check_budget_choices
from specdec.bench.plots import PLOT_FILES, write_plots, write_temperature_plot
from specdec.bench.rows import RowSpec, kind_rank
from specdec.bench.runlog import RUNS_FILE, RunLog, identity_differences, logged_budget, read_runlog, strict_json
from specdec.bench.runner import aggregate
from specdec.bench.sweep import OPTIMUM_NOTE, RunRecord
from specdec.errors import InvalidConfigError

if TYPE_CHECKING:
    from rich.console import JustifyMethod

__all__ = [
    "results_table",
    "format_cell",
    "gap_text",
    "write_results",
    "goal_summary",
    "goal_lines",
    "check_out_dir",
    "remove_stale_outputs",
    "open_out_dir",
    "write_report",
    "write_meta",
    "budget_lines",
    "OUTPUT_FILES",
]

OUTPUT_FILES: tuple[str, ...] = ("results.json", "meta.json", "runs.jsonl", "spec_bench.json", *PLOT_FILES)
"""Every file ``specdec bench --out DIR`` writes: a folder holding one of them holds an earlier run's results."""


def format_cell(x: Any, spec: str = ".2f") -> str:
    """A table cell: ``x`` formatted with ``spec``, ``-`` for a missing or NaN value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def gap_text(rec: Mapping[str, Any]) -> str:
    """The ``gap`` cell of a record: the acceptance its rule left on the table per tested node
    (:func:`~specdec.bench.runner.aggregate`), ``<=`` when it is an upper bound, ``-`` when not measured.

    Example:
        >>> gap_text({"gap": 0.0312, "optimum_bound": False}), gap_text({"gap": 0.05204, "optimum_bound": True})
        ('0.031', '<=0.052')
        >>> gap_text({"gap": None})
        '-'
    """
    gap = rec.get("gap")
    if gap is None or (isinstance(gap, float) and math.isnan(gap)):
        return "-"
    return ("<=" if rec.get("optimum_bound") else "") + f"{gap:.3f}"


def _split(rec: Mapping[str, Any]) -> str:
    """``draft/target/verify/other`` shares of the wall time, in percent."""
    total = rec.get("time_total") or 0.0
    draft, target, verify = (rec.get(k) for k in ("time_draft", "time_target", "time_verify"))
    if total <= 0 or draft is None or target is None or verify is None:
        return "-"
    other = max(0.0, total - draft - target - verify)  # prefill and loop overhead
    return "/".join(f"{100 * p / total:.0f}" for p in (draft, target, verify, other))


def results_table(records: Sequence[Mapping[str, Any]], title: str = "specdec bench") -> Any:
    """A :class:`rich.table.Table` of the records (one row per method and temperature); the
    ``gap`` column (:func:`gap_text`) only when some record measured it (``--optimum``)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=False)
    gap = any(rec.get("gap") is not None for rec in records)
    position = any(rec.get("acceptance_by_position") for rec in records)  # logs with the per-position counts
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("method", "left"), ("draft", "left"), ("T", "right"), ("tau", "right"), ("tok/s", "right"),
        ("speedup", "right"), ("acceptance by depth", "left"), *((("by position", "left"),) if position else ()),
        *((("gap", "right"),) if gap else ()),
        ("time % dft/tgt/ver/oth", "right"), ("fwd", "right"), ("tokens", "right"), ("=AR", "right"))
    for col, just in columns:
        table.add_column(col, justify=just, no_wrap=True)
    for rec in sorted(records, key=lambda r: (r["temperature"], kind_rank(r.get("kind", "")))):
        acc = " ".join(f"{a:.2f}" for a in rec.get("acceptance_by_depth") or [])
        by_position = " ".join(f"{a:.2f}" for a in rec.get("acceptance_by_position") or []) or "-"
        match = rec.get("matches_autoregressive")
        tau = format_cell(rec["tau"])
        if rec.get("tau_stderr") is not None and not math.isnan(rec["tau_stderr"]) and rec["kind"] != "autoregressive":
            tau += f"±{rec['tau_stderr']:.2f}"
        table.add_row(  # names as Text: "rheo[m=2]" is a row name, not rich markup
            Text(rec["method"]), Text(rec.get("draft") or "-"), f"{rec['temperature']:g}", tau,
            format_cell(rec["tokens_per_s"], ".1f"), format_cell(rec["speedup"], ".2f") + "x", acc or "-",
            *((by_position,) if position else ()), *((gap_text(rec),) if gap else ()), _split(rec), str(rec["target_forwards"]), str(rec["new_tokens"]),
            "-" if match is None else f"{100 * match:.0f}%",
        )
    return table


def check_out_dir(path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Create ``path`` if needed and check a file can be written in it.

    A folder that already holds results of an earlier run (any of
    :data:`OUTPUT_FILES`) is refused unless ``overwrite`` is true (the
    ``--overwrite`` flag); other files in the folder do not count.

    Raises:
        InvalidConfigError: it is a file, it holds earlier results and
            ``overwrite`` is false, or it cannot be created or written.
    """
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise InvalidConfigError(f"--out {p} exists and is not a directory")
    found = sorted(name for name in OUTPUT_FILES if (p / name).exists()) if p.is_dir() else []
    if found and not overwrite:
        raise InvalidConfigError(
            f"--out {p} already holds results of an earlier run ({', '.join(found)}); pass --overwrite to "
            "replace them, or choose another folder"
        )
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".specdec-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise InvalidConfigError(f"--out {p} cannot be written: {exc.strerror or exc}") from None
    return p


def write_results(out: str | os.PathLike, records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any],
                  runs: Sequence[Mapping[str, Any]] = ()) -> list[Path]:
    """Write ``results.json`` (the records), ``meta.json`` and ``runs.jsonl``; returns the paths."""
    p = Path(out)
    files = [p / "results.json", p / "meta.json"]
    files[0].write_text(json.dumps(strict_json(list(records)), indent=2, allow_nan=False) + "\n")
    files[1].write_text(json.dumps(strict_json(dict(meta)), indent=2, allow_nan=False) + "\n")
    if runs:
        path = p / "runs.jsonl"
        with path.open("w") as fh:
            for r in runs:
                fh.write(json.dumps(strict_json(dict(r)), allow_nan=False) + "\n")
        files.append(path)
    return files


def remove_stale_outputs(out: str | os.PathLike, written: Sequence[str | os.PathLike]) -> list[Path]:
    """Delete the :data:`OUTPUT_FILES` in ``out`` that this run did not write
    (``written``): with ``--overwrite``, the plots or ``runs.jsonl`` of an
    earlier run would otherwise sit next to results they do not describe.
    Returns the paths removed."""
    p = Path(out)
    keep = {Path(f).name for f in written}
    removed = []
    for name in OUTPUT_FILES:
        f = p / name
        if name not in keep and f.is_file():
            f.unlink()
            removed.append(f)
    return removed


def goal_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The issue's goals, computed from the records.

    - ``rheo_vs_eagle_T1``: rheo's tau at T=1 / the best eagle2/eagle3 tau at
      T=1 among rows with the same draft kind as the rheo row (and over all
      rows, ``..._any_draft``); the goal is >= 1.10. A 1-node budget (which
      ``--budget auto`` can choose) does not test it: the tree has no siblings.
    - ``rheo_vs_eagle_T0``: the tau difference at T=0 with the same draft, in
      units of its standard error (the goal: within noise, |z| < 2).
    - ``best_speedup_T0``: the best speculative speedup at T=0 (goal > 1.0).
    """
    def rows(t: float) -> list[Mapping[str, Any]]:
        return [r for r in records if r["temperature"] == t and r["kind"] == "speculative"]

    out: dict[str, Any] = {}
    for t, key in ((1.0, "T1"), (0.0, "T0")):
        rheo = [r for r in rows(t) if r["base_method"] == "rheo"]
        eagle = [r for r in rows(t) if r["base_method"] in ("eagle2", "eagle3")]
        comparisons = []
        for rr in rheo:
            same = [e for e in eagle if e["draft"] == rr["draft"]]
            if same:
                best = max(same, key=lambda e: e["tau"])
                se = math.sqrt(sum((x or 0.0) ** 2 for x in (rr.get("tau_stderr"), best.get("tau_stderr")))
                               if all(x is not None and not math.isnan(x) for x in (rr.get("tau_stderr"), best.get("tau_stderr"))) else float("nan"))
                comparisons.append({
                    "rheo": rr["method"], "eagle": best["method"], "draft": rr["draft"],
                    "rheo_tau": rr["tau"], "eagle_tau": best["tau"], "ratio": rr["tau"] / best["tau"],
                    "budget_nodes": rr.get("budget_nodes"),
                    "z": (rr["tau"] - best["tau"]) / se if se and se == se else None,
                })
        if comparisons:
            out[f"rheo_vs_eagle_{key}"] = comparisons
        if rheo and eagle:
            out[f"rheo_vs_eagle_{key}_any_draft"] = max(r["tau"] for r in rheo) / max(e["tau"] for e in eagle)
    t0 = rows(0.0)
    if t0:
        best = max(t0, key=lambda r: r["speedup"] if r["speedup"] == r["speedup"] else -1)
        out["best_speedup_T0"] = {"method": best["method"], "speedup": best["speedup"]}
    return out


def goal_lines(goals: Mapping[str, Any]) -> list[str]:
    """Human-readable lines of :func:`goal_summary`."""
    lines = []
    for c in goals.get("rheo_vs_eagle_T1", []):
        ok = "met" if c["ratio"] >= 1.10 else "NOT met"
        if c.get("budget_nodes") == 1:  # one node: no siblings, nothing for rheo's sampled slot to add
            ok = "not tested at a 1-node budget: rheo's gain is in the sibling slots; use --budget >= 2"
        lines.append(f"T=1: {c['rheo']} tau {c['rheo_tau']:.3f} vs {c['eagle']} {c['eagle_tau']:.3f} "
                     f"(draft {c['draft']}): ratio {c['ratio']:.3f} (goal >= 1.10: {ok})")
    if "rheo_vs_eagle_T1_any_draft" in goals:
        lines.append(f"T=1: best rheo / best eagle2-eagle3 tau over all drafts: {goals['rheo_vs_eagle_T1_any_draft']:.3f}")
    for c in goals.get("rheo_vs_eagle_T0", []):
        z = c["z"]
        ok = "within noise" if z is None or abs(z) < 2 else "NOT within noise"
        lines.append(f"T=0: {c['rheo']} tau {c['rheo_tau']:.3f} vs {c['eagle']} {c['eagle_tau']:.3f} "
                     f"(draft {c['draft']}): z = {'-' if z is None else f'{z:.2f}'} ({ok})")
    if "best_speedup_T0" in goals:
        b = goals["best_speedup_T0"]
        ok = "met" if b["speedup"] > 1.0 else "NOT met"
        lines.append(f"T=0: best speedup {b['speedup']:.2f}x ({b['method']}) (goal > 1.0: {ok})")
    return lines


# ------------------------------------------------------------ resumable output folders (runs.jsonl)
def open_out_dir(path: str | os.PathLike, identity: Mapping[str, Any], *, overwrite: bool = False
                 ) -> tuple[Path, RunLog | None]:
    """Check ``--out`` before any model loads; returns ``(folder, RunLog or None)``.

    - ``overwrite``: the folder is checked for writing; the run starts over
      (a fresh ``runs.jsonl`` replaces the old one once measuring starts).
    - The folder holds a ``runs.jsonl`` of the same identity (the same
      command): it is returned, to be resumed. A cut last line is dropped.
      A log written before run logs recorded the drafts' hashes
      (:data:`~specdec.bench.hashes.HASH_KEY`) is compared without them and
      resumed as it is (its header keeps no hash: nothing checks its drafts).
    - It holds a ``runs.jsonl`` of another identity, a corrupt or foreign
      one, or one whose tree budget choices disagree with their digest or with its
      generations (:func:`~specdec.bench.hashes.check_budget_choices`): refused, naming what
      differs; nothing is touched.
    - It holds other result files but no ``runs.jsonl`` (an earlier
      specdec's run): refused as :func:`check_out_dir` does.

    Raises:
        InvalidConfigError: as above, or the folder cannot be written.
    """
    p = Path(path).expanduser()
    if overwrite or not (p / RUNS_FILE).exists():
        return check_out_dir(p, overwrite=overwrite), None
    log = read_runlog(p / RUNS_FILE)
    if HASH_KEY not in log.config:  # logged before the drafts' hashes were recorded: compare the rest
        identity = {k: v for k, v in identity.items() if k != HASH_KEY}
    diffs = identity_differences(log.config, identity)
    if diffs:
        raise InvalidConfigError(
            f"--out {p} holds a sweep of another configuration ({'; '.join(diffs)}): rerun that sweep's command to "
            "resume it, pass --overwrite to start over, or choose another folder"
        )
    check_budget_choices(log.header, log.records, str(log.path))  # resumed only with the choices it ran with
    check_out_dir(p, overwrite=True)  # writable
    if log.dropped_tail:
        log = read_runlog(p / RUNS_FILE, repair=True)
    return p, log


def _report_inputs(header: Mapping[str, Any]) -> dict[str, Any]:
    """aggregate()'s arguments from a run-log header (the budget per temperature where it has one;
    a header of one budget, as every log before ``--budget auto`` chose per temperature, serves all)."""
    res, cfg = header["resolved"], header["config"]
    budget, slots = logged_budget(res)
    return {
        "rows": [RowSpec(**r) for r in res["rows"]],
        "temperatures": [float(t) for t in cfg["temperatures"]],
        "budget": budget,
        "sampled_slots": slots,
        "options": {(name, float(t)): o for name, t, o in res.get("options", [])},
        "descriptions": dict(res.get("models") or {}),
        "batch_size": int(cfg.get("batch_size", 1)),
    }


def write_report(header: Mapping[str, Any], runs: Sequence[RunRecord], out: str | os.PathLike | None, *, console: Any,
                 plots: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any], list[Path]]:
    """Aggregate ``runs`` as the header describes, print the table, the models and
    the goal lines on ``console``, and (``out`` given) write ``results.json`` and
    the plots. Returns ``(records, goals, files written)``."""
    from rich.markup import escape

    inp = _report_inputs(header)
    records = aggregate(runs, inp["rows"], inp["temperatures"], budget=inp["budget"], options=inp["options"],
                        descriptions=inp["descriptions"], batch_size=inp["batch_size"])
    cfg, res = header["config"], header["resolved"]
    budget = inp["budget"]
    per_t = not isinstance(budget, Budget)
    per_kind = per_t and any(not isinstance(b, Budget) for b in budget.values())
    auto = bool((res.get("budget") or {}).get("auto"))
    title = (f"specdec bench --preset {cfg['preset']}: {res['prompts']['count']} prompts x {cfg['max_new_tokens']} new "
             f"tokens, budget " + (("auto, " if auto else "")
                                   + ("per temperature and draft kind (below)" if per_kind else "per temperature (below)")
                                   if per_t else f"{budget}" + (" (auto)" if auto else ""))
             + (f", batch size {inp['batch_size']}" if inp["batch_size"] > 1 else "")
             + (", --optimum (timings include its host work)" if cfg.get("optimum") else ""))
    console.print(results_table(records, title=title))

    def say(text: str) -> None:
        console.print(escape(text), soft_wrap=True, highlight=False)

    for line in budget_lines(header):
        say(line)

    desc = inp["descriptions"]
    say(f"target: {desc.get('target', '?')}")
    for kind in dict.fromkeys(r.draft for r in inp["rows"] if r.draft):  # every draft kind a row used, in row order
        if kind in desc:
            say(f"draft {kind}: {desc[kind]}")
    console.print("tau = tokens per target forward (accepted drafts + 1 bonus); speedup = tokens/s over the "
                  "autoregressive baseline run interleaved in the same process; =AR: share of T=0 outputs "
                  "equal to the baseline's.")
    if any(r.get("acceptance_by_position") for r in records):
        say("acceptance by depth d = accepted at d / steps whose walk tested a draft at d; by position d = accepted "
            "at d / steps whose tree drafted a node at d (vLLM's per-position acceptance rate).")
    if any(r.get("gap") is not None for r in records):
        say("gap = the best lossless acceptance at the tested nodes (from their recorded proposals) minus the "
            "acceptance the rule reached there, per tested node, all depths together; <= marks an upper bound "
            "(some node's optimum was bounded, not solved)")
    if cfg.get("optimum"):
        say(OPTIMUM_NOTE)
    goals = goal_summary(records)
    for line in goal_lines(goals):
        say(line)
    for line in bound_lines(records, (res.get("auto_budget") or {}).get("forward_time_s")):  # issue 48
        say(line)
    files: list[Path] = []
    if out is not None:
        p = Path(out)
        f = p / "results.json"
        f.write_text(json.dumps(strict_json(list(records)), indent=2, allow_nan=False) + "\n")
        files.append(f)
        if plots:
            short = (", ".join(f"T={t:g}: {_short_budget(b)}" for t, b in sorted(budget.items())) if per_t
                     else f"{budget}")
            label = f"{desc.get('target', 'target').split(' ')[0]}, budget {short}"
            files += write_plots(p, records, title=label)
            files.append(write_temperature_plot(p, records, title=label))
    return records, goals, files


def _short_budget(entry: Budget | Mapping[str, Budget]) -> str:
    """``"4/2"`` (nodes/depth), or per draft kind ``"eagle3 4/2, lm 1/1"``."""
    if isinstance(entry, Budget):
        return f"{entry.nodes}/{entry.depth}"
    return ", ".join(f"{k} {entry[k].nodes}/{entry[k].depth}" for k in sorted(entry))


def budget_lines(header: Mapping[str, Any]) -> list[str]:
    """What ``--budget auto`` chose, per temperature: ``N``, ``d`` (per draft kind, each from its own
    profile, where the log chose per kind), rheo's ``m`` and its pilot figures (empty for a fixed budget,
    and for a log of one auto budget for every temperature: the title says it).

    Example:
        >>> from specdec.bench.runlog import budget_entry
        >>> budget_lines({"resolved": {"budget": budget_entry(
        ...     {0.0: {"lm": Budget(1, 1), "eagle3": Budget(4, 2)}}, {0.0: 1}, auto=True)}})
        ['auto budget at T=0: eagle3 4 nodes, depth 2; lm 1 node, depth 1; rheo m=1 (greedy: m plays no part)']
    """
    res = header["resolved"]
    budget, slots = logged_budget(res)
    if isinstance(budget, Budget):
        return []
    auto = bool((res.get("budget") or {}).get("auto"))
    pilots = {float(e["temperature"]): e.get("pilot") for e in (res.get("auto_budget") or {}).get("by_temperature", [])}
    lines = []
    for t in sorted(budget):
        entry = budget[t]
        chosen = (str(entry) if isinstance(entry, Budget)
                  else "; ".join(f"{k} {entry[k]}" for k in sorted(entry)))
        line = f"{'auto ' if auto else ''}budget at T={t:g}: {chosen}"
        if t in slots:
            line += f"{'; ' if not isinstance(entry, Budget) else ', '}rheo m={slots[t]}"
            pilot = pilots.get(t)
            if t == 0:
                line += " (greedy: m plays no part)"
            elif pilot and pilot.get("tau"):
                line += " (pilot tau " + ", ".join(f"m={m} {v:.3f}" for m, v in pilot["tau"].items()) + ")"
            elif pilot:
                line += f" (the only candidate of {pilot.get('candidates')})"
        lines.append(line)
    return lines


def write_meta(out: str | os.PathLike, meta: Mapping[str, Any]) -> Path:
    """Write ``meta.json``; returns its path."""
    f = Path(out) / "meta.json"
    f.write_text(json.dumps(strict_json(dict(meta)), indent=2, allow_nan=False) + "\n")
    return f


