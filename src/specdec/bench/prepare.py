"""What a ``specdec bench`` sweep needs from the models before it runs (docs/bench.md).

:func:`prepare_sweep` renders the prompts, checks the rows and the context,
profiles Sequoia's acceptance and rheo's calibrated proxy, and settles
``--budget auto`` (:func:`auto_budget`: the forward and draft timings, the
acceptance profiles, the budget of every temperature and draft kind and rheo's sampled slots
``m``). It runs in the command's process, or on worker 0 with ``--workers``
(:meth:`~specdec.bench.workers.WorkerPool.prepare`); its result is plain data.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from specdec.bench import auto_budget
from specdec.bench.budget import Budget, dynamic_width, method_options, method_tree
from specdec.bench.models import BenchModels
from specdec.bench.prompts import BenchPrompt, select_prompts
from specdec.bench.rows import RowSpec
from specdec.bench.runner import check_rows
from specdec.bench.settings import BenchSettings
from specdec.bench.sweep import BenchConfig
from specdec.errors import InvalidConfigError
from specdec.sampling import SamplingConfig
from specdec import tune
from specdec.trees.rheo import policy_options
from specdec.trees.sequoia import measure_draft_level_time

__all__ = ["CALIBRATION_STEPS_FACTOR", "prepare_sweep"]

CALIBRATION_STEPS_FACTOR = 4
"""The calibrated proxy's profile runs this many times the preset's Sequoia profile steps per
prompt (its table has a row per draw and a column per bin, so it needs more draws than
Sequoia's one vector)."""


def prepare_sweep(models: BenchModels, args: argparse.Namespace, settings: BenchSettings, rows: Sequence[RowSpec],
                  prompts: Sequence[BenchPrompt], prompts_all: Sequence[BenchPrompt], resolved: dict[str, Any] | None,
                  log: Callable[[str], None], resume_path: str = "runs.jsonl") -> dict[str, Any]:
    """What a sweep needs from the models before it runs: the rendered prompts, the checks, the profiles and
    the budget (``resolved``: a resumed sweep's logged header, whose profiles and budget are kept): under
    ``budget`` one :class:`~specdec.bench.budget.Budget`, or ``{T: {draft kind: Budget}}`` with ``--budget auto``, and
    under ``sampled_slots`` ``--budget auto``'s rheo ``m`` per temperature (empty otherwise).

    Runs in this process, or on worker 0 with ``--workers`` (:meth:`~specdec.bench.workers.WorkerPool.prepare`):
    the result is plain data.

    Raises:
        InvalidConfigError: no prompt fits ``--max-prompt-tokens``, the context is too short, a bad row.
    """
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
    fixed = settings.budget if isinstance(settings.budget, Budget) else None  # None: --budget auto
    biggest = max(auto_budget.AUTO_CANDIDATES) if fixed is None else fixed.nodes
    if limit is not None and max(map(len, rendered)) + settings.max_new_tokens + biggest + 1 > limit:
        raise InvalidConfigError(
            f"the longest prompt ({max(map(len, rendered))} tokens) + --max-new-tokens "
            f"({settings.max_new_tokens}) + the tree does not fit the target's context of {limit} tokens"
        )
    probe_budget = Budget(8, 4) if fixed is None else fixed
    check_rows(models, BenchConfig(rows, settings.temperatures, settings.seeds, settings.max_new_tokens, probe_budget))
    out: dict[str, Any] = {"rendered": rendered, "used": used, "descriptions": dict(models.descriptions),
                           "sequoia_acc": {}, "rheo_cal": {}, "auto_info": None, "budget": None, "sampled_slots": {},
                           "profile_count": 0}
    if resolved is not None:
        return out
    k = settings.profile_prompts
    spare = [p for p in select_prompts(prompts_all, len(prompts) + k) if p not in prompts]
    speculative = [r.method_and_draft() for r in rows if r.kind == "speculative"]
    sequoia_kinds = sorted({draft for method, draft in speculative if method_tree(method) == "sequoia"})
    profile_prompts = [ids for ids in (models.tokenize(p.text) for p in spare)
                       if len(ids) <= args.max_prompt_tokens][:k]
    if not profile_prompts:  # the documented fallback, said in the log: the set has no prompt the run does not report
        profile_prompts = rendered[:k]
        log(f"the profiles{' and --budget auto' if fixed is None else ''} use {len(profile_prompts)} of the "
            "reported prompts: the prompt set has no other prompt (choices are made on tuning prompts only when the "
            "set has prompts the run does not use)")
    out["profile_count"] = len(profile_prompts)
    kinds = sorted({draft for _, draft in speculative})
    for kind in sequoia_kinds:
        for t in settings.temperatures:
            log(f"profiling Sequoia acceptance: draft {kind}, T={t:g}")
            rates = auto_budget.profile_positional_acceptance(
                models.targets[kind], models.drafts[kind], profile_prompts, SamplingConfig(temperature=t), 8,
                children="wor", steps_per_prompt=settings.profile_steps)
            out["sequoia_acc"][(kind, t)] = auto_budget.smooth_acceptance(
                rates, len(profile_prompts) * settings.profile_steps)
    for row in rows:  # rheo / sampled-dynamic rows with the calibrated proxy and no table of their own: one per T > 0
        own = dict(row.options)
        if row.kind != "speculative" or own.get("proxy") != "calibrated" or "calibration" in own:
            continue
        method, draft = row.method_and_draft()
        tree = method_tree(method)
        if tree not in ("rheo", "sampled-dynamic"):
            continue
        width = dynamic_width(fixed) if fixed is not None else 10
        draws = int(own.get("m", 10)) if tree == "rheo" else int(own.get("K", width))  # rows of the table
        for t in settings.temperatures:
            if t == 0:
                continue  # no node is sampled at T = 0: the tree is EAGLE-2's, no proxy is read
            log(f"profiling the calibrated proxy: {row.name}, T={t:g}")
            out["rheo_cal"][(row.name, float(t))] = tune.profile_calibration(
                models.targets[draft], models.drafts[draft], profile_prompts, SamplingConfig(temperature=t),
                draws=draws, M=int(own.get("M", policy_options(tree, t).get("M", 1024))),
                rank_law=str(own.get("rank_law", "untempered")),
                steps_per_prompt=CALIBRATION_STEPS_FACTOR * settings.profile_steps)
    if fixed is None:
        out["budget"], out["sampled_slots"], out["auto_info"] = _auto_budget(
            models, kinds or ["lm"], settings, profile_prompts, log, rows)
    else:
        out["budget"] = fixed
    return out


def _auto_budget(models: BenchModels, kinds: Sequence[str], settings: BenchSettings, prompts: Sequence[Sequence[int]],
                 log: Callable[[str], None], rows: Sequence[RowSpec] = ()
                 ) -> tuple[dict[float, dict[str, Budget]], dict[float, int], dict[str, Any]]:
    """Measure forward and draft times and acceptance profiles on the tuning prompts ``prompts`` (never the
    reported ones); choose the budget of every (temperature, draft kind) from that kind's own profile and,
    with pilot generations of the rheo rows, rheo's sampled slots ``m`` (docs/bench.md).

    Returns ``({T: {kind: Budget}}, {T: m}, info)``; ``{T: m}`` is empty when no row's builder is rheo without
    its own ``m``.
    """
    prompt = list(prompts[0])
    batch = settings.batch_size  # the costs are those of B rows together: the best tree shrinks as B grows
    for_rows = f" for {batch} rows" if batch > 1 else ""
    log(f"auto budget: timing target forwards over tree sizes{for_rows} ...")
    sizes = sorted({n + 1 for n in auto_budget.AUTO_CANDIDATES} | {1})
    # the sizes in turn, the fastest of 5: a spell of load on this machine falls on every size alike and only
    # adds time, so the choice between near-tied budgets does not follow the noise (issue 48)
    # (issue 57: one prefill, not one per forward; a progress line per round)
    forward = auto_budget.time_tree_forwards(models.target, prompt, sizes, repeats=5, warmup=1, batch_size=batch,
                                             log=log)
    level_times: dict[str, dict[int, float]] = {}
    acceptance: dict[float, dict[str, tuple[str, tuple[float, ...]]]] = {float(t): {} for t in settings.temperatures}
    for kind in kinds:
        widths = (1, 10)
        log(f"auto budget: timing draft {kind}'s levels of {widths[0]} and {widths[1]} nodes")
        level_times[kind] = {w: measure_draft_level_time(models.drafts[kind], prompt, w, repeats=3, batch_size=batch,
                                                         target=models.targets[kind]) for w in widths}
        for t in settings.temperatures:
            log(f"auto budget: acceptance profile of draft {kind} at T={t:g}")
            rates = auto_budget.profile_positional_acceptance(
                models.targets[kind], models.drafts[kind], prompts, SamplingConfig(temperature=t), 8,
                children="topk", steps_per_prompt=settings.profile_steps)
            smoothed = auto_budget.smooth_acceptance(rates, len(prompts) * settings.profile_steps)
            acceptance[float(t)][f"{kind}@T={t:g}"] = (kind, smoothed)
    choices = auto_budget.choose_budgets(forward, {k: auto_budget.linear_level_time(v) for k, v in level_times.items()},
                                         acceptance)
    # rheo's m: the rows whose builder is rheo and that leave m to the budget, one pilot per (method, draft), each
    # at its draft kind's budget
    free_m = [r.method_and_draft() for r in rows if r.kind == "speculative" and "m" not in dict(r.options)]
    pilots = sorted({(method, kind) for method, kind in free_m if method_tree(method) == "rheo"})
    slots: dict[float, int] = {}
    per_t: list[dict[str, Any]] = []
    for t, by_kind in choices.items():
        # per row, tokens per second are G / cost; B rows share each forward, so the sums are B times that
        kinds_entry: dict[str, dict[str, Any]] = {}
        for kind, choice in by_kind.items():
            kinds_entry[kind] = {
                "nodes": choice.budget.nodes,
                "depth": choice.budget.depth,
                "expected_tokens_per_step": dict(choice.expected_tokens),  # per profile key of the kind
                "expected_tokens_per_s": choice.expected_tokens_per_s * batch,
                "predicted_speedup": choice.expected_tokens_per_s * forward[1],
                "table": {f"{n},{d}": v for (n, d), v in sorted(choice.table.items())},
            }
            log(f"auto budget{for_rows}: T={t:g}, draft {kind}: {choice.budget} predicts "
                f"{kinds_entry[kind]['expected_tokens_per_s']:.1f} tokens/s against {batch / forward[1]:.1f} for "
                f"autoregressive decoding (x{kinds_entry[kind]['predicted_speedup']:.2f}; a model, not a "
                "measurement: the table below measures)")
        entry: dict[str, Any] = {"temperature": t, "m": None, "by_kind": kinds_entry, "pilot": None}
        per_t.append(entry)
        if pilots and t == 0:
            slots[t] = 1  # greedy: rheo builds EAGLE-2's tree, m plays no part
        elif pilots:
            measured: dict[str, dict[str, float]] = {}

            def tau_of(m: int, t: float = t, by_kind: dict[str, auto_budget.BudgetChoice] = by_kind,
                       measured: dict[str, dict[str, float]] = measured) -> float:
                taus = []
                for method, kind in pilots:
                    opts = {**method_options(method, by_kind[kind].budget), "m": m}
                    emitted, steps = auto_budget.pilot_tau(models.targets[kind], models.drafts[kind], method, opts,
                                                           prompts, SamplingConfig(temperature=t),
                                                           settings.pilot_tokens, seed=settings.seeds[0])
                    measured.setdefault(f"{method}@{kind}", {})[str(m)] = emitted / steps
                    taus.append(emitted / steps)
                return sum(taus) / len(taus)

            # m < K for every piloted kind's K (a row's own K is widened or m lowered by row_options)
            width = min(dynamic_width(by_kind[kind].budget) for _, kind in pilots)
            log(f"auto budget: rheo's sampled slots m at T={t:g}: pilot generations at "
                + ", ".join(f"{kind}'s {by_kind[kind].budget}" for kind in sorted({k for _, k in pilots})))
            sc = auto_budget.choose_sampled_slots(tau_of, width)
            slots[t] = sc.m
            entry["pilot"] = {"candidates": list(sc.candidates), "tau": {str(m): v for m, v in sc.tau.items()},
                              "by_row": measured, "tokens": settings.pilot_tokens, "prompts": len(prompts),
                              "seed": settings.seeds[0]}
            figures = ", ".join(f"m={m} {v:.3f}" for m, v in sc.tau.items()) or f"only m=1 fits K={width}"
            log(f"auto budget: T={t:g}: rheo m={sc.m} (pilot tau: {figures})")
        entry["m"] = slots.get(t)
    info = {
        "batch_size": batch,
        "per_draft_kind": True,  # each (temperature, draft kind) chose from that kind's own profile (issue 59)
        "forward_time_s": {str(k): v for k, v in forward.items()},
        "draft_level_time_s": {k: {str(w): t for w, t in v.items()} for k, v in level_times.items()},
        "acceptance": {k: list(a) for per in acceptance.values() for k, (_, a) in per.items()},
        "autoregressive_tokens_per_s": batch / forward[1],
        "by_temperature": per_t,
    }
    return {t: {k: c.budget for k, c in by_kind.items()} for t, by_kind in choices.items()}, slots, info

