"""Host sync-type events per step on every generation path (issue 42's goal: at most 4).

SmolLM2-135M-Instruct target with the shipped EAGLE-3 head, 60-node depth-6 trees, T = 1,
``--tokens`` new tokens, for ``eagle3``, ``rheo`` and ``sequoia-traversal`` (Sequoia trees verified
by ``traversal``'s tensor form, issue 56), on the paths a user can take:

- ``cpu_default``: ``kernel="auto"`` on the CPU (the tensor rule);
- ``torch``: ``kernel="torch"``;
- ``triton_interpreter``: ``kernel="triton"`` under ``TRITON_INTERPRET=1`` (the fused kernel on
  the device tree batch, what ``kernel="auto"`` runs on CUDA with Triton);
- ``batch4``: ``generate_batch`` with 4 prompts (per batched step);
- ``batch4_mixed``: the same with one sampling configuration per row (T = 1, T = 0.7 with
  top-k 40, T = 1 with top-p 0.9, T = 0.5);
- ``logits_processor``: a processor applied to every node in its own context;
- ``logprobs``: ``return_logprobs=True``.

Sync-type events (:class:`specdec.testing.counter.StepCounter`): ``Tensor.item/tolist/__bool__/
__int__/__float__/__index__/numpy`` calls and tensors made from Python data on a device, outside
the model forwards, prefill included, divided by the steps. ``numpy_views_per_step`` counts those
among them that are the CPU top-p sort's ``.numpy()`` view (CPU-only code: no device waits on it). The counts do not depend on the
hardware, so they carry to a GPU; the interpreter path is slow (minutes per method).

Usage::

    TRITON_INTERPRET=1 python benchmarks/sync_paths.py --json benchmarks/results/sync_paths.json
    python benchmarks/sync_paths.py --methods sequoia-traversal --paths cpu_default,torch,batch4,batch4_mixed,logits_processor,logprobs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

import specdec
from specdec.testing.counter import StepCounter

METHODS = ("eagle3", "rheo", "sequoia-traversal")
PATHS = ("cpu_default", "torch", "triton_interpreter", "batch4", "batch4_mixed", "logits_processor", "logprobs")
TREE: dict[str, dict[str, Any]] = {
    "eagle3": {"N": 60, "depth": 6}, "rheo": {"N": 60, "depth": 6},
    "sequoia-traversal": {"method": "sequoia", "verifier": "traversal", "num_nodes": 60, "max_depth": 6,
                          "acceptance": (0.5, 0.2, 0.1, 0.05, 0.03, 0.02)},
}
MIXED = [specdec.SamplingConfig(temperature=1.0), specdec.SamplingConfig(temperature=0.7, top_k=40),
         specdec.SamplingConfig(temperature=1.0, top_p=0.9), specdec.SamplingConfig(temperature=0.5)]


def ban_token(token: int) -> Any:
    """A logits processor: token ``token`` is never produced (its index tensor made once per
    device: a processor's own host-to-device copies would be counted too)."""
    index: dict[torch.device, torch.Tensor] = {}

    def processor(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.device not in index:
            index[scores.device] = torch.tensor([token], device=scores.device)
        return scores.index_fill(1, index[scores.device], float("-inf"))

    return processor


def load_real() -> tuple[Any, Any, list[list[int]]]:
    from specdec.drafts.eagle import load_shipped
    from specdec.models.smollm2 import load_smollm2
    from specdec.targets.hf import HFTarget

    model, tokenizer = load_smollm2()
    draft = load_shipped(3, model)
    target = HFTarget(model, capture_layers=draft.target_layers)
    questions = ["Explain why the sky is blue in two sentences.", "Write a haiku about rivers.",
                 "What is the capital of France?", "List three uses of copper."]
    prompts = []
    for q in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        prompts.append([int(t) for t in (ids if isinstance(ids, list) else ids["input_ids"])])
    return target, draft, prompts


def count(target: Any, draft: Any, prompts: list[list[int]], method: str, path: str, tokens: int) -> dict[str, Any]:
    kernel = {"torch": "torch", "triton_interpreter": "triton"}.get(path, "auto")
    if path == "triton_interpreter" and method == "sequoia-traversal":  # a path rule: no fused kernel
        return {"steps": 0, "tau": 0.0, "syncs_per_step": float("nan"), "sites": [], "kernel_path": "n/a"}
    options = dict(TREE[method])
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=options.pop("method", method), kernel=kernel,
                                       **options)
    sampling = specdec.SamplingConfig(temperature=1.0)

    def run(n: int) -> tuple[int, float]:
        if path in ("batch4", "batch4_mixed"):
            out = gen.generate_batch(prompts[:4], n, MIXED if path == "batch4_mixed" else sampling, seeds=[0, 1, 2, 3])
            return out.steps, out.tau
        extra: dict[str, Any] = {}
        if path == "logits_processor":
            extra["logits_processor"] = ban_token(13)
        if path == "logprobs":
            extra["return_logprobs"] = True
        single = gen.generate(prompts[0], n, sampling, seed=0, **extra)
        return single.stats.steps, single.stats.tau

    run(4)  # warm-up: per-shape index tensors are made once per shape and device
    with StepCounter() as counter:
        steps, tau = run(tokens)
    views = sum(k for (kind, site), k in counter.sync_sites["step"].items() if site == numpy_view_site())
    return {
        "steps": steps, "tau": tau, "syncs_per_step": counter.syncs / steps,
        "numpy_views_per_step": views / steps,
        "sites": [f"{k}x {kind} {site}" for (kind, site), k in counter.sync_sites["step"].most_common(8)],
        "all_sites": [f"{k}x {kind} {site}" for (kind, site), k in counter.sync_sites["step"].most_common()],
        "kernel_path": kernel,
    }


def numpy_view_site() -> str:
    """``specdec/sampling.py:LINE`` of the CPU values-only top-p sort's ``.numpy()``: a view of a CPU
    tensor, which StepCounter counts as a read (issue 56 reports it apart: no device waits on it)."""
    import dis

    from specdec import sampling

    code = sampling._sorted_values.__code__  # the loaded code's lines (the file may have changed since)
    line = next(i.positions.lineno for i in dis.get_instructions(code) if i.argval == "numpy" and i.positions)
    return f"specdec/sampling.py:{line}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    paths = [p for p in args.paths.split(",") if p]
    if "triton_interpreter" in paths and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("triton_interpreter needs TRITON_INTERPRET=1 set before Python starts", file=sys.stderr)
        return 2
    target, draft, prompts = load_real()
    out: dict[str, Any] = {"torch": torch.__version__, "tokens": args.tokens, "tree": TREE, "results": {}}
    for method in [m for m in args.methods.split(",") if m]:
        for path in paths:
            row = count(target, draft, prompts, method, path, args.tokens)
            out["results"][f"{method}/{path}"] = row
            print(f"{method:17s} {path:20s} {row['syncs_per_step']:6.2f} syncs/step (.numpy() views "
                  f"{row['numpy_views_per_step']:.2f})  ({row['steps']} steps, tau {row['tau']:.2f})  "
                  f"{'; '.join(row['sites'][:4])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
