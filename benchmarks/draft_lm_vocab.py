"""The shipped SmolLM2 draft LM over its proposal vocabulary against the full vocabulary (issue 48).

The draft LM's distillation loss read only its run's 8,192-id draft vocabulary,
which it now proposes over (``proposal_ids.json``; the bench's ``lm`` draft),
while transformers' assisted generation applies the whole 49,152-row LM head
(the bench's ``lm-full`` draft). This measures the first draft's acceptance
under both laws exactly, without sampling noise in the acceptance itself: on
the target's own continuation of every shipped prompt (greedy at T = 0,
sampled at T = 1, seed 0), teacher-forced, at every generated position

- T = 0: 1 when the draft's argmax is the target's (the chain's acceptance);
- T > 0: ``sum_x min(p(x), q(x))``, the probability that a draft drawn from
  ``q`` is accepted by speculative sampling (Leviathan et al., rule 1),

with ``q`` the draft's law over the whole vocabulary or over the proposal ids
(``-inf`` elsewhere, as ``HFDraft(proposal_ids=...)`` gives it). Reports the
means, the paired difference with its standard error, and the target's mass
outside the proposal vocabulary. Hardware-free (no timing).

    python benchmarks/draft_lm_vocab.py --json benchmarks/results/draft_lm_vocab.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from specdec.bench.prompts import load_prompts, render_prompt
from specdec.drafts.eagle.checkpoints import draft_lm_proposal_ids, load_draft_lm, shipped_draft_lm_path
from specdec.models import smollm2

SHIPPED_PROMPTS = "shipped"


def _mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / len(values) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=SHIPPED_PROMPTS, help="as specdec bench --prompts (default: the shipped set)")
    ap.add_argument("--tokens", type=int, default=40, help="target tokens generated per prompt")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, tok = smollm2.load_smollm2()
    lm = load_draft_lm(shipped_draft_lm_path(), target)
    ids = draft_lm_proposal_ids(shipped_draft_lm_path())
    if ids is None:
        raise SystemExit("the installed draft LM has no proposal vocabulary (specdec-trees-smollm2 < 0.1.1)")
    outside = torch.ones(int(target.config.vocab_size), dtype=torch.bool)
    outside[ids] = False
    prompts = load_prompts(args.prompts)
    report: dict[str, object] = {"prompts": args.prompts, "count": len(prompts), "tokens": args.tokens,
                                 "proposal_ids": len(ids), "by_temperature": []}
    for t in (float(x) for x in args.temperatures.split(",")):
        full: list[float] = []
        vd: list[float] = []
        p_out: list[float] = []
        for i, prompt in enumerate(prompts):
            ctx = torch.tensor([render_prompt(tok, prompt.turns[0])])
            n0 = ctx.shape[1]
            torch.manual_seed(i)
            with torch.no_grad():
                seq = target.generate(ctx, max_new_tokens=args.tokens, do_sample=t > 0, temperature=t if t > 0 else None,
                                      top_k=0, top_p=1.0)
                p_logits = target(seq).logits[0, n0 - 1:-1].double()
                q_logits = lm(seq).logits[0, n0 - 1:-1].double()
            q_vd = torch.full_like(q_logits, float("-inf"))
            q_vd[:, ids] = q_logits[:, ids]
            if t == 0:
                top = p_logits.argmax(-1)
                full += (q_logits.argmax(-1) == top).double().tolist()
                vd += (q_vd.argmax(-1) == top).double().tolist()
                p_out += outside[top].double().tolist()
            else:
                p = torch.softmax(p_logits / t, -1)
                full += torch.minimum(p, torch.softmax(q_logits / t, -1)).sum(-1).tolist()
                vd += torch.minimum(p, torch.softmax(q_vd / t, -1)).sum(-1).tolist()
                p_out += p[:, outside].sum(-1).tolist()
        diff = [a - b for a, b in zip(vd, full)]
        row = {"temperature": t, "positions": len(full), "acceptance_full": _mean_se(full),
               "acceptance_proposal": _mean_se(vd), "difference": _mean_se(diff),
               "target_mass_outside": _mean_se(p_out)}
        report["by_temperature"].append(row)  # type: ignore[union-attr]
        print(f"T={t:g}: {len(full)} positions; first-draft acceptance full {row['acceptance_full'][0]:.4f}, "
              f"over the {len(ids)} proposal ids {row['acceptance_proposal'][0]:.4f}; difference "
              f"{row['difference'][0]:+.4f} +- {row['difference'][1]:.4f} (SE); target mass outside "
              f"{row['target_mass_outside'][0]:.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
