"""Time per step outside the model forwards, stub models, for comparing two checkouts (issue 14).

The same measurement as ``step_counts.py --stub``'s step path, in a script that
runs against whichever ``specdec`` is imported, so that an older commit can be
timed from a worktree between runs of the current one (this machine's speed
drifts by up to 2x within an hour: only interleaved runs compare)::

    git worktree add /tmp/wt_filing f1f7dae      # the code issue 14 was filed against
    for i in 1 2 3 4; do
      PYTHONPATH=/tmp/wt_filing/src python benchmarks/step_time.py
      python benchmarks/step_time.py
    done

Stub models: one :class:`~specdec.models.CallableLM` as target and draft,
returning fixed logits (``4 * randn(V)``, V = 128256) for every row; the time
spent in it is subtracted. EAGLE-2 and RheoSampling trees with their default
options, T = 1, one thread, 24 tokens, the median of 7 generations (after 3
warm-up generations). Prints one JSON line: ms per step outside the forwards.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import specdec
from specdec.models import CallableLM


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--compile", default=None, help="SpeculativeGenerator(compile=...) (e.g. inductor); default eager")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    V = args.vocab
    fixed = torch.randn(1, V, generator=torch.Generator().manual_seed(0)) * 4  # [1, V]
    spent = {"s": 0.0}

    def logits(prefixes):  # [len(prefixes), V]
        t0 = time.perf_counter()
        out = fixed.expand(len(prefixes), V).clone()
        spent["s"] += time.perf_counter() - t0
        return out

    result: dict[str, object] = {"specdec": specdec.__file__, "compile": args.compile}
    for method in ("eagle2", "rheo"):
        lm = CallableLM(logits, vocab_size=V)
        kw = {"compile": args.compile} if args.compile else {}
        gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method=method, kernel="auto", **kw)
        sampling = specdec.SamplingConfig(temperature=1.0)
        for seed in (97, 98, 99):  # warm-up (and compilation)
            gen.generate([1, 2, 3], 8, sampling=sampling, seed=seed)
        times = []
        for seed in range(args.repeats):
            spent["s"] = 0.0
            t0 = time.perf_counter()
            out = gen.generate([1, 2, 3], args.tokens, sampling=sampling, seed=seed)
            times.append((time.perf_counter() - t0 - spent["s"]) / out.stats.steps * 1000)
        result[method] = round(statistics.median(times), 1)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
