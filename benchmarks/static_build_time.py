"""Time to grow one static tree (Sequoia) over a large vocabulary with a reduced proposal vocabulary.

The draft is a stub (:class:`~specdec.testing.ProposalLM`) declaring ``Vd`` of
``V`` ids, as an EAGLE-3 head does (Gemma-3: V = 262,144, Vd = 16,384), with
logits ``-inf`` outside them; the tree is Sequoia's for a flat acceptance
vector (a wide root, as at high temperature). The script times whichever
``specdec`` is imported, so an older commit can be timed from a worktree
between runs of the current one (only interleaved runs compare on a shared
machine)::

    git worktree add /tmp/wt_before 9c6ff84      # before the static draws moved to the Vd columns
    PYTHONPATH=/tmp/wt_before/src python benchmarks/static_build_time.py
    python benchmarks/static_build_time.py

One thread, T = 1.2, the median of ``--repeats`` builds (the stub's own time
included: it writes ``[R, V]`` logits per level). Prints one JSON line: the
median seconds per tree and the first tokens of the last tree (the same in
both checkouts: the trees are the same draw for draw).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import specdec
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing import ProposalLM
from specdec.trees import build_trees

ACCEPTANCE = (0.35, 0.12, 0.07, 0.05, 0.04, 0.03, 0.025, 0.02, 0.02, 0.015)
"""A flat positional acceptance vector: Sequoia's tree for it has a wide root."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=262144, help="V, the target's vocabulary")
    ap.add_argument("--proposal", type=int, default=16384, help="Vd, the draft's proposal vocabulary (every V/Vd-th id)")
    ap.add_argument("--nodes", type=int, default=60)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    V, Vd = args.vocab, args.proposal
    if not 0 < Vd <= V:
        raise SystemExit(f"--proposal must be in 1..{V}, got {Vd}")
    keep = torch.arange(0, V, V // Vd)[:Vd]  # [Vd] ascending ids
    g = torch.Generator().manual_seed(0)
    base = torch.randn(Vd, generator=g) * 3  # [Vd]

    def logits(prefixes):  # [len(prefixes), V], -inf outside the proposal ids
        out = torch.full((len(prefixes), V), float("-inf"))
        out[:, keep] = base + 0.1 * torch.randn(len(prefixes), Vd, generator=g)
        return out

    builder = get("tree", "sequoia")(num_nodes=args.nodes, max_depth=args.depth, acceptance=ACCEPTANCE)
    draft = ProposalLM(logits, vocab_size=V, keep=keep)
    sampling = SamplingConfig(temperature=1.2)
    times, tree = [], None
    for seed in range(args.repeats):
        draft.begin([1, 2])
        t0 = time.perf_counter()
        tree = build_trees(builder, 2, draft, sampling, TorchRandom.seeded(seed))
        times.append(time.perf_counter() - t0)
    root_children = sum(1 for p in builder.shape()[0] if len(p) == 1)
    print(json.dumps({
        "specdec": specdec.__file__, "V": V, "Vd": Vd, "nodes": args.nodes, "root_children": root_children,
        "median_s": round(statistics.median(times), 4), "tokens": tree.tokens[0, :8].tolist(),
    }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
