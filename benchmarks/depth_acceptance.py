"""Positional acceptance by depth: is a draw at depth 2 accepted as often as the same draw at depth 1?

RheoSampling's calibrated proxy (docs/trees.md, "The calibrated proxy") and
Sequoia's positional acceptance vector are both measured on one-level trees
(the root's children), and both builders then use them at every depth. An
EAGLE head drafts depth 1 from the target's own features and deeper levels
from its own predicted ones, so its deeper draws may be accepted less often
at the same rank and the same draft probability. This script measures it:
two-level static trees (``k`` children of the root, ``k`` children of each,
drawn without replacement), verified by rule 4 (``rejection-wor``) and
committed, as the profiles do (:func:`specdec.engine.profile_steps`). For
depth ``d`` and draw ``i`` it reports

* ``a[d][i]``: the fraction of the visits of a depth-``d`` node set in which
  the ``i``-th drawn child was the accepted one (depth 2 counts only the
  steps whose depth-1 child was accepted);
* the same split by the bin of the draft's ``q`` at the child's rank (the
  calibrated proxy's :data:`~specdec.trees.calibration.CALIBRATION_EDGES`), pooled over draws.

Contexts: the first user turns of ShareGPT *training-split* conversations
(seeded; the held-out slice and the bench prompts are not used)::

    python benchmarks/depth_acceptance.py --target smollm2 --temperature 1.2 --prompts 12 --steps 16
    python benchmarks/depth_acceptance.py --target gemma3 --temperature 1.2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2", help="smollm2 (shipped EAGLE-3 head) or gemma3 (the user cache's)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--k", type=int, default=8, help="children per node (draws)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--steps", type=int, default=16, help="committed steps per prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.temperature <= 0:
        raise SystemExit("--temperature must be > 0 (at T = 0 the trees are not sampled)")
    if args.k < 1 or args.prompts < 1 or args.steps < 1:
        raise SystemExit("--k, --prompts and --steps must be >= 1")
    torch.set_num_threads(args.threads)

    from specdec.bench.models import load_bench_models
    from specdec.registry import get
    from specdec.rng import TorchRandom
    from specdec.sampling import SamplingConfig
    from specdec.engine import profile_steps
    from specdec.train.data import is_heldout, load_records
    from specdec.trees.calibration import CALIBRATION_EDGES, _bin
    from specdec.trees.static import StaticTreeBuilder

    t0 = time.perf_counter()
    models = load_bench_models(args.target, need_kinds=frozenset({"eagle3"}),
                               log=lambda s: print(s, file=sys.stderr, flush=True))
    if "eagle3" not in models.drafts:
        raise SystemExit(f"no EAGLE-3 head for {args.target}")
    target, draft = models.targets["eagle3"], models.drafts["eagle3"]
    recs = [r for r in load_records(None, split="train") if r.messages and r.messages[0][0] == "user"
            and not is_heldout(r.id) and len(r.messages[0][1]) > 40]
    random.Random(args.seed).shuffle(recs)
    prompts = [models.tokenize(r.messages[0][1][:800]) for r in recs[: args.prompts]]

    k = args.k
    builder = StaticTreeBuilder(expansion=(k, k), mode="wor")
    verifier = get("verifier", "rejection-wor")()
    sampling = SamplingConfig(temperature=args.temperature)
    bins = len(CALIBRATION_EDGES)
    visits = [0, 0]  # per depth: node sets visited (depth 2: the accepted depth-1 child's children)
    accepted = [[0] * k for _ in range(2)]  # [depth][draw]
    bin_seen = [[0] * bins for _ in range(2)]  # [depth][bin] children drawn (at reached node sets)
    bin_acc = [[0] * bins for _ in range(2)]
    n = 0
    for outcome in profile_steps(target, draft, prompts, builder, verifier, sampling,
                                 TorchRandom.seeded(args.seed), args.steps, room=k * k + 1, name="depth_acceptance"):
        tree = outcome.tree
        n += 1
        t = tree.tree(0)
        parents, order = t.parents.tolist(), t.draw_order.tolist()
        path = list(outcome.result.accepted_nodes)  # accepted node ids, root's child first
        reached = [0] + path[:1]  # the node sets visited: the root's, then the accepted depth-1 child's
        for d, node in enumerate(reached):
            kids = [c for c in range(1, len(parents)) if parents[c] == node]
            if not kids:
                continue
            visits[d] += 1
            law = t.sampled_law_at(node)  # the node's q (SparseLaw: ascending ids and probs)
            ranked = sorted(law.probs.tolist(), reverse=True)
            for c in kids:
                i = order[c]
                q_rank = ranked[i] if i < len(ranked) else 0.0  # q at the child's rank (the displaced weight)
                b = _bin(q_rank)
                bin_seen[d][b] += 1
                if len(path) > d and path[d] == c:
                    accepted[d][i] += 1
                    bin_acc[d][b] += 1
    out = {
        "target": args.target, "temperature": args.temperature, "k": k, "prompts": args.prompts,
        "steps_per_prompt": args.steps, "seed": args.seed, "steps": n, "visits": visits,
        "a": [[round(c / max(v, 1), 4) for c in row] for row, v in zip(accepted, visits)],
        "any": [round(sum(row) / max(v, 1), 4) for row, v in zip(accepted, visits)],
        "bins": list(CALIBRATION_EDGES),
        "rate_by_bin": [[None if s == 0 else round(a / s, 4) for a, s in zip(ra, rs)] for ra, rs in zip(bin_acc, bin_seen)],
        "count_by_bin": bin_seen, "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
