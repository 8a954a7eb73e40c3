"""Time ``process_logits`` before and after a change to specdec.sampling (issue 17: transformers'
exact top-p; issue 56: the CPU shortcuts without host reads).

The "before" implementation is ``src/specdec/sampling.py`` as of ``--git-rev``
(``git show REV:src/specdec/sampling.py``), loaded into a temporary module;
the "after" one is the working tree's ``specdec.sampling``. Both process the
same ``[rows, V]`` float32 logits (``4 * randn`` per row, peaked as an LLM's,
as in benchmarks/profile_step.py) with ``check=False`` (the step path), at
each ``--rows``, ``--top-k`` and ``--top-p`` (top-k 0 with top-p 1 is left out).
The two are timed in turns, one call each per repeat, so a busy machine slows
both alike. Reported per setting: the median and the minimum of ``--repeats``
timed calls (after two warm-up calls), milliseconds, and how many rows keep a
different set under the two rules.

Usage (the figures in docs come from a quiet machine)::

    python benchmarks/top_p_speed.py --git-rev 6e712c9          # V=128256, 61 rows, T=0.8, top-p 0.9
    python benchmarks/top_p_speed.py --git-rev 6e712c9 --vocab 5000 --repeats 3 --out /tmp/t.json  # smoke run
    python benchmarks/top_p_speed.py --git-rev ebb6d0e --vocab 49152 --rows 4 60 --temperature 0.7 \
        --top-k 0 40 --top-p 1.0 0.9 --out /tmp/issue56.json   # issue 56: top-k alone, top-p alone, both

Writes ``--out`` (default ``benchmarks/results/top_p_speed.json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

import specdec.sampling as new_sampling

ROOT = Path(__file__).resolve().parent.parent


def load_old(rev: str) -> ModuleType:
    """``specdec/sampling.py`` at ``rev`` as a module of its own."""
    source = subprocess.run(["git", "show", f"{rev}:src/specdec/sampling.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="specdec_old_sampling_"))
    path = folder / "specdec_old_sampling.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("specdec_old_sampling", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def timed_in_turns(fns, repeats: int) -> list[list[float]]:
    """Milliseconds of ``repeats`` calls of each of ``fns``, called in turns (after two warm-ups each)."""
    for fn in fns:
        fn()
        fn()
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, out):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-rev", required=True, help="the revision whose sampling.py is 'before'")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rows", type=int, nargs="+", default=[61])
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, nargs="+", default=[0.9])
    parser.add_argument("--top-k", type=int, nargs="+", default=[0, 50])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "top_p_speed.json")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    old = load_old(args.git_rev)
    g = torch.Generator().manual_seed(args.seed)
    all_logits = 4 * torch.randn(max(args.rows), args.vocab, generator=g)
    results = []
    for rows in args.rows:
        logits = all_logits[:rows]
        for top_k in args.top_k:
            for top_p in args.top_p:
                if top_k == 0 and top_p >= 1.0:
                    continue
                before_cfg = old.SamplingConfig(temperature=args.temperature, top_k=top_k, top_p=top_p)
                after_cfg = new_sampling.SamplingConfig(temperature=args.temperature, top_k=top_k, top_p=top_p)
                p_old = old.process_logits(logits, before_cfg, check=False)
                p_new = new_sampling.process_logits(logits, after_cfg, check=False)
                differ = int(((p_old > 0) != (p_new > 0)).any(dim=-1).sum())
                bits = bool(torch.equal(p_old, p_new))
                t_old, t_new = timed_in_turns([lambda: old.process_logits(logits, before_cfg, check=False),
                                               lambda: new_sampling.process_logits(logits, after_cfg, check=False)],
                                              args.repeats)
                row = {
                    "rows": rows,
                    "top_k": top_k,
                    "top_p": top_p,
                    "before_ms_median": statistics.median(t_old),
                    "before_ms_min": min(t_old),
                    "after_ms_median": statistics.median(t_new),
                    "after_ms_min": min(t_new),
                    "after_over_before": statistics.median(t_new) / statistics.median(t_old),
                    "after_over_before_min": min(t_new) / min(t_old),
                    "rows_with_a_different_set": differ,
                    "same_bits": bits,
                }
                results.append(row)
                print(f"rows={rows:4d} top_k={top_k:5d} top_p={top_p:.2f}  before {row['before_ms_median']:8.2f} ms "
                      f"(min {row['before_ms_min']:.2f})  after {row['after_ms_median']:8.2f} ms "
                      f"(min {row['after_ms_min']:.2f})  x{row['after_over_before']:.2f} (min x"
                      f"{row['after_over_before_min']:.2f})  other set: {differ}/{rows}  same bits: {bits}",
                      flush=True)
    report = {
        "benchmark": "top_p_speed",
        "git_rev_before": args.git_rev,
        "vocab": args.vocab,
        "rows": args.rows,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "load_average": list(os.getloadavg()),
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
