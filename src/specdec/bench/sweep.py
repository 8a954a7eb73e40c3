"""What a ``specdec bench`` sweep runs, and what one generation of it records.

A sweep runs every row (:mod:`specdec.bench.rows`) on every *unit*, one
``(prompt, temperature, seed)`` (:func:`bench_units`; at temperature 0 only the
first seed runs: greedy decoding ignores it), or with ``--batch-size`` > 1 on
every chunk of prompts (:func:`batch_chunks`). Inside a unit the rows run in
the order :func:`unit_order` gives, rotated by one position from unit to unit
(the interleaving of :mod:`specdec.bench.runner`).

:class:`BenchConfig` holds the sweep's settings (rows, temperatures, seeds,
tokens, the tree budget per temperature and draft kind); :func:`row_options` maps them onto
every speculative row's builder options; each generate call yields one
:class:`RunRecord` (a line of ``runs.jsonl``, :mod:`specdec.bench.runlog`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from specdec.bench.budget import Budget, budget_at, method_options, method_tree
from specdec.bench.rows import RowSpec
from specdec.errors import InvalidConfigError
from specdec.methods import resolve_method
from specdec.trees.rheo import policy_options

__all__ = [
    "BenchConfig",
    "RunRecord",
    "bench_units",
    "batch_chunks",
    "unit_order",
    "row_options",
    "OPTIMUM_NOTE",
    "OPTIMUM_BATCH_REFUSAL",
]

OPTIMUM_NOTE = ("--optimum: the speculative rows measure the best lossless acceptance at every tested node, "
                "host work done inside each step: their times, tokens/s and speedups include it and are not "
                "comparable with a run without --optimum (tau, acceptance and the gap are unaffected)")
"""What the log, the report and ``meta.json`` say of a run with ``--optimum``."""

OPTIMUM_BATCH_REFUSAL = ("--optimum with --batch-size > 1: a batched call measures no optimum, so there "
                         "is no gap to report; measure the gap with --batch-size 1")
"""The error of ``--optimum`` with ``--batch-size`` > 1."""


def _rows_field(value: Iterable[RowSpec]) -> tuple[RowSpec, ...]:
    return tuple(value)


def _floats_field(value: Iterable[float]) -> tuple[float, ...]:
    return tuple(value)


def _ints_field(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _budget_field(value: Any) -> Budget | dict[float, Budget | dict[str, Budget]]:
    if isinstance(value, Budget):
        return value
    if isinstance(value, Mapping) and value:
        out: dict[float, Budget | dict[str, Budget]] = {}
        for t, b in value.items():
            if isinstance(b, Budget):
                out[float(t)] = b
            elif isinstance(b, Mapping) and b and all(isinstance(k, str) and isinstance(x, Budget)
                                                      for k, x in b.items()):
                out[float(t)] = dict(b)
            else:
                break
        else:
            return out
    raise InvalidConfigError(f"budget must be a Budget or a non-empty mapping temperature -> Budget (or -> "
                             f"{{draft kind: Budget}}), got {value!r}")


def _slots_field(value: Any) -> dict[float, int]:
    out = {}
    for t, m in dict(value or {}).items():
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidConfigError(f"sampled_slots: m must be an int >= 1, got {m!r} at T={t}")
        out[float(t)] = m
    return out


@attrs.frozen
class BenchConfig:
    """What to run.

    Attributes:
        rows: the rows (:func:`~specdec.bench.rows.parse_rows`).
        temperatures: sampling temperatures (``SamplingConfig(temperature=T)``,
            no top-k / top-p).
        seeds: seeds of the sampled runs (only the first one at T = 0).
        max_new_tokens: tokens per generation.
        budget: the tree budget of every speculative row: one :class:`Budget`
            for every temperature (``--budget N``), one per temperature
            (``{T: Budget}``: logs of ``--budget auto`` before it chose per draft kind), or one per
            temperature and draft kind (``{T: {kind: Budget}}``, ``--budget auto``); every temperature
            needs one, and every draft kind of a budgeted row one at every temperature.
        ignore_eos: generate ``max_new_tokens`` even past EOS.
        warmup: run every row once (8 tokens, last temperature), untimed, before measuring.
        batch_size: prompts decoded together (``generate_batch`` and the batched
            autoregressive baseline at the same size); 1 = one prompt per call.
        sampled_slots: RheoSampling's ``m`` per temperature (``--budget auto``'s
            choice), given to the rows whose builder is ``rheo`` and that do not
            set ``m`` themselves (:func:`row_options`); empty: the builder's default.
        optimum: the speculative rows measure, per step, the best lossless acceptance at
            every node their path tested (``StepOptions(optimum=True)``, ``--optimum``;
            :attr:`RunRecord.depth_optimum`). Host work per step, inside the timings: the
            speedups of such a run are not comparable with those of a plain one. Refused
            with ``batch_size`` > 1 (a batched call measures no optimum).
    """

    rows: tuple[RowSpec, ...] = attrs.field(converter=_rows_field)
    temperatures: tuple[float, ...] = attrs.field(converter=_floats_field)
    seeds: tuple[int, ...] = attrs.field(converter=_ints_field)
    max_new_tokens: int
    budget: Budget | dict[float, Budget | dict[str, Budget]] = attrs.field(converter=_budget_field)
    ignore_eos: bool = False
    warmup: bool = True
    batch_size: int = 1
    sampled_slots: dict[float, int] = attrs.field(factory=dict, converter=_slots_field)
    optimum: bool = False

    def __attrs_post_init__(self) -> None:
        if self.optimum and self.batch_size > 1:
            raise InvalidConfigError(OPTIMUM_BATCH_REFUSAL)
        if isinstance(self.budget, dict):
            missing = [t for t in self.temperatures if float(t) not in self.budget]
            if missing:
                raise InvalidConfigError(f"no tree budget for T={', '.join(f'{t:g}' for t in missing)} "
                                         f"(budgets for {', '.join(f'T={t:g}' for t in sorted(self.budget))})")
            for row in self.rows:  # a per-kind budget names every draft kind of a budgeted row
                if row.kind == "speculative" and row.budgeted:
                    for t in self.temperatures:
                        self.budget_at(t, row.draft)

    def budget_at(self, temperature: float, kind: str | None = None) -> Budget:
        """The tree budget at ``temperature`` of the speculative rows of draft ``kind`` (the kind matters only
        where the budget is chosen per draft kind: :func:`~specdec.bench.budget.budget_at`)."""
        return budget_at(self.budget, temperature, kind)


@attrs.frozen
class RunRecord:
    """One generate call.

    Attributes:
        sequence: position in the run order (0, 1, ...).
        unit: index of the ``(prompt, temperature, seed)`` unit.
        prompt_index, temperature, seed, row: what ran.
        new_tokens, steps, emitted: tokens returned, target forwards, tokens
            emitted by the verifier (for the peer: its target forwards, prefill
            included, and its new tokens).
        depth_attempted, depth_accepted: per depth, as in :class:`~specdec.GenerationStats`.
        time_total, time_prefill, time_draft, time_target, time_verify: seconds
            (the peer reports only ``time_total``; the others are NaN).
        tokens: the new tokens.
        budget_nodes, budget_depth: the tree budget of the unit's temperature
            (speculative rows; None for the baseline, the peer, and records
            logged before the budget was recorded per generation).
        depth_optimum: per depth, the best lossless acceptance at the tested nodes,
            summed over the steps (:attr:`~specdec.GenerationStats.depth_optimum`; same
            indexing as ``depth_attempted``); empty unless the sweep ran with ``--optimum``.
        optimum_bound: some value summed in ``depth_optimum`` is an upper bound, not the optimum.
        depth_drafted: per depth, the steps whose tree had a node there
            (:attr:`~specdec.GenerationStats.depth_drafted`); empty for the peer and for records
            logged before it was recorded.
    """

    sequence: int
    unit: int
    prompt_index: int
    temperature: float
    seed: int
    row: str
    new_tokens: int
    steps: int
    emitted: int
    depth_attempted: tuple[int, ...]
    depth_accepted: tuple[int, ...]
    time_total: float
    time_prefill: float
    time_draft: float
    time_target: float
    time_verify: float
    tokens: tuple[int, ...]
    budget_nodes: int | None = None
    budget_depth: int | None = None
    depth_optimum: tuple[float, ...] = ()
    optimum_bound: bool = False
    depth_drafted: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["depth_drafted"] = list(self.depth_drafted)
        out["depth_attempted"] = list(self.depth_attempted)
        out["depth_accepted"] = list(self.depth_accepted)
        out["depth_optimum"] = list(self.depth_optimum)
        out["tokens"] = list(self.tokens)
        return out


def bench_units(num_prompts: int, temperatures: Sequence[float], seeds: Sequence[int]) -> list[tuple[int, float, int]]:
    """The ``(prompt index, temperature, seed)`` units, in run order.

    Example:
        >>> bench_units(2, [0.0, 1.0], [5, 6])
        [(0, 0.0, 5), (0, 1.0, 5), (0, 1.0, 6), (1, 0.0, 5), (1, 1.0, 5), (1, 1.0, 6)]
    """
    out = []
    for p in range(num_prompts):
        for t in temperatures:
            for s in (seeds[:1] if t == 0 else seeds):
                out.append((p, float(t), int(s)))
    return out


def unit_order(rows: Sequence[RowSpec], unit: int) -> list[RowSpec]:
    """The rows of unit ``unit``: all of them, rotated left by ``unit`` positions.

    Example:
        >>> rs = [RowSpec(n, "speculative") for n in "abc"]
        >>> [r.name for r in unit_order(rs, 4)]
        ['b', 'c', 'a']
    """
    k = unit % len(rows)
    return list(rows[k:]) + list(rows[:k])


def batch_chunks(num_prompts: int, temperatures: Sequence[float], seeds: Sequence[int], batch_size: int
                 ) -> list[tuple[tuple[int, ...], float, int]]:
    """The batched runs' units: ``(prompt indices, temperature, seed)``, in run order.

    Example:
        >>> batch_chunks(3, [0.0, 1.0], [5, 6], 2)
        [((0, 1), 0.0, 5), ((0, 1), 1.0, 5), ((0, 1), 1.0, 6), ((2,), 0.0, 5), ((2,), 1.0, 5), ((2,), 1.0, 6)]
    """
    out = []
    for start in range(0, num_prompts, batch_size):
        chunk = tuple(range(start, min(start + batch_size, num_prompts)))
        for t in temperatures:
            for s in (seeds[:1] if t == 0 else seeds):
                out.append((chunk, float(t), int(s)))
    return out


def row_options(
    config: BenchConfig,
    acceptance: Mapping[tuple[str, float], Sequence[float]] | None = None,
    calibration: Mapping[tuple[str, float], Any] | None = None,
) -> dict[tuple[str, float], dict[str, Any]]:
    """Builder options per (speculative row, temperature): the mapping of the
    budget of the temperature and the row's draft kind (:func:`~specdec.bench.budget.method_options`), with
    Sequoia's acceptance profile for the row's draft and temperature when
    ``acceptance`` has it, and, for rows whose builder is ``rheo``, the sampled
    slots ``m`` that ``config.sampled_slots`` gives the temperature (lowered to
    ``K - 1`` where a row's own ``K`` leaves no room for it); the row's own
    options override all of it key by key (a row's own ``m`` that the
    budget's ``K`` has no room for raises ``K`` to ``m + 1``, as rheo keeps a deterministic slot; ``N``
    and ``d`` stay; a row whose own ``K`` has no room for the budget's ``m`` gets ``m = K - 1``).
    A row whose builder has no budget mapping (:attr:`RowSpec.budgeted
    <specdec.bench.rows.RowSpec.budgeted>` False) gets its method's defaults and its own options.
    The default policy's options at ``T`` (:func:`specdec.trees.rheo.policy_options`: ``M = 8192`` for
    ``sampled-dynamic`` at ``T = 0.6``) are written out where the row does not set them, so that the log
    records the tree that ran.
    ``calibration`` maps ``(row name, T)`` to the table of a rheo row with ``proxy=calibrated``
    (:func:`~specdec.tune.profile_calibration`), given to it as ``calibration``.

    Example:
        >>> from specdec.bench.rows import parse_rows
        >>> rows = parse_rows("rheo,rheo[m=1]@lm,sd", ["lm"], add_baseline=False)
        >>> config = BenchConfig(rows, (0.0, 1.0), (0,), 8, {0.0: Budget(8, 4), 1.0: Budget(12, 3)},
        ...                      sampled_slots={0.0: 1, 1.0: 3})
        >>> options = row_options(config)
        >>> options[("rheo", 0.0)], options[("rheo", 1.0)]
        ({'N': 8, 'depth': 4, 'K': 2, 'B': 2, 'm': 1}, {'N': 12, 'depth': 3, 'K': 4, 'B': 4, 'm': 3})
        >>> options[("rheo[m=1]@lm", 1.0)]["m"], options[("sd", 1.0)]
        (1, {'depth': 3})
        >>> row_options(attrs.evolve(config, rows=parse_rows("rheo[m=3]@lm", ["lm"], add_baseline=False)))[
        ...     ("rheo[m=3]@lm", 0.0)]
        {'N': 8, 'depth': 4, 'K': 4, 'B': 2, 'm': 3}
    """
    out = {}
    for row in config.rows:
        if row.kind != "speculative":
            continue
        method, draft = row.method_and_draft()
        own = dict(row.options)
        rheo = method_tree(method) == "rheo"
        for t in config.temperatures:
            if not row.budgeted:  # a builder without a budget mapping: the method's options (RowSpec.note)
                out[(row.name, t)] = {**resolve_method(method).defaults, **own}
                continue
            a = (acceptance or {}).get((draft, t))
            opts = {**method_options(method, config.budget_at(t, draft), acceptance=a), **own}
            m = config.sampled_slots.get(float(t))
            if m is not None and "m" not in own and rheo:
                k = opts.get("K")
                opts["m"] = max(1, min(m, int(k) - 1)) if isinstance(k, int) else m  # rheo keeps a deterministic slot
            elif rheo and isinstance(own.get("m"), int) and "K" not in own and isinstance(opts.get("K"), int) \
                    and own["m"] >= opts["K"]:
                opts["K"] = own["m"] + 1  # the row's m needs m < K: widen the nodes' children (N and d stay)
            for key, value in policy_options(method_tree(method), t).items():  # the default policy, written out
                opts.setdefault(key, value)
            table = (calibration or {}).get((row.name, float(t)))
            if table is not None and "calibration" not in own:
                opts["calibration"] = table
            out[(row.name, t)] = opts
    return out

