"""Traversal verification per step: its tensor form against rule 4's, on a 61-node tree at V = 49,152.

One static tree (expansion 4, 2, 2, 2: 60 draft nodes and the root, depth 4), children drawn
without replacement from random dense draft laws (the builders' default: the full law recorded,
``L = V``) or from their top 64 (``proposal_top_k = 64``, ``L = 64``); random float32 target logits,
T = 1, batch 1. Timed, per step, from the target's logits to the decision (what the step's
verification does): ``traversal`` by its tensor form (:func:`specdec.verify.traversal_tensor.decide_traversal_from_logits`),
``traversal`` by its host walk (the engine's path before the tensor form: each row's ``p`` processed,
then :meth:`TraversalVerifier.verify`), and rule 4 (``rejection-wor``) by its tensor form
(:func:`specdec.verify.fast.decide_from_logits`, ``rows="path"``: the CPU default, and ``rows="all"``:
every node at once, the form other devices run). Each figure is the minimum over ``--repeats`` runs
(``--walk-repeats`` for the walk and rule 4's every-node form), the runs of the four interleaved, a
fresh uniform table each run: the machine is shared, so the minimum is the least noisy figure. Each
is given twice: wall clock, and this thread's CPU time (``time.thread_time``: without the time other
jobs hold the core, still with the slowdown they cause while it runs); the load average is recorded.

Usage::

    python benchmarks/traversal_speed.py --threads 1 --repeats 15 --walk-repeats 7 --json benchmarks/results/traversal_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.tree import SampleMode, SparseLaw, TreeAssembler
from specdec.tree_batch import TreeBatch
from specdec.verify.fast import decide_from_logits
from specdec.verify.traversal_tensor import decide_traversal_from_logits

V = 49_152
EXPANSION = (4, 2, 2, 2)


def build_tree(top_k: int, seed: int = 0) -> TreeBatch:
    """The 61-node tree, children drawn without replacement from random draft laws (dense, or their top ``top_k``)."""
    g = torch.Generator().manual_seed(seed)
    asm = TreeAssembler(0, V)
    frontier = [0]
    for k in EXPANSION:
        new = []
        for node in frontier:
            q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 3, -1)
            if top_k:
                top = torch.topk(q, top_k)
                law = SparseLaw(top.indices, top.values / top.values.sum(), SampleMode.WITHOUT_REPLACEMENT)
            else:
                law = SparseLaw.from_dense(q, SampleMode.WITHOUT_REPLACEMENT)
            for i in torch.multinomial(law.probs, k, replacement=False, generator=g).tolist():
                new.append(asm.add_sampled(node, int(law.indices[i]), law, 1.0))
        frontier = new
    return TreeBatch.from_trees([asm.build()])


def best_of(fns: dict[str, Callable[[int], Any]], repeats: dict[str, int]) -> dict[str, tuple[float, float]]:
    """The minimum time of each function, wall clock and this thread's CPU time (which leaves out
    the time the shared machine's other jobs hold the core; not the slowdown they cause while
    it runs), the repeats interleaved (a load on the shared machine hits every function alike)."""
    for fn in fns.values():
        fn(-1)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for r in range(max(repeats.values())):
        for name, fn in fns.items():
            if r < repeats[name]:
                start, cpu = time.perf_counter(), time.thread_time()
                fn(r)
                times[name].append((time.perf_counter() - start, time.thread_time() - cpu))
    return {name: (min(w for w, _ in t), min(c for _, c in t)) for name, t in times.items()}


def measure(top_k: int, repeats: int, walk_repeats: int) -> dict[str, Any]:
    tree = build_tree(top_k)
    n = tree.node_slots
    logits = torch.randn(1, n, V, generator=torch.Generator().manual_seed(1)) * 3  # float32, as a model's
    sampling = SamplingConfig(temperature=1.0)
    rule4 = get("verifier", "rejection-wor")().fused
    assert rule4 is not None
    walk = get("verifier", "traversal")()
    host = tree.tree(0)

    def table(r: int) -> torch.Tensor:
        return torch.rand(1, n, tree.max_children + 1, generator=torch.Generator().manual_seed(100 + r), dtype=torch.float64)

    def tensor(r: int) -> None:
        decide_traversal_from_logits(tree, logits, table(r), sampling).packed()

    def host_walk(r: int) -> None:
        walk.verify(host, process_logits(logits[0], sampling, check=False), TorchRandom.seeded(100 + r))

    def rule4_rows(rows: str) -> Callable[[int], None]:
        def run(r: int) -> None:
            decide_from_logits(rule4, tree, logits, table(r), sampling, rows=rows).packed()
        return run

    fns = {"traversal_tensor_ms": tensor, "traversal_walk_ms": host_walk, "rule4_path_ms": rule4_rows("path"),
           "rule4_all_ms": rule4_rows("all")}
    best = best_of(fns, {name: walk_repeats if name in ("traversal_walk_ms", "rule4_all_ms") else repeats for name in fns})
    out: dict[str, Any] = {"law_width": int(tree.law_ids.shape[-1]), "nodes": n, "vocab": V, "expansion": list(EXPANSION)}
    out.update({name: 1e3 * t for name, (t, _) in best.items()})
    out.update({name.replace("_ms", "_cpu_ms"): 1e3 * t for name, (_, t) in best.items()})
    for clock in ("", "_cpu"):
        for form in ("path", "all"):
            out[f"tensor_over_rule4_{form}{clock}"] = out[f"traversal_tensor{clock}_ms"] / out[f"rule4_{form}{clock}_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--walk-repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {"torch": torch.__version__, "threads": args.threads, "repeats": args.repeats, "statistic": "min",
               "device": "cpu", "load_average": list(os.getloadavg()), "laws": {}}
    for name, top_k in (("dense", 0), ("top64", 64)):
        row = measure(top_k, args.repeats, args.walk_repeats)
        results["laws"][name] = row
        print(f"{name:6s} L={row['law_width']:6d}  traversal tensor {row['traversal_tensor_ms']:8.2f} ms  "
              f"walk {row['traversal_walk_ms']:8.2f} ms  rule 4 path {row['rule4_path_ms']:7.2f} ms  "
              f"all {row['rule4_all_ms']:7.2f} ms  (tensor / rule 4: {row['tensor_over_rule4_path']:.2f}x path, "
              f"{row['tensor_over_rule4_all']:.2f}x all)", flush=True)
        print(f"{'':6s} thread CPU time: traversal tensor {row['traversal_tensor_cpu_ms']:8.2f} ms  "
              f"walk {row['traversal_walk_cpu_ms']:8.2f} ms  rule 4 path {row['rule4_path_cpu_ms']:7.2f} ms  "
              f"all {row['rule4_all_cpu_ms']:7.2f} ms  (tensor / rule 4: {row['tensor_over_rule4_path_cpu']:.2f}x path, "
              f"{row['tensor_over_rule4_all_cpu']:.2f}x all)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
