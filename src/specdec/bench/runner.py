"""The benchmark loop: every method side by side with the autoregressive baseline.

Words: a *row* is one line of the result table: the autoregressive baseline,
a registered method with a draft kind (``"rheo"`` with the EAGLE-3 head,
``"rheo@eagle2"``...), or the transformers peer (``"hf-assisted"``). A *unit*
is one ``(prompt, temperature, seed)``; at temperature 0 only the first seed
runs (greedy decoding ignores it).

Interleaving: the runner visits the units one by one and, inside a unit, runs
every row once, the baseline included, on the same prompt, temperature and
seed, rotating the order of the rows by one position from unit to unit
(:func:`unit_order`). So every row sees the same machine conditions (other
processes, thermal state) and speedups are ratios of rows measured side by
side, never against a baseline measured at another time.

Metrics per row and temperature (:func:`aggregate`), summed over units:

- ``tau``: tokens emitted per target forward (accepted drafts + 1 bonus),
  ``emitted / steps``; the baseline's is 1;
- ``tokens_per_s``: new tokens / wall time of the generate calls (prefill
  included);
- ``speedup``: ``tokens_per_s`` / the baseline's ``tokens_per_s`` at the same
  temperature;
- ``acceptance_by_depth[d-1]``: accepted drafts at depth ``d`` / steps in
  which a draft at depth ``d`` was tested;
- time split: seconds in drafting (tree building and draft commits), target
  tree forwards, verification (logit processing included), prefill.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs
import torch

from specdec.bench.budget import Budget, budget_at, method_options, method_tree, supports_budget
from specdec.bench.models import BenchModels
from specdec.bench.runlog import run_key
from specdec.errors import InvalidConfigError, UnknownNameError
from specdec.registry import get
from specdec.sampling import SamplingConfig

__all__ = [
    "AUTOREGRESSIVE",
    "PEER",
    "DEFAULT_DRAFT",
    "RowSpec",
    "RunRecord",
    "BenchConfig",
    "parse_rows",
    "unit_order",
    "bench_units",
    "run_bench",
    "aggregate",
    "hf_assisted_generate",
]

AUTOREGRESSIVE = "autoregressive"
"""Name of the baseline row (:func:`specdec.autoregressive_generate`)."""

PEER = "hf-assisted"
"""Name of the peer row: transformers' ``generate(assistant_model=...)``."""

DEFAULT_DRAFT: Mapping[str, str] = {"eagle2": "eagle2", "eagle3": "eagle3", "rheo": "eagle3"}
"""Draft kind of a method written without ``@draft``; other methods use ``"lm"``.
A head that is not available falls back to ``"lm"`` (the output says so)."""


@attrs.frozen
class RowSpec:
    """One row of the benchmark.

    Attributes:
        name: the row's label (unique): ``autoregressive``, ``hf-assisted``,
            a method name, or ``method@draft`` when the draft is not the default.
        kind: ``"autoregressive"``, ``"speculative"`` or ``"peer"``.
        method: registered method name (speculative rows).
        draft: draft kind (``"lm"``, ``"eagle2"``, ``"eagle3"``), None for the baseline.
        note: why the draft differs from the method's default, if it does.
        options: builder options written in the row (``rheo[m=2,proxy=residual]``),
            ``(name, value)`` pairs that override the budget's mapping
            (:func:`row_options`); empty for the method's defaults.
    """

    name: str
    kind: str
    method: str | None = None
    draft: str | None = None
    note: str = ""
    options: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=lambda o: tuple(tuple(x) for x in o))


def _split_entries(text: str) -> list[str]:
    """``--methods`` split at the commas outside ``[...]``."""
    entries, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidConfigError(f"unbalanced ']' in --methods {text!r}")
        if ch == "," and depth == 0:
            entries.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth:
        raise InvalidConfigError(f"unclosed '[' in --methods {text!r}")
    entries.append("".join(current).strip())
    return [e for e in entries if e]


def _option_value(text: str) -> Any:
    """An option's value from its text: int, float, bool (``true``/``false``) or the string itself."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parse_options(method: str, text: str, entry: str) -> tuple[tuple[str, Any], ...]:
    """``k=v,k=v`` of ``method[...]`` checked against the method's tree builder's options."""
    from specdec.registry import get

    builder = get("tree", method_tree(method))
    known = sorted(f.name for f in attrs.fields(builder)) if attrs.has(builder) else []
    out: dict[str, Any] = {}
    for item in (i.strip() for i in text.split(",")):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value:
            raise InvalidConfigError(f"option {item!r} in {entry!r} is not name=value")
        if name not in known:
            raise InvalidConfigError(
                f"{entry!r}: the {method} tree builder has no option {name!r} (its options: {', '.join(known)})"
            )
        if name in out:
            raise InvalidConfigError(f"{entry!r} sets {name!r} twice")
        out[name] = _option_value(value)
    return tuple(out.items())


def parse_rows(text: str, available: Sequence[str], *, add_baseline: bool = True) -> list[RowSpec]:
    """Parse ``--methods a,b@draft,...`` into rows (the baseline first).

    Args:
        text: comma-separated entries: a registered method (its default draft,
            :data:`DEFAULT_DRAFT`), ``method@draft`` with a draft kind, or
            ``hf-assisted``. ``autoregressive`` is accepted and always present.
            A method may carry builder options, ``method[k=v,...]`` or
            ``method[k=v,...]@draft`` (ablations: ``rheo[m=2]``,
            ``rheo[proxy=residual,M=64]``); they override the budget's mapping.
        available: draft kinds that can be loaded (``"lm"`` always).
        add_baseline: put the autoregressive row first.

    Raises:
        InvalidConfigError / UnknownNameError: unknown method or draft kind,
            a method without a budget mapping, duplicates, empty list.

    Example:
        >>> [r.name for r in parse_rows("sd,rheo@lm,hf-assisted", ["lm"])]
        ['autoregressive', 'sd', 'rheo@lm', 'hf-assisted']
        >>> [(r.name, r.options) for r in parse_rows("rheo[m=2,proxy=residual]@lm", ["lm"], add_baseline=False)]
        [('rheo[m=2,proxy=residual]@lm', (('m', 2), ('proxy', 'residual')))]
    """
    from specdec.bench.models import DRAFT_KINDS
    from specdec.registry import list_registered

    entries = _split_entries(text)
    if not entries:
        raise InvalidConfigError("--methods is empty: give at least one method (see `specdec list method`)")
    rows: list[RowSpec] = [RowSpec(AUTOREGRESSIVE, "autoregressive")] if add_baseline else []
    seen: dict[tuple[Any, ...], str] = {}
    methods = list_registered("method")
    for entry in entries:
        if entry == AUTOREGRESSIVE:
            continue
        if entry == PEER:
            key: tuple[Any, ...] = (PEER,)
            row = RowSpec(PEER, "peer", draft="lm")
        else:
            spec, _, draft = entry.partition("@")
            method, bracket, rest = spec.partition("[")
            method = method.strip()
            if bracket and (not rest.endswith("]") or not rest[:-1].strip()):
                raise InvalidConfigError(f"{entry!r}: write builder options as method[name=value,...]")
            if method not in methods:
                glob = " (--methods takes method names, not glob patterns)" if any(c in entry for c in "*?[") else ""
                raise UnknownNameError(
                    f"unknown method {method!r} in --methods; known: {', '.join(methods)}, {PEER} "
                    f"(optionally method@draft with draft in {', '.join(DRAFT_KINDS)}){glob}"
                )
            if not supports_budget(method):
                raise InvalidConfigError(f"method {method!r} has no tree-budget mapping in specdec bench")
            options = _parse_options(method, rest[:-1], entry) if bracket else ()
            label = f"{method}[{rest[:-1].strip()}]" if bracket else method
            note = ""
            if draft:
                if draft not in DRAFT_KINDS:
                    raise InvalidConfigError(
                        f"unknown draft kind {draft!r} in {entry!r}; use one of: {', '.join(DRAFT_KINDS)}"
                    )
                if draft not in available:
                    raise InvalidConfigError(
                        f"{entry!r} asks for the {draft} draft, which is not available "
                        f"(no shipped {draft} head for this target; give --{draft}-head PATH)"
                    )
            else:
                draft = DEFAULT_DRAFT.get(method, "lm")
                if draft not in available:
                    note = f"{draft} head not available: runs with the draft LM"
                    draft = "lm"
            key = (method, draft, options)
            default = DEFAULT_DRAFT.get(method, "lm")
            name = label if draft == default or (note and not entry.count("@")) else f"{label}@{draft}"
            row = RowSpec(name, "speculative", method, draft, note, options)
        if key in seen:
            raise InvalidConfigError(f"--methods lists {entry!r} twice (same method and draft as {seen[key]!r})")
        seen[key] = entry
        rows.append(row)
    return rows


@attrs.frozen
class BenchConfig:
    """What to run.

    Attributes:
        rows: the rows (:func:`parse_rows`).
        temperatures: sampling temperatures (``SamplingConfig(temperature=T)``,
            no top-k / top-p).
        seeds: seeds of the sampled runs (only the first one at T = 0).
        max_new_tokens: tokens per generation.
        budget: the tree budget of every speculative row: one :class:`Budget`
            for every temperature (``--budget N``), or one per temperature
            (``{T: Budget}``, ``--budget auto``; every temperature needs one).
        ignore_eos: generate ``max_new_tokens`` even past EOS.
        warmup: run every row once (8 tokens, last temperature), untimed, before measuring.
        batch_size: prompts decoded together (``generate_batch`` and the batched
            autoregressive baseline at the same size); 1 = one prompt per call.
        sampled_slots: RheoSampling's ``m`` per temperature (``--budget auto``'s
            choice), given to the rows whose builder is ``rheo`` and that do not
            set ``m`` themselves (:func:`row_options`); empty: the builder's default.
    """

    rows: tuple[RowSpec, ...] = attrs.field(converter=tuple)
    temperatures: tuple[float, ...] = attrs.field(converter=tuple)
    seeds: tuple[int, ...] = attrs.field(converter=tuple)
    max_new_tokens: int
    budget: Budget | dict[float, Budget] = attrs.field(converter=lambda b: _budget_field(b))
    ignore_eos: bool = False
    warmup: bool = True
    batch_size: int = 1
    sampled_slots: dict[float, int] = attrs.field(factory=dict, converter=lambda s: _slots_field(s))

    def __attrs_post_init__(self) -> None:
        if isinstance(self.budget, dict):
            missing = [t for t in self.temperatures if float(t) not in self.budget]
            if missing:
                raise InvalidConfigError(f"no tree budget for T={', '.join(f'{t:g}' for t in missing)} "
                                         f"(budgets for {', '.join(f'T={t:g}' for t in sorted(self.budget))})")

    def budget_at(self, temperature: float) -> Budget:
        """The tree budget of the speculative rows at ``temperature``."""
        return budget_at(self.budget, temperature)


def _budget_field(value: Any) -> Budget | dict[float, Budget]:
    if isinstance(value, Budget):
        return value
    if isinstance(value, Mapping) and value and all(isinstance(b, Budget) for b in value.values()):
        return {float(t): b for t, b in value.items()}
    raise InvalidConfigError(f"budget must be a Budget or a non-empty mapping temperature -> Budget, got {value!r}")


def _slots_field(value: Any) -> dict[float, int]:
    out = {}
    for t, m in dict(value or {}).items():
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidConfigError(f"sampled_slots: m must be an int >= 1, got {m!r} at T={t}")
        out[float(t)] = m
    return out


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

    def as_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["depth_attempted"] = list(self.depth_attempted)
        out["depth_accepted"] = list(self.depth_accepted)
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
    import copy

    import transformers

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
    """One :class:`~specdec.SpeculativeGenerator` per (speculative row, temperature)."""
    from specdec.generate import SpeculativeGenerator

    gens = {}
    for row in config.rows:
        if row.kind != "speculative":
            continue
        for t in config.temperatures:
            gens[(row.name, t)] = SpeculativeGenerator(
                target=models.targets[row.draft], draft=models.drafts[row.draft], method=row.method,
                **dict(options[(row.name, t)]),
            )
    return gens


def row_options(
    config: BenchConfig,
    acceptance: Mapping[tuple[str, float], Sequence[float]] | None = None,
    calibration: Mapping[tuple[str, float], Any] | None = None,
) -> dict[tuple[str, float], dict[str, Any]]:
    """Builder options per (speculative row, temperature): the mapping of the
    temperature's budget (:func:`~specdec.bench.budget.method_options`), with
    Sequoia's acceptance profile for the row's draft and temperature when
    ``acceptance`` has it, and, for rows whose builder is ``rheo``, the sampled
    slots ``m`` that ``config.sampled_slots`` gives the temperature (lowered to
    ``K - 1`` where a row's own ``K`` leaves no room for it); the row's own
    options override all of it key by key (a row's own ``m`` that the
    budget's ``K`` has no room for raises ``K`` to ``m``; ``N`` and ``d`` stay).
    ``calibration`` maps ``(row name, T)`` to the table of a rheo row with ``proxy=calibrated``
    (:func:`~specdec.trees.rheo.profile_calibration`), given to it as ``calibration``.

    Example:
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
        {'N': 8, 'depth': 4, 'K': 3, 'B': 2, 'm': 3}
    """
    out = {}
    for row in config.rows:
        if row.kind != "speculative":
            continue
        own = dict(row.options)
        for t in config.temperatures:
            a = (acceptance or {}).get((row.draft, t))
            opts = {**method_options(row.method, config.budget_at(t), acceptance=a), **own}
            rheo = method_tree(row.method) == "rheo"  # type: ignore[arg-type]
            m = config.sampled_slots.get(float(t))
            if m is not None and "m" not in own and rheo:
                k = opts.get("K")
                opts["m"] = max(1, min(m, int(k))) if isinstance(k, int) else m
            elif rheo and isinstance(own.get("m"), int) and "K" not in own and isinstance(opts.get("K"), int) \
                    and own["m"] > opts["K"]:
                opts["K"] = own["m"]  # the row's m needs m <= K: widen the nodes' children (N and d stay)
            table = (calibration or {}).get((row.name, float(t)))
            if table is not None and "calibration" not in own:
                opts["calibration"] = table
            out[(row.name, t)] = opts
    return out


def batch_refusal(row: RowSpec) -> str | None:
    """Why ``row`` cannot run with ``--batch-size`` > 1 (None when it can): batched
    speculative generation needs a builder that grows batches (level-wise or shaped:
    every built-in one) and a draft with a rows mode (the EAGLE heads, the draft LM)."""
    from specdec.trees.dynamic import DynamicTreeBuilder
    from specdec.trees.static import ShapedTreeBuilder

    if row.kind == "autoregressive":
        return None
    if row.kind == "peer":
        return f"{row.name}: transformers' assisted generation decodes one sequence at a time"
    cls = get("tree", method_tree(row.method))  # type: ignore[arg-type]
    levelwise = isinstance(cls, type) and issubclass(cls, DynamicTreeBuilder) and next(
        c for c in cls.__mro__ if "level_fn" in c.__dict__
    ) is not DynamicTreeBuilder
    shaped = isinstance(cls, type) and issubclass(cls, ShapedTreeBuilder)
    if not (levelwise or shaped):
        return f"{row.name}: its tree builder ({method_tree(row.method)}) does not grow batches of trees yet"  # type: ignore[arg-type]
    if row.draft not in ("eagle2", "eagle3", "lm", "ngram"):
        return f"{row.name}: the {row.draft} draft has no rows mode yet (the EAGLE heads, the draft LM and ngram have)"
    return None


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
    from specdec.generate import autoregressive_generate

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
                    time_target=s.time_target, time_verify=s.time_verify, tokens=tuple(out.tokens))

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
        rec = RunRecord(sequence=len(records), unit=u, prompt_index=pi, temperature=t, seed=seed,
                        row=row.name, **result, **_budget_of(config, row, t))
        records.append(rec)
        if on_run:
            on_run(rec)
    return records


def _budget_of(config: BenchConfig, row: RowSpec, t: float) -> dict[str, int | None]:
    """A record's ``budget_nodes`` / ``budget_depth``: the budget of its temperature (speculative rows)."""
    if row.kind != "speculative":
        return {"budget_nodes": None, "budget_depth": None}
    b = config.budget_at(t)
    return {"budget_nodes": b.nodes, "budget_depth": b.depth}


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
    the time split and the acceptance by depth are not recorded). Every row of
    a chunk uses the unit's seed, so a prompt's tokens are those of its
    batch-1 run (at T = 0 token for token)."""
    from specdec.batch import autoregressive_generate_batch

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
        for j, pi in enumerate(chunk):
            if run_key(row.name, pi, t, seed) in skip:
                continue
            rec = RunRecord(
                sequence=len(records), unit=unit_of[(pi, t, seed)], prompt_index=pi, temperature=t, seed=seed,
                row=row.name, new_tokens=len(out.tokens[j]), steps=out.steps_by_row[j],
                emitted=out.emitted_by_row[j], depth_attempted=(), depth_accepted=(),
                time_total=out.time_total / len(chunk), time_prefill=nan, time_draft=nan, time_target=nan,
                time_verify=nan, tokens=tuple(out.tokens[j]), **_budget_of(config, row, t),
            )
            records.append(rec)
            if on_run:
                on_run(rec)
    return records


def _stderr(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def aggregate(
    runs: Sequence[RunRecord],
    rows: Sequence[RowSpec],
    temperatures: Sequence[float],
    *,
    budget: Budget | Mapping[float, Budget] | None = None,
    options: Mapping[tuple[str, float], Mapping[str, Any]] | None = None,
    descriptions: Mapping[str, str] | None = None,
    batch_size: int = 1,
) -> list[dict[str, Any]]:
    """One result record per (row, temperature) (the ``results.json`` schema, docs/bench.md).

    ``budget`` is one budget or one per temperature (``budget_nodes`` and
    ``budget_depth`` of a record are those of its temperature); without it,
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
            rate = new / total if total > 0 else float("nan")

            def tsum(name: str) -> float | None:
                vals = [getattr(r, name) for r in rs]
                return None if any(math.isnan(v) for v in vals) else sum(vals)

            matches = None
            if t == 0 and ar_tokens:
                pairs = [(r.tokens, ar_tokens.get(r.unit)) for r in rs]
                pairs = [(a, b) for a, b in pairs if b is not None]
                matches = sum(a == b for a, b in pairs) / len(pairs) if pairs else None
            nodes = depth_bound = None
            if row.kind == "speculative":
                if budget is not None:
                    b = budget_at(budget, t)
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
                "time_total": total,
                "time_prefill": tsum("time_prefill"),
                "time_draft": tsum("time_draft"),
                "time_target": tsum("time_target"),
                "time_verify": tsum("time_verify"),
                "matches_autoregressive": matches,
                "batch_size": batch_size,
                "budget_nodes": nodes,
                "budget_depth": depth_bound,
                "options": _jsonable(dict((options or {}).get((row.name, t), {}))) if row.kind == "speculative" else None,
            }
            out.append(rec)
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)
