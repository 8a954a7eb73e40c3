"""Wall time of a ``specdec bench`` sweep in one process vs sharded over ``--workers N`` Ray workers (issue 18).

Runs the same sweep twice as two ``specdec bench`` commands, each in its own
fresh ``--out`` folder: once in one process with ``--threads T`` (default: the
machine's cores), once with ``--workers N --threads T/N`` (the cores split
between the workers). It reports both commands' wall times (start to exit:
model loading, Ray's start and the workers' model loading included) and their
ratio, the goal being ``workers / one process <= 0.6`` for 2 workers on a 2-core
CPU, and checks that the two ``runs.jsonl`` hold the same generations (tokens,
steps and depth counts; timings aside).

Usage (the issue's goal, SmolLM2 with its EAGLE-3 head; about 3 minutes per sweep on a 2-core CPU)::

    python benchmarks/bench_workers.py --workers 2 -- --methods eagle3 --num-prompts 8 \\
        --max-new-tokens 24 --temperatures 0 --budget 8

Everything after ``--`` is passed to both ``specdec bench`` commands
(``--out``, ``--threads`` and ``--workers`` are set by this script).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _sweep(extra: list[str], out: Path, threads: int, workers: int) -> float:
    cmd = [sys.executable, "-c", "import sys; from specdec.cli import main; sys.exit(main())", "bench", *extra,
           "--out", str(out), "--threads", str(threads), "--no-plots"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    print("$", " ".join(cmd[3:]), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"specdec bench failed with status {proc.returncode}")
    return seconds


def _generations(out: Path) -> dict[tuple, dict]:
    from specdec.bench.runlog import read_runlog

    skip = {"sequence", "time_total", "time_prefill", "time_draft", "time_target", "time_verify"}
    return {(r["row"], r["prompt_index"], r["temperature"], r["seed"]): {k: v for k, v in r.items() if k not in skip}
            for r in read_runlog(out).records}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of the one-process sweep; each worker gets threads // workers")
    ap.add_argument("--goal", type=float, default=0.6, help="the ratio to meet (workers / one process)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(own)
    per = max(1, args.threads // args.workers)
    with tempfile.TemporaryDirectory(prefix="specdec-bench-workers-") as tmp:
        one, many = Path(tmp) / "one", Path(tmp) / "many"
        t1 = _sweep(extra, one, args.threads, 1)
        tn = _sweep(extra, many, per, args.workers)
        g1, gn = _generations(one), _generations(many)
        same = g1 == gn
        n = len(g1)
        differ = sorted(k for k in g1.keys() | gn.keys() if g1.get(k) != gn.get(k))
        fields = sorted({f for k in differ if k in g1 and k in gn for f in g1[k] if g1[k][f] != gn[k].get(f)})
    if differ:
        print(f"{len(differ)} generation(s) differ (fields {fields}), e.g. {differ[:6]}")
    ratio = tn / t1
    verdict = "met" if ratio <= args.goal else "NOT met"
    print(f"one process ({args.threads} threads): {t1:.1f} s; {args.workers} workers ({per} thread(s) each): "
          f"{tn:.1f} s; ratio {ratio:.2f} (goal <= {args.goal:g}: {verdict}); {n} generations, "
          f"{'the same' if same else 'NOT the same'} in both runs")
    if args.json:
        args.json.write_text(json.dumps({"one_process_s": t1, "workers_s": tn, "ratio": ratio, "workers": args.workers,
                                         "threads": args.threads, "generations": n, "same_records": same,
                                         "differing": [list(k) for k in differ], "differing_fields": fields,
                                         "argv": extra}, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
