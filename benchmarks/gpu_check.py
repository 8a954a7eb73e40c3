"""One-shot GPU check of the Triton kernels: correctness against the torch
references, then kernel-vs-reference timings (issue 6, item 4).

Prepared to run in ONE call on a lent GPU (the device budget is 15 minutes in
all); it has NOT been run on a GPU yet (no device was lent when it was
written). It was smoke-tested on the CPU through Triton's interpreter::

    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --device cpu --vocab 1000 --sizes 8 --reps 1 --out /tmp/gpu_check

On the GPU machine::

    pip install -e '.[kernels]'          # triton>=3.0
    python benchmarks/gpu_check.py --out $OUT/gpu_check     # ~5 minutes on an H100/H200

What it does, for vocabularies 49152 and 128256 and trees of 16, 64 and 128
nodes (``--vocab``, ``--sizes``):

1. correctness: for each fused verifier (rules 2-5) and input mode (``probs``
   = processed rows, ``logits`` = raw logits with temperature 0.7 and top-k 50
   fused), every node's decision from the kernel
   (:func:`~specdec.kernels.verify_fused.node_decisions`) is compared with the
   reference verifier's ``verify_node`` on the same counter-based uniforms,
   and the whole walk (:func:`~specdec.kernels.verify_fused.fused_verify`)
   with ``Verifier.verify``. Float32 rows may disagree when a uniform falls
   within float rounding of a threshold (different summation order); the
   check reports the count and requires it below ``--max-mismatch-rate``
   (float64 rows are checked too and should agree everywhere);
2. timing, median over ``--reps`` after warm-up, CUDA events: the reference
   (``process_logits`` + ``Verifier.verify`` on the CUDA logits, the path the
   generation loop takes with ``kernel="torch"``), the same with the logits
   copied to the CPU first (the default of ``HFTarget``, ``logits_device="cpu"``;
   3 repetitions, without top-p only), and the kernel path (:func:`~specdec.kernels.verify_fused.fused_verify`: logits mode for T=0.7/top-k 50, probs mode with
   top-p 0.9), for each kernel block in ``--blocks`` (1024 and 4096; the
   fastest is reported). The issue's goal: kernel >= 5x faster than the reference for a
   64-node tree at V=128256;
3. KV compaction (SmolLM2-135M cache: 30 layers, 3 KV heads, head dim 64, 512
   committed positions + the tree, bfloat16): Triton vs the in-place torch
   version vs the gather reference, correctness and time;
4. the full step (``step_check``): a random-weight Llama of about 1B
   parameters in bf16 (V=128256) with a random EAGLE-3 head, 60-node depth-6
   trees, eagle3 and rheo, step path vs Triton path vs the compiled step
   (``compile="inductor"``): time split, host syncs (``StepCounter`` and
   ``torch.cuda.set_sync_debug_mode("warn")``), ops dispatched and CUDA kernels
   launched outside the forwards (``KernelCounter``), tau.
   Smoke-tested on the CPU with ``--device cpu --skip correctness timing kv
   --step-vocab 1000 --step-hidden 128 --step-layers 2 --step-tokens 8``;
5. a target split over two GPUs (``multi_gpu_check``, ``device_map`` through
   accelerate): greedy tokens equal to the one-GPU run, one KV slab per
   device, features on the head's device. Needs two GPUs (skipped otherwise,
   and so never run yet: the lent machine has one);
6. batched verification (``batch_check``, issue 15): ``B`` = 1, 4, 8, 16
   ragged trees (``--batch-sizes``, ``--batch-nodes``, ``--batch-vocab``),
   each row with its own counter stream: the fused kernel run ONCE for all
   rows (:func:`~specdec.kernels.verify_fused.fused_verify_batch`) vs one
   launch per row (:func:`~specdec.kernels.verify_fused.fused_verify`, the
   batch-1 path) vs the batched torch reference
   (:func:`~specdec.verify.fast.decide_tree_batch`); rows whose tokens differ
   (must be 0 against the per-row kernel; float32 rounding may rarely differ
   from torch) and the time per verification. Smoke-tested on the CPU with
   ``TRITON_INTERPRET=1 python benchmarks/gpu_check.py --device cpu --skip correctness timing kv step multi_gpu
   --batch-sizes 1 2 --batch-vocab 300 --batch-nodes 6 --reps 1``;
7. ``specdec bench --device cuda`` (``bench_check``, issue 18): the GPU test of
   ``tests/bench/test_bench_device.py`` (a tiny random target and draft, every
   kind of row, T=0 outputs equal to the baseline's), run by pytest in a
   subprocess; its exit status and the tail of its output are recorded.

8. CUDA graphs (``cuda_graph_check``, issue 58; docs/cuda_graphs.md): on the first GPU
   (``cuda:0``), the fixed-shape step (:mod:`specdec.engine.fixed_step`, ``rheo`` and
   ``sd`` at T=1, ``B = --graph-batch``, ``V = --graph-vocab``) captured with
   ``torch.cuda.CUDAGraph``: each tree level, the finish and the verification, replayed
   ``--graph-replays`` times with new roots, draft and target logits and uniform tables
   copied into the static inputs, every output compared with the eager functions on the
   same inputs (must be equal), and the replayed vs eager time of the verification.
   Without CUDA the section records why and does nothing; ``--graph-dry-run`` runs the
   same static-buffer logic on ``--device`` without a capture (the CPU smoke test)::

       python benchmarks/gpu_check.py --device cpu --skip correctness timing kv step multi_gpu batch bench \
           --graph-dry-run --graph-vocab 64 --graph-replays 2 --out /tmp/gpu_check

Writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out``. Every section
catches its own errors (recorded in the output, exit status 1 at the end) so
that one failure does not lose the rest of a scarce GPU run; ``--budget-s``
stops starting new timing cases when time runs short.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specdec.rng import CounterRandom
from specdec.kernels.kv_compact import compact_kv_inplace, compact_kv_reference, kv_keep_index
from specdec.kernels.verify_fused import fused_verify, fused_verify_batch, node_decisions
from specdec.registry import get
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.tree import DraftTree, SampleMode, SparseLaw, TreeAssembler

RULES = ("match", "rejection-iid", "rejection-wor", "mixed")
AUTO_SYNC_BUDGET = 4  # host syncs per step on the default CUDA path (issue 42)
SHAPE = {"match": "eagle (top-K)", "rejection-iid": "specinfer (iid)", "rejection-wor": "sequoia (wor)",
         "mixed": "rheo (1 sampled + top-K)"}
LOGITS_SAMPLING = SamplingConfig(temperature=0.7, top_k=50)
PROBS_SAMPLING = SamplingConfig(temperature=0.7, top_k=50, top_p=0.9)
BRANCHING = (4, 3, 2, 2, 2, 1, 1, 1, 1, 1)
TOP_M = 64


# ---------------------------------------------------------------- test trees
def make_case(rule: str, vocab: int, num_nodes: int, seed: int, device: str) -> tuple[DraftTree, torch.Tensor]:
    """A tree of exactly ``num_nodes`` nodes shaped as its method builds them, and
    ``[n, V]`` float32 target logits on ``device`` correlated with the draft.

    Shapes: ``match`` top-K deterministic children (EAGLE); ``mixed`` one
    sampled child from ``q' = top-64 of q minus S`` then top-K deterministic
    (RheoSampling); ``rejection-iid``/``rejection-wor`` sampled children from the
    node's whole ``q`` (static SpecInfer / Sequoia trees record it).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    draft_logits = 3.0 * torch.randn(num_nodes, vocab, generator=gen)
    q = torch.softmax(draft_logits.double(), dim=-1)
    asm = TreeAssembler(root_token=int(torch.randint(vocab, (1,), generator=gen)), vocab_size=vocab)
    depth = {0: 0}
    frontier = [0]
    while len(asm) < num_nodes:
        if not frontier:
            frontier = [len(asm) - 1]
        node = frontier.pop(0)
        room = num_nodes - len(asm)
        b = min(BRANCHING[min(depth[node], len(BRANCHING) - 1)], room)
        top = torch.topk(q[node], TOP_M)
        kids: list[int] = []
        if rule == "match":
            kids = [asm.add_deterministic(node, int(t), weight=0.5) for t in top.indices[:b].tolist()]
        elif rule == "mixed":
            det = top.indices[: b - 1]
            rest_i, rest_p = top.indices[b - 1 :], top.values[b - 1 :]
            law = SparseLaw(rest_i, rest_p / rest_p.sum(), SampleMode.IID)
            y = int(law.indices[torch.multinomial(law.probs, 1, generator=gen)])
            kids.append(asm.add_sampled(node, y, law, weight=0.5))
            kids += [asm.add_deterministic(node, int(t), weight=0.5) for t in det.tolist()]
        else:
            mode = SampleMode.IID if rule == "rejection-iid" else SampleMode.WITHOUT_REPLACEMENT
            law = SparseLaw.from_dense(q[node], mode)
            draws = torch.multinomial(law.probs, b, replacement=mode == SampleMode.IID, generator=gen)
            kids = [asm.add_sampled(node, int(law.indices[i]), law, weight=0.5) for i in draws.tolist()]
        for k in kids:
            depth[k] = depth[node] + 1
        frontier += kids
    tree = asm.build()
    # node i's draft row was q[i]; the target's logits are the draft's plus noise
    target = draft_logits[: tree.num_nodes] + 0.7 * torch.randn(tree.num_nodes, vocab, generator=gen)
    return tree, target.to(device)


# ------------------------------------------------------------------- helpers
def kernel_verify(verifier: Any, sampling: SamplingConfig, block: int) -> Callable[..., Any]:
    """The fused kernel on a host tree (:func:`fused_verify`): softmax and top-k fused when
    ``top_p == 1`` and ``T > 0``, the processed ``p`` otherwise; its own counter stream."""
    counter = CounterRandom.seeded(0)

    def run(tree: DraftTree, logits: torch.Tensor, rng: Any = None) -> Any:
        if sampling.greedy or sampling.top_p < 1.0:
            return fused_verify(verifier, tree, process_logits(logits, sampling), counter, inputs="probs", block=block)
        return fused_verify(verifier, tree, logits, counter, inputs="logits", sampling=sampling, block=block)

    return run


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], device: str, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def environment(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    info["interpreter"] = os.environ.get("TRITON_INTERPRET", "0")
    return info


# --------------------------------------------------------------- correctness
def check_case(rule: str, tree: DraftTree, logits: torch.Tensor, inputs: str, dtype: torch.dtype,
               seed: int, block: int | None) -> dict[str, Any]:
    verifier = get("verifier", rule)()
    sampling = LOGITS_SAMPLING
    p = process_logits(logits.to(dtype), sampling)
    x = p if inputs == "probs" else logits
    walk = 5
    (kernel,) = node_decisions(verifier, [tree], x, seed=seed, walks=[walk], inputs=inputs, sampling=sampling,
                               block=block)
    rng = CounterRandom(seed)
    mismatches = []
    for node in range(tree.num_nodes):
        rng.set_position(walk, node, 0)
        ref = verifier.verify_node(tree, node, p[node], rng)
        got = kernel[node]
        if (got.accepted_child, got.bonus_token, got.draws) != (ref.accepted_child, ref.bonus_token, rng.draw):
            mismatches.append({"node": node, "kernel": [got.accepted_child, got.bonus_token, got.draws],
                               "reference": [ref.accepted_child, ref.bonus_token, rng.draw]})
    a, b = CounterRandom(seed, walk=walk - 1), CounterRandom(seed, walk=walk - 1)
    same_walk = fused_verify(verifier, tree, x, a, inputs=inputs, sampling=sampling, block=block) == \
        verifier.verify(tree, p, b) and a.position == b.position
    return {"nodes": tree.num_nodes, "mismatches": len(mismatches), "examples": mismatches[:3],
            "walk_equal": bool(same_walk)}


def correctness(args: argparse.Namespace, report: dict[str, Any]) -> None:
    rows = []
    for vocab in args.vocab:
        for n in args.sizes:
            for rule in RULES:
                tree, logits = make_case(rule, vocab, n, seed=vocab + n, device=args.device)
                for inputs, dtype in (("probs", torch.float32), ("logits", torch.float32), ("probs", torch.float64)):
                    if inputs == "logits" and dtype != torch.float32:
                        continue
                    try:
                        res = check_case(rule, tree, logits, inputs, dtype, seed=n, block=args.block)
                    except Exception as exc:  # recorded; the run goes on
                        res = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
                    res.update(vocab=vocab, size=n, rule=rule, inputs=inputs, dtype=str(dtype).replace("torch.", ""))
                    rows.append(res)
                    print(f"[check] V={vocab} n={n} {rule} {inputs}/{res['dtype']}: "
                          f"{res.get('mismatches', 'ERROR')} mismatches, walk equal {res.get('walk_equal')}",
                          flush=True)
    report["correctness"] = rows
    decisions = sum(r.get("nodes", 0) for r in rows)
    bad = sum(r.get("mismatches", 0) for r in rows)
    errors = [r for r in rows if "error" in r]
    f64_bad = sum(r.get("mismatches", 0) for r in rows if r["dtype"] == "float64")
    report["correctness_summary"] = {
        "decisions": decisions, "mismatches": bad, "float64_mismatches": f64_bad, "errors": len(errors),
        "walks_equal": sum(bool(r.get("walk_equal")) for r in rows), "walks": len(rows),
        "ok": not errors and decisions > 0 and bad <= args.max_mismatch_rate * decisions and f64_bad == 0,
    }


# -------------------------------------------------------------------- timing
def timing(args: argparse.Namespace, report: dict[str, Any], deadline: float) -> None:
    rows = []
    for vocab in args.vocab:
        for n in args.sizes:
            for rule in RULES:
                if time.monotonic() > deadline:
                    report.setdefault("skipped_for_time", []).append(f"timing V={vocab} n={n} {rule}")
                    continue
                tree, logits = make_case(rule, vocab, n, seed=vocab + n, device=args.device)
                verifier = get("verifier", rule)()
                res: dict[str, Any] = {"vocab": vocab, "size": n, "rule": rule, "shape": SHAPE[rule]}
                try:
                    for label, sampling in (("T0.7-k50", LOGITS_SAMPLING), ("T0.7-k50-p0.9", PROBS_SAMPLING)):
                        rng = TorchRandom.seeded(0, device=args.device)
                        res[f"torch_device_ms[{label}]"] = median_ms(
                            lambda: verifier.verify(tree, process_logits(logits, sampling), rng),
                            args.device, args.reps)
                        if sampling.top_p == 1.0:  # a CPU top-p sort of [n, V] takes ~0.5 s: not repeated
                            rng_cpu = TorchRandom.seeded(0)
                            res[f"torch_cpu_copy_ms[{label}]"] = median_ms(
                                lambda: verifier.verify(tree, process_logits(logits.cpu(), sampling), rng_cpu),
                                args.device, min(3, args.reps), warmup=1)
                        for blk in args.blocks:  # the kernel's vocabulary block: a tuning knob, best one kept
                            step = kernel_verify(verifier, sampling, blk)
                            res[f"triton_ms[{label}][block={blk}]"] = median_ms(
                                lambda: step(tree, logits, rng), args.device, args.reps)
                        best = min(args.blocks, key=lambda blk: res[f"triton_ms[{label}][block={blk}]"])
                        res[f"triton_ms[{label}]"] = res[f"triton_ms[{label}][block={best}]"]
                        res[f"best_block[{label}]"] = best
                        res[f"speedup_vs_torch_device[{label}]"] = (
                            res[f"torch_device_ms[{label}]"] / res[f"triton_ms[{label}]"])
                except Exception as exc:
                    res["error"] = f"{type(exc).__name__}: {exc}"
                    res["trace"] = traceback.format_exc()[-2000:]
                rows.append(res)
                print(f"[time] V={vocab} n={n} {rule}: " + ", ".join(
                    f"{k}={v:.3f}" for k, v in res.items() if isinstance(v, float)), flush=True)
    report["timing"] = rows
    goal = [r for r in rows if r["vocab"] == 128256 and r["size"] == 64 and "error" not in r]
    report["goal_5x_at_V128256_n64"] = {
        r["rule"]: round(r["speedup_vs_torch_device[T0.7-k50]"], 2) for r in goal
    }


def kv_check(args: argparse.Namespace, report: dict[str, Any]) -> None:
    from specdec.kernels.kv_compact_triton import compact_kv_triton

    rows = []
    for n in args.sizes:
        res: dict[str, Any] = {"tree_nodes": n}
        try:
            gen = torch.Generator().manual_seed(n)
            shape = (1, 3, 512 + n, 64)
            base = [torch.randn(shape, generator=gen).to(args.device, torch.bfloat16) for _ in range(60)]
            path = [0] + sorted(torch.randperm(n - 1, generator=gen)[: min(6, n - 1)].add(1).tolist())
            keep = kv_keep_index(512, path, device=args.device)
            expected = compact_kv_reference(base, keep)
            got = compact_kv_triton([t.clone() for t in base], keep)
            res["equal"] = all(torch.equal(a, b) for a, b in zip(got, expected))
            res["triton_ms"] = median_ms(lambda: compact_kv_triton([t for t in base], keep), args.device, args.reps)
            res["inplace_ms"] = median_ms(lambda: compact_kv_inplace([t for t in base], keep), args.device, args.reps)
            res["reference_ms"] = median_ms(lambda: compact_kv_reference(base, keep), args.device, args.reps)
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}"
            res["trace"] = traceback.format_exc()[-2000:]
        rows.append(res)
        print(f"[kv] n={n}: {res}", flush=True)
    report["kv_compaction"] = rows


# -------------------------------------------------------------- full step
def step_check(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The whole speculative step (issue 14, item 13) on a random-weight Llama
    of about 1B parameters (``--step-*``; bf16 on CUDA) with a random EAGLE-3
    head, 60-node depth-6 trees, T=1: eagle3 and rheo on the step path
    (``kernel="torch"``), on the per-step Triton path (``kernel="triton"``) and
    compiled (``compile="inductor"``); per step, the time split (CUDA events), host
    syncs counted by ``StepCounter`` and under ``torch.cuda.set_sync_debug_mode("warn")``,
    the ops and kernels dispatched and the CUDA kernels launched outside the
    forwards (``KernelCounter``), and tau."""
    import warnings

    import transformers

    import specdec
    from specdec.drafts.eagle import EagleConfig, EagleHead, make_draft
    from specdec.targets.hf import HFTarget
    from specdec.testing.counter import KernelCounter, StepCounter

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = transformers.LlamaConfig(
        vocab_size=args.step_vocab, hidden_size=args.step_hidden, intermediate_size=args.step_hidden * 11 // 4,
        num_hidden_layers=args.step_layers, num_attention_heads=max(1, args.step_hidden // 64),
        num_key_value_heads=max(1, args.step_hidden // 256), max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(device, dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    head_cfg = EagleConfig.for_target(cfg, 3)
    head = EagleHead(head_cfg, model.get_input_embeddings().weight.detach()).to(device, dtype)
    draft = make_draft(head)
    target = HFTarget(model, capture_layers=head_cfg.target_layers)
    prompt = list(range(1, 65))
    rows = []
    KernelCounter.profile_compiled_kernels()
    for method in ("eagle3", "rheo"):
        for kernel, compile_backend in (("auto", None), ("torch", None), ("triton", None), ("torch", "inductor")):
            row: dict[str, Any] = {"method": method, "kernel": kernel, "compile": compile_backend, "params": params}
            try:
                gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel=kernel,
                                                   compile=compile_backend or False)
                sampling = specdec.SamplingConfig(temperature=1.0)
                for warm_seed in (0, 2):  # warm-up (and, compiled, every shape of the step)
                    gen.generate(prompt, 8, sampling=sampling, seed=warm_seed)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if device.type == "cuda":
                        torch.cuda.set_sync_debug_mode("warn")
                    try:
                        with StepCounter(ops=False) as counter:
                            out = gen.generate(prompt, args.step_tokens, sampling=sampling, seed=1)
                    finally:
                        if device.type == "cuda":
                            torch.cuda.set_sync_debug_mode("default")
                # what the host dispatches and launches per step outside the forwards (KernelCounter:
                # ATen ops and inductor kernels; on CUDA, the kernel launches themselves)
                with KernelCounter(cuda=device.type == "cuda") as dispatched:
                    counted = gen.generate(prompt, args.step_tokens, sampling=sampling, seed=1)
                counted_steps = max(counted.stats.steps, 1)
                row.update(
                    dispatched_per_step_outside_models=dispatched.ops / counted_steps,
                    launches_per_step_outside_models=dispatched.launches / counted_steps,
                )
                st = out.stats
                steps = max(st.steps, 1)
                row.update(
                    steps=st.steps, tau=st.tau, clock=st.clock, kernel_path=st.kernel_path,
                    ms_draft=1000 * st.time_draft / steps, ms_target=1000 * st.time_target / steps,
                    ms_verify=1000 * st.time_verify / steps, ms_total=1000 * st.time_total / steps,
                    tokens_per_s=st.tokens_per_second,
                    syncs_per_step_outside_models=counter.syncs / steps,
                    syncs_per_step_inside_models=counter.model_syncs / steps,
                    cuda_sync_warnings_per_step=sum("synchroniz" in str(w.message) for w in caught) / steps,
                )
            except Exception:
                row["error"] = traceback.format_exc()[-1500:]
            rows.append(row)
            print(f"[step] {row}", flush=True)
    report["step"] = rows
    # issue 42: kernel="auto" on CUDA with Triton runs the device-resident step with the fused kernel
    # (the tree never goes to the host), with at most 4 host syncs per step (StepCounter, and the CUDA
    # runtime's own count under torch.cuda.set_sync_debug_mode("warn"))
    auto = [r for r in rows if r["kernel"] == "auto" and r["compile"] is None]
    report["auto_check"] = {
        "max_syncs_per_step": AUTO_SYNC_BUDGET,
        "rows": [{k: r.get(k) for k in ("method", "kernel_path", "syncs_per_step_outside_models",
                                         "cuda_sync_warnings_per_step", "error")} for r in auto],
        "passed": device.type != "cuda" or (bool(auto) and all(
            "error" not in r and r["kernel_path"] == "triton" and r["syncs_per_step_outside_models"] <= AUTO_SYNC_BUDGET
            and r["cuda_sync_warnings_per_step"] <= AUTO_SYNC_BUDGET for r in auto)),
    }
    print(f"[step] auto check: {report['auto_check']}", flush=True)


def multi_gpu_check(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """A target split over two GPUs with ``device_map`` (issue 14, item 9):
    the ``--step-*`` Llama with its first half of layers on cuda:0 and the rest
    (with the final norm and the LM head) on cuda:1, through accelerate's
    ``dispatch_model``; the EAGLE-3 head on cuda:0. Checks, at T=0: the tokens
    equal those of the same model on one GPU, the KV cache has one slab per
    device, the hidden features arrive on the head's device; reports tau and
    the time per step. Skipped with fewer than two CUDA devices."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        report["multi_gpu"] = {"skipped": f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA device(s)"}
        return
    import transformers
    from accelerate import dispatch_model

    import specdec
    from specdec.drafts.eagle import EagleConfig, EagleHead, make_draft
    from specdec.targets.hf import HFTarget

    cfg = transformers.LlamaConfig(
        vocab_size=args.step_vocab, hidden_size=args.step_hidden, intermediate_size=args.step_hidden * 11 // 4,
        num_hidden_layers=args.step_layers, num_attention_heads=max(1, args.step_hidden // 64),
        num_key_value_heads=max(1, args.step_hidden // 256), max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    half = args.step_layers // 2
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    device_map.update({f"model.layers.{i}": 0 if i < half else 1 for i in range(args.step_layers)})
    head_cfg = EagleConfig.for_target(cfg, 3)
    prompt = list(range(1, 65))
    sampling = specdec.SamplingConfig(temperature=0.0)
    results: dict[str, Any] = {"device_map": "layers 0-%d on cuda:0, %d-%d on cuda:1" % (half - 1, half, args.step_layers - 1)}
    outputs = {}
    for name in ("one_gpu", "two_gpus"):
        if name == "one_gpu":
            m = model.to("cuda:0")
        else:
            m = dispatch_model(model.to("cpu"), device_map=device_map)
            m.hf_device_map = device_map
        torch.manual_seed(1)
        head = EagleHead(head_cfg, m.get_input_embeddings().weight.detach()).to("cuda:0", torch.bfloat16)
        target = HFTarget(m, capture_layers=head_cfg.target_layers)
        gen = specdec.SpeculativeGenerator(target=target, draft=make_draft(head), method="eagle3", kernel="torch")
        gen.generate(prompt, 4, sampling=sampling, seed=0)  # warm-up
        torch.cuda.synchronize()
        out = gen.generate(prompt, args.step_tokens, sampling=sampling, seed=0)
        outputs[name] = out.tokens
        results[name] = {
            "tau": out.stats.tau, "ms_per_step": 1000 * out.stats.time_total / max(out.stats.steps, 1),
            "kv_slabs": sorted(str(sl.device) for sl in target._cache.slabs),
            "hidden_device": str(target.hidden_states().device) if target.hidden_states() is not None else None,
        }
        if name == "one_gpu":
            model = m.to("cpu")
    results["tokens_equal"] = outputs["one_gpu"] == outputs["two_gpus"]
    report["multi_gpu"] = results
    print(f"[multi_gpu] {results}", flush=True)


# ----------------------------------------------------------- batched verification
def batch_check(args: argparse.Namespace, report: dict[str, Any], deadline: float) -> None:
    """Issue 15: one launch of the fused kernel for all rows of a batch vs one
    launch per row vs the batched torch reference (see the module docstring, 6)."""
    from specdec.tree_batch import TreeBatch
    from specdec.verify.fast import decide_tree_batch

    rows = []
    sampling = LOGITS_SAMPLING  # T = 0.7, top-k 50: softmax and top-k fused in the kernel
    for rule in args.batch_rules:
        verifier = get("verifier", rule)()
        for B in args.batch_sizes:
            if time.monotonic() > deadline:
                report.setdefault("skipped_for_time", []).append(f"batch {rule} B={B}")
                continue
            res: dict[str, Any] = {"rule": rule, "shape": SHAPE[rule], "B": B, "vocab": args.batch_vocab}
            try:
                sizes = [max(2, args.batch_nodes - (b % 4) * args.batch_nodes // 8) for b in range(B)]  # ragged
                cases = [make_case(rule, args.batch_vocab, n, seed=1000 + b, device=args.device)
                         for b, n in enumerate(sizes)]
                trees = [t for t, _ in cases]
                batch = TreeBatch.from_trees(trees, device=args.device)
                n = batch.node_slots
                logits = torch.stack([torch.cat([lg, lg[:1].expand(n - lg.shape[0], -1)]) for _, lg in cases])  # [B, n, V]
                seeds = [7 * b + 1 for b in range(B)]

                def streams() -> RowStreams:
                    return RowStreams([CounterRandom(s) for s in seeds])

                def one_launch() -> Any:
                    return fused_verify_batch(verifier.fused, batch, logits, streams(), inputs="logits", sampling=sampling)

                def per_row() -> list[Any]:
                    return [fused_verify(verifier, t, lg, CounterRandom(s), inputs="logits", sampling=sampling)
                            for t, (_, lg), s in zip(trees, cases, seeds)]

                def torch_batched() -> Any:
                    p = process_logits(logits, sampling, check=False)
                    u = streams().verify_uniforms((B, n, batch.max_children + 1), device=logits.device)
                    return decide_tree_batch(verifier.fused, batch, p, u)

                got, singles, ref = one_launch(), per_row(), torch_batched()
                res["nodes"] = sum(sizes)
                res["mean_accepted"] = float(got.num_accepted.double().mean())
                res["rows_differ_vs_per_row_kernel"] = sum(
                    got.tokens[b, : int(got.num_accepted[b]) + 1].tolist() != list(one.tokens)
                    for b, one in enumerate(singles))
                res["rows_differ_vs_torch_batched"] = int((got.tokens != ref[2]).any(dim=-1).sum())
                for label, fn in (("one_launch", one_launch), ("per_row_launches", per_row),
                                  ("torch_batched", torch_batched)):
                    res[f"{label}_ms"] = median_ms(fn, args.device, args.reps)
                res["speedup_one_launch_vs_per_row"] = res["per_row_launches_ms"] / res["one_launch_ms"]
                res["speedup_one_launch_vs_torch_batched"] = res["torch_batched_ms"] / res["one_launch_ms"]
            except Exception as exc:
                res["error"] = f"{type(exc).__name__}: {exc}"
                res["trace"] = traceback.format_exc()[-2000:]
            rows.append(res)
            print(f"[batch] {rule} B={B}: " + ", ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()
                if k not in ("trace", "shape")), flush=True)
    report["batch"] = rows


# -------------------------------------------------------------------- output
def to_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = ["# GPU check of the Triton kernels", "", f"Command: `{report['command']}`", "",
             "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    summary = report.get("correctness_summary")
    if summary:
        lines += ["## Correctness (kernel vs reference verifiers on the same counter stream)", "",
                  f"{summary['decisions']} node decisions, {summary['mismatches']} mismatches "
                  f"({summary['float64_mismatches']} with float64 rows), {summary['walks_equal']}/{summary['walks']} "
                  f"walks equal, {summary['errors']} errors: {'OK' if summary['ok'] else 'FAILED'}.", ""]
    if report.get("timing"):
        lines += ["## Verification time per step, ms (median)", "",
                  "| V | nodes | tree | torch on GPU (k50) | torch via CPU copy (k50) | triton (k50) | speedup (k50) "
                  "| torch on GPU (k50,p0.9) | triton (k50,p0.9) | speedup (k50,p0.9) |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in report["timing"]:
            if "error" in r:
                lines.append(f"| {r['vocab']} | {r['size']} | {r['shape']} | error: {r['error'][:80]} |")
                continue
            a, b = "[T0.7-k50]", "[T0.7-k50-p0.9]"
            lines.append(
                f"| {r['vocab']} | {r['size']} | {r['shape']} | {r['torch_device_ms' + a]:.3f} | "
                f"{r['torch_cpu_copy_ms' + a]:.3f} | {r['triton_ms' + a]:.3f} (b{r['best_block' + a]}) | "
                f"{r['speedup_vs_torch_device' + a]:.1f}x | {r['torch_device_ms' + b]:.3f} | "
                f"{r['triton_ms' + b]:.3f} (b{r['best_block' + b]}) | {r['speedup_vs_torch_device' + b]:.1f}x |")
        lines += ["", f"Goal (>= 5x at V=128256, 64 nodes): {report.get('goal_5x_at_V128256_n64')}", ""]
    if report.get("kv_compaction"):
        lines += ["## KV compaction (SmolLM2 cache, bf16), ms (median)", "",
                  "| tree nodes | equal | triton | torch in place | torch reference |", "|---:|---|---:|---:|---:|"]
        for r in report["kv_compaction"]:
            if "error" in r:
                lines.append(f"| {r['tree_nodes']} | error: {r['error'][:80]} | | | |")
            else:
                lines.append(f"| {r['tree_nodes']} | {r['equal']} | {r['triton_ms']:.3f} | {r['inplace_ms']:.3f} | "
                             f"{r['reference_ms']:.3f} |")
    if report.get("step"):
        lines += ["", "## Full step (random Llama, EAGLE-3 head, 60 nodes, T=1), per step", "",
                  "| method | kernel | compile | tau | draft ms | target ms | verify ms | total ms | syncs outside | "
                  "syncs inside | CUDA sync warnings | dispatched outside | launches outside |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in report["step"]:
            where = f"| {r['method']} | {r['kernel']} | {r.get('compile') or '-'} |"
            if "error" in r:
                lines.append(f"{where} error: {r['error'][-80:]} |")
                continue
            lines.append(f"{where} {r['tau']:.2f} | {r['ms_draft']:.2f} | "
                         f"{r['ms_target']:.2f} | {r['ms_verify']:.2f} | {r['ms_total']:.2f} | "
                         f"{r['syncs_per_step_outside_models']:.1f} | {r['syncs_per_step_inside_models']:.1f} | "
                         f"{r['cuda_sync_warnings_per_step']:.1f} | {r['dispatched_per_step_outside_models']:.0f} | "
                         f"{r['launches_per_step_outside_models']:.0f} |")
    if report.get("batch"):
        lines += ["", "## Batched verification: one launch for all rows vs a launch per row (T=0.7, top-k 50), ms (median)",
                  "", "| tree | B | nodes | V | one launch | per-row launches | torch batched | vs per-row | vs torch "
                  "| rows differ (per-row kernel / torch) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in report["batch"]:
            if "error" in r:
                lines.append(f"| {r['shape']} | {r['B']} | | | error: {r['error'][:80]} |")
                continue
            lines.append(f"| {r['shape']} | {r['B']} | {r['nodes']} | {r['vocab']} | {r['one_launch_ms']:.3f} | "
                         f"{r['per_row_launches_ms']:.3f} | {r['torch_batched_ms']:.3f} | "
                         f"{r['speedup_one_launch_vs_per_row']:.1f}x | {r['speedup_one_launch_vs_torch_batched']:.1f}x | "
                         f"{r['rows_differ_vs_per_row_kernel']} / {r['rows_differ_vs_torch_batched']} |")
    if report.get("multi_gpu"):
        lines += ["", "## Target split over two GPUs (device_map), EAGLE-3, T=0", "", "```", json.dumps(report["multi_gpu"], indent=1), "```"]
    if report.get("bench"):
        b = report["bench"]
        lines += ["", "## specdec bench --device cuda (tests/bench/test_bench_device.py)", "",
                  f"{'passed' if b['passed'] else 'FAILED'} (exit {b['returncode']}, {b['wall_s']} s): `{b['command']}`"]
    if report.get("cuda_graph"):
        lines += ["", "## CUDA graphs: the fixed-shape step captured and replayed (docs/cuda_graphs.md)", "",
                  "```", json.dumps(report["cuda_graph"], indent=1), "```"]
    if report.get("skipped_for_time"):
        lines += ["", "Skipped for time: " + "; ".join(report["skipped_for_time"])]
    return "\n".join(lines) + "\n"


def cuda_graph_check(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Capture and replay of the fixed-shape step on the first GPU (module docstring, item 8)."""
    from specdec.engine.fixed_step import fixed_step

    dry = args.graph_dry_run
    if not dry and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        report["cuda_graph"] = {"skipped": "no CUDA device: the CUDA-graph capture-and-replay check runs on the "
                                           "first GPU only (--graph-dry-run runs its static-buffer logic without a capture)"}
        print(f"[cuda_graph] {report['cuda_graph']['skipped']}", flush=True)
        return
    device = torch.device(args.device if dry else "cuda:0")
    B, V, H = args.graph_batch, args.graph_vocab, 64
    gen = torch.Generator(device="cpu").manual_seed(0)
    emb = torch.randn(V, H, generator=gen).to(device)  # a Markov draft and target: logits = emb[token] @ out
    out_t = (torch.randn(H, V, generator=gen) / H ** 0.5 * 3).to(device)
    out_d = out_t + (torch.randn(H, V, generator=gen) / H ** 0.5).to(device)
    sampling = SamplingConfig(temperature=1.0)
    rows = []
    for method, tree_name, options, rule in (("rheo", "rheo", {"K": 4, "depth": 4, "N": 24, "M": 16}, "mixed"),
                                             ("sd", "chain", {"depth": 4}, "rejection-iid")):
        row: dict[str, Any] = {"method": method, "B": B, "V": V, "dry_run": dry}
        try:
            plan = fixed_step(get("tree", tree_name)(**options), get("verifier", rule)(), sampling, batch=B, vocab=V)
            row.update(_graph_rounds(plan, emb, out_d, out_t, device, args.graph_replays, args.reps, dry))
        except Exception:
            row["error"] = traceback.format_exc()[-1500:]
        rows.append(row)
        print(f"[cuda_graph] {row}", flush=True)
    report["cuda_graph"] = {"rows": rows, "passed": all("error" not in r and r["mismatches"] == 0 for r in rows)}


class _Captured:
    """``fn`` on static copies of its example arguments, captured in a ``torch.cuda.CUDAGraph``
    (after a warm-up on a side stream); a call copies its arguments into the static inputs and
    replays. ``dry``: no capture, ``fn`` runs on the static inputs (the CPU smoke test)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], dry: bool) -> None:
        from torch.utils import _pytree as pytree

        self.pytree, self.fn, self.dry = pytree, fn, dry
        self.static = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, args)
        self.graph: Any = None
        if dry:
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*self.static)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(*self.static)

    def __call__(self, *args: Any) -> Any:
        for s, x in zip(self.pytree.tree_leaves(self.static), self.pytree.tree_leaves(args), strict=True):
            if isinstance(s, torch.Tensor):
                s.copy_(x)
        if self.graph is None:
            return self.fn(*self.static)
        self.graph.replay()
        return self.out


_TREE_FIELDS = ("tokens", "parents", "depths", "kinds", "draw_order", "weights", "num_nodes", "law_ids", "law_probs",
                "law_wor", "ancestors", "draft_bad")


def _graph_rounds(plan: Any, emb: torch.Tensor, out_d: torch.Tensor, out_t: torch.Tensor, device: torch.device,
                  replays: int, reps: int, dry: bool) -> dict[str, Any]:
    """Capture every level, the finish and the verification of ``plan`` (fields of the tree in,
    :class:`~specdec.engine.fixed_step.FixedVerify` out), then run ``replays`` steps with new
    inputs through the replayed graphs and through the eager functions: fields that differ."""
    from torch.utils import _pytree as pytree

    b = plan.budget
    consts = plan.constants(device)
    fns = plan.eager()
    gen = torch.Generator(device="cpu").manual_seed(1)

    def verify_fields(fields: dict[str, torch.Tensor], logits: torch.Tensor, u: torch.Tensor,
                      lens: torch.Tensor) -> Any:
        return fns.verify(plan.tree(fields), logits, u, lens)

    def inputs() -> dict[str, Any]:  # one step's roots, uniform tables and prefix lengths
        return {"roots": torch.randint(b.vocab, (b.batch,), generator=gen).to(device),
                "tables": [torch.rand(plan.table_shape(d), generator=gen, dtype=torch.float64).to(device)
                           for d in range(1, b.depth + 1)],
                "u": torch.rand(plan.verify_table_shape, generator=gen, dtype=torch.float64).to(device),
                "lens": torch.randint(1, 100, (b.batch,), generator=gen).to(device)}

    def step(x: dict[str, Any], levels_fns: Any, finish: Any, verify: Any) -> tuple[list[Any], Any, Any]:
        """One step; the draft and target forwards (``emb[token] @ out``) are the engine's, eager."""
        root, live, score = plan.start(x["roots"])
        logits = emb[root.view(-1)] @ out_d  # [B, V] the roots' draft logits
        levels = []
        for d in range(1, b.depth + 1):
            lv = levels_fns[d - 1](logits, x["tables"][d - 1], root, live, score, consts)
            levels.append(lv)
            if lv.tokens is not None:
                logits = emb[lv.tokens] @ out_d  # [B, k, V]
                live, score = plan.carry(lv)
        fields = finish(levels, root, consts)
        return levels, fields, verify(fields, emb[fields["tokens"]] @ out_t, x["u"], x["lens"])

    # the eager run of a first step gives every function's example arguments, which the captures copy
    first = inputs()
    examples: list[tuple[Any, ...]] = []

    def recording(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            examples.append(args)
            return fn(*args)
        return call

    step(first, [recording(f) for f in fns.levels], recording(fns.finish), recording(verify_fields))
    graphs = [_Captured(f, a, dry) for f, a in zip([*fns.levels, fns.finish, verify_fields], examples, strict=True)]
    levels_g, finish_g, verify_g = graphs[: b.depth], graphs[b.depth], graphs[b.depth + 1]
    mismatches, compared = 0, 0
    for _ in range(replays):
        x = inputs()
        want = step(x, fns.levels, fns.finish, verify_fields)
        got = step(x, levels_g, finish_g, verify_g)
        for a, c in zip(pytree.tree_leaves(want), pytree.tree_leaves(got), strict=True):
            if isinstance(a, torch.Tensor):
                compared += 1
                mismatches += not torch.equal(a, c)
    result: dict[str, Any] = {"nodes": b.nodes, "depth": b.depth, "replays": replays, "tensors_compared": compared,
                              "mismatches": mismatches, "graphs": 0 if dry else len(graphs)}
    if not dry:
        args_v = examples[-1]
        result["verify_eager_ms"] = median_ms(lambda: verify_fields(*args_v), "cuda", reps)
        result["verify_replay_ms"] = median_ms(verify_g.graph.replay, "cuda", reps)
        result["step_eager_ms"] = median_ms(lambda: step(first, fns.levels, fns.finish, verify_fields), "cuda", reps)
        result["step_replayed_ms"] = median_ms(lambda: step(first, levels_g, finish_g, verify_g), "cuda", reps)
    return result

def bench_check(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """``specdec bench --device cuda`` end to end: the GPU test of tests/bench/test_bench_device.py."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
           str(root / "tests" / "bench" / "test_bench_device.py"), "-k", "on_the_gpu"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    tail = (proc.stdout + proc.stderr)[-2000:]
    report["bench"] = {"command": " ".join(cmd[1:]), "returncode": proc.returncode,
                       "passed": proc.returncode == 0 and " passed" in tail and "skipped" not in tail,
                       "wall_s": round(time.monotonic() - t0, 1), "tail": tail}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Correctness and timing of specdec's Triton kernels on a GPU.")
    parser.add_argument("--out", default="benchmarks/results/gpu")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 128256])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--block", type=int, default=None, help="kernel block for the correctness checks")
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 4096], help="kernel blocks timed")
    parser.add_argument("--max-mismatch-rate", type=float, default=1e-3)
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop starting timing cases after this")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["correctness", "timing", "kv", "step", "multi_gpu", "batch", "bench", "cuda_graph"])
    parser.add_argument("--graph-batch", type=int, default=4, help="rows of the CUDA-graph check")
    parser.add_argument("--graph-vocab", type=int, default=32000, help="vocabulary of the CUDA-graph check")
    parser.add_argument("--graph-replays", type=int, default=5, help="steps replayed with new inputs")
    parser.add_argument("--graph-dry-run", action="store_true",
                        help="the CUDA-graph check's static-buffer logic without a capture (runs on a CPU)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--batch-nodes", type=int, default=64, help="nodes of the largest tree of a batch")
    parser.add_argument("--batch-vocab", type=int, default=128256)
    parser.add_argument("--batch-rules", nargs="+", default=["match", "mixed"], choices=list(RULES))
    parser.add_argument("--step-vocab", type=int, default=128256)
    parser.add_argument("--step-hidden", type=int, default=2048)
    parser.add_argument("--step-layers", type=int, default=16, help="16 x 2048 with V=128256: about 1.1B parameters")
    parser.add_argument("--step-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"command": "python benchmarks/gpu_check.py " + " ".join(argv or sys.argv[1:]),
                              "environment": environment(args.device)}
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        report["error"] = "no CUDA device"
    sections = [("correctness", lambda: correctness(args, report)),
                ("timing", lambda: timing(args, report, start + args.budget_s)),
                ("kv", lambda: kv_check(args, report)),
                ("step", lambda: step_check(args, report)),
                ("multi_gpu", lambda: multi_gpu_check(args, report)),
                ("batch", lambda: batch_check(args, report, start + args.budget_s)),
                ("bench", lambda: bench_check(args, report)),
                ("cuda_graph", lambda: cuda_graph_check(args, report))]
    for name, run in sections:
        if name in args.skip or "error" in report:
            continue
        try:
            run()
        except Exception as exc:
            report.setdefault("section_errors", {})[name] = traceback.format_exc()[-3000:]
            print(f"[{name}] failed: {exc}", flush=True)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))  # keep partial results
    report["wall_s"] = round(time.monotonic() - start, 1)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(to_markdown(report))
    print(to_markdown(report))
    ok = ("error" not in report and not report.get("section_errors")
          and report.get("correctness_summary", {}).get("ok", "correctness" in args.skip)
          and all("error" not in r and r["rows_differ_vs_per_row_kernel"] == 0 for r in report.get("batch", []))
          and report.get("bench", {}).get("passed", "bench" in args.skip or args.device == "cpu")
          and report.get("auto_check", {}).get("passed", "step" in args.skip)
          and report.get("cuda_graph", {}).get("passed", True))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
