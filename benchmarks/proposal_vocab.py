"""EAGLE-3 proposing over its draft vocabulary against the full vocabulary (issue 14, item 8).

The shipped SmolLM2 EAGLE-3 head has a draft vocabulary of 8192 ids in a
49152-token target vocabulary. With ``DraftModel.proposal_ids`` the
level-wise builders process, rank and draw ``q`` over the 8192 columns and map
ids once per level, and the static builders (SpecInfer, Sequoia) keep each
node's law over those columns, so the rejection verifiers' residual work is
``[n, 8192]`` instead of ``[n, 49152]``; "full" disables it (``proposal_ids =
None``), so ``q`` is processed and kept over all 49152 columns (``-inf``
outside the draft vocabulary), as before. The trees and the emitted tokens are
the same (checked: ``same_tokens``); the time per step is not.

    python benchmarks/proposal_vocab.py --json benchmarks/results/proposal_vocab.json
    python benchmarks/proposal_vocab.py --target gemma3 --methods specinfer,sequoia --tokens 16 --repeats 1
"""

from __future__ import annotations

import argparse
import json

import torch

import specdec
from specdec.bench.models import load_bench_models
from specdec.drafts.eagle import EagleDraft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting; the best is reported")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="smollm2", help="smollm2 (shipped head) or gemma3 (the head in the user cache)")
    ap.add_argument("--methods", default="eagle3,rheo,specinfer,sequoia")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = load_bench_models(args.target, need_kinds=frozenset({"eagle3"}))
    if "eagle3" not in models.drafts:
        raise SystemExit(f"no EAGLE-3 head for {args.target}")
    prompt = models.tokenize("Explain how a bicycle stays upright.")
    reduced_ids = EagleDraft.proposal_ids
    runs: dict[tuple[str, str], list[dict]] = {}
    try:
        for _ in range(args.repeats):
            for mode in ("reduced", "full"):
                EagleDraft.proposal_ids = reduced_ids if mode == "reduced" else property(lambda self: None)
                for method in args.methods.split(","):
                    draft, target = models.drafts["eagle3"], models.targets["eagle3"]
                    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="torch")
                    out = gen.generate(prompt, args.tokens, specdec.SamplingConfig(temperature=1.0), seed=1)
                    s = out.stats
                    runs.setdefault((method, mode), []).append(dict(
                        draft_ms=1e3 * s.time_draft / s.steps, verify_ms=1e3 * s.time_verify / s.steps,
                        target_ms=1e3 * s.time_target / s.steps, tau=s.tau, steps=s.steps, tokens=list(out.tokens)))
    finally:
        EagleDraft.proposal_ids = reduced_ids
    rows = []
    for (method, mode), rs in runs.items():
        best = min(rs, key=lambda r: r["draft_ms"] + r["verify_ms"])
        same = all(r["tokens"] == o["tokens"] for r in rs for o in runs[(method, "reduced")])
        rows.append(dict(method=method, proposal=mode, same_tokens=same,
                         **{k: v for k, v in best.items() if k != "tokens"}))
        print(f"{method:9s} {mode:7s}: draft {best['draft_ms']:7.1f} ms/step (tree building + head forwards), "
              f"verify {best['verify_ms']:7.1f}, target {best['target_ms']:6.1f}, tau {best['tau']:.2f}, "
              f"tokens equal to reduced: {same}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "target": models.descriptions["target"], "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
