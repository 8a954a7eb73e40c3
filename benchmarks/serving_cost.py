"""What the default serving call costs (issue 58, deliverables 2 and 5): host reads, law memory, CPU time.

For every registered method, ``B = 4`` rows with 4 sampling configurations (``T = 1``; ``T = 0.7``,
top-p 0.9; ``T = 1.2``, top-k 50; greedy) at ``V = 49,152`` (SmolLM2's vocabulary): the trees are
drafted through the serving feed (:func:`specdec.engine.serving.engine_feed`, its default laws;
``--laws dense`` asks for the full ones) from a toy draft (random logits by the last token mod 64),
the target's logits likewise, and :func:`specdec.engine.serving.verify_for_engine` is called with
its defaults. Per method:

- host reads of the call (``StepCounter``: ``item`` / ``tolist`` / ``bool`` / ... outside models;
  a second call, the first warms up), and host-to-device copies;
- the bytes of the tree batch's laws (``law_ids`` int64 + ``law_probs`` float64) and of the whole batch;
- the CPU time of the call (median of ``--repeats``, one torch thread).

    python benchmarks/serving_cost.py --markdown benchmarks/results/serving_cost_issue58.md \\
        --json benchmarks/results/serving_cost_issue58.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

import specdec.engine.serving as serving
from specdec.registry import get, list_registered
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing.counter import StepCounter
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import DraftSpec, TreeFeed

CONFIGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9),
           SamplingConfig(temperature=1.2, top_k=50), SamplingConfig(temperature=0.0)]
FIELDS = ("tokens", "parents", "depths", "kinds", "draw_order", "weights", "num_nodes", "law_ids", "law_probs",
          "law_wor", "ancestors")


def _tables(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(64, vocab, generator=g) * 3  # logits by the last token mod 64
    return target, target + torch.randn(64, vocab, generator=g)


def draft_tree(method: str, vocab: int, laws: str, seed: int = 0) -> tuple[TreeBatch, str]:
    """The method's tree batch over ``B = 4`` rows, drafted through the serving feed."""
    m = get("method", method)
    builder, verifier = m.build()
    _, draft = _tables(vocab, seed)
    roots = torch.tensor([1, 2, 3, 4])
    rng = RowStreams([TorchRandom.seeded(seed + b) for b in range(4)])
    engine_feed = getattr(serving, "engine_feed", None)
    if engine_feed is None:  # before issue 58: the plain feed (the builder's own laws)
        feed = TreeFeed(builder, roots, CONFIGS, rng, DraftSpec(vocab))
    else:
        feed = engine_feed(builder, roots, CONFIGS, rng, DraftSpec(vocab), laws=laws)
    while (request := feed.request) is not None:
        feed.give(request.level, draft[roots % 64] if request.level == 0 else draft[request.tokens % 64])
    return feed.tree, verifier.registry_name


def measure(method: str, vocab: int, laws: str, repeats: int) -> dict[str, Any]:
    tree, verifier = draft_tree(method, vocab, laws)
    target, _ = _tables(vocab, 0)
    logits = target[tree.tokens % 64]  # [B, n, V]

    def call() -> serving.EngineVerification:
        rng = RowStreams([TorchRandom.seeded(100 + b) for b in range(4)])
        return serving.verify_for_engine(tree, logits, verifier, CONFIGS, rng)

    call()
    with StepCounter(ops=False) as counter:
        out = call()
    reads = sum(k for (kind, _), k in counter.sync_sites["step"].items() if kind == "read")
    copies = sum(k for (kind, _), k in counter.sync_sites["step"].items() if kind == "h2d")
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        call()
        times.append(time.thread_time() - t0)
    law = tree.law_ids.numel() * tree.law_ids.element_size() + tree.law_probs.numel() * tree.law_probs.element_size()
    whole = sum(getattr(tree, f).numel() * getattr(tree, f).element_size() for f in FIELDS)
    return {"method": method, "verifier": verifier, "laws": laws, "nodes": tree.node_slots,
            "law_width": int(tree.law_ids.shape[-1]), "host_reads": reads, "h2d": copies, "law_bytes": law,
            "batch_bytes": whole, "cpu_s": statistics.median(times), "path": out.path,
            "flags": out.flag.tolist(), "sites": sorted(f"{kind} {site} x{k}" for (kind, site), k
                                                        in counter.sync_sites["step"].items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49_152)
    ap.add_argument("--laws", default="sparse", choices=("sparse", "dense"))
    ap.add_argument("--methods", default=",".join(list_registered("method")))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default="", help="a heading for this run (e.g. before / after)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [measure(m, args.vocab, args.laws, args.repeats) for m in args.methods.split(",")]
    rheo = next((r["cpu_s"] for r in rows if r["method"] == "rheo"), None)
    lines = [f"verify_for_engine, defaults, V = {args.vocab:,}, B = 4 rows, 4 sampling configurations, "
             f"serving feed laws: {args.laws} {args.label}".rstrip(), "",
             "| method | verifier | nodes | law width | host reads | h2d copies | laws | whole tree batch | "
             "CPU s / call | vs rheo |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['cpu_s'] / rheo:.2f}" if rheo else "-"
        lines.append(f"| {r['method']} | {r['verifier']} | {r['nodes']} | {r['law_width']} | {r['host_reads']} | "
                     f"{r['h2d']} | {r['law_bytes'] / 1e6:.3f} MB | {r['batch_bytes'] / 1e6:.3f} MB | "
                     f"{r['cpu_s']:.4f} | {ratio} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as fh:
            fh.write(text + "\nCommand: `python benchmarks/serving_cost.py " + f"--laws {args.laws} --markdown "
                     f"{args.markdown}`\n\n")
    if args.json:
        try:
            with open(args.json) as fh:
                runs = json.load(fh)
        except FileNotFoundError:
            runs = {}
        runs[f"{args.label or 'run'} ({args.laws})"] = {"vocab": args.vocab, "rows": rows}
        with open(args.json, "w") as fh:
            json.dump(runs, fh, indent=1)


if __name__ == "__main__":
    main()
