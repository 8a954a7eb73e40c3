"""Host sync-type events per step on every generation path (issue 42's goal: at most 4).

SmolLM2-135M-Instruct target with the shipped EAGLE-3 head, 60-node depth-6 trees, T = 1,
``--tokens`` new tokens, for ``eagle3`` and ``rheo``, on the paths a user can take:

- ``cpu_default``: ``kernel="auto"`` on the CPU (the tensor rule);
- ``torch``: ``kernel="torch"``;
- ``triton_interpreter``: ``kernel="triton"`` under ``TRITON_INTERPRET=1`` (the fused kernel on
  the device tree batch, what ``kernel="auto"`` runs on CUDA with Triton);
- ``batch4``: ``generate_batch`` with 4 prompts (per batched step);
- ``logits_processor``: a processor applied to every node in its own context;
- ``logprobs``: ``return_logprobs=True``.

Sync-type events (:class:`specdec.testing.counter.StepCounter`): ``Tensor.item/tolist/__bool__/
__int__/__float__/__index__/numpy`` calls and tensors made from Python data on a device, outside
the model forwards, prefill included, divided by the steps. The counts do not depend on the
hardware, so they carry to a GPU; the interpreter path is slow (minutes per method).

Usage::

    TRITON_INTERPRET=1 python benchmarks/sync_paths.py --json benchmarks/results/sync_paths.json
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

METHODS = ("eagle3", "rheo")
PATHS = ("cpu_default", "torch", "triton_interpreter", "batch4", "logits_processor", "logprobs")
TREE = {"eagle3": {"N": 60, "depth": 6}, "rheo": {"N": 60, "depth": 6}}


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
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel=kernel, **TREE[method])
    sampling = specdec.SamplingConfig(temperature=1.0)

    def run(n: int) -> tuple[int, float]:
        if path == "batch4":
            out = gen.generate_batch(prompts[:4], n, sampling, seeds=[0, 1, 2, 3])
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
    return {
        "steps": steps, "tau": tau, "syncs_per_step": counter.syncs / steps,
        "sites": [f"{k}x {kind} {site}" for (kind, site), k in counter.sync_sites["step"].most_common(8)],
        "kernel_path": kernel,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    paths = [p for p in args.paths.split(",") if p]
    if "triton_interpreter" in paths and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("triton_interpreter needs TRITON_INTERPRET=1 set before Python starts", file=sys.stderr)
        return 2
    target, draft, prompts = load_real()
    out: dict[str, Any] = {"torch": torch.__version__, "tokens": args.tokens, "tree": TREE, "results": {}}
    for method in METHODS:
        for path in paths:
            row = count(target, draft, prompts, method, path, args.tokens)
            out["results"][f"{method}/{path}"] = row
            print(f"{method:7s} {path:20s} {row['syncs_per_step']:6.2f} syncs/step  ({row['steps']} steps, "
                  f"tau {row['tau']:.2f})  {'; '.join(row['sites'][:4])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
