"""Batched throughput: speculative vs batched autoregressive decoding at batch sizes B (issue 15).

SmolLM2-135M-Instruct target (float32) with the shipped EAGLE-3 head, the
shipped prompts (chat template), ``--tokens`` new tokens per prompt without
EOS stops (every row runs to its length), ``--prompts`` prompts decoded in
batches of ``B`` (``B = 1`` is batch-1 decoding of each prompt in turn).
Throughput = new tokens summed over all prompts / wall time of the
``generate_batch`` calls (prefill included); tau = tokens emitted per
row-step. Each row decodes with its own seed.

Usage::

    python benchmarks/batch_throughput.py --batch-sizes 1 4 8 16 --nodes 4 --depth 4 \\
        --json benchmarks/results/batch_throughput.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

import torch

import specdec
from specdec.batch import autoregressive_generate_batch
from specdec.bench.budget import Budget, method_options
from specdec.bench.prompts import load_prompts, render_prompt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--methods", nargs="+", default=["eagle3", "rheo"])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from specdec.drafts.eagle import load_shipped
    from specdec.models.smollm2 import load_smollm2
    from specdec.targets.hf import HFTarget

    model, tokenizer = load_smollm2()
    draft = load_shipped(3, model)
    target = HFTarget(model, capture_layers=draft.target_layers)
    prompts = [render_prompt(tokenizer, p.turns[0]) for p in load_prompts("shipped")[: args.prompts]]
    budget = Budget(args.nodes, args.depth)
    rows: list[dict[str, Any]] = []

    def run(label: str, method: str | None, temperature: float, B: int, fn: Any) -> None:
        sampling = specdec.SamplingConfig(temperature=temperature)
        fn(prompts[:B], min(4, args.tokens), sampling, list(range(B)))  # warm-up
        start, new, row_steps, emitted = time.perf_counter(), 0, 0, 0.0
        for i in range(0, len(prompts), B):
            out = fn(prompts[i : i + B], args.tokens, sampling, list(range(i, i + len(prompts[i : i + B]))))
            new += out.new_tokens
            row_steps += out.row_steps
            emitted += out.tau * out.row_steps
        seconds = time.perf_counter() - start
        row = {"kind": label, "method": method, "temperature": temperature, "batch_size": B,
               "tokens_per_s": new / seconds, "tau": emitted / row_steps if row_steps else None,
               "new_tokens": new, "seconds": seconds}
        rows.append(row)
        print(f"{label:14s} {method or '':7s} T={temperature} B={B:3d}: {row['tokens_per_s']:7.2f} tok/s"
              + (f", tau {row['tau']:.2f}" if label == "speculative" else ""), flush=True)

    for temperature in args.temperatures:
        for B in args.batch_sizes:
            run("autoregressive", None, temperature, B,
                lambda p, n, s, seeds: autoregressive_generate_batch(target, p, n, s, seeds))
            for method in args.methods:
                gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method,
                                                   **method_options(method, budget))
                run("speculative", method, temperature, B,
                    lambda p, n, s, seeds, gen=gen: gen.generate_batch(p, n, s, seeds))
    for r in rows:
        if r["kind"] == "speculative":
            base = next(x for x in rows if x["kind"] == "autoregressive" and x["temperature"] == r["temperature"]
                        and x["batch_size"] == r["batch_size"])
            one = next(x for x in rows if x["kind"] == "speculative" and x["method"] == r["method"]
                       and x["temperature"] == r["temperature"] and x["batch_size"] == 1)
            r["speedup_vs_batched_ar"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["throughput_vs_batch1"] = r["tokens_per_s"] / one["tokens_per_s"]
    report = {"command": "python benchmarks/batch_throughput.py " + " ".join(argv or []),
              "budget": {"nodes": args.nodes, "depth": args.depth}, "prompts": args.prompts, "tokens": args.tokens,
              "threads": args.threads, "torch": torch.__version__, "machine": platform.platform(), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
