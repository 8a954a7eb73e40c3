"""Spec-Bench's report of a ``specdec bench`` sweep: ``specdec bench report DIR --format spec-bench``.

:func:`spec_bench_summary` computes Spec-Bench's figures per task and per
category (as its ``evaluation/speed.py`` does) from a sweep's runs;
:func:`spec_bench_report` prints them, with the greedy equality check, and
writes ``spec_bench.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specdec.bench.prompts import SPEC_BENCH_CATEGORIES, SPEC_BENCH_TASK_NAMES, spec_bench_task
from specdec.bench.report import format_cell
from specdec.bench.rows import AUTOREGRESSIVE, kind_rank
from specdec.bench.runlog import strict_json
from specdec.bench.sweep import RunRecord
from specdec.errors import InvalidConfigError

if TYPE_CHECKING:
    from rich.console import JustifyMethod

__all__ = ["spec_bench_summary", "spec_bench_report"]


def spec_bench_summary(header: Mapping[str, Any], runs: Sequence[RunRecord]) -> dict[str, Any]:
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


def spec_bench_report(header: Mapping[str, Any], runs: Sequence[RunRecord], *, console: Any,
                      out_dir: str | os.PathLike | None = None, by: str = "task") -> int:
    """Print Spec-Bench's table (speedup per task, mean accepted tokens, walltime, overall), the mean
    accepted tokens, speedup and walltime per task (``by="task"``) or per category (``by="category"``),
    and its greedy equality check; with ``out_dir``, write ``spec_bench.json``
    (:func:`spec_bench_summary`: both levels). Returns 0."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

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
        for method, g in sorted(methods.items(), key=lambda kv: kind_rank(kinds.get(kv[0], ""))):
            cells = [format_cell(g.get(f"task:{t}", {}).get("speedup"), ".2f") + ("x" if f"task:{t}" in g else "")
                     for t in SPEC_BENCH_TASK_NAMES]
            o = g["overall"]
            eq = o.get("greedy_equal")
            table.add_row(Text(method), *cells, format_cell(o["mean_accepted_tokens"]), format_cell(o["speedup"]) + "x",
                          format_cell(o["walltime"], ".3f"), "-" if eq is None else f"{100 * eq:.0f}%")
        console.print(table)
        long = Table(title=f"Spec-Bench report, {tkey}, per {by}")
        columns: tuple[tuple[str, JustifyMethod], ...] = (
            ("method", "left"), (by, "left"), ("questions", "right"), ("#MAT", "right"), ("speedup", "right"),
            ("walltime s", "right"), ("tok/s", "right"), ("=AR", "right"))
        for col, just in columns:
            long.add_column(col, justify=just, no_wrap=True)
        order = list(SPEC_BENCH_TASK_NAMES) if by == "task" else list(SPEC_BENCH_CATEGORIES)
        for method, g in sorted(methods.items(), key=lambda kv: kind_rank(kinds.get(kv[0], ""))):
            for name in order:
                e = g.get(f"{by}:{name}")
                if e is None:
                    continue
                eq = e.get("greedy_equal")
                long.add_row(Text(method), name, str(e["runs"]), format_cell(e["mean_accepted_tokens"]),
                             format_cell(e["speedup"]) + "x", format_cell(e["walltime"], ".3f"),
                             format_cell(e["tokens_per_s"], ".1f"), "-" if eq is None else f"{100 * eq:.0f}%")
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
        f.write_text(json.dumps(strict_json(summary), indent=2, allow_nan=False) + "\n")
        console.print(escape(f"wrote {f}"), soft_wrap=True, highlight=False)
    return 0

