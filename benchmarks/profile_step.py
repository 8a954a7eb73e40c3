"""Profile one speculative step outside the model forwards (issue 6, item 1).

Where does a step's time go when the target and draft forwards are free? The
draft is a fake :class:`~specdec.models.CallableLM` whose logits are a
deterministic function of the prefix (``4 * randn(V)`` seeded by the prefix),
so tree building runs the real builders on realistic, peaked laws; the time
spent inside the fake forward is measured and reported separately. The
target's logits at the tree nodes are the draft's plus ``0.5 * randn`` noise,
so drafts are often accepted and verification walks deep, as with a trained
draft.

Timed separately (median of ``--repeats`` runs, milliseconds):

- tree building, broken down by exclusive time in: the draft's
  ``process_logits`` (``q``), ``normalised_law`` (float64 renormalisation),
  ``top_tokens`` (top-k), ``draw_children`` (sampling), ``SparseLaw.from_dense``,
  ``keep_best`` (global rerank), ``TreeAssembler.build`` (``DraftTree``
  construction and validation), and the rest of the builder (beam sort,
  proposals, bookkeeping);
- the tree-attention mask (``DraftTree.ancestor_mask``) and positions
  (``DraftTree.depths``);
- ``process_logits`` on the target's ``[n, V]`` logits (T=1, and T=0.7 with
  top-k 50 and top-p 0.9);
- verification (the tree's verifier with a TorchRandom, the default path; and
  with a CounterRandom, the stream the fused kernel reproduces);
- KV compaction of a SmolLM2-135M-sized cache (30 layers, 3 KV heads, head
  dim 64, 512 committed positions + the tree), float32: the wrappers' default
  in-place version and the gather-everything reference.

Trees: ``eagle`` (EAGLE-2, K=10, depth 6, N=60), ``rheo`` (K=10, m=1, M=64,
depth 6, N=60) and ``specinfer`` (static (4, 2, 2, 1), i.i.d. children).

Usage::

    python benchmarks/profile_step.py                       # both vocabularies, 1 and 2 threads
    python benchmarks/profile_step.py --vocab 49152 --threads 1 --repeats 3

Writes ``benchmarks/results/profile_cpu.md`` and ``profile_cpu.json``
(``--out`` changes the stem).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import specdec.drafts.base as drafts_base
import specdec.trees.dynamic as dynamic
import specdec.trees.rheo as rheo
import specdec.trees.static as static
from specdec.rng import CounterRandom
from specdec.kernels.kv_compact import compact_kv_inplace, compact_kv_reference, kv_keep_index
from specdec.models import CallableLM
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.tree import DraftTree, SparseLaw, TreeAssembler
from specdec.trees import build_tree

TREES = {
    "eagle": ("eagle", "match", {"K": 10, "depth": 6, "N": 60}),
    "rheo": ("rheo", "mixed", {"K": 10, "m": 1, "M": 64, "depth": 6, "N": 60}),
    "specinfer": ("static", "rejection-iid", {"expansion": (4, 2, 2, 1), "mode": "iid"}),
}
SAMPLING = SamplingConfig(temperature=1.0)
SAMPLING_FILTERED = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9)
KV_LAYERS, KV_HEADS, HEAD_DIM, KV_PAST = 30, 3, 64, 512
ROOT = 7


# ------------------------------------------------------------ exclusive timers
class Timers:
    """Exclusive wall time per label of wrapped functions (a call's time minus
    the time of wrapped calls nested in it)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}
        self._stack: list[float] = []  # time spent in nested wrapped calls, per open frame

    def wrap(self, fn: Callable, label: str) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                nested = self._stack.pop()
                self.total[label] = self.total.get(label, 0.0) + elapsed - nested
                if self._stack:
                    self._stack[-1] += elapsed

        return timed

    def reset(self) -> None:
        self.total.clear()


TIMERS = Timers()
BUILD_PARTS = {
    "draft forward (fake, excluded)": None,
    "draft process_logits (q)": [(drafts_base, "process_logits")],
    "normalised_law (float64)": [(dynamic, "normalised_law"), (static, "normalised_law")],
    "top-k (top_tokens)": [(dynamic, "top_tokens"), (rheo, "top_tokens")],
    "sampling (draw_children)": [(rheo, "draw_children"), (static, "draw_children")],
    "SparseLaw.from_dense": [(SparseLaw, "from_dense")],
    "global rerank (keep_best)": [(dynamic, "keep_best")],
    "DraftTree build + validate": [(TreeAssembler, "build")],
}


def install_timers() -> None:
    for label, targets in BUILD_PARTS.items():
        for owner, name in targets or []:
            original = getattr(owner, name)
            if isinstance(owner, type) and isinstance(owner.__dict__.get(name), classmethod):
                func = original.__func__
                setattr(owner, name, classmethod(TIMERS.wrap(func, label)))
            else:
                setattr(owner, name, TIMERS.wrap(original, label))


# ------------------------------------------------------------ the fake models
def prefix_logits(prefix: tuple[int, ...], vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash(prefix) % (2**62))
    return 4.0 * torch.randn(vocab, generator=gen)


def make_draft(vocab: int) -> CallableLM:
    def fn(prefixes: list[list[int]]) -> torch.Tensor:
        return torch.stack([prefix_logits(tuple(p), vocab) for p in prefixes])

    return CallableLM(TIMERS.wrap(fn, "draft forward (fake, excluded)"), vocab_size=vocab)


def target_logits(tree: DraftTree, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for node in range(tree.num_nodes):
        prefix = (ROOT, *[int(tree.tokens[i]) for i in tree.path_to(node)])
        rows.append(prefix_logits(prefix, vocab) + 0.5 * torch.randn(vocab, generator=gen))
    return torch.stack(rows)


# ------------------------------------------------------------------- timing
def _cached_function(cls: type, name: str) -> Callable:
    """The function behind a (slotted attrs) cached property, to time it uncached."""
    import inspect

    param = inspect.signature(cls.__getattr__).parameters.get("cached_properties")
    if param is not None and name in param.default:
        return param.default[name]
    return getattr(cls, name).func  # a plain functools.cached_property


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def profile_tree(kind: str, vocab: int, repeats: int) -> dict[str, float]:
    tree_name, verifier_name, options = TREES[kind]
    builder = get("tree", tree_name)(**options)
    verifier = get("verifier", verifier_name)()
    draft = make_draft(vocab)
    draft.begin([ROOT])
    out: dict[str, float] = {}
    # tree building: per-part exclusive medians
    parts: dict[str, list[float]] = {label: [] for label in BUILD_PARTS}
    totals, trees = [], []
    for rep in range(repeats):
        TIMERS.reset()
        start = time.perf_counter()
        tree = build_tree(builder, ROOT, draft, SAMPLING, TorchRandom.seeded(rep))
        totals.append(time.perf_counter() - start)
        trees.append(tree)
        for label in parts:
            parts[label].append(TIMERS.total.get(label, 0.0))
    forward = statistics.median(parts["draft forward (fake, excluded)"])
    for label, values in parts.items():
        out[f"build: {label}"] = 1e3 * statistics.median(values)
    named = sum(statistics.median(v) for k, v in parts.items())
    out["build: other builder bookkeeping (beam, proposals)"] = 1e3 * max(statistics.median(totals) - named, 0.0)
    out["build: total without the fake forward"] = 1e3 * (statistics.median(totals) - forward)
    tree = trees[0]
    out["nodes"] = float(tree.num_nodes)
    out["depth"] = float(int(tree.depths.max()))
    # mask and positions
    out["tree mask (ancestor_mask)"] = median_ms(tree.ancestor_mask, repeats)
    depths_fn = _cached_function(DraftTree, "depths")
    out["positions (depths)"] = median_ms(lambda: depths_fn(tree), repeats)
    # target processing and verification
    logits = target_logits(tree, vocab, seed=1)
    out["target process_logits [n,V] T=1"] = median_ms(lambda: process_logits(logits, SAMPLING), repeats)
    out["target process_logits [n,V] T=0.7 k=50 p=0.9"] = median_ms(
        lambda: process_logits(logits, SAMPLING_FILTERED), repeats
    )
    p = process_logits(logits, SAMPLING)
    rng = TorchRandom.seeded(0)
    accepted = []

    def verify_torch() -> None:
        accepted.append(verifier.verify(tree, p, rng).num_accepted)

    out[f"verify ({verifier_name}, TorchRandom)"] = median_ms(verify_torch, repeats)
    out["accepted per verify (mean)"] = sum(accepted) / len(accepted)
    counter = CounterRandom(0)
    out[f"verify ({verifier_name}, CounterRandom)"] = median_ms(lambda: verifier.verify(tree, p, counter), repeats)
    # KV compaction after this tree, SmolLM2-sized
    path = [0, *verifier.verify(tree, p, TorchRandom.seeded(1)).accepted_nodes]
    gen = torch.Generator().manual_seed(0)
    shape = (1, KV_HEADS, KV_PAST + tree.num_nodes, HEAD_DIM)
    cache = [torch.randn(shape, generator=gen) for _ in range(2 * KV_LAYERS)]
    keep = kv_keep_index(KV_PAST, path)
    out["KV compaction in place (default), f32"] = median_ms(lambda: compact_kv_inplace(cache, keep), repeats)
    out["KV compaction reference (gather all), f32"] = median_ms(lambda: compact_kv_reference(cache, keep), repeats)
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}; torch {torch.__version__}; Python {platform.python_version()}"


ORDER = [
    "build: draft process_logits (q)",
    "build: normalised_law (float64)",
    "build: top-k (top_tokens)",
    "build: sampling (draw_children)",
    "build: SparseLaw.from_dense",
    "build: global rerank (keep_best)",
    "build: DraftTree build + validate",
    "build: other builder bookkeeping (beam, proposals)",
    "build: total without the fake forward",
    "tree mask (ancestor_mask)",
    "positions (depths)",
    "target process_logits [n,V] T=1",
    "target process_logits [n,V] T=0.7 k=50 p=0.9",
    "verify (TorchRandom)",
    "verify (CounterRandom)",
    "KV compaction in place (default), f32",
    "KV compaction reference (gather all), f32",
    "build: draft forward (fake, excluded)",
]


def to_markdown(results: dict[str, Any], command: str) -> str:
    lines = [
        "# CPU profile of one speculative step (outside the model forwards)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {results['machine']}. Median of {results['repeats']} runs, milliseconds. "
        "Generated by `benchmarks/profile_step.py` (see its docstring for the setup). "
        "No GPU was lent for this profile.",
        "",
    ]
    for run in results["runs"]:
        vocab, threads, data = run["vocab"], run["threads"], run["trees"]
        kinds = list(data)
        lines += [f"## V = {vocab}, {threads} thread(s)", ""]
        header = "| step part | " + " | ".join(
            f"{k} (n={int(data[k]['nodes'])}, {TREES[k][1]})" for k in kinds
        ) + " |"
        lines += [header, "|---|" + "---:|" * len(kinds)]
        for key in ORDER:
            cells = []
            for k in kinds:
                if key.startswith("verify ("):
                    source = key[len("verify (") : -1]
                    value = data[k].get(f"verify ({TREES[k][1]}, {source})")
                else:
                    value = data[k].get(key)
                cells.append("" if value is None else f"{value:.3f}")
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        acc = " / ".join(f"{k}: {data[k]['accepted per verify (mean)']:.1f}" for k in kinds)
        lines += ["", f"Accepted drafts per verification (mean): {acc}.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 128256])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--trees", nargs="+", default=list(TREES), choices=list(TREES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "profile_cpu"))
    args = parser.parse_args(argv)
    install_timers()
    command = "python benchmarks/profile_step.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results: dict[str, Any] = {"machine": machine(), "repeats": args.repeats, "command": command.strip(), "runs": []}
    before = torch.get_num_threads()
    try:
        for vocab in args.vocab:
            for threads in args.threads:
                torch.set_num_threads(threads)
                run = {"vocab": vocab, "threads": threads, "trees": {}}
                for kind in args.trees:
                    run["trees"][kind] = profile_tree(kind, vocab, args.repeats)
                    print(f"V={vocab} threads={threads} {kind}: done", file=sys.stderr)
                results["runs"].append(run)
    finally:
        torch.set_num_threads(before)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(to_markdown(results, command.strip()))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
