"""EAGLE-3 proposing over its draft vocabulary against the full vocabulary (issue 14, item 8).

The shipped SmolLM2 EAGLE-3 head has a draft vocabulary of 8192 ids in a
49152-token target vocabulary. With ``DraftModel.proposal_ids`` the
level-wise builders process, rank and draw ``q`` over the 8192 columns and map
ids once per level; "full" disables it (``proposal_ids = None``), so ``q`` is
processed over all 49152 columns (``-inf`` outside the draft vocabulary), as
before. The trees are the same (same tau); the draft's time per step is not.

    python benchmarks/proposal_vocab.py --json benchmarks/results/proposal_vocab.json
"""

from __future__ import annotations

import argparse
import json

import torch

import specdec
from specdec.drafts.eagle import EagleDraft, load_shipped
from specdec.models.smollm2 import load_smollm2
from specdec.targets.hf import HFTarget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting; the best is reported")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_smollm2()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Explain how a bicycle stays upright."}],
                                     tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    reduced_ids = EagleDraft.proposal_ids
    runs: dict[tuple[str, str], list[dict]] = {}
    try:
        for _ in range(args.repeats):
            for mode in ("reduced", "full"):
                EagleDraft.proposal_ids = reduced_ids if mode == "reduced" else property(lambda self: None)
                for method in ("eagle3", "rheo"):
                    draft = load_shipped(3, model)
                    target = HFTarget(model, capture_layers=draft.target_layers)
                    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="torch")
                    s = gen.generate(prompt, args.tokens, specdec.SamplingConfig(temperature=1.0), seed=1).stats
                    runs.setdefault((method, mode), []).append(dict(
                        draft_ms=1e3 * s.time_draft / s.steps, verify_ms=1e3 * s.time_verify / s.steps,
                        target_ms=1e3 * s.time_target / s.steps, tau=s.tau, steps=s.steps))
    finally:
        EagleDraft.proposal_ids = reduced_ids
    rows = []
    for (method, mode), rs in runs.items():
        best = min(rs, key=lambda r: r["draft_ms"])
        rows.append(dict(method=method, proposal=mode, **best))
        print(f"{method:6s} {mode:7s}: draft {best['draft_ms']:6.1f} ms/step (tree building + head forwards), "
              f"verify {best['verify_ms']:5.1f}, target {best['target_ms']:6.1f}, tau {best['tau']:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
