"""Verifiers compared on the same trees (issue 44): tau per row, the paired ratio of two rows
with a bootstrap interval over prompts, acceptance and the gap to the best lossless acceptance
per depth, from ``specdec bench --optimum --out DIR`` run logs.

Reads ``DIR/runs.jsonl`` of one or more folders (one table). Per row and temperature: tau =
emitted tokens / target forwards over the row's generations (bonus included, as ``specdec
bench``) with its standard error over generations; acceptance by depth = accepted / tested;
optimum by depth = the best lossless acceptance at the tested nodes (``--optimum``), gap =
optimum - acceptance (``<=`` where some node's optimum was an upper bound). ``--pair A=B``:
tau(A) / tau(B) over the units (prompt, seed) both rows finished, with a seeded bootstrap over
prompts (2,000 resamples, 95 %).

Usage::

    python benchmarks/paired_verifiers.py DIR [DIR ...] --pair "sequoia[verifier=traversal]@eagle3=sequoia@eagle3" \\
        --markdown out.md
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(dirs: list[Path]) -> list[dict[str, Any]]:
    out = []
    for d in dirs:
        with open(d / "runs.jsonl") as fh:
            out += [rec for rec in (json.loads(line) for line in fh if line.strip()) if "row" in rec]  # not the header
    return out


def cell_stats(rs: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(r["steps"] for r in rs)
    emitted = sum(r["emitted"] for r in rs)
    taus = [r["emitted"] / r["steps"] for r in rs if r["steps"]]
    mean = sum(taus) / len(taus) if taus else float("nan")
    se = (math.sqrt(sum((t - mean) ** 2 for t in taus) / (len(taus) - 1) / len(taus)) if len(taus) > 1
          else float("nan"))
    depth = max((len(r.get("depth_attempted") or ()) for r in rs), default=0)
    att = [sum((r.get("depth_attempted") or ())[d] for r in rs if d < len(r.get("depth_attempted") or ()))
           for d in range(depth)]
    acc = [sum((r.get("depth_accepted") or ())[d] for r in rs if d < len(r.get("depth_accepted") or ()))
           for d in range(depth)]
    opt = [sum((r.get("depth_optimum") or ())[d] for r in rs if d < len(r.get("depth_optimum") or ()))
           for d in range(depth)]
    measured = any(r.get("depth_optimum") for r in rs)
    return {
        "runs": len(rs), "prompts": len({r["prompt_index"] for r in rs}),
        "tau": emitted / steps if steps else float("nan"), "tau_se": se,
        "acceptance_by_depth": [a / n if n else 0.0 for a, n in zip(acc, att)],
        "optimum_by_depth": [o / n if n else 0.0 for o, n in zip(opt, att)] if measured else None,
        "gap": (sum(opt) - sum(acc)) / sum(att) if measured and sum(att) else None,
        "bound": any(r.get("optimum_bound") for r in rs),
    }


def paired(records: list[dict[str, Any]], a: str, b: str, t: float, seed: int = 0) -> dict[str, Any] | None:
    """tau(a) / tau(b) over the (prompt, seed) units both rows finished, bootstrap over prompts."""
    by: dict[str, dict[tuple[int, int], dict[str, Any]]] = {a: {}, b: {}}
    for r in records:
        if r["row"] in by and r["temperature"] == t:
            by[r["row"]][(r["prompt_index"], r["seed"])] = r
    units = sorted(set(by[a]) & set(by[b]))
    if not units:
        return None
    prompts = sorted({u[0] for u in units})

    def ratio(sample: list[int]) -> float:
        chosen = [u for p in sample for u in units if u[0] == p]
        ea = sum(by[a][u]["emitted"] for u in chosen) / sum(by[a][u]["steps"] for u in chosen)
        eb = sum(by[b][u]["emitted"] for u in chosen) / sum(by[b][u]["steps"] for u in chosen)
        return ea / eb

    rng = random.Random(seed)
    boots = sorted(ratio([rng.choice(prompts) for _ in prompts]) for _ in range(2000))
    return {"a": a, "b": b, "temperature": t, "units": len(units), "prompts": len(prompts),
            "ratio": ratio(prompts), "low": boots[49], "high": boots[1949]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument("--pair", action="append", default=[], metavar="A=B", help="tau(A) / tau(B), paired")
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    records = load(args.dirs)
    cells: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        cells[(r["row"], r["temperature"])].append(r)
    lines = ["| row | T | prompts x runs | tau | acceptance by depth | optimum by depth | gap |",
             "|---|---|---|---|---|---|---|"]
    for (row, t), rs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        s = cell_stats(rs)
        acc = " ".join(f"{x:.2f}" for x in s["acceptance_by_depth"])
        opt = "-" if s["optimum_by_depth"] is None else " ".join(f"{x:.2f}" for x in s["optimum_by_depth"])
        gap = "-" if s["gap"] is None else ("<=" if s["bound"] else "") + f"{s['gap']:.3f}"
        lines.append(f"| {row} | {t:g} | {s['prompts']} x {s['runs']} | {s['tau']:.3f} ± {s['tau_se']:.3f} | "
                     f"{acc} | {opt} | {gap} |")
    temps = sorted({t for _, t in cells})
    pair_lines = ["", "| A / B | T | units (prompts) | tau ratio | 95 % interval |", "|---|---|---|---|---|"]
    for spec in args.pair:
        a, _, b = spec.rpartition("=")  # the last "=": row names may hold [k=v]
        for t in temps:
            res = paired(records, a, b, t)
            if res is not None:
                pair_lines.append(f"| {a} / {b} | {t:g} | {res['units']} ({res['prompts']}) | {res['ratio']:.3f} | "
                                  f"[{res['low']:.3f}, {res['high']:.3f}] |")
    text = "\n".join(lines + (pair_lines if args.pair else []))
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
