"""Time per step with and without a logits processor (issue 17, item 2).

Goal: processors add at most 10% to the time per step at 60 nodes with a
repetition penalty on. The SmolLM2-135M-Instruct target with the shipped
EAGLE-3 head (method ``eagle3``, a dynamic tree of ``--nodes`` nodes and depth
``--depth``), ``T = 1``, generates ``--tokens`` tokens with and without
``RepetitionPenaltyLogitsProcessor(--penalty)``; the processor runs once per
depth over all node rows (``specdec.processors``). Reported: ms per step
(generation time after prefill / steps; the best of ``--repeats`` runs), its
split (draft / target / verify, where verify includes the processor), tau,
and the overhead ``with / without - 1``. With the penalty the text differs,
so tau differs; the goal is on the time per step.

    python benchmarks/processor_overhead.py --device cuda --json benchmarks/results/processor_overhead.json
    python benchmarks/processor_overhead.py --tiny --tokens 16 --repeats 1   # a CPU check: tiny random Llamas
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import specdec


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def load(tiny: bool, device: str):
    """``(target, draft, prompt)``: SmolLM2 + its shipped EAGLE-3 head, or two tiny random Llamas."""
    if tiny:
        import transformers

        from specdec.drafts.hf import HFDraft
        from specdec.targets.hf import HFTarget

        def llama(seed: int):
            torch.manual_seed(seed)
            config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=512)
            return transformers.LlamaForCausalLM(config).eval().to(device)

        return HFTarget(llama(0)), HFDraft(llama(1)), [5, 17, 42, 8, 3, 99, 12]
    from specdec.drafts.eagle import load_shipped
    from specdec.models.smollm2 import load_smollm2
    from specdec.targets.hf import HFTarget

    model, tok = load_smollm2()
    model = model.to(device)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Explain how a bicycle stays upright."}],
                                     tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    draft = load_shipped(3, model)
    return HFTarget(model, capture_layers=draft.target_layers), draft, prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=60)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--penalty", type=float, default=1.2)
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting; the best is reported")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--kernel", default="auto", help="the generator's kernel= (auto, torch, triton)")
    ap.add_argument("--tiny", action="store_true", help="tiny random Llamas instead of SmolLM2 + EAGLE-3 (a check)")
    ap.add_argument("--process-draft", action="store_true",
                    help="also run with the draft wrapped in ProcessedDraft (the same processor on the draft's logits)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, prompt = load(args.tiny, args.device)
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="eagle3", kernel=args.kernel,
                                       K=10, depth=args.depth, N=args.nodes)
    sampling = specdec.SamplingConfig(temperature=1.0)
    settings = {"none": None, f"repetition_penalty={args.penalty}":
                LogitsProcessorList([RepetitionPenaltyLogitsProcessor(args.penalty)])}
    gen.generate(prompt, 8, sampling, seed=0)  # warm-up (allocations, kernels)
    rows = []
    runs = [(name, processor, gen) for name, processor in settings.items()]
    if args.process_draft:
        from specdec.drafts import ProcessedDraft

        name, processor = list(settings.items())[1]
        processed = specdec.SpeculativeGenerator(target=target, draft=ProcessedDraft(draft, processor), method="eagle3",
                                                 kernel=args.kernel, K=10, depth=args.depth, N=args.nodes)
        processed.generate(prompt, 8, sampling, seed=0, logits_processor=processor)  # warm-up
        runs.append((name + " + draft", processor, processed))
    for name, processor, generator in runs:
        best = None
        for r in range(args.repeats):
            _sync(args.device)
            t0 = time.perf_counter()
            out = generator.generate(prompt, args.tokens, sampling, seed=r, logits_processor=processor)
            _sync(args.device)
            s = out.stats
            wall = time.perf_counter() - t0 - s.time_prefill
            row = dict(processor=name, ms_per_step=1e3 * wall / s.steps, draft_ms=1e3 * s.time_draft / s.steps,
                       target_ms=1e3 * s.time_target / s.steps, verify_ms=1e3 * s.time_verify / s.steps,
                       tau=s.tau, steps=s.steps, tree_nodes_per_step=s.tree_nodes / s.steps,
                       kernel_path=s.kernel_path)
            if best is None or row["ms_per_step"] < best["ms_per_step"]:
                best = row
        rows.append(best)
        print(f"{name:26s}: {best['ms_per_step']:7.2f} ms/step (draft {best['draft_ms']:.2f}, target "
              f"{best['target_ms']:.2f}, verify {best['verify_ms']:.2f}), tau {best['tau']:.2f}, "
              f"{best['tree_nodes_per_step']:.0f} nodes/step, {best['kernel_path']}")
    overhead = rows[1]["ms_per_step"] / rows[0]["ms_per_step"] - 1.0
    print(f"overhead of the processor: {100 * overhead:+.1f}% per step (goal: <= +10%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=args.device, tiny=args.tiny, nodes=args.nodes, depth=args.depth,
                           tokens=args.tokens, rows=rows, overhead=overhead), f, indent=2)


if __name__ == "__main__":
    main()
