"""Where a step's time goes: ``sd`` against transformers' assisted generation (issue 48).

Same draft LM, same target, same prompts, same sampling: the quick preset's
``sd`` row (a chain of the draft LM's drafts, ``--depth``, and optionally the
adaptive chains of issue 48) and its ``hf-assisted`` row
(:func:`specdec.bench.runner.hf_assisted_generate`: ``target.generate(
assistant_model=draft)``, transformers' defaults). Each generation is split,
per step (one target tree forward), into:

- ``draft``: the draft LM's forwards (the model call and its LM head);
- ``target[n]``: the target's forward over ``n`` new tokens (the tree, or
  transformers' candidates + 1), by token count;
- ``verify``: specdec's logit processing and verification (the engine's
  ``time_verify``; transformers' is inside ``other``);
- ``other``: everything else (tree building outside the draft forwards,
  masks, cache compaction, Python; for transformers also its verification).

Prefill forwards (more than ``--prefill-min`` new tokens) are counted apart
and left out of the per-step figures. The forwards are timed by wrapping
:func:`specdec.models.hf_forward._forward` (specdec's only model call) and by
forward hooks on the two Hugging Face models (transformers' calls). Rows run
interleaved, prompt by prompt, in one process (A, B, A, B...), so they see the
same machine load.

Also measured, interleaved the same way: the target forward cost curve
``t_target(n)`` (a chain of ``n`` tokens after a 60-token prompt, median), the
one-token draft forward, and from them the hardware-aware bound of each row
(Sequoia's model; docs/bench.md "Why the speedup is bounded")::

    bound = tau * t_target(1) / (t_draft_step + t_target(n_step))

Usage (writes ``<out>.md`` and ``<out>.json``)::

    HF_HUB_OFFLINE=1 python benchmarks/step_split.py --out benchmarks/results/step_split_smollm2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import specdec.models.hf_forward as hf_forward
from specdec.bench.models import load_bench_models
from specdec.bench.prompts import load_prompts, select_prompts
from specdec.bench.runner import hf_assisted_generate
from specdec.generate import SpeculativeGenerator, autoregressive_generate
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree, SampleMode, SparseLaw


class Split:
    """Forward timings of one generation: ``{(role, tokens): [seconds, ...]}``."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], list[float]] = defaultdict(list)

    def add(self, role: str, tokens: int, seconds: float) -> None:
        self.calls[(role, tokens)].append(seconds)


@contextmanager
def instrument(target_model: Any, draft_model: Any, split: Split) -> Iterator[None]:
    """Time every forward of the two HF models into ``split`` (specdec's ``_forward`` and transformers' calls)."""
    roles = {id(target_model): "target", id(target_model.base_model): "target",
             id(draft_model): "draft", id(draft_model.base_model): "draft"}
    original = hf_forward._forward
    depth = [0]

    def timed(model: Any, cache: Any, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        start = time.perf_counter()
        try:
            return original(model, cache, input_ids, *args, **kwargs)
        finally:
            depth[0] -= 1
            split.add(roles.get(id(model), "other"), int(input_ids.shape[-1]) * int(input_ids.shape[0]),
                      time.perf_counter() - start)

    starts: dict[int, list[float]] = defaultdict(list)
    handles = []
    for model in (target_model, draft_model):
        role = roles[id(model)]

        def pre(module: Any, args: Any, kwargs: Any, *, _key: int = id(model)) -> None:
            if depth[0] == 0:  # a transformers call (specdec's own are timed by `timed`)
                starts[_key].append(time.perf_counter())

        def post(module: Any, args: Any, kwargs: Any, out: Any, *, _key: int = id(model), _role: str = role) -> None:
            if depth[0] == 0 and starts[_key]:
                ids = kwargs.get("input_ids", args[0] if args else None)
                n = int(ids.shape[-1]) if ids is not None else -1
                split.add(_role, n, time.perf_counter() - starts[_key].pop())

        handles.append(model.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(model.register_forward_hook(post, with_kwargs=True))
    hf_forward._forward = timed
    try:
        yield
    finally:
        hf_forward._forward = original
        for h in handles:
            h.remove()


def forward_curve(target: Any, sizes: Sequence[int], repeats: int, prompt: Sequence[int]) -> dict[int, float]:
    """Median seconds of a target chain forward of each size, sizes interleaved round by round.

    Raises:
        RuntimeError: a size whose forward fails (no curve is guessed).
    """
    vocab = target.vocab_size
    law = SparseLaw.from_dense(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64), SampleMode.IID)
    trees = {n: DraftTree.chain(int(prompt[-1]), [int(prompt[i % len(prompt)]) for i in range(n - 1)],
                                [law] * (n - 1), vocab) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for rep in range(repeats + 1):
        for n, tree in trees.items():
            target.prefill(prompt)
            start = time.perf_counter()
            try:
                target.score_tree(tree)
            except Exception as exc:  # noqa: BLE001 - one clear message naming the size
                raise RuntimeError(f"the target forward of {n} tokens failed: {type(exc).__name__}: {exc}") from exc
            if rep:
                times[n].append(time.perf_counter() - start)
    return {n: statistics.median(v) for n, v in times.items()}


def summarize(name: str, runs: list[dict[str, Any]], prefill_min: int) -> dict[str, Any]:
    """Per-step figures of one row from its generations."""
    steps = sum(r["steps"] for r in runs)
    tokens = sum(r["new_tokens"] for r in runs)
    total = sum(r["seconds"] for r in runs)
    draft = target = prefill = 0.0
    by_n: dict[int, list[float]] = defaultdict(list)
    draft_calls = 0
    for r in runs:
        for (role, n), secs in r["calls"].items():
            if n > prefill_min:
                prefill += sum(secs)
            elif role == "draft":
                draft += sum(secs)
                draft_calls += len(secs)
            elif role == "target":
                target += sum(secs)
                by_n[n].extend(secs)
    verify = sum(r.get("verify", 0.0) for r in runs)
    other = total - prefill - draft - target - verify
    per = 1e3 / max(steps, 1)
    return {
        "row": name, "generations": len(runs), "steps": steps, "new_tokens": tokens,
        "tau": tokens / max(steps, 1), "tokens_per_s": tokens / total if total else 0.0,
        "ms_per_token": 1e3 * (total - prefill) / max(tokens, 1),
        "ms_per_step": per * (total - prefill), "draft_ms": per * draft, "draft_calls_per_step": draft_calls / max(steps, 1),
        "target_ms": per * target, "verify_ms": per * verify, "other_ms": per * other, "prefill_s": prefill,
        "target_by_n": {n: {"calls": len(v), "median_ms": 1e3 * statistics.median(v)} for n, v in sorted(by_n.items())},
        "mean_tree_tokens": sum(n * len(v) for n, v in by_n.items()) / max(sum(len(v) for v in by_n.values()), 1),
    }


def bound(row: dict[str, Any], curve: dict[int, float], draft_one: float) -> float:
    """Sequoia's hardware-aware speedup bound of a row: ``tau * t(1) / (t_draft_step + t(n_step))``,
    with the row's measured draft forwards per step at the one-token draft cost and its mean tree size
    interpolated on the curve."""
    n = row["mean_tree_tokens"]
    sizes = sorted(curve)
    lo = max((s for s in sizes if s <= n), default=sizes[0])
    hi = min((s for s in sizes if s >= n), default=sizes[-1])
    t_n = curve[lo] if hi == lo else curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo)
    return row["tau"] * curve[1] / (row["draft_calls_per_step"] * draft_one + t_n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=6, help="shipped prompts (the quick preset's 6)")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--depth", type=int, default=2, help="the sd row's chain depth (the quick preset's auto budget: 2)")
    ap.add_argument("--rows", default="sd,hf-assisted",
                    help="comma list of: autoregressive, sd (--depth), sd-adaptive (heuristic schedule from --depth, "
                         "confidence 0.4, at most 20), sd-confidence (depth 20, confidence 0.4: transformers' "
                         "defaults), sd-confidence-d2 (--depth, confidence 0.4), hf-assisted")
    ap.add_argument("--curve", default="1,2,3,4,5,6,9,17", help="target forward sizes to time")
    ap.add_argument("--curve-repeats", type=int, default=7)
    ap.add_argument("--prefill-min", type=int, default=32, help="forwards of more new tokens count as prefill")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = load_bench_models(need_kinds=frozenset({"lm"}))
    prompts = [models.tokenize(p.text) for p in select_prompts(load_prompts("shipped"), args.prompts)]
    temps = [float(t) for t in args.temperatures.split(",")]
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    eos = models.eos_token_id
    pad = eos[0] if isinstance(eos, list) else eos
    gens: dict[tuple[str, float], SpeculativeGenerator] = {}
    adaptive = {"sd": {"depth": args.depth},
                "sd-adaptive": {"depth": args.depth, "schedule": "heuristic", "confidence": 0.4, "max_depth": 20},
                "sd-confidence": {"depth": 20, "confidence": 0.4},
                "sd-confidence-d2": {"depth": args.depth, "confidence": 0.4}}
    for r in rows:
        if r in adaptive:
            for t in temps:
                gens[(r, t)] = SpeculativeGenerator(target=models.targets["lm"], draft=models.drafts["lm"], method="sd",
                                                    **adaptive[r])
    assert models.hf_target is not None and models.hf_draft is not None

    def run(row: str, prompt: list[int], t: float, n: int) -> dict[str, Any]:
        split = Split()
        with instrument(models.hf_target, models.hf_draft, split):
            if row == "hf-assisted":
                toks, secs, calls = hf_assisted_generate(models.hf_target, models.hf_draft, prompt, n, t, 0, eos, pad)
                out = {"steps": calls, "new_tokens": len(toks), "seconds": secs}
            elif row == "autoregressive":
                res = autoregressive_generate(models.target, prompt, n, sampling=SamplingConfig(temperature=t), seed=0,
                                              eos_token_id=eos)
                s = res.stats
                out = {"steps": s.steps, "new_tokens": s.new_tokens, "seconds": s.time_total}
            else:
                res = gens[(row, t)].generate(prompt, n, sampling=SamplingConfig(temperature=t), seed=0, eos_token_id=eos)
                s = res.stats
                out = {"steps": s.steps, "new_tokens": s.new_tokens, "seconds": s.time_total, "verify": s.time_verify}
        out["calls"] = dict(split.calls)
        return out

    for row in rows:  # warm-up, untimed
        run(row, prompts[0], temps[-1], 8)
    runs: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        for t in temps:
            order = rows[i % len(rows):] + rows[: i % len(rows)]  # rotate the order, as the bench does
            for row in order:
                runs[(row, t)].append(run(row, prompt, t, args.max_new_tokens))
    curve_sizes = [int(s) for s in args.curve.split(",")]
    curve = forward_curve(models.targets["lm"], curve_sizes, args.curve_repeats, prompts[0][:60])
    draft_one = _draft_one(models, prompts[0][:60], args.curve_repeats)
    table = [summarize(r, runs[(r, t)], args.prefill_min) | {"temperature": t} for t in temps for r in rows]
    base = {rec["temperature"]: rec["tokens_per_s"] for rec in table if rec["row"] == "autoregressive"}
    for rec in table:
        rec["bound"] = bound(rec, curve, draft_one) if rec["row"] != "autoregressive" else 1.0
        rec["speedup"] = rec["tokens_per_s"] / base[rec["temperature"]] if rec["temperature"] in base else None
    report = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
              "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
              "curve_ms": {n: 1e3 * s for n, s in curve.items()}, "draft_one_ms": 1e3 * draft_one, "rows": table}
    text = render(report)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
        args.out.with_suffix(".md").write_text(text)


def _draft_one(models: Any, prompt: list[int], repeats: int) -> float:
    """Median seconds of one one-token draft forward (the draft's root logits after one committed token)."""
    draft = models.drafts["lm"]
    times = []
    for _ in range(repeats + 1):
        draft.begin(prompt)
        draft.root_logits()  # the prompt
        draft.commit([int(prompt[-1])])
        start = time.perf_counter()
        draft.root_logits()  # one new token
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def render(report: dict[str, Any]) -> str:
    curve = report["curve_ms"]
    lines = [f"# Step split: sd against hf-assisted ({report['machine']}, torch {report['torch']})", "",
             "Per step (one target forward), milliseconds; prefill excluded. `other` = everything outside the "
             "draft and target forwards and specdec's verification (transformers' verification is in its `other`).", "",
             "| T | row | tau | tok/s | speedup | ms/token | ms/step | draft (calls) | target | verify | other | mean n "
             "| bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        speedup = "-" if r.get("speedup") is None else f"{r['speedup']:.2f}x"
        lines.append(f"| {r['temperature']:g} | {r['row']} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | {speedup} | "
                     f"{r['ms_per_token']:.1f} | {r['ms_per_step']:.1f} | {r['draft_ms']:.1f} "
                     f"({r['draft_calls_per_step']:.2f}) | {r['target_ms']:.1f} | {r['verify_ms']:.1f} | "
                     f"{r['other_ms']:.1f} | {r['mean_tree_tokens']:.2f} | {r['bound']:.2f}x |")
    lines += ["", "Target forward by token count (median ms, calls):", ""]
    for r in report["rows"]:
        parts = ", ".join(f"n={n}: {v['median_ms']:.1f} ({v['calls']})" for n, v in r["target_by_n"].items())
        lines.append(f"- T={r['temperature']:g} {r['row']}: {parts}")
    lines += ["", "Target forward cost curve (chain of n tokens after a 60-token prompt, median ms): "
              + ", ".join(f"{n}: {v:.1f}" for n, v in curve.items())
              + f"; one-token draft forward: {report['draft_one_ms']:.1f} ms.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
