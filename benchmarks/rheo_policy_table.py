"""The default policy of rheo and sampled-dynamic (issue 47; docs/trees.md, "Default policy"), applied to a tuning run.

Reads ``DIR/runs.jsonl`` of one ``specdec bench`` run on the tuning prompts and, for each method
(:data:`STANDING`) and temperature, applies the rule stated in docs/trees.md:

1. the candidates are the method's rows in the log that vary only ``m``, ``proxy``, ``M`` and
   ``truncate`` (rows that set ``K`` or ``B`` change the budget's shape and are ablations, not
   candidates);
2. the best candidate is the one with the highest tau pooled over its generations (emitted tokens /
   target forwards, bonus included);
3. it replaces the standing default only if its paired tau ratio over the standing default, over the
   (prompt, seed) units both finished, has a 95% bootstrap interval entirely above 1 (prompts
   resampled, 2,000 resamples, seed 0: ``benchmarks/rheo_sweep_table.py``'s ``ratio_interval``);
   otherwise the standing default stays;
4. the library default (what a generator gets without options) is chosen the same way among the
   candidates that need no measured table (``proxy=calibrated`` does); the bench row registered for a
   comparison may use one (the bench profiles its table).

The rule decides only on a complete run (every planned generation logged): on a partial one the script
prints the figures and says that nothing is decided (``--partial`` to print them at all).

Usage::

    python benchmarks/rheo_policy_table.py benchmarks/results/rheo_policy_tune_smollm2/sweep [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rheo_sweep_table import cells, ratio_interval, read_logs, stderr, tau  # noqa: E402

STANDING = {"rheo": "rheo", "sampled-dynamic": "sampled-dynamic"}
"""Each method's standing default row (its library defaults) in a tuning run."""

POLICY_OPTIONS = ("m", "proxy", "M", "truncate", "proxy_scale")
"""The options the policy chooses; a row setting any other is an ablation, not a candidate."""


def row_options(row: str) -> tuple[str, dict[str, str]]:
    """``(method, {option: value})`` of a bench row name (``rheo[m=2,proxy=geometric]``; no ``@draft``)."""
    spec = row.split("@", 1)[0]
    method, _, rest = spec.partition("[")
    items = [i.strip() for i in rest.rstrip("]").split(",") if i.strip()]
    return method, dict(i.split("=", 1) for i in items)


def decide(table: dict[tuple[str, float], dict[tuple[int, int], tuple[int, int]]], method: str, t: float, *,
           table_free: bool = False) -> dict[str, Any]:
    """The rule (module docstring) for ``method`` at ``t``: the candidates' tau, the best, its ratio over the
    standing default, and the choice."""
    standing = STANDING[method]
    cands = {}
    for (row, temp), units in table.items():
        m, opts = row_options(row)
        if temp != t or m != method or not units or set(opts) - set(POLICY_OPTIONS):
            continue
        if table_free and opts.get("proxy") == "calibrated":
            continue
        cands[row] = units
    if standing not in cands:
        raise SystemExit(f"no {standing!r} row at T={t:g}: the standing default must be measured beside its candidates")
    taus = {row: tau(u) for row, u in cands.items()}
    best = max(sorted(taus), key=lambda r: (taus[r], r == standing))
    r, lo, hi, n = ratio_interval(cands[best], cands[standing])
    chosen = best if best != standing and lo > 1.0 else standing
    return {"method": method, "temperature": t, "table_free": table_free, "standing": standing, "best": best,
            "best_over_standing": [r, lo, hi], "prompts": n, "chosen": chosen,
            "candidates": {row: {"tau": taus[row], "stderr": stderr(cands[row]), "generations": len(cands[row])}
                           for row in sorted(taus, key=lambda x: -taus[x])}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+", help="the tuning run's --out folder(s)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--partial", action="store_true", help="print the figures of an unfinished run (no decision)")
    args = ap.parse_args(argv)
    _, records, planned = read_logs(args.dirs)
    complete = len(records) >= planned
    if not complete and not args.partial:
        raise SystemExit(f"{len(records)} of {planned} generations: the rule decides on the complete tuning run only "
                         "(--partial prints the figures, without a decision)")
    table = cells(records)
    temps = sorted({t for _, t in table})
    out = []
    lines = []
    for method in STANDING:
        for t in temps:
            if not any(row_options(r)[0] == method and tt == t for r, tt in table):
                continue
            for table_free in (False, True):
                d = decide(table, method, t, table_free=table_free)
                if not complete:
                    d["chosen"] = None
                out.append(d)
                what = "library default (no table)" if table_free else "bench setting"
                r, lo, hi = d["best_over_standing"]
                lines.append(f"{method} T={t:g} {what}: {d['chosen'] or 'no decision (partial run)'} "
                             f"(best {d['best']}, / {d['standing']} "
                             f"{r:.3f} [{lo:.3f}, {hi:.3f}], {d['prompts']} prompts)")
                if not table_free:
                    lines += [f"    {row}: {c['tau']:.3f} ± {c['stderr']:.3f} ({c['generations']} generations)"
                              for row, c in d["candidates"].items()]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
