"""Host syncs, ATen ops and time per speculative step outside the model forwards (issue 14).

Measurements of the step (:func:`specdec.engine.step.run_step`: level-wise tensor builder +
tensor verification + one read), at T=1, 60-node depth-6 trees (the per-node path the
library ran before issue 14 is gone since issue 42; its figures stay in
``benchmarks/results/step_counts.md``):

1. ``--real``: SmolLM2-135M-Instruct target with the shipped EAGLE-3 head,
   ``--tokens`` new tokens on one prompt; counts per step from
   :class:`specdec.testing.counter.StepCounter` (host reads of tensors and
   tensors made from Python data, by call site; ATen ops), split into outside
   and inside model forwards. Counts do not depend on the hardware.
2. ``--stub``: ``CallableLM`` target and draft returning fixed logits
   (V = 128256), so the models cost nothing; median wall time per step
   outside the forwards (``--compile BACKEND``: also with
   ``SpeculativeGenerator(..., compile=BACKEND)``). The stub's own host work
   (``CallableLM`` builds every node's prefix and scores the tree's host view)
   counts as outside; only its logits function is subtracted.
3. ``--stub-ops``: ATen ops per step outside the logits function with the
   same stub models (``--vocab``, e.g. 4096): hardware-free, so it can be
   measured on a busy machine (the eager step path's op diet, issue 14).

``--step-only`` is accepted for old commands (there is only the step now). ``--rows all`` counts the
verification's batch form (every node at once, what a GPU runs) instead of the CPU's walk.

Usage::

    python benchmarks/step_counts.py --stub --real --threads 2 --json benchmarks/results/step_counts.json
    python benchmarks/step_counts.py --stub-ops --vocab 4096 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

import specdec
from specdec.engine import StepOptions
from specdec.testing.counter import KernelCounter, StepCounter

METHODS = ("eagle3", "rheo")
OPTIONS = StepOptions()  # set from --rows in main


def _per_step(gen: Any, prompt: list[int], tokens: int, seed: int = 0) -> dict[str, Any]:
    gen.generate(prompt, 4, sampling=specdec.SamplingConfig(temperature=1.0), seed=seed)  # warm-up
    with StepCounter() as counter:
        out = gen.generate(prompt, tokens, sampling=specdec.SamplingConfig(temperature=1.0), seed=seed)
    steps = out.stats.steps
    return {
        "steps": steps,
        "tau": out.stats.tau,
        "syncs_outside_models": counter.syncs / steps,
        "syncs_inside_models": counter.model_syncs / steps,
        "ops_outside_models": counter.ops / steps,
        "compute_ops_outside_models": counter.compute_ops / steps,
        "top_sync_sites": [f"{k}x {kind} {site}" for (kind, site), k in counter.sync_sites["step"].most_common(8)],
        "top_ops": counter.op_names["step"].most_common(12),
    }


def _per_step_dispatched(gen: Any, prompt: list[int], tokens: int, seed: int = 0) -> dict[str, Any]:
    """ATen ops and compiled kernels dispatched per step outside the model forwards
    (:class:`KernelCounter`, the profiler's events: counts a compiled step too)."""
    for warm_seed in (seed, seed + 1):  # compiles every shape of the step (root, middle and last levels)
        gen.generate(prompt, 8, sampling=specdec.SamplingConfig(temperature=1.0), seed=warm_seed)
    with KernelCounter() as counter:
        out = gen.generate(prompt, tokens, sampling=specdec.SamplingConfig(temperature=1.0), seed=seed)
    steps = out.stats.steps
    return {
        "steps": steps,
        "tau": out.stats.tau,
        "dispatched_outside_models": counter.ops / steps,
        "compute_dispatched_outside_models": counter.compute_ops / steps,
        "compiled_kernels": counter.kernels / steps,
        "top_ops": counter.op_names.most_common(12),
    }


def load_real() -> tuple[Any, Any, list[int]]:
    from specdec.drafts.eagle import load_shipped
    from specdec.models.smollm2 import load_smollm2
    from specdec.targets.hf import HFTarget

    model, tokenizer = load_smollm2()
    draft = load_shipped(3, model)
    target = HFTarget(model, capture_layers=draft.target_layers)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Explain why the sky is blue in two sentences."}], add_generation_prompt=True
    )
    if not isinstance(prompt, list):  # a BatchEncoding in recent transformers
        prompt = prompt["input_ids"]
    return target, draft, [int(t) for t in prompt]


def stub_models(vocab: int, seed: int = 0) -> tuple[Any, float]:
    from specdec.models import CallableLM

    g = torch.Generator().manual_seed(seed)
    fixed = torch.randn(1, vocab, generator=g) * 4
    spent = {"t": 0.0}

    def fn(prefixes: list[list[int]]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = fixed.expand(len(prefixes), vocab).clone()
        spent["t"] += time.perf_counter() - t0
        return out

    return CallableLM(fn, vocab_size=vocab), spent  # type: ignore[return-value]


def stub(vocab: int, repeats: int, compile_backend: str | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for method in METHODS:
        lm, spent = stub_models(vocab)
        name = "eagle2" if method == "eagle3" else method
        row: dict[str, Any] = {}
        variants: list[tuple[str, str | None]] = [("step", None)]
        if compile_backend:
            variants.append((f"step_compiled_{compile_backend}", compile_backend))
        for label, backend in variants:
            gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method=name, kernel="auto", compile=backend or False,
                                               options=OPTIONS)
            gen.generate([1, 2, 3], 8, sampling=specdec.SamplingConfig(temperature=1.0), seed=99)  # warm-up / compile
            times = []
            for r in range(repeats):
                spent["t"] = 0.0
                t0 = time.perf_counter()
                out = gen.generate([1, 2, 3], 24, sampling=specdec.SamplingConfig(temperature=1.0), seed=r)
                total = time.perf_counter() - t0
                times.append((total - spent["t"]) / out.stats.steps)
            row[label] = {"ms_per_step_outside_models": 1000 * statistics.median(times), "tau": out.stats.tau}
        results[method] = row
        print(f"stub {method}: " + ", ".join(f"{k} {v['ms_per_step_outside_models']:.1f} ms/step"
                                            for k, v in row.items() if isinstance(v, dict)), flush=True)
    return results


def stub_ops(vocab: int, tokens: int, step_only: bool, compile_backend: str | None = None) -> dict[str, Any]:
    """ATen ops (and host syncs) per step outside the stub's logits function, ``T = 1``, seed 1;
    with ``compile_backend``, also the ops and kernels the compiled step dispatches."""
    results: dict[str, Any] = {}
    for method in METHODS:
        name = "eagle2" if method == "eagle3" else method
        row: dict[str, Any] = {}
        for label in ("step",):
            lm, _ = stub_models(vocab)
            gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method=name, kernel="auto", options=OPTIONS)
            row[label] = _per_step(gen, [1, 2, 3], tokens, seed=1)
            r = row[label]
            print(f"stub ops {name} {label} (V = {vocab}): {r['ops_outside_models']:.1f} ops/step outside the logits "
                  f"({r['compute_ops_outside_models']:.1f} not views), {r['syncs_outside_models']:.1f} syncs/step, "
                  f"{r['steps']} steps", flush=True)
        if compile_backend:
            lm, _ = stub_models(vocab)
            gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method=name, kernel="auto", compile=compile_backend,
                                               options=OPTIONS)
            r = row[f"step_compiled_{compile_backend}"] = _per_step_dispatched(gen, [1, 2, 3], tokens, seed=1)
            print(f"stub ops {name} compiled ({compile_backend}, V = {vocab}): {r['dispatched_outside_models']:.1f} "
                  f"ops + kernels/step outside the logits ({r['compute_dispatched_outside_models']:.1f} not views, "
                  f"{r['compiled_kernels']:.1f} compiled kernels), {r['steps']} steps", flush=True)
        results[name] = row
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", action="store_true", help="SmolLM2 + shipped EAGLE-3 head: counts per step")
    ap.add_argument("--stub", action="store_true", help="fixed-logit CallableLM models: time per step")
    ap.add_argument("--stub-ops", action="store_true", help="fixed-logit CallableLM models: ATen ops per step")
    ap.add_argument("--step-only", action="store_true", help="skip the per-node path (--real, --stub-ops)")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", default=None,
                    help="also the step path compiled with this backend (e.g. inductor): time (--stub), "
                         "ops and kernels dispatched (--stub-ops, --real)")
    ap.add_argument("--rows", default="auto", choices=("auto", "all", "path"),
                    help="the step's verification rows (specdec.engine.StepOptions.rows): auto (a CPU walks the "
                         "visited nodes), all (every node at once: the GPU's form), path")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    global OPTIONS
    OPTIONS = StepOptions(rows=args.rows)
    return _main(args)


def _main(args: argparse.Namespace) -> int:
    if args.compile:
        KernelCounter.profile_compiled_kernels()
    out: dict[str, Any] = {"torch": torch.__version__, "threads": args.threads, "rows": args.rows}
    if args.stub:
        out["stub"] = stub(args.vocab, args.repeats, args.compile)
    if args.stub_ops:
        out["stub_ops"] = {"vocab": args.vocab, **stub_ops(args.vocab, args.tokens, args.step_only, args.compile)}
    if args.real:
        target, draft, prompt = load_real()
        out["real"] = {}
        for method in METHODS:
            gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="auto", options=OPTIONS)
            out["real"][method] = {"step": _per_step(gen, prompt, args.tokens)}
            for label in out["real"][method]:
                r = out["real"][method][label]
                print(f"real {method} {label}: {r['syncs_outside_models']:.1f} syncs/step outside models "
                      f"({r['syncs_inside_models']:.1f} inside), {r['ops_outside_models']:.0f} ops/step outside "
                      f"({r['compute_ops_outside_models']:.0f} not views), "
                      f"tau {r['tau']:.2f}", flush=True)
            if args.compile:
                gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="auto",
                                                   compile=args.compile)
                label = f"step_compiled_{args.compile}"
                r = out["real"][method][label] = _per_step_dispatched(gen, prompt, args.tokens)
                print(f"real {method} {label}: {r['dispatched_outside_models']:.0f} ops + kernels/step outside "
                      f"({r['compute_dispatched_outside_models']:.0f} not views, {r['compiled_kernels']:.0f} "
                      f"compiled kernels), tau {r['tau']:.2f}", flush=True)
    text = json.dumps(out, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
