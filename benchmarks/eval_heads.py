"""Measure the EAGLE heads and the draft LM against SmolLM2-135M-Instruct on held-out prompts.

Prompts: the first user turn of held-out ShareGPT conversations (ids in
``specdec/assets/sharegpt_heldout_ids.txt``, never used in training), rendered
with the chat template. For each prompt the target greedily generates
``--new-tokens`` tokens; then, teacher-forced on that sequence:

* ``top1``: how often the draft's most likely next token equals the target's,
  over the generated positions (depth 1);
* for the EAGLE heads, ``top1@d`` for d = 2, 3: the same for the head's d-th
  chained step (feeding its own features, ground-truth tokens), i.e. the
  agreement of a chain draft at depth d given the earlier tokens were right.

With ``--tau``, also runs the speculative generator (eagle2 / eagle3 / rheo
methods, 60-node depth-6 trees) at T=0 and T=1 and reports tau.

Usage::

    python benchmarks/eval_heads.py --run /work/train_runs/smollm2   # a training run's exports
    python benchmarks/eval_heads.py --shipped                        # the weights in specdec/assets
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def heldout_prompts(tok, n: int, max_prompt_tokens: int) -> list[tuple[str, list[int]]]:
    from specdec.train.data import is_heldout, load_records

    recs = [r for r in load_records(None, split="heldout") if r.messages and r.messages[0][0] == "user"]
    recs.sort(key=lambda r: r.id)
    out = []
    for r in recs:
        text = r.messages[0][1]
        ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        if 8 <= len(ids) <= max_prompt_tokens:
            assert is_heldout(r.id)
            out.append((r.id, list(ids)))
        if len(out) >= n:
            break
    return out


@torch.no_grad()
def greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                         pad_token_id=model.config.eos_token_id)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def head_agreement(head, hidden, ids, prompt_len, steps=3):
    """top-1 agreement at chain depths 1..steps over positions predicting generated tokens."""
    from specdec.train.trainer import eagle3_ttt_forward

    feats = torch.cat([hidden[l] for l in head.config.target_layers], dim=-1)
    outs = eagle3_ttt_forward(head, feats, ids, steps)
    t = ids.shape[1]
    res = []
    for j, h in enumerate(outs):
        # column i, step j predicts token x_{i+2+j}; the target's choice is ids[i+2+j] (greedy sequence)
        cols = [i for i in range(t - 1) if prompt_len <= i + 2 + j < t]
        pred = head.draft_to_target[head.draft_logits(h[0, cols]).argmax(-1)]
        want = ids[0, [i + 2 + j for i in cols]]
        res.append((int((pred == want).sum()), len(cols)))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", type=Path, help="training run folder (eagle2/, eagle3/, draft_lm/ or checkpoint/)")
    src.add_argument("--shipped", action="store_true", help="the weights shipped in specdec/assets")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=200)
    ap.add_argument("--tau", action="store_true", help="also measure tau with the generator")
    ap.add_argument("--tau-prompts", type=int, default=5)
    ap.add_argument("--tau-seeds", type=int, default=1, help="seeds per prompt at T=1 (T=0 is deterministic)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--tau-temps", default="0,1", help="temperatures of the tau runs (comma list)")
    ap.add_argument("--tau-methods", default=None, help="comma list of methods of the tau runs (default: all)")
    ap.add_argument("--only", default=None,
                    help="comma list of drafts to measure among eagle2, eagle3, draft_lm, truncated (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from specdec.drafts.eagle.checkpoints import load_draft_lm, load_head, shipped_draft_lm_path, shipped_head_path
    from specdec.models.smollm2 import load_smollm2
    from specdec.train.trainer import make_draft_lm

    t0 = time.time()
    model, tok = load_smollm2()
    heads, lms = {}, {}
    for v in (2, 3):
        path = shipped_head_path(v) if args.shipped else args.run / f"eagle{v}"
        if not args.shipped and not path.exists():
            continue
        if (path / "config.json").exists():
            heads[f"eagle{v}"] = load_head(path, model)
    if args.shipped:
        lms["draft_lm"] = load_draft_lm(shipped_draft_lm_path(), model)
    elif (args.run / "draft_lm" / "config.json").exists():
        from transformers import AutoModelForCausalLM

        lms["draft_lm"] = AutoModelForCausalLM.from_pretrained(args.run / "draft_lm").eval()
    if not args.shipped and not heads and (args.run / "checkpoint").exists():  # still training
        from specdec.train.recipes import students_from_checkpoint

        for name, m in students_from_checkpoint(args.run, model).items():
            (lms if name == "draft_lm" else heads)[name] = m
        step = json.loads((args.run / "checkpoint" / "state.json").read_text())["step"]
        print(f"using the run's checkpoint at step {step}")
    lms["truncated-2-layer"] = make_draft_lm(model, 2).eval()  # the untrained baseline (first 2 layers)
    keep = set(args.only.split(",")) if args.only else None
    if keep is not None:
        unknown = keep - {"eagle2", "eagle3", "draft_lm", "truncated"}
        if unknown:
            ap.error(f"--only: unknown drafts {sorted(unknown)}")
        heads = {k: v for k, v in heads.items() if k in keep}
        lms = {k: v for k, v in lms.items() if k in keep or (k.startswith("truncated") and "truncated" in keep)}
    prompts = heldout_prompts(tok, args.prompts, args.max_prompt_tokens)
    print(f"{len(prompts)} held-out prompts; loaded in {time.time() - t0:.0f}s", flush=True)
    counts: dict[str, list[list[int]]] = {}
    layers = sorted({l for h in heads.values() for l in h.config.target_layers})
    for pid, prompt in prompts:
        cont = greedy(model, prompt, args.new_tokens)
        ids = torch.tensor([prompt + cont])
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        hidden = {l: out.hidden_states[l] for l in layers}
        target_top = out.logits[0].argmax(-1)
        for name, head in heads.items():
            for j, (ok, n) in enumerate(head_agreement(head, hidden, ids, len(prompt))):
                c = counts.setdefault(f"{name} top1@{j + 1}", [0, 0])
                c[0] += ok
                c[1] += n
        for name, lm in lms.items():
            with torch.no_grad():
                pred = lm(input_ids=ids).logits[0].argmax(-1)
            sl = slice(len(prompt) - 1, ids.shape[1] - 1)
            c = counts.setdefault(f"{name} top1@1", [0, 0])
            c[0] += int((pred[sl] == target_top[sl]).sum())
            c[1] += sl.stop - sl.start
        print(pid, {k: round(a / b, 3) for k, (a, b) in counts.items()}, flush=True)
    results = {"prompts": [p for p, _ in prompts], "new_tokens": args.new_tokens,
               "agreement": {k: a / b for k, (a, b) in counts.items()},
               "positions": {k: b for k, (_, b) in counts.items()}}
    if args.tau:
        results["tau"] = measure_tau(model, heads, lms.get("draft_lm"), prompts[: args.tau_prompts], args.new_tokens,
                                     seeds=args.tau_seeds, truncated=keep is None or "truncated" in keep,
                                     temps=[float(t) for t in args.tau_temps.split(",")],
                                     methods=args.tau_methods.split(",") if args.tau_methods else None)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def measure_tau(model, heads, draft_lm, prompts, new_tokens, seeds=1, truncated=True, temps=(0.0, 1.0),
                methods=None):
    import specdec
    from specdec.bench.runner import _stderr
    from specdec.drafts.eagle import hf_feature_fn, make_draft
    from specdec.targets.hf import HFTarget

    from specdec.drafts.hf import HFDraft
    from specdec.models.hf_common import truncated_copy

    out = {}
    runs = [("eagle2", "eagle2"), ("eagle3", "eagle3"), ("rheo", "eagle3"), ("eagle2", "draft_lm"),
            ("eagle2", "truncated-4-layer")]
    for method, head_name in runs:
        if methods is not None and method not in methods:
            continue
        if head_name in heads:
            head = heads[head_name]
            draft = make_draft(head, feature_fn=hf_feature_fn(model, head.config.target_layers))
            target = HFTarget(model, capture_layers=head.config.target_layers)
        elif head_name == "draft_lm" and draft_lm is not None:
            draft, target = HFDraft(draft_lm), HFTarget(model)
        elif head_name == "truncated-4-layer" and truncated:  # issue 3's baseline draft
            draft, target = HFDraft(truncated_copy(model, 4)), HFTarget(model)
        else:
            continue
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, N=60, depth=6)
        for temp in temps:
            emitted = steps = 0
            taus = []
            t0 = time.time()
            for i, (_, prompt) in enumerate(prompts):
                for s in range(seeds if temp > 0 else 1):
                    o = gen.generate(prompt, max_new_tokens=new_tokens,
                                     sampling=specdec.SamplingConfig(temperature=temp), seed=i + 1000 * s)
                    emitted += o.stats.emitted
                    steps += o.stats.steps
                    taus.append(o.stats.emitted / o.stats.steps)
            # tau = all emitted tokens / all steps; stderr: of the per-run taus' mean (as specdec bench)
            out[f"{method}+{head_name} T={temp:g}"] = {"tau": emitted / steps, "runs": len(taus),
                                                       "stderr": _stderr(taus), "seconds": time.time() - t0}
            print(method, head_name, temp, out[f"{method}+{head_name} T={temp:g}"], flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
