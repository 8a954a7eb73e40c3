"""The benchmark loop: every method side by side with the autoregressive baseline.

Words: a *row* is one line of the result table (:mod:`specdec.bench.rows`):
the autoregressive baseline, a registered method with a draft kind (``"rheo"``
with the EAGLE-3 head, ``"rheo@eagle2"``...), or the transformers peer
(``"hf-assisted"``). A *unit* is one ``(prompt, temperature, seed)``
(:mod:`specdec.bench.sweep`); at temperature 0 only the first seed runs
(greedy decoding ignores it).

Interleaving: the runner visits the units one by one and, inside a unit, runs
every row once, the baseline included, on the same prompt, temperature and
seed, rotating the order of the rows by one position from unit to unit
(:func:`~specdec.bench.sweep.unit_order`). So every row sees the same machine
conditions (other processes, thermal state) and speedups are ratios of rows
measured side by side, never against a baseline measured at another time.

Metrics per row and temperature (:func:`aggregate`), summed over units:

- ``tau``: tokens emitted per target forward (accepted drafts + 1 bonus),
  ``emitted / steps``; the baseline's is 1;
- ``tokens_per_s``: new tokens / wall time of the generate calls (prefill
  included);
- ``speedup``: ``tokens_per_s`` / the baseline's ``tokens_per_s`` at the same
  temperature;
- ``acceptance_by_depth[d-1]``: accepted drafts at depth ``d`` / steps in
  which a draft at depth ``d`` was tested;
- ``acceptance_by_position[d-1]``: accepted drafts at depth ``d`` / steps whose
  tree drafted a node at depth ``d`` (vLLM's per-position acceptance rate;
  ``drafted_by_depth``: the denominators; None for logs without the counts);
- time split: seconds in drafting (tree building and draft commits), target
  tree forwards, verification (logit processing included), prefill;
- with ``--optimum`` (:attr:`BenchConfig.optimum <specdec.bench.sweep.BenchConfig.optimum>`):
  ``optimum_by_depth[d-1]``, the best lossless acceptance at the nodes tested at
  depth ``d`` (summed over the steps) / the steps in which one was tested,
  ``gap_by_depth`` = ``optimum_by_depth - acceptance_by_depth``, and ``gap``, the
  acceptance left on the table per tested node, all depths together.

The rows, the sweep's configuration and its records are defined in
:mod:`specdec.bench.rows` and :mod:`specdec.bench.sweep`; their names stay
importable from here.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from specdec.batch import autoregressive_generate_batch
from specdec.bench.budget import BudgetPlan, budget_at
from specdec.bench.models import BenchModels
from specdec.bench.rows import AUTOREGRESSIVE, DEFAULT_DRAFT, PEER, RowSpec, batch_refusal, parse_rows
from specdec.bench.runlog import jsonable, run_key
from specdec.bench.sweep import BenchConfig, RunRecord, batch_chunks, bench_units, row_options, unit_order
from specdec.engine.options import StepOptions
from specdec.errors import InvalidConfigError
from specdec.generate import SpeculativeGenerator, autoregressive_generate
from specdec.sampling import SamplingConfig

# AUTOREGRESSIVE, PEER, DEFAULT_DRAFT, RowSpec, parse_rows, batch_refusal (specdec.bench.rows), BenchConfig,
# RunRecord, bench_units, batch_chunks, unit_order and row_options (specdec.bench.sweep) were defined here:
# they stay importable from this module, and are documented where they are defined now
__all__ = ["run_bench", "check_rows", "aggregate", "hf_assisted_generate"]


def hf_assisted_generate(
    target_model: Any,
    draft_model: Any,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float,
    seed: int,
    eos_token_id: int | list[int] | None,
    pad_token_id: int | None = None,
) -> tuple[list[int], float, int]:
    """Transformers' assisted generation: ``target.generate(assistant_model=draft)``.

    Sampling matches the benchmark's: ``do_sample = T > 0`` with
    ``temperature=T`` and top-k / top-p off; otherwise transformers' defaults
    (``num_assistant_tokens=20``, schedule ``constant``,
    ``assistant_confidence_threshold=0.4`` in transformers 5).

    Returns:
        ``(new tokens, seconds, target forwards)``; forwards are counted with
        a forward hook on the target and include the first (prefill + verify) one.
    """
    import transformers  # heavy: only the peer row needs it

    device = next(target_model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    config = copy.deepcopy(target_model.generation_config)
    config.max_new_tokens = int(max_new_tokens)
    config.min_new_tokens = None
    config.max_length = None
    config.do_sample = temperature > 0
    config.temperature = float(temperature) if temperature > 0 else 1.0
    config.top_k = 0
    config.top_p = 1.0
    config.eos_token_id = eos_token_id
    if config.pad_token_id is None:
        config.pad_token_id = pad_token_id
    kwargs: dict[str, Any] = dict(generation_config=config, assistant_model=draft_model,
                                  attention_mask=torch.ones_like(ids))
    calls = [0]

    def hook(_module: Any, _args: Any, _out: Any) -> None:
        calls[0] += 1

    handle = target_model.register_forward_hook(hook)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.inference_mode():
            out = target_model.generate(ids, **kwargs)
        seconds = time.perf_counter() - start
    finally:
        handle.remove()
        transformers.logging.set_verbosity(verbosity)
    tokens = [int(t) for t in out[0, ids.shape[1]:].tolist()]
    return tokens, seconds, calls[0]


def _generators(models: BenchModels, config: BenchConfig, options: Mapping[tuple[str, float], Mapping[str, Any]]) -> dict[tuple[str, float], Any]:
    """One :class:`~specdec.SpeculativeGenerator` per (speculative row, temperature); with
    ``config.optimum``, each measures the gap to the best lossless acceptance
    (``StepOptions(optimum=True)``)."""
    step = StepOptions(optimum=True) if config.optimum else None
    gens = {}
    for row in config.rows:
        if row.kind != "speculative":
            continue
        method, draft = row.method_and_draft()
        for t in config.temperatures:
            gens[(row.name, t)] = SpeculativeGenerator(
                target=models.targets[draft], draft=models.drafts[draft], method=method, options=step,
                **dict(options[(row.name, t)]),
            )
    return gens


def check_rows(models: BenchModels, config: BenchConfig) -> None:
    """Build every generator once (bad options, vocabularies or budgets fail here,
    before any timing) and check the peer row has Hugging Face models."""
    for row in config.rows:
        if row.kind == "speculative" and row.draft not in models.drafts:
            raise InvalidConfigError(f"row {row.name!r} needs the {row.draft} draft, which is not loaded")
        if row.kind == "peer" and (models.hf_target is None or models.hf_draft is None):
            raise InvalidConfigError(f"the {PEER} row needs Hugging Face target and draft models")
    _generators(models, config, row_options(config))


def run_bench(
    models: BenchModels,
    config: BenchConfig,
    prompts: Sequence[Sequence[int]],
    *,
    options: Mapping[tuple[str, float], Mapping[str, Any]] | None = None,
    on_run: Callable[[RunRecord], None] | None = None,
    on_start: Callable[[str], None] | None = None,
    skip: Collection[tuple[str, int, float, int]] = frozenset(),
    units: Collection[int] | None = None,
) -> list[RunRecord]:
    """Run every row on every unit, interleaved (see the module docstring).

    Args:
        models: the loaded models.
        config: what to run.
        prompts: token-id prompts.
        options: builder options per (row, temperature) (default
            :func:`row_options` without profiles).
        on_run: called after each generate call (progress bars).
        on_start: called with a short description before the warm-up and
            before each call.
        skip: generations already done (:func:`~specdec.bench.runlog.run_key`
            of a resumed ``runs.jsonl``): not run again.
        units: indices of the units to run (of :func:`bench_units`, or of
            :func:`batch_chunks` with ``batch_size`` > 1); None: all. A Ray
            worker gets a subset; each unit keeps its index, so rows rotate
            as in a one-process run.

    Returns:
        one :class:`RunRecord` per generate call made, in run order (with
        ``batch_size`` > 1: one per prompt of each batched call).
    """
    if not prompts:
        raise InvalidConfigError("the benchmark needs at least one prompt")
    options = row_options(config) if options is None else options
    gens = _generators(models, config, options)
    eos = None if config.ignore_eos else models.eos_token_id

    def call(row: RowSpec, prompt: Sequence[int], t: float, seed: int, n: int) -> dict[str, Any]:
        sampling = SamplingConfig(temperature=t)
        if row.kind == "peer":
            pad = models.eos_token_id[0] if isinstance(models.eos_token_id, list) else models.eos_token_id
            tokens, seconds, calls = hf_assisted_generate(models.hf_target, models.hf_draft, prompt, n, t, seed, eos,
                                                          pad_token_id=pad)
            nan = float("nan")
            return dict(new_tokens=len(tokens), steps=calls, emitted=len(tokens), depth_attempted=(),
                        depth_accepted=(), time_total=seconds, time_prefill=nan, time_draft=nan,
                        time_target=nan, time_verify=nan, tokens=tuple(tokens))
        if row.kind == "autoregressive":
            out = autoregressive_generate(models.target, prompt, n, sampling=sampling, seed=seed, eos_token_id=eos)
        else:
            out = gens[(row.name, t)].generate(prompt, n, sampling=sampling, seed=seed, eos_token_id=eos)
        s = out.stats
        return dict(new_tokens=s.new_tokens, steps=s.steps, emitted=s.emitted,
                    depth_attempted=tuple(s.depth_attempted), depth_accepted=tuple(s.depth_accepted),
                    time_total=s.time_total, time_prefill=s.time_prefill, time_draft=s.time_draft,
                    time_target=s.time_target, time_verify=s.time_verify, tokens=tuple(out.tokens),
                    depth_optimum=tuple(s.depth_optimum), optimum_bound=s.optimum_bound,
                    depth_drafted=tuple(s.depth_drafted))

    if config.batch_size > 1:
        return _run_batched(models, config, prompts, gens, eos, on_run, on_start, skip, units)
    plan = [(u, row) for u, (pi, t, seed) in enumerate(bench_units(len(prompts), config.temperatures, config.seeds))
            if units is None or u in units
            for row in unit_order(config.rows, u) if run_key(row.name, pi, t, seed) not in skip]
    if config.warmup and plan:
        if on_start:
            on_start("warm-up")
        for row in config.rows:  # one short untimed call per row (allocator, caches, lazy imports)
            call(row, prompts[0], config.temperatures[-1], config.seeds[0], min(8, config.max_new_tokens))
    records: list[RunRecord] = []
    all_units = bench_units(len(prompts), config.temperatures, config.seeds)
    for u, row in plan:
        pi, t, seed = all_units[u]
        if on_start:
            on_start(f"{row.name} T={t:g} prompt {pi + 1}/{len(prompts)}")
        result = call(row, prompts[pi], t, seed, config.max_new_tokens)
        nodes, depth = _budget_of(config, row, t)
        rec = RunRecord(sequence=len(records), unit=u, prompt_index=pi, temperature=t, seed=seed,
                        row=row.name, **result, budget_nodes=nodes, budget_depth=depth)
        records.append(rec)
        if on_run:
            on_run(rec)
    return records


def _budget_of(config: BenchConfig, row: RowSpec, t: float) -> tuple[int | None, int | None]:
    """A record's ``(budget_nodes, budget_depth)``: the budget of its temperature and its row's draft kind
    (speculative rows whose builder the budget maps onto)."""
    if row.kind != "speculative" or not row.budgeted:
        return None, None
    b = config.budget_at(t, row.draft)
    return b.nodes, b.depth


def _run_batched(
    models: BenchModels,
    config: BenchConfig,
    prompts: Sequence[Sequence[int]],
    gens: Mapping[tuple[str, float], Any],
    eos: Any,
    on_run: Callable[[RunRecord], None] | None,
    on_start: Callable[[str], None] | None,
    skip: Collection[tuple[str, int, float, int]] = frozenset(),
    units: Collection[int] | None = None,
) -> list[RunRecord]:
    """:func:`run_bench` with ``batch_size`` > 1: each chunk of prompts is decoded
    together by every row (rows rotated per chunk). One :class:`RunRecord` per
    prompt: its tokens, its own steps and emitted tokens, and an equal share of
    the batched call's time (so that summed times give the batch's throughput;
    the time split is not recorded; the per-depth counts are the prompt's own). Every row of
    a chunk uses the unit's seed, so a prompt's tokens are those of its
    batch-1 run (at T = 0 token for token). A :class:`BenchConfig` refuses ``optimum`` with
    ``batch_size`` > 1: a batched call measures no optimum, so there would be no gap."""
    for row in config.rows:
        why = batch_refusal(row)
        if why is not None:
            raise InvalidConfigError(f"--batch-size {config.batch_size}: {why}")
    unit_of = {u: i for i, u in enumerate(bench_units(len(prompts), config.temperatures, config.seeds))}

    def call(row: RowSpec, chunk: Sequence[int], t: float, seed: int, n: int) -> Any:
        sampling = SamplingConfig(temperature=t)
        batch = [prompts[i] for i in chunk]
        seeds = [seed] * len(batch)
        if row.kind == "autoregressive":
            return autoregressive_generate_batch(models.target, batch, n, sampling, seeds, eos)
        return gens[(row.name, t)].generate_batch(batch, n, sampling, seeds, eos)

    chunks = batch_chunks(len(prompts), config.temperatures, config.seeds, config.batch_size)
    # a (chunk, row) call runs again unless every prompt of it is done; only its missing records are kept
    plan = [(c, row) for c, (chunk, t, seed) in enumerate(chunks) if units is None or c in units
            for row in unit_order(config.rows, c) if any(run_key(row.name, pi, t, seed) not in skip for pi in chunk)]
    if config.warmup and plan:
        if on_start:
            on_start("warm-up")
        first = tuple(range(min(config.batch_size, len(prompts))))
        for row in config.rows:
            call(row, first, config.temperatures[-1], config.seeds[0], min(8, config.max_new_tokens))
    records: list[RunRecord] = []
    nan = float("nan")
    for c, row in plan:
        chunk, t, seed = chunks[c]
        if on_start:
            on_start(f"{row.name} T={t:g} prompts {chunk[0] + 1}-{chunk[-1] + 1}/{len(prompts)}")
        out = call(row, chunk, t, seed, config.max_new_tokens)
        nodes, depth = _budget_of(config, row, t)
        for j, pi in enumerate(chunk):
            if run_key(row.name, pi, t, seed) in skip:
                continue
            attempted, accepted, drafted = _depth_counts(out, j)
            rec = RunRecord(
                sequence=len(records), unit=unit_of[(pi, t, seed)], prompt_index=pi, temperature=t, seed=seed,
                row=row.name, new_tokens=len(out.tokens[j]), steps=out.steps_by_row[j],
                emitted=out.emitted_by_row[j], depth_attempted=attempted, depth_accepted=accepted,
                time_total=out.time_total / len(chunk), time_prefill=nan, time_draft=nan, time_target=nan,
                time_verify=nan, tokens=tuple(out.tokens[j]), budget_nodes=nodes, budget_depth=depth,
                depth_drafted=drafted,
            )
            records.append(rec)
            if on_run:
                on_run(rec)
    return records


def _depth_counts(out: Any, j: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Row ``j``'s ``(depth_attempted, depth_accepted, depth_drafted)`` of a batched call (its
    ``acceptance_by_row``; none: empty), each as long as a one-row record's (attempted and accepted to
    the deepest tested depth, drafted to the deepest drafted one)."""
    rows = getattr(out, "acceptance_by_row", ())
    if j >= len(rows):
        return (), (), ()
    c = rows[j]
    tested = sum(1 for n in c.attempted if n)
    drafted = sum(1 for n in c.drafted if n)
    return c.attempted[:tested], c.accepted[:tested], c.drafted[:drafted]


def _stderr(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _gap(rs: Sequence[RunRecord], att: Sequence[int], acc: Sequence[int]) -> dict[str, Any]:
    """The gap-to-optimum keys of a (row, temperature) record: all None unless some record
    measured the optimum (``--optimum``). Per depth, ``optimum_by_depth`` = summed optimum /
    tested nodes and ``gap_by_depth`` = ``optimum_by_depth - acceptance_by_depth``; ``gap`` =
    (summed optimum - accepted) / tested nodes over all depths; ``optimum_bound``: some summed
    value was an upper bound (then so are the optimum and the gap)."""
    if not any(r.depth_optimum for r in rs):
        return {"optimum_by_depth": None, "gap_by_depth": None, "gap": None, "optimum_bound": None}
    opt = [sum(r.depth_optimum[d] for r in rs if d < len(r.depth_optimum)) for d in range(len(att))]
    by_depth = [o / n if n else 0.0 for o, n in zip(opt, att)]
    accepted = [a / n if n else 0.0 for a, n in zip(acc, att)]
    tested = sum(att)
    return {
        "optimum_by_depth": by_depth,
        "gap_by_depth": [o - a for o, a in zip(by_depth, accepted)],
        "gap": (sum(opt) - sum(acc)) / tested if tested else 0.0,
        "optimum_bound": any(r.optimum_bound for r in rs),
    }


def aggregate(
    runs: Sequence[RunRecord],
    rows: Sequence[RowSpec],
    temperatures: Sequence[float],
    *,
    budget: BudgetPlan | None = None,
    options: Mapping[tuple[str, float], Mapping[str, Any]] | None = None,
    descriptions: Mapping[str, str] | None = None,
    batch_size: int = 1,
) -> list[dict[str, Any]]:
    """One result record per (row, temperature) (the ``results.json`` schema, docs/bench.md).

    ``budget`` is one budget, one per temperature, or one per temperature and draft kind
    (``budget_nodes`` and ``budget_depth`` of a record are those of its temperature and its row's
    draft kind: :func:`~specdec.bench.budget.budget_at`); without it,
    the records' own ``budget_nodes`` / ``budget_depth`` are used where they
    carry them.

    Example:
        >>> rows = [RowSpec("autoregressive", "autoregressive"), RowSpec("sd", "speculative", "sd", "lm")]
        >>> mk = lambda seq, row, n, steps, t: RunRecord(seq, 0, 0, 0.0, 0, row, n, steps, n, (), (), t,
        ...                                             0.0, 0.0, 0.0, 0.0, tuple(range(n)))
        >>> recs = aggregate([mk(0, "autoregressive", 8, 8, 2.0), mk(1, "sd", 8, 4, 1.0)], rows, [0.0])
        >>> [(r["method"], r["tau"], r["speedup"], r["matches_autoregressive"]) for r in recs]
        [('autoregressive', 1.0, 1.0, 1.0), ('sd', 2.0, 2.0, 1.0)]
    """
    by: dict[tuple[str, float], list[RunRecord]] = {}
    # in unit order, whatever order the records came in (Ray workers finish in any order): the
    # float sums (time totals, the standard error) then have the bits of a one-process run's
    for r in sorted(runs, key=lambda r: (r.unit, r.prompt_index, r.seed, r.row)):
        by.setdefault((r.row, r.temperature), []).append(r)
    ar_tokens = {(r.unit): r.tokens for r in runs if r.row == AUTOREGRESSIVE}
    out: list[dict[str, Any]] = []
    base_rate: dict[float, float] = {}
    for t in temperatures:
        base = by.get((AUTOREGRESSIVE, t), [])
        total = sum(r.time_total for r in base)
        base_rate[t] = sum(r.new_tokens for r in base) / total if total > 0 else float("nan")
    for row in rows:
        for t in temperatures:
            rs = by.get((row.name, t), [])
            if not rs:
                continue
            new = sum(r.new_tokens for r in rs)
            steps = sum(r.steps for r in rs)
            emitted = sum(r.emitted for r in rs)
            total = sum(r.time_total for r in rs)
            depth = max((len(r.depth_attempted) for r in rs), default=0)
            att = [sum(r.depth_attempted[d] for r in rs if d < len(r.depth_attempted)) for d in range(depth)]
            acc = [sum(r.depth_accepted[d] for r in rs if d < len(r.depth_accepted)) for d in range(depth)]
            positions = max((len(r.depth_drafted) for r in rs), default=0)
            drafted = [sum(r.depth_drafted[d] for r in rs if d < len(r.depth_drafted)) for d in range(positions)]
            accepted = [sum(r.depth_accepted[d] for r in rs if d < len(r.depth_accepted)) for d in range(positions)]
            rate = new / total if total > 0 else float("nan")
            gap = _gap(rs, att, acc)

            def tsum(name: str) -> float | None:
                vals = [getattr(r, name) for r in rs]
                return None if any(math.isnan(v) for v in vals) else sum(vals)

            matches = None
            if t == 0 and ar_tokens:
                pairs = [(r.tokens, ar_tokens.get(r.unit)) for r in rs]
                pairs = [(a, b) for a, b in pairs if b is not None]
                matches = sum(a == b for a, b in pairs) / len(pairs) if pairs else None
            nodes = depth_bound = None
            if row.kind == "speculative" and row.budgeted:
                if budget is not None:
                    b = budget_at(budget, t, row.draft)
                    nodes, depth_bound = b.nodes, b.depth
                else:
                    logged = {(r.budget_nodes, r.budget_depth) for r in rs if r.budget_nodes is not None}
                    if len(logged) == 1:
                        nodes, depth_bound = next(iter(logged))
            rec: dict[str, Any] = {
                "method": row.name,
                "base_method": row.method if row.kind == "speculative" else row.name,
                "kind": row.kind,
                "draft": row.draft,
                "draft_description": (descriptions or {}).get(row.draft or "", None),
                "note": row.note or None,
                "temperature": t,
                "runs": len(rs),
                "new_tokens": new,
                "target_forwards": steps,
                "tau": emitted / steps if steps else float("nan"),
                "tau_stderr": _stderr([r.emitted / r.steps for r in rs if r.steps]),
                "tokens_per_s": rate,
                "speedup": rate / base_rate[t] if base_rate.get(t) and base_rate[t] == base_rate[t] else float("nan"),
                "acceptance_by_depth": [a / n if n else 0.0 for a, n in zip(acc, att)],
                # per position (vLLM's per-position rate): accepted / drafted at depth d; None: no record counted it
                "acceptance_by_position": ([a / n if n else 0.0 for a, n in zip(accepted, drafted)]
                                           if any(r.depth_drafted for r in rs) else None),
                "drafted_by_depth": drafted if any(r.depth_drafted for r in rs) else None,
                "time_total": total,
                "time_prefill": tsum("time_prefill"),
                "time_draft": tsum("time_draft"),
                "time_target": tsum("time_target"),
                "time_verify": tsum("time_verify"),
                "matches_autoregressive": matches,
                "batch_size": batch_size,
                "budget_nodes": nodes,
                "budget_depth": depth_bound,
                "options": (jsonable(dict((options or {}).get((row.name, t), {})))
                            if row.kind == "speculative" else None),
                **gap,
            }
            out.append(rec)
    return out


