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
    "PLOT_FILES",
    "OUTPUT_FILES",
]

PLOT_FILES: tuple[str, ...] = ("tau.png", "acceptance.png", "speedup.png")

OUTPUT_FILES: tuple[str, ...] = ("results.json", "meta.json", "runs.jsonl", *PLOT_FILES)
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
        table.add_row(
            rec["method"], rec.get("draft") or "-", f"{rec['temperature']:g}", tau,
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
