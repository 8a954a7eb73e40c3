"""SmolLM2-135M target forward time against tree size, with and without the few-row linear dispatch.

Measures :func:`~specdec.trees.sequoia.measure_forward_times` (a tree of
``n`` tokens scored after a 300-token prompt, median of ``--repeats``) for an
:class:`~specdec.targets.hf.HFTarget` with ``cpu_linear=False`` (``F.linear``
everywhere; trees of 2-3 tokens padded to 4, the previous default) and with
``cpu_linear=True`` (:func:`~specdec.kernels.linear.accelerate_linears`), in
the same process, alternating. Writes a JSON record and a markdown table::

    python benchmarks/forward_linear.py --threads 2 --out benchmarks/results/linear_cpu
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from specdec.kernels.linear import restore_linears
from specdec.models.smollm2 import load_smollm2
from specdec.targets.hf import HFTarget
from specdec.trees.sequoia import measure_forward_times

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of (off, on); the minimum per size counts")
    ap.add_argument("--out", type=Path, default=None, help="folder for forward_linear.json and forward_linear.md")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_smollm2()
    prompt = list(range(100, 400))
    results: dict[str, dict[int, float]] = {"off": {}, "on": {}}
    plans = {}
    tune_s = 0.0
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            restore_linears(model)
            start = time.perf_counter()
            target = HFTarget(model, cpu_linear=(mode == "on"))
            if mode == "on":
                tune_s = max(tune_s, time.perf_counter() - start)
                plans = target.linear_plans
            times = measure_forward_times(target, prompt, SIZES, repeats=args.repeats)
            for n, t in times.items():
                results[mode][n] = min(results[mode].get(n, float("inf")), t)
            print(mode, {n: round(t * 1000, 1) for n, t in times.items()}, flush=True)
    rows = ["| tokens | F.linear (ms) | tuned dispatch (ms) | ratio | vs 1 token, F.linear | vs 1 token, tuned |",
            "|---:|---:|---:|---:|---:|---:|"]
    off1, on1 = results["off"][1], results["on"][1]
    for n in SIZES:
        a, b = results["off"][n], results["on"][n]
        rows.append(f"| {n} | {a * 1000:.1f} | {b * 1000:.1f} | {a / b:.2f}x | {a / off1:.2f} | {b / on1:.2f} |")
    plan_rows = ["| weight | methods for 1..16 rows |", "|---|---|"]
    for shape, plan in sorted(plans.items()):
        plan_rows.append(f"| {shape[0]} x {shape[1]} | {' '.join(plan.methods)} |")
    md = "\n".join(rows) + "\n\n" + "\n".join(plan_rows) + "\n"
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            "command": "python benchmarks/forward_linear.py " + " ".join(
                f"--{k} {v}" for k, v in (("threads", args.threads), ("repeats", args.repeats), ("rounds", args.rounds)) if v),
            "threads": torch.get_num_threads(),
            "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__},
            "forward_ms": {mode: {str(n): t * 1000 for n, t in r.items()} for mode, r in results.items()},
            "tuning_s": tune_s,
            "plans": {f"{s[0]}x{s[1]}": list(p.methods) for s, p in plans.items()},
        }
        (args.out / "forward_linear.json").write_text(json.dumps(record, indent=2) + "\n")
        (args.out / "forward_linear.md").write_text(md)


if __name__ == "__main__":
    main()
