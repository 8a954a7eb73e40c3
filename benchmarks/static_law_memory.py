"""Sparse static-tree laws (issue 45, item 5): law memory per step, and what the truncation costs in acceptance.

1. Memory (hardware-free): a SpecInfer tree (``static``, expansion ``(4, 2, 2, 1)``: 45 nodes)
   over ``V = 128,256`` (Llama-3's vocabulary), one row, drafted from random logits: the bytes of
   the tree batch's laws (``law_ids`` int64 + ``law_probs`` float64) with the full law and with
   ``proposal_top_k = k``; and the laws the serving path records by default (issue 58: the tree
   drafted through :func:`specdec.engine.serving.engine_feed` from the builder with its full-law
   default, ``proposal_top_k = 0``, so ``SERVING_LAW_TOP_K``).
2. Acceptance (hardware-free): on SmolLM2-135M-Instruct with the shipped draft LM (full
   vocabulary, V = 49,152), at every position of a few ShareGPT prompts, the best one-draft
   acceptance ``sum_x min(p(x), q(x))`` (speculative sampling's) with the draft's law ``q`` and
   with ``q`` truncated to its top ``k`` (renormalised): the mean ratio says what the sparse
   proposal gives up per drafted token.

    python benchmarks/static_law_memory.py --markdown benchmarks/results/static_law_memory.md
    python benchmarks/static_law_memory.py --no-acceptance --markdown benchmarks/results/static_law_memory_issue58.md \
        --json benchmarks/results/static_law_memory_issue58.json
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec.engine.serving import SERVING_LAW_TOP_K, engine_feed
from specdec.models import CallableLM
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import DraftSpec
from specdec.trees.static import StaticTreeBuilder, truncate_proposal
from specdec.trees import build_trees

KS = (64, 256, 1024)


def law_bytes(vocab: int, k: int, seed: int = 0) -> tuple[int, int, int]:
    """(law bytes, whole tree batch bytes, nodes) of one SpecInfer tree over ``vocab``."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(16, vocab, generator=g) * 3  # logits by the last token mod 16

    draft = CallableLM(lambda ps: table[[p[-1] % 16 for p in ps]], vocab_size=vocab)
    draft.begin([1, 2])
    builder = StaticTreeBuilder(expansion=(4, 2, 2, 1), proposal_top_k=k)
    batch = build_trees(builder, 2, draft, SamplingConfig(temperature=1.0), TorchRandom.seeded(seed))
    return _sizes(batch)


def serving_law_bytes(vocab: int, seed: int = 0) -> tuple[int, int, int, int]:
    """(law bytes, whole tree batch bytes, nodes, law width) of the same tree drafted through the
    serving feed with its default laws (the builder's own option left at the full law)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(16, vocab, generator=g) * 3
    feed = engine_feed(StaticTreeBuilder(expansion=(4, 2, 2, 1)), torch.tensor([2]), SamplingConfig(temperature=1.0),
                       RowStreams([TorchRandom.seeded(seed)]), DraftSpec(vocab))
    while (request := feed.request) is not None:
        feed.give(request.level, table[torch.tensor([2]) % 16] if request.level == 0 else table[request.tokens % 16])
    return (*_sizes(feed.tree), int(feed.tree.law_ids.shape[-1]))


def _sizes(batch: TreeBatch) -> tuple[int, int, int]:
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
    laws, total, n, width = serving_law_bytes(args.vocab)
    rows.append({"proposal_top_k": f"serving default (engine_feed, {width})", "nodes": n, "law_bytes": laws,
                 "batch_bytes": total, "vs_full": laws / base if base else 1.0})
    assert width == min(SERVING_LAW_TOP_K, args.vocab)
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
            fh.write(text + "\nCommand: `python benchmarks/static_law_memory.py "
                     + ("--no-acceptance " if args.no_acceptance else "") + f"--markdown {args.markdown}`\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"memory": rows, "acceptance": acc}, fh, indent=1)


if __name__ == "__main__":
    main()
