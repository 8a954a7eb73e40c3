"""The RheoSampling sweep as a paper's table (issue 19): tau per method and temperature from a
``specdec bench --out DIR`` run log, with standard errors and rheo's ratio to eagle3 with a
paired bootstrap 95% interval.

Reads ``DIR/runs.jsonl`` only (a partial sweep too: it says how many prompts each cell holds).
Several folders merge into one table when they are parts of one sweep (for example one folder per
temperature, run in priority order): they must share the target, drafts, heads, tokens, budget,
seeds and prompts, and the content hashes of the drafts both use (``draft_sha256``, recorded by
``specdec bench`` since issue 47): a mismatch is an error naming the field and both values. A log
written before the hashes were recorded merges only with logs that lack them too (its heads cannot
be checked: the table says so). No generation of a method may appear in two of them (each folder's
own autoregressive baseline is allowed: the table does not use it).
Per cell (row, T): tau = emitted tokens / target forwards over the cell's generations (bonus token
included, as ``specdec bench``), its standard error over generations, and the number of prompts.
The ratio rheo / eagle3 (and rheo / the best static tree) is taken over the units (prompt, seed)
that both rows finished, with a bootstrap over prompts (seeded, 2,000 resamples).

Usage::

    python benchmarks/rheo_sweep_table.py benchmarks/results/rheo_sweep_smollm2_b60
    python benchmarks/rheo_sweep_table.py DIR --json out.json --markdown out.md --plot tau_vs_t.png
    python benchmarks/rheo_sweep_table.py DIR_T1 DIR_T03 DIR_T06 --markdown sweep.md
    python benchmarks/rheo_sweep_table.py DIRS... --same-at "rheo[rank_law=untempered]=rheo@0,1"

Every Rheo row of the log (``rheo`` and ablation rows such as ``rheo[m=2]``) and every
``sampled-dynamic`` row gets its ratios; a
row with options is compared with the ``eagle3`` row of the same options where the log has one
(``rheo[rank_law=untempered]`` with ``eagle3[rank_law=untempered]``), else with ``eagle3``, unless
``--eagle-row ROW=EAGLE_ROW`` names its comparison;
``--plot`` draws tau (± one standard error) against temperature, one line per row.
Cells logged as rheo with every slot sampled (``m = K`` in the header's options: rows such as
``rheo[m=10,proxy=displaced]``, or a ``--budget auto`` rheo row whose pilot chose ``m = K``, logged
before issue 47) are the ``sampled-dynamic`` method's and are shown under its name, the options
spelled for it (``sampled-dynamic[proxy=displaced,M=1024]``; rheo's default proxy, ``scaled``, and
its default ``M`` then, 1024, written out: ``sampled-dynamic``'s ``M`` now depends on the temperature),
never as rheo's (:func:`every_slot_names`; the output lists them).
``--rename OLD=NEW`` shows row ``OLD`` as ``NEW``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

STATIC = ("specinfer@eagle3", "sequoia@eagle3")


def cells(records: list[dict[str, Any]]) -> dict[tuple[str, float], dict[tuple[int, int], tuple[int, int]]]:
    """``(row, T) -> {(prompt, seed): (emitted, steps)}`` of the speculative rows."""
    out: dict[tuple[str, float], dict[tuple[int, int], tuple[int, int]]] = defaultdict(dict)
    for r in records:
        if r["row"] in ("autoregressive", "hf-assisted") or not r["steps"]:
            continue
        out[(r["row"], float(r["temperature"]))][(r["prompt_index"], r["seed"])] = (r["emitted"], r["steps"])
    return out


def tau(units: dict[tuple[int, int], tuple[int, int]]) -> float:
    emitted = sum(e for e, _ in units.values())
    steps = sum(s for _, s in units.values())
    return emitted / steps if steps else float("nan")


def stderr(units: dict[tuple[int, int], tuple[int, int]]) -> float:
    xs = [e / s for e, s in units.values()]
    if len(xs) < 2:
        return float("nan")
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def ratio_interval(a: dict, b: dict, *, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float, int]:
    """tau(a) / tau(b) over the units both hold, and a 95% bootstrap interval resampling prompts."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return float("nan"), float("nan"), float("nan"), 0
    prompts = sorted({p for p, _ in shared})
    by_prompt = {p: [u for u in shared if u[0] == p] for p in prompts}

    def value(units: list[tuple[int, int]]) -> float:
        ta = sum(a[u][0] for u in units) / sum(a[u][1] for u in units)
        tb = sum(b[u][0] for u in units) / sum(b[u][1] for u in units)
        return ta / tb

    point = value(shared)
    rng = random.Random(seed)
    draws = sorted(value([u for p in rng.choices(prompts, k=len(prompts)) for u in by_prompt[p]])
                   for _ in range(resamples))
    return point, draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1], len(prompts)


#: header config keys that must agree for folders to merge into one sweep table
SAME = ("target", "draft", "eagle2_head", "eagle3_head", "max_new_tokens", "budget", "ignore_eos", "batch_size",
        "max_prompt_tokens", "prompts", "draft_sha256")
HASHES = "draft_sha256"
#: the methods whose rows get ratios to eagle3 and to the best static tree
RATIO_METHODS = ("rheo", "sampled-dynamic")


def _short(value: Any, limit: int = 70) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def config_differences(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> list[str]:
    """What keeps two run headers' ``config`` from merging: one line per field of :data:`SAME` that differs,
    naming the field and both values (the drafts' hashes per draft kind that both logs use)."""
    out = []
    for key in SAME:
        va, vb = a.get(key), b.get(key)
        if key == HASHES:
            if (va is None) != (vb is None):
                old = names[0] if va is None else names[1]
                out.append(f"{key}: recorded in one log only ({old} was written before run logs recorded the "
                           "drafts' content hashes, so its heads cannot be checked against the other's)")
                continue
            for kind in sorted(set(va or {}) & set(vb or {})):
                ha, hb = va[kind].get("sha256"), vb[kind].get("sha256")
                if ha != hb:
                    out.append(f"{key}.{kind}: {ha} in {names[0]}, {hb} in {names[1]} (another {kind} draft)")
        elif va != vb:
            out.append(f"{key}: {_short(va)} in {names[0]}, {_short(vb)} in {names[1]}")
    return out


def every_slot_names(headers: list[dict[str, Any]]) -> dict[tuple[str, float], str]:
    """``{(row, T): name}`` of the cells whose logged options are rheo's with ``m = K`` (every slot sampled):
    the ``sampled-dynamic`` method, named with the row's own options less ``m`` (and ``proxy=scaled`` and
    ``M=1024``, rheo's defaults, where the row set none), its ``@draft`` kept.

    Example:
        >>> every_slot_names([{"resolved": {"options": [["rheo[m=10,proxy=displaced]", 1.0, {"K": 10, "m": 10}],
        ...     ["rheo", 0.6, {"K": 2, "m": 2}], ["rheo", 1.0, {"K": 2, "m": 1}]]}}])
        {('rheo[m=10,proxy=displaced]', 1.0): 'sampled-dynamic[proxy=displaced,M=1024]', ('rheo', 0.6): 'sampled-dynamic[proxy=scaled,M=1024]'}
    """
    out: dict[tuple[str, float], str] = {}
    for header in headers:
        for row, t, opts in header.get("resolved", {}).get("options", []):
            spec, at, draft = row.partition("@")
            method, _, rest = spec.partition("[")
            if method != "rheo" or not isinstance(opts, dict) or opts.get("m") is None or opts.get("m") != opts.get("K"):
                continue
            items = [i.strip() for i in rest.rstrip("]").split(",") if i.strip()] if rest else []
            items = [i for i in items if i.partition("=")[0].strip() != "m"]
            if not any(i.partition("=")[0].strip() == "proxy" for i in items):
                items.insert(0, "proxy=scaled")
            if not any(i.partition("=")[0].strip() == "M" for i in items):
                items.append("M=1024")
            out[(row, float(t))] = f"sampled-dynamic[{','.join(items)}]" + (f"@{draft}" if at else "")
    return out


def is_ratio_row(row: str) -> bool:
    """Whether ``row`` is a row of :data:`RATIO_METHODS` (plain, with options, or ``@draft``)."""
    method = row.split("[", 1)[0].split("@", 1)[0]
    return method in RATIO_METHODS


def seeds_run(cfg: dict[str, Any]) -> tuple[list[Any], bool]:
    """``(seeds, greedy_only)``: the seeds a run's folder holds, and whether its every temperature is 0
    (``specdec bench`` then runs only the first of its ``--seeds``)."""
    temps, seeds = cfg.get("temperatures"), list(cfg.get("seeds") or [])
    greedy_only = bool(temps) and all(float(t) == 0 for t in temps)
    return (seeds[:1] if greedy_only else seeds), greedy_only


def read_logs(dirs: list[Path], headers: list[dict[str, Any]] | None = None
              ) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """The merged records of one or more run folders: ``(first header, records, planned generations)``
    (every folder's header appended to ``headers`` when given).

    Raises ``SystemExit`` with the reason when the folders are not parts of one sweep.
    """
    logs: list[tuple[Path, dict[str, Any], list[str]]] = []
    for d in dirs:
        path = d / "runs.jsonl"
        if not path.is_file():
            raise SystemExit(f"{path}: no run log (is {d} the --out folder of a specdec bench run?)")
        lines = path.read_text().splitlines()
        logs.append((d, json.loads(lines[0]), lines[1:]))
    first = logs[0][1]
    if headers is not None:
        headers.extend(h for _, h, _ in logs)
    for d, header, _ in logs[1:]:
        diff = config_differences(first.get("config", {}), header.get("config", {}), (str(dirs[0]), str(d)))
        if diff:
            raise SystemExit(f"{d} is not part of the same sweep as {dirs[0]}: " + "; ".join(diff))
    # the folders of T > 0 hold the same seeds; a folder of T = 0 alone holds the first of them
    seeds = [(d, *seeds_run(header.get("config", {}))) for d, header, _ in logs]
    ref_dir, ref, _ = next((s for s in seeds if not s[2]), seeds[0])
    for d, held, greedy_only in seeds:
        if held != (ref[:1] if greedy_only else ref):
            raise SystemExit(f"{d} is not part of the same sweep as {ref_dir}: seeds differ")
    records: list[dict[str, Any]] = []
    where: dict[tuple[Any, ...], Path] = {}
    planned = 0
    for d, header, lines in logs:
        exp = header.get("resolved", {}).get("expected_runs")
        planned += exp if isinstance(exp, int) else 0
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut by a kill (the bench drops it on resume)
                continue
            key = (rec["row"], float(rec["temperature"]), rec["prompt_index"], rec["seed"])
            if key in where and rec["row"] in ("autoregressive", "hf-assisted"):
                continue  # every folder runs its own baseline (for its speedups); the table does not use it
            if key in where:
                raise SystemExit(f"generation {key} is in both {where[key]} and {d}: merge parts of one sweep only")
            where[key] = d
            records.append(rec)
    return first, records, planned


def _split_outside_brackets(spec: str) -> tuple[str, str, str]:
    """``spec`` split at its first ``=`` outside brackets (a row's options carry their own):
    ``(left, "=", right)``, or ``(spec, "", "")`` without one."""
    depth = 0
    for i, ch in enumerate(spec):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "=" and depth == 0:
            return spec[:i], "=", spec[i + 1:]
    return spec, "", ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+", help="the --out folder(s) of a specdec bench sweep")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="PNG: tau against temperature per row")
    ap.add_argument("--title", default="", help="the plot's title (default: the folder's name)")
    ap.add_argument("--same-at", action="append", default=[], metavar="ROW=OTHER@T1,T2",
                    help="ROW's cells at T1, T2 are OTHER's (the two rows are the same method there, e.g. "
                         "'rheo[rank_law=untempered]=rheo@0,1'); repeatable")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="show row OLD as NEW (a row logged under an older name, e.g. "
                         "'rheo[m=10,proxy=displaced]=sampled-dynamic[proxy=displaced]'); repeatable, applied first")
    ap.add_argument("--eagle-row", action="append", default=[], metavar="ROW=EAGLE_ROW",
                    help="compare rheo row ROW with EAGLE_ROW at every temperature where EAGLE_ROW has a cell "
                         "(e.g. 'rheo[m=10,proxy=displaced]=eagle3[rank_law=untempered]': the eagle3 row of the "
                         "current defaults); repeatable")
    args = ap.parse_args(argv)
    headers: list[dict[str, Any]] = []
    header, records, planned = read_logs(args.dirs, headers)
    names = ", ".join(str(d / "runs.jsonl") for d in args.dirs)
    table = cells(records)
    renamed = every_slot_names(headers)
    for (row, t), new in sorted(renamed.items()):
        if (row, t) not in table:
            continue
        if (new, t) in table:
            ap.error(f"{row} at T={t:g} is sampled-dynamic's {new}, which these logs also hold at T={t:g}")
        table[(new, t)] = table.pop((row, t))
    every_slot_note = "; ".join(f"{row} at T={t:g} shown as {new}" for (row, t), new in sorted(renamed.items()))
    for spec in args.rename:
        old, sep, new = _split_outside_brackets(spec)
        if not sep or not old or not new:
            ap.error(f"--rename {spec!r}: expected OLD=NEW")
        if not any(r == old for r, _ in table):
            ap.error(f"--rename {spec!r}: no row {old!r} in these logs")
        if any(r == new for r, _ in table):
            ap.error(f"--rename {spec!r}: these logs already have a row {new!r}")
        table = {(new if r == old else r, t): v for (r, t), v in table.items()}
    for spec in args.same_at:
        rows_part, _, temps_part = spec.rpartition("@")
        row, sep, other = _split_outside_brackets(rows_part)
        if not sep or not row or not other or not temps_part:
            ap.error(f"--same-at {spec!r}: expected ROW=OTHER@T1,T2")
        for t in (float(x) for x in temps_part.split(",")):
            if (row, t) in table:
                ap.error(f"--same-at {spec!r}: {row} has its own cell at T={t:g}")
            if (other, t) not in table:
                ap.error(f"--same-at {spec!r}: {other} has no cell at T={t:g}")
            table[(row, t)] = table.pop((other, t))
    chosen_eagle: dict[str, str] = {}
    for spec in args.eagle_row:
        row, sep, other = _split_outside_brackets(spec)
        if not sep or not row or not other:
            ap.error(f"--eagle-row {spec!r}: expected ROW=EAGLE_ROW")
        for name in (row, other):
            if not any(r == name for r, _ in table):
                ap.error(f"--eagle-row {spec!r}: no row {name!r} in these logs")
        chosen_eagle[row] = other
    rows = sorted({r for r, _ in table}, key=lambda r: (r not in ("eagle3", "rheo"), r))
    temps = sorted({t for _, t in table})
    out: dict[str, Any] = {"dirs": [str(d) for d in args.dirs], "generations": len(records), "cells": [], "ratios": []}
    md = ["| row | " + " | ".join(f"T={t:g}" for t in temps) + " |", "|---|" + "---|" * len(temps)]
    for row in rows:
        cols = []
        for t in temps:
            units = table.get((row, t), {})
            if not units:
                cols.append("")
                continue
            n_prompts = len({p for p, _ in units})
            out["cells"].append({"row": row, "temperature": t, "tau": tau(units), "stderr": stderr(units),
                                 "generations": len(units), "prompts": n_prompts})
            se = stderr(units)
            cols.append(f"{tau(units):.2f} ± {se:.2f} ({n_prompts}p)" if se == se else f"{tau(units):.2f} ({n_prompts}p)")
        md.append(f"| {row} | " + " | ".join(cols) + " |")
    rheo_rows = [r for r in rows if is_ratio_row(r)]
    md += ["", "| T | row | / eagle3 [95% CI] | / best static [95% CI] | prompts |", "|---|---|---|---|---|"]
    for t in temps:
        for rheo_row in rheo_rows:
            # a rheo row with options is compared with the eagle3 row of the same options where there is one
            # (rheo[rank_law=sampling] with eagle3[rank_law=sampling]), else with eagle3; --eagle-row overrides
            same = "eagle3" + rheo_row[len(rheo_row.split("[", 1)[0].split("@", 1)[0]):]
            eagle_row = chosen_eagle.get(rheo_row) or (same if table.get((same, t)) else "eagle3")
            rheo, eagle = table.get((rheo_row, t), {}), table.get((eagle_row, t), {})
            if not rheo or not eagle:
                continue
            r, lo, hi, n = ratio_interval(rheo, eagle)
            statics = [(tau(table[(s, t)]), s) for s in STATIC if table.get((s, t))]
            best = max(statics)[1] if statics else None
            rs = ratio_interval(rheo, table[(best, t)]) if best else (float("nan"),) * 3 + (0,)
            out["ratios"].append({"temperature": t, "row": rheo_row, "eagle_row": eagle_row, "rheo_over_eagle3": [r, lo, hi],
                                  "best_static": best, "rheo_over_best_static": list(rs[:3]), "prompts": n})
            vs = "" if eagle_row == "eagle3" else f" ({eagle_row})"
            md.append(f"| {t:g} | {rheo_row} | {r:.3f} [{lo:.3f}, {hi:.3f}]{vs} | "
                      + (f"{rs[0]:.3f} [{rs[1]:.3f}, {rs[2]:.3f}] ({best})" if best else "") + f" | {n} |")
    expected = header.get("config", {})
    seeds = sorted({r["seed"] for r in records})
    md.insert(0, f"{len(records)} of {planned} generations from {names} "
                 f"({expected.get('prompts', {}).get('count', '?')} prompts, seeds {seeds}); "
                 "tau ± standard error (prompts per cell)"
                 + (f"; every slot sampled, logged as rheo (the sampled-dynamic method): {every_slot_note}" if
                    every_slot_note else "") + "\n")
    text = "\n".join(md)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.plot:
        plot(out["cells"], args.plot, title=args.title or ", ".join(d.name for d in args.dirs))
    return 0


def plot(cell_list: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """tau (± one standard error) against temperature, one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for row in sorted({c["row"] for c in cell_list}, key=lambda r: (r not in ("eagle3", "rheo"), r)):
        pts = sorted((c["temperature"], c["tau"], c["stderr"]) for c in cell_list if c["row"] == row)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] if p[2] == p[2] else 0 for p in pts],
                    marker="o", capsize=3, label=row, linewidth=2.2 if row.startswith("rheo") else 1.2)
    ax.set_xlabel("temperature T")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
