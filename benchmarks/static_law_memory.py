"""Sparse static-tree laws (issue 45, item 5): law memory per step, and what the truncation costs in acceptance.

1. Memory (hardware-free): a SpecInfer tree (``static``, expansion ``(4, 2, 2, 1)``: 45 nodes)
   over ``V = 128,256`` (Llama-3's vocabulary), one row, drafted from random logits: the bytes of
   the tree batch's laws (``law_ids`` int64 + ``law_probs`` float64) with the full law and with
   ``proposal_top_k = k``.
2. Acceptance (hardware-free): on SmolLM2-135M-Instruct with the shipped draft LM (full
   vocabulary, V = 49,152), at every position of a few ShareGPT prompts, the best one-draft
   acceptance ``sum_x min(p(x), q(x))`` (speculative sampling's) with the draft's law ``q`` and
   with ``q`` truncated to its top ``k`` (renormalised): the mean ratio says what the sparse
   proposal gives up per drafted token.

    python benchmarks/static_law_memory.py --markdown benchmarks/results/static_law_memory.md
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec.models import CallableLM
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.trees.static import StaticTreeBuilder, truncate_proposal

KS = (64, 256, 1024)


def law_bytes(vocab: int, k: int, seed: int = 0) -> tuple[int, int, int]:
    """(law bytes, whole tree batch bytes, nodes) of one SpecInfer tree over ``vocab``."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(16, vocab, generator=g) * 3  # logits by the last token mod 16

    draft = CallableLM(lambda ps: table[[p[-1] % 16 for p in ps]], vocab_size=vocab)
    draft.begin([1, 2])
    builder = StaticTreeBuilder(expansion=(4, 2, 2, 1), proposal_top_k=k)
    batch = builder.build_batch(2, draft, SamplingConfig(temperature=1.0), TorchRandom.seeded(seed))
    laws = batch.law_ids.numel() * batch.law_ids.element_size() + batch.law_probs.numel() * batch.law_probs.element_size()
    total = sum(t.numel() * t.element_size() for t in (batch.tokens, batch.parents, batch.depths, batch.kinds,
                                                         batch.draw_order, batch.weights, batch.law_ids,
                                                         batch.law_probs, batch.law_wor, batch.ancestors))
    return laws, total, batch.node_slots


def acceptance(prompts: int, temperatures: tuple[float, ...]) -> dict[str, dict[str, float]]:
    from specdec.bench.models import load_bench_models
    from specdec.bench.prompts import load_sharegpt_prompts

    models = load_bench_models("smollm2", need_kinds=frozenset({"lm"}))
    target, draft = models.target, models.drafts["lm"]
    texts = [p.turns[0] for p in load_sharegpt_prompts(prompts)]
    out: dict[str, dict[str, float]] = {}
    for T in temperatures:
        sampling = SamplingConfig(temperature=T)
        full, trunc = 0.0, {k: 0.0 for k in KS}
        positions = 0
        for text in texts:
            ids = models.tokenize(text)[:256]
            p_rows = target_rows(target, ids)
            q_rows = draft_rows(draft, ids)
            for p_logits, q_logits in zip(p_rows, q_rows):
                p = process_logits(p_logits.double(), sampling)
                q = process_logits(q_logits.double(), sampling)
                full += float(torch.minimum(p, q).sum())
                for k in KS:
                    cols, probs = truncate_proposal(q.unsqueeze(0), k)
                    keep = cols[0] >= 0
                    trunc[k] += float(torch.minimum(p[cols[0][keep]], probs[0][keep]).sum())
                positions += 1
        out[f"T={T}"] = {"positions": positions, "full": full / positions,
                         **{f"top{k}": trunc[k] / positions for k in KS},
                         **{f"ratio_top{k}": trunc[k] / full for k in KS}}
    return out


def target_rows(target, ids: list[int]) -> list[torch.Tensor]:
    """The target's logits after every prefix of ``ids`` (one forward of the prompt)."""
    model = target.model
    with torch.no_grad():
        return list(model(torch.tensor([ids])).logits[0, 1:].float())


def draft_rows(draft, ids: list[int]) -> list[torch.Tensor]:
    model = draft.model
    with torch.no_grad():
        return list(model(torch.tensor([ids])).logits[0, 1:].float())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128_256)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--no-acceptance", action="store_true", help="the memory table only (no model load)")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    base = None
    for k in (0, *KS):
        laws, total, n = law_bytes(args.vocab, k)
        base = laws if k == 0 else base
        rows.append({"proposal_top_k": k, "nodes": n, "law_bytes": laws, "batch_bytes": total,
                     "vs_full": laws / base if base else 1.0})
    acc = {} if args.no_acceptance else acceptance(args.prompts, (1.0, 0.6))
    lines = [f"SpecInfer tree, expansion (4, 2, 2, 1), V = {args.vocab:,}, one row: law memory per step", "",
             "| proposal_top_k | nodes | laws (law_ids + law_probs) | whole tree batch | laws vs full |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['proposal_top_k'] or 'full'} | {r['nodes']} | {r['law_bytes'] / 1e6:.3f} MB | "
                     f"{r['batch_bytes'] / 1e6:.3f} MB | {r['vs_full']:.5f} |")
    if acc:
        lines += ["", "SmolLM2-135M-Instruct, shipped draft LM, ShareGPT prompts: mean one-draft acceptance "
                  "sum min(p, q) at every prompt position", "",
                  "| T | positions | full q | " + " | ".join(f"top-{k} (ratio)" for k in KS) + " |",
                  "|---|---|---|" + "---|" * len(KS)]
        for name, a in acc.items():
            lines.append(f"| {name[2:]} | {a['positions']} | {a['full']:.4f} | "
                         + " | ".join(f"{a[f'top{k}']:.4f} ({a[f'ratio_top{k}']:.4f})" for k in KS) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text + "\nCommand: `python benchmarks/static_law_memory.py --markdown "
                     "benchmarks/results/static_law_memory.md`\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"memory": rows, "acceptance": acc}, fh, indent=1)


if __name__ == "__main__":
    main()
