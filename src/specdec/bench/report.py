"""Benchmark output: the terminal table, ``results.json``, the plots, the goal check.

``results.json`` is a JSON list of the records :func:`specdec.bench.runner.aggregate`
returns (schema in ``docs/bench.md``); ``meta.json`` records how the run was
made; ``runs.jsonl`` holds one line per generate call. The plots (PNG, made
with matplotlib, imported only here) are ``tau.png``, ``acceptance.png`` and
``speedup.png``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specdec.errors import InvalidConfigError

__all__ = [
    "results_table",
    "write_results",
    "write_plots",
    "goal_summary",
    "check_out_dir",
    "remove_stale_outputs",
    "open_out_dir",
    "write_report",
    "write_meta",
    "write_temperature_plot",
    "budget_lines",
    "spec_bench_summary",
    "spec_bench_report",
    "PLOT_FILES",
    "OUTPUT_FILES",
]

PLOT_FILES: tuple[str, ...] = ("tau.png", "acceptance.png", "speedup.png", "temperature.png")

OUTPUT_FILES: tuple[str, ...] = ("results.json", "meta.json", "runs.jsonl", "spec_bench.json", *PLOT_FILES)
"""Every file ``specdec bench --out DIR`` writes: a folder holding one of them holds an earlier run's results."""


def _fmt(x: Any, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _split(rec: Mapping[str, Any]) -> str:
    """``draft/target/verify/other`` shares of the wall time, in percent."""
    total = rec.get("time_total") or 0.0
    parts = [rec.get(k) for k in ("time_draft", "time_target", "time_verify")]
    if total <= 0 or any(p is None for p in parts):
        return "-"
    other = max(0.0, total - sum(parts))  # prefill and loop overhead
    return "/".join(f"{100 * p / total:.0f}" for p in (*parts, other))


def results_table(records: Sequence[Mapping[str, Any]], title: str = "specdec bench") -> Any:
    """A :class:`rich.table.Table` of the records (one row per method and temperature)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=False)
    for col, just in (("method", "left"), ("draft", "left"), ("T", "right"), ("tau", "right"),
                      ("tok/s", "right"), ("speedup", "right"), ("acceptance by depth", "left"),
                      ("time % dft/tgt/ver/oth", "right"), ("fwd", "right"), ("tokens", "right"),
                      ("=AR", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    for rec in sorted(records, key=lambda r: (r["temperature"], _row_rank(r))):
        acc = " ".join(f"{a:.2f}" for a in rec.get("acceptance_by_depth") or [])
        match = rec.get("matches_autoregressive")
        tau = _fmt(rec["tau"])
        if rec.get("tau_stderr") is not None and not math.isnan(rec["tau_stderr"]) and rec["kind"] != "autoregressive":
            tau += f"±{rec['tau_stderr']:.2f}"
        table.add_row(  # names as Text: "rheo[m=2]" is a row name, not rich markup
            Text(rec["method"]), Text(rec.get("draft") or "-"), f"{rec['temperature']:g}", tau,
            _fmt(rec["tokens_per_s"], ".1f"), _fmt(rec["speedup"], ".2f") + "x", acc or "-", _split(rec),
            str(rec["target_forwards"]), str(rec["new_tokens"]),
            "-" if match is None else f"{100 * match:.0f}%",
        )
    return table


def _row_rank(rec: Mapping[str, Any]) -> int:
    return {"autoregressive": 0, "speculative": 1, "peer": 2}.get(rec.get("kind", ""), 3)


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


def _clean(value: Any) -> Any:
    """NaN -> None, recursively (strict JSON)."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_results(out: str | os.PathLike, records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any],
                  runs: Sequence[Mapping[str, Any]] = ()) -> list[Path]:
    """Write ``results.json`` (the records), ``meta.json`` and ``runs.jsonl``; returns the paths."""
    p = Path(out)
    files = [p / "results.json", p / "meta.json"]
    files[0].write_text(json.dumps(_clean(list(records)), indent=2, allow_nan=False) + "\n")
    files[1].write_text(json.dumps(_clean(dict(meta)), indent=2, allow_nan=False) + "\n")
    if runs:
        path = p / "runs.jsonl"
        with path.open("w") as fh:
            for r in runs:
                fh.write(json.dumps(_clean(dict(r)), allow_nan=False) + "\n")
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


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise InvalidConfigError(
            "the benchmark plots need matplotlib: pip install matplotlib "
            "(or pip install 'specdec-trees[bench]'), or pass --no-plots"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(out: str | os.PathLike, records: Sequence[Mapping[str, Any]], title: str = "") -> list[Path]:
    """Write ``tau.png``, ``acceptance.png`` and ``speedup.png`` into ``out``.

    Raises:
        InvalidConfigError: matplotlib is not installed.
    """
    plt = _pyplot()
    p = Path(out)
    temps = sorted({r["temperature"] for r in records})
    names: list[str] = []
    for r in sorted(records, key=_row_rank):
        if r["method"] not in names:
            names.append(r["method"])
    lookup = {(r["method"], r["temperature"]): r for r in records}
    files = []

    def bars(metric: str, fname: str, ylabel: str, hline: float | None) -> None:
        shown = [n for n in names if any((n, t) in lookup and lookup[(n, t)].get(metric) is not None for t in temps)]
        fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(shown) + 2), 4.2))
        width = 0.8 / max(1, len(temps))
        for i, t in enumerate(temps):
            xs, ys = [], []
            for j, n in enumerate(shown):
                v = lookup.get((n, t), {}).get(metric)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    xs.append(j + (i - (len(temps) - 1) / 2) * width)
                    ys.append(v)
            b = ax.bar(xs, ys, width=width, label=f"T={t:g}")
            ax.bar_label(b, fmt="%.2f", fontsize=7)
        if hline is not None:
            ax.axhline(hline, color="grey", linewidth=1, linestyle="--")
        ax.set_xticks(range(len(shown)), shown, rotation=20, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel}{' - ' + title if title else ''}", fontsize=10)
        ax.legend()
        fig.tight_layout()
        fig.savefig(p / fname, dpi=110)
        plt.close(fig)
        files.append(p / fname)

    bars("tau", "tau.png", "tau (tokens per target forward)", 1.0)

    fig, axes = plt.subplots(1, len(temps), figsize=(5.2 * len(temps), 4.0), squeeze=False)
    for ax, t in zip(axes[0], temps):
        deepest = 1
        for n in names:
            r = lookup.get((n, t))
            if r and r["kind"] == "speculative" and r.get("acceptance_by_depth"):
                acc = r["acceptance_by_depth"]
                ax.plot(range(1, len(acc) + 1), acc, marker="o", label=n)
                deepest = max(deepest, len(acc))
        ax.set_xticks(range(1, deepest + 1))
        ax.set_xlabel("depth")
        ax.set_ylabel("P(accepted | tested)")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"acceptance by depth, T={t:g}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(p / "acceptance.png", dpi=110)
    plt.close(fig)
    files.append(p / "acceptance.png")

    bars("speedup", "speedup.png", "speedup vs autoregressive (wall clock)", 1.0)
    return files


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
def open_out_dir(path: str | os.PathLike, identity: Mapping[str, Any], *, overwrite: bool = False) -> tuple[Path, Any]:
    """Check ``--out`` before any model loads; returns ``(folder, RunLog or None)``.

    - ``overwrite``: the folder is checked for writing; the run starts over
      (a fresh ``runs.jsonl`` replaces the old one once measuring starts).
    - The folder holds a ``runs.jsonl`` of the same identity (the same
      command): it is returned, to be resumed. A cut last line is dropped.
    - It holds a ``runs.jsonl`` of another identity, a corrupt or foreign
      one: refused, naming what differs; nothing is touched.
    - It holds other result files but no ``runs.jsonl`` (an earlier
      specdec's run): refused as :func:`check_out_dir` does.

    Raises:
        InvalidConfigError: as above, or the folder cannot be written.
    """
    from specdec.bench.runlog import RUNS_FILE, identity_differences, read_runlog

    p = Path(path).expanduser()
    if overwrite or not (p / RUNS_FILE).exists():
        return check_out_dir(p, overwrite=overwrite), None
    log = read_runlog(p / RUNS_FILE)
    diffs = identity_differences(log.config, identity)
    if diffs:
        raise InvalidConfigError(
            f"--out {p} holds a sweep of another configuration ({'; '.join(diffs)}): rerun that sweep's command to "
            "resume it, pass --overwrite to start over, or choose another folder"
        )
    check_out_dir(p, overwrite=True)  # writable
    if log.dropped_tail:
        log = read_runlog(p / RUNS_FILE, repair=True)
    return p, log


def _report_inputs(header: Mapping[str, Any]) -> dict[str, Any]:
    """aggregate()'s arguments from a run-log header (the budget per temperature where it has one;
    a header of one budget, as every log before ``--budget auto`` chose per temperature, serves all)."""
    from specdec.bench.runlog import logged_budget
    from specdec.bench.runner import RowSpec

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


def write_report(header: Mapping[str, Any], runs: Sequence[Any], out: str | os.PathLike | None, *, console: Any,
                 plots: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any], list[Path]]:
    """Aggregate ``runs`` as the header describes, print the table, the models and
    the goal lines on ``console``, and (``out`` given) write ``results.json`` and
    the plots. Returns ``(records, goals, files written)``."""
    from rich.markup import escape

    from specdec.bench.budget import Budget
    from specdec.bench.runner import aggregate

    inp = _report_inputs(header)
    records = aggregate(runs, inp["rows"], inp["temperatures"], budget=inp["budget"], options=inp["options"],
                        descriptions=inp["descriptions"], batch_size=inp["batch_size"])
    cfg, res = header["config"], header["resolved"]
    budget = inp["budget"]
    per_t = not isinstance(budget, Budget)
    auto = bool((res.get("budget") or {}).get("auto"))
    title = (f"specdec bench --preset {cfg['preset']}: {res['prompts']['count']} prompts x {cfg['max_new_tokens']} new "
             f"tokens, budget " + (("auto, " if auto else "") + "per temperature (below)" if per_t
                                   else f"{budget}" + (" (auto)" if auto else ""))
             + (f", batch size {inp['batch_size']}" if inp["batch_size"] > 1 else ""))
    console.print(results_table(records, title=title))

    def say(text: str) -> None:
        console.print(escape(text), soft_wrap=True, highlight=False)

    for line in budget_lines(header):
        say(line)

    desc = inp["descriptions"]
    say(f"target: {desc.get('target', '?')}")
    for kind in ("lm", "eagle2", "eagle3"):
        if kind in desc and any(r.draft == kind for r in inp["rows"]):
            say(f"draft {kind}: {desc[kind]}")
    console.print("tau = tokens per target forward (accepted drafts + 1 bonus); speedup = tokens/s over the "
                  "autoregressive baseline run interleaved in the same process; =AR: share of T=0 outputs "
                  "equal to the baseline's.")
    goals = goal_summary(records)
    for line in goal_lines(goals):
        say(line)
    files: list[Path] = []
    if out is not None:
        p = Path(out)
        f = p / "results.json"
        f.write_text(json.dumps(_clean(list(records)), indent=2, allow_nan=False) + "\n")
        files.append(f)
        if plots:
            short = (", ".join(f"T={t:g}: {b.nodes}/{b.depth}" for t, b in sorted(budget.items())) if per_t
                     else f"{budget}")
            label = f"{desc.get('target', 'target').split(' ')[0]}, budget {short}"
            files += write_plots(p, records, title=label)
            files.append(write_temperature_plot(p, records, title=label))
    return records, goals, files


def budget_lines(header: Mapping[str, Any]) -> list[str]:
    """What ``--budget auto`` chose, per temperature: ``N``, ``d``, rheo's ``m`` and its pilot figures
    (empty for a fixed budget, and for a log of one auto budget for every temperature: the title says it)."""
    from specdec.bench.budget import Budget
    from specdec.bench.runlog import logged_budget

    res = header["resolved"]
    budget, slots = logged_budget(res)
    if isinstance(budget, Budget):
        return []
    auto = bool((res.get("budget") or {}).get("auto"))
    pilots = {float(e["temperature"]): e.get("pilot") for e in (res.get("auto_budget") or {}).get("by_temperature", [])}
    lines = []
    for t in sorted(budget):
        line = f"{'auto ' if auto else ''}budget at T={t:g}: {budget[t]}"
        if t in slots:
            line += f", rheo m={slots[t]}"
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
    f.write_text(json.dumps(_clean(dict(meta)), indent=2, allow_nan=False) + "\n")
    return f


def write_temperature_plot(out: str | os.PathLike, records: Sequence[Mapping[str, Any]], title: str = "") -> Path:
    """``temperature.png``: tau (left) and speedup (right) against the temperature, one line per method.

    The figure of the one-hot dilemma: a tree built from the draft's top-k
    children keeps its tau at T = 0 and loses it as T grows, while rheo's
    sampled slot holds it up (docs/bench.md, "The temperature sweep").
    """
    plt = _pyplot()
    p = Path(out)
    names: list[str] = []
    for r in sorted(records, key=_row_rank):
        if r["method"] not in names:
            names.append(r["method"])
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.2))
    for ax, metric, ylabel in ((axes[0], "tau", "tau (tokens per target forward)"),
                               (axes[1], "speedup", "speedup vs autoregressive")):
        for n in names:
            pts = sorted((r["temperature"], r[metric]) for r in records if r["method"] == n
                         and r.get(metric) is not None and not (isinstance(r[metric], float) and math.isnan(r[metric])))
            if not pts or (n == "autoregressive"):
                continue
            ax.plot([t for t, _ in pts], [v for _, v in pts], marker="o", label=n)
        ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")  # the baseline: tau 1, speedup 1
        ax.set_xlabel("temperature")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel.split(' (')[0]} vs temperature", fontsize=10)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    f = p / "temperature.png"
    fig.savefig(f, dpi=110)
    plt.close(fig)
    return f


# ------------------------------------------------------------------------------ Spec-Bench's report
def spec_bench_summary(header: Mapping[str, Any], runs: Sequence[Any]) -> dict[str, Any]:
    """Spec-Bench's figures per task (and per category) from a sweep's runs, computed as Spec-Bench's
    ``evaluation/speed.py`` does.

    For every temperature, method and group (``task:<task>`` for each Spec-Bench
    task, ``category:<category>``, ``overall``):

    - ``mean_accepted_tokens``: the mean, over all decoding steps, of the tokens a
      step emits (accepted drafts + the bonus token): Spec-Bench's ``#Mean accepted
      tokens``, EAGLE's tau, our ``tau`` (emitted tokens / steps);
    - ``tokens_per_s``: the mean over generations of new tokens / wall time
      (Spec-Bench averages per-answer speeds; our table pools tokens and seconds);
    - ``speedup``: that mean / the baseline's on the same generations' prompts
      (Spec-Bench's ``ratio``);
    - ``walltime``: mean seconds per generation; ``runs``; ``new_tokens``;
    - ``greedy_equal`` (T = 0): the share of outputs equal to the baseline's for
      the same prompt and seed (Spec-Bench's equality check), else None.

    Raises:
        InvalidConfigError: a prompt's category is not one of Spec-Bench's 13.
    """
    from specdec.bench.prompts import SPEC_BENCH_CATEGORIES, spec_bench_task
    from specdec.bench.runner import AUTOREGRESSIVE

    cats = list(header["resolved"]["prompts"]["categories"])
    bad = sorted({c for c in cats if c not in SPEC_BENCH_CATEGORIES})
    if bad:
        raise InvalidConfigError(
            f"--format spec-bench needs Spec-Bench's question.jsonl categories ({', '.join(SPEC_BENCH_CATEGORIES)}); "
            f"this sweep's prompts have {', '.join(map(repr, bad))}"
        )
    base_tokens = {(r.prompt_index, r.temperature, r.seed): r.tokens for r in runs if r.row == AUTOREGRESSIVE}
    cells: dict[tuple[float, str, str], list[Any]] = {}
    for r in runs:
        c = cats[r.prompt_index]
        for key in ("overall", f"task:{spec_bench_task(c)}", f"category:{c}"):
            cells.setdefault((r.temperature, r.row, key), []).append(r)

    def speed(rs: Sequence[Any]) -> float:
        v = [r.new_tokens / r.time_total for r in rs if r.time_total > 0]
        return sum(v) / len(v) if v else float("nan")

    out: dict[str, Any] = {}
    order = {r["name"]: i for i, r in enumerate(header["resolved"]["rows"])}
    for (t, row, key), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99), kv[0][2])):
        base = cells.get((t, AUTOREGRESSIVE, key))
        tps = speed(rs)
        b = speed(base) if base else float("nan")
        steps = sum(r.steps for r in rs)
        eq = None
        if t == 0:
            pairs = [(r.tokens, base_tokens.get((r.prompt_index, r.temperature, r.seed))) for r in rs]
            pairs = [(x, y) for x, y in pairs if y is not None]
            eq = sum(x == y for x, y in pairs) / len(pairs) if pairs else None
        out.setdefault(f"T={t:g}", {}).setdefault(row, {})[key] = {
            "mean_accepted_tokens": sum(r.emitted for r in rs) / steps if steps else float("nan"),
            "speedup": tps / b if b == b and b > 0 else float("nan"),
            "walltime": sum(r.time_total for r in rs) / len(rs),
            "tokens_per_s": tps, "runs": len(rs), "new_tokens": sum(r.new_tokens for r in rs),
            "greedy_equal": eq,
        }
    return out


def spec_bench_report(header: Mapping[str, Any], runs: Sequence[Any], *, console: Any,
                      out_dir: str | os.PathLike | None = None, by: str = "task") -> int:
    """Print Spec-Bench's table (speedup per task, mean accepted tokens, walltime, overall), the mean
    accepted tokens, speedup and walltime per task (``by="task"``) or per category (``by="category"``),
    and its greedy equality check; with ``out_dir``, write ``spec_bench.json``
    (:func:`spec_bench_summary`: both levels). Returns 0."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from specdec.bench.prompts import SPEC_BENCH_CATEGORIES, SPEC_BENCH_TASK_NAMES

    if by not in ("task", "category"):
        raise InvalidConfigError(f"--by must be task or category, got {by!r}")

    summary = spec_bench_summary(header, runs)
    kinds = {r["name"]: r["kind"] for r in header["resolved"]["rows"]}
    for tkey, methods in summary.items():
        table = Table(title=f"Spec-Bench report, {tkey} (speedup per task; #MAT = mean accepted tokens, bonus counted)")
        table.add_column("method", no_wrap=True)
        for name in SPEC_BENCH_TASK_NAMES.values():
            table.add_column(name, justify="right", no_wrap=True)
        for col in ("#MAT", "overall", "walltime s", "=AR"):
            table.add_column(col, justify="right", no_wrap=True)
        for method, g in sorted(methods.items(), key=lambda kv: _row_rank({"kind": kinds.get(kv[0], "")})):
            cells = [_fmt(g.get(f"task:{t}", {}).get("speedup"), ".2f") + ("x" if f"task:{t}" in g else "")
                     for t in SPEC_BENCH_TASK_NAMES]
            o = g["overall"]
            eq = o.get("greedy_equal")
            table.add_row(Text(method), *cells, _fmt(o["mean_accepted_tokens"]), _fmt(o["speedup"]) + "x",
                          _fmt(o["walltime"], ".3f"), "-" if eq is None else f"{100 * eq:.0f}%")
        console.print(table)
        long = Table(title=f"Spec-Bench report, {tkey}, per {by}")
        for col, just in (("method", "left"), (by, "left"), ("questions", "right"), ("#MAT", "right"),
                          ("speedup", "right"), ("walltime s", "right"), ("tok/s", "right"), ("=AR", "right")):
            long.add_column(col, justify=just, no_wrap=True)
        order = list(SPEC_BENCH_TASK_NAMES) if by == "task" else list(SPEC_BENCH_CATEGORIES)
        for method, g in sorted(methods.items(), key=lambda kv: _row_rank({"kind": kinds.get(kv[0], "")})):
            for name in order:
                e = g.get(f"{by}:{name}")
                if e is None:
                    continue
                eq = e.get("greedy_equal")
                long.add_row(Text(method), name, str(e["runs"]), _fmt(e["mean_accepted_tokens"]), _fmt(e["speedup"]) + "x",
                             _fmt(e["walltime"], ".3f"), _fmt(e["tokens_per_s"], ".1f"),
                             "-" if eq is None else f"{100 * eq:.0f}%")
        console.print(long)
        if tkey == "T=0":
            for method, g in methods.items():
                eq = g["overall"].get("greedy_equal")
                if eq is None or kinds.get(method) == "autoregressive":
                    continue
                verdict = "all equal" if eq == 1.0 else "NOT all equal"
                console.print(escape(f"greedy equality: {method}: {100 * eq:.0f}% of {g['overall']['runs']} outputs "
                                     f"equal the baseline's ({verdict})"), soft_wrap=True, highlight=False)
    if out_dir is not None:
        f = Path(out_dir) / "spec_bench.json"
        f.write_text(json.dumps(_clean(summary), indent=2, allow_nan=False) + "\n")
        console.print(escape(f"wrote {f}"), soft_wrap=True, highlight=False)
    return 0
