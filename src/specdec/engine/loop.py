"""The one generation loop: ``B`` rows around :func:`~specdec.engine.step.step_rows`.

Every way of generating runs :func:`decode_rows` (the record form: the roles, a
:class:`RowsRequest`; :func:`run_rows` is its compatibility form): ``SpeculativeGenerator.generate`` and
``stream`` (one row), ``generate_batch`` / ``stream_batch`` and the batched baseline (``B``
rows), plain autoregressive decoding (a root-only tree), the profiles behind Sequoia's
acceptance, Rheo's calibration and the bench's budget search (:func:`profile_steps`).
Here, and only here: the checks before any forward, the one verification dispatch
(:func:`~specdec.engine.dispatch.choose_verification`), prefill, EOS and length
handling, the per-row accounting, log-probabilities, committing, and rows leaving the
batch when they stop. The loop reads top to bottom in named phases: ``_check`` (before any
forward), ``_start`` (prefill, the rows begin), then per step ``_step``, ``_stop`` (EOS and
length) and ``_retire`` (the commit, rows leaving the batch).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

import attrs
import torch

from specdec.adapters import rows_draft, rows_target
from specdec.drafts.base import DraftModel
from specdec.engine.dispatch import Verification, choose_verification
from specdec.engine.options import StepOptions
from specdec.engine.row_sampling import RowSampling
from specdec.engine.stats import StepTally
from specdec.engine.step import Roles, StepInputs, StepOutcome, commit_step, step_rows
from specdec.errors import ContextOverflowError, InvalidConfigError, VocabMismatchError
from specdec.inputs import as_token_ids
from specdec.lease import hold
from specdec.processors import LogitsProcessorLike
from specdec.rng import CounterRandom, RandomSource, RowStreams
from specdec.sampling import SamplingConfig
from specdec.targets.base import TargetModel
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier

__all__ = ["RowsRequest", "StepReport", "check_prompts", "check_rows", "decode_rows", "profile_steps", "run_rows"]


@attrs.frozen(eq=False)
class StepReport:
    """What one step of the loop gives its caller.

    Attributes:
        rows: the original row (index into the prompts) of each batch row of this step.
        kept: ``{row: tokens}`` the tokens each row keeps (EOS and length applied).
        outcome: the step's :class:`~specdec.engine.step.StepOutcome` (the scored tree batch,
            the device decision, the per-row results).
        logprobs: ``{row: [len(kept[row])] float64}`` on the device, when asked for.
        top_logprobs: ``{row: ([len(kept[row]), k] float64, [len(kept[row]), k] int64)}`` the
            ``k`` largest log-probabilities of each kept token's law and their ids, on the
            device, when asked for (``RowsRequest.top_logprobs = k > 0``).
    """

    rows: tuple[int, ...]
    kept: dict[int, list[int]]
    outcome: StepOutcome
    logprobs: dict[int, torch.Tensor] = attrs.field(factory=dict)
    top_logprobs: dict[int, tuple[torch.Tensor, torch.Tensor]] = attrs.field(factory=dict)


def check_prompts(prompts: object) -> None:
    """``prompts`` must be a non-empty sequence (of token-id sequences, checked row by row by :func:`check_rows`)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise InvalidConfigError(
            f"prompts must be a non-empty list of token-id sequences, got {type(prompts).__name__} {prompts!r:.60}"
        )


def check_rows(prompts: object, vocab_size: int, named: bool) -> list[list[int]]:
    """The prompts as lists of ids: a non-empty sequence of non-empty prompts, ids in the vocabulary.

    Args:
        named: batched generation (errors name the prompt) rather than a single one.
    """
    if named:
        check_prompts(prompts)
    assert isinstance(prompts, Sequence)
    rows = []
    for b, prompt in enumerate(prompts):
        row = as_token_ids(prompt, f"prompt {b}") if named else as_token_ids(prompt)
        if not row:
            raise InvalidConfigError(f"prompt {b} must be a non-empty sequence of token ids" if named
                                     else "the prompt is empty: give at least one token id")
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            where = f"prompt {b}: " if named else "prompt "
            raise InvalidConfigError(f"{where}token id {bad[0]} outside the vocabulary [0, {vocab_size})")
        rows.append(row)
    return rows


def _check_context(rows: list[list[int]], max_new_tokens: int, depth: int, limit: int | None, who: str, named: bool) -> None:
    """Before any forward: the deepest tree node of the last step sits at position
    ``prompt + max_new_tokens - 2 + depth``; it must exist in ``who``'s context."""
    if limit is None:
        return
    for b, r in enumerate(rows):
        need = len(r) + max_new_tokens - 1 + depth
        if need > limit:
            where = f"row {b}: " if named else ""
            raise ContextOverflowError(
                f"{where}prompt ({len(r)}) + max_new_tokens ({max_new_tokens}) - 1 + tree depth ({depth}) = {need} "
                f"positions exceed the {who}'s context of {limit} tokens"
            )


@attrs.frozen(eq=False)
class RowsRequest:
    """What a generation of ``B`` rows asks of the loop, as one record (:func:`decode_rows`).

    Attributes:
        prompts: ``B`` prompts (checked: :func:`check_rows`).
        sampling: one configuration for every row, or one per row (a sequence of ``B``, or a
            :class:`~specdec.engine.row_sampling.RowSampling`): each row is then built and verified
            under its own (:mod:`specdec.engine.row_sampling`; one verification for all rows, on
            any path, the fused kernel included).
        sources: one random source per row; row ``b`` draws only from ``sources[b]``
            (a :class:`~specdec.rng.RowStreams` of them for ``B > 1``), so it emits what
            its one-row generation with the same source emits wherever the models' logits
            agree across batch sizes.
        max_new_tokens: per row (None: no length limit; then give ``max_steps``).
        max_steps: stop after this many steps (the profiles).
        eos: ids that stop a row (kept as its last token).
        kernel: ``"auto"``, ``"torch"`` or ``"triton"`` (:mod:`specdec.engine.dispatch`).
        verify_seeds: the kernel's per-row counter streams when the sources are not
            :class:`~specdec.rng.CounterRandom` (one seed per row).
        options: :class:`~specdec.engine.options.StepOptions` (default: ``StepOptions()``).
        compiler: a :class:`~specdec.engine.compiler.StepCompiler` (one row only).
        logits_processor: applied to every node's target logits in its own context (a tuple:
            one processor, or None, per row).
        logprobs: fill :attr:`StepReport.logprobs`.
        top_logprobs: ``k > 0``: fill :attr:`StepReport.top_logprobs` (0: not).
        what: names the call in a :class:`~specdec.errors.ModelBusyError` of a later caller.
        named: a batched call: errors name the row.
    """

    prompts: Sequence[Sequence[int]]
    sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling
    sources: Sequence[RandomSource]
    max_new_tokens: int | None
    max_steps: int | None = None
    eos: Iterable[int] = ()
    kernel: str = "auto"
    verify_seeds: Sequence[int | None] | None = None
    options: StepOptions | None = None
    compiler: object = None
    logits_processor: LogitsProcessorLike | tuple[LogitsProcessorLike | None, ...] | None = None
    logprobs: bool = False
    what: str = "a generation"
    named: bool = False
    top_logprobs: int = 0


def run_rows(
    target: TargetModel,
    draft: DraftModel | None,
    builder: TreeBuilder,
    verifier: Verifier,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling,
    sources: Sequence[RandomSource],
    *,
    max_new_tokens: int | None,
    max_steps: int | None = None,
    eos: Iterable[int] = (),
    kernel: str = "auto",
    verify_seeds: Sequence[int | None] | None = None,
    options: StepOptions | None = None,
    compiler: object = None,
    logits_processor: LogitsProcessorLike | None = None,
    logprobs: bool = False,
    tallies: Sequence[StepTally] | None = None,
    what: str = "a generation",
    named: bool = False,
) -> Iterator[StepReport]:
    """Generate for every prompt at once; yield a :class:`StepReport` after each step: the
    compatibility form of :func:`decode_rows`.

    The engine path is the record form, :func:`decode_rows` (``Roles(target, draft, builder,
    verifier)`` and a :class:`RowsRequest` of the other arguments but ``tallies``); this form
    builds the two records and runs it, with the same results (arguments: :class:`RowsRequest`;
    ``tallies``: :func:`decode_rows`).
    """
    request = RowsRequest(prompts, sampling, sources, max_new_tokens, max_steps=max_steps, eos=eos, kernel=kernel,
                          verify_seeds=verify_seeds, options=options, compiler=compiler,
                          logits_processor=logits_processor, logprobs=logprobs, what=what, named=named)
    return decode_rows(Roles(target, draft, builder, verifier), request, tallies)


@attrs.frozen(eq=False)
class _Plan:
    """What :func:`_check` settles before any forward: the rows, the roles as they serve ``B``
    rows, the one verification per configuration, the options and the tallies."""

    roles: Roles  # the target and draft as they serve B rows (specdec.adapters)
    request: RowsRequest
    rows: list[list[int]]
    sampling: SamplingConfig  # every row's, or the first row's when they differ
    per_row: RowSampling | None  # several configurations (specdec.engine.row_sampling)
    paths: dict[SamplingConfig, Verification]
    options: StepOptions
    clock: str
    steps_cap: int
    eos: set[int]
    tallies: Sequence[StepTally]


@attrs.define(eq=False)
class _Batch:
    """The live rows between steps (:func:`_start`, then each :func:`_retire`)."""

    active: list[int]  # the original row of each batch row
    produced: list[int]  # per original row
    roots: torch.Tensor  # [len(active)]
    rng: RandomSource
    verify_rng: RowStreams | None
    sampling: SamplingConfig
    per_row: RowSampling | None
    verification: Verification
    contexts: list[torch.Tensor] | None
    steps: int = 0


def decode_rows(roles: Roles, request: RowsRequest, tallies: Sequence[StepTally] | None = None) -> Iterator[StepReport]:
    """Generate for every prompt of ``request`` at once; yield a :class:`StepReport` after each step.

    The one generation loop, in named phases: :func:`_check` (everything before any forward),
    :func:`_start` (the models held, prefill, the rows begin), then per step :func:`_step` (the
    step of the live rows), :func:`_stop` (each row's kept tokens: EOS and length) and, after the
    report, :func:`_retire` (the commit; rows that stopped leave the batch).

    Args:
        roles: the target, draft, builder and verifier (:class:`~specdec.engine.step.Roles`).
        request: the prompts, sampling, sources and limits (:class:`RowsRequest`).
        tallies: one :class:`~specdec.engine.stats.StepTally` per row, filled as it goes.

    Raises:
        InvalidConfigError, VocabMismatchError, ContextOverflowError: before any forward.
        UnsupportedTreeError: the verifier cannot verify the builder's trees (first step).
        InvalidDistributionError: a row's logits are bad where they are used.
    """
    plan = _check(roles, request, tallies)
    t0 = time.perf_counter()
    with hold(request.what, target=roles.target, draft=roles.draft):  # one generation per model at a time (specdec.lease)
        batch = _start(plan, t0)
        while batch.active:
            outcome = _step(plan, batch)
            report, keep = _stop(plan, batch, outcome)
            yield report
            if not keep:
                return
            _retire(plan, batch, outcome, keep)


def _check(roles: Roles, request: RowsRequest, tallies: Sequence[StepTally] | None) -> _Plan:
    """Everything before any forward: the arguments, the prompts, the contexts, the verifier's
    configurations and the one verification dispatch; the tallies' clock and path."""
    target, draft, builder, verifier = roles.target, roles.draft, roles.builder, roles.verifier
    sampling, max_new_tokens, max_steps, named = request.sampling, request.max_new_tokens, request.max_steps, request.named
    if max_new_tokens is not None and (
        not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0
    ):
        raise InvalidConfigError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if max_new_tokens is None and max_steps is None:
        raise InvalidConfigError("give max_new_tokens or max_steps")
    if not isinstance(sampling, (SamplingConfig, RowSampling)) and (
        isinstance(sampling, (str, bytes)) or not isinstance(sampling, Sequence)
    ):
        raise InvalidConfigError(
            f"sampling must be a SamplingConfig or one SamplingConfig per row, got {type(sampling).__name__}")
    if not isinstance(target, TargetModel):
        raise InvalidConfigError(f"target must be a TargetModel, got {type(target).__name__}")
    if draft is not None and not isinstance(draft, DraftModel):
        raise InvalidConfigError(f"draft must be a DraftModel or None, got {type(draft).__name__}")
    vocab = target.vocab_size
    if draft is not None and draft.vocab_size != vocab:
        raise VocabMismatchError(f"the draft's vocabulary ({draft.vocab_size}) differs from the target's ({vocab})")
    rows = check_rows(request.prompts, vocab, named)
    B = len(rows)
    per_row: RowSampling | None = None  # several configurations (specdec.engine.row_sampling)
    if not isinstance(sampling, SamplingConfig):
        per_row = RowSampling.of(sampling, B, target.device)
        if per_row.uniform:
            sampling, per_row = per_row.configs[0], None
        else:
            sampling = per_row.configs[0]
    sources = request.sources
    if len(sources) != B:
        raise InvalidConfigError(f"{len(sources)} random sources for {B} rows")
    target = rows_target(target, B)  # a one-row target serves several rows as one copy per row (specdec.adapters)
    if draft is not None:  # a one-row draft serves several rows as one copy per row (specdec.adapters)
        draft = rows_draft(draft, B)
    if B > 1 and request.compiler is not None:
        raise InvalidConfigError("batched generation does not compile the step yet: compile= is not supported with batches")
    depth = builder.max_depth
    if max_new_tokens is not None:
        steps_cap = max_new_tokens
    else:
        assert max_steps is not None  # checked above: one of the two is given
        steps_cap = max_steps * (depth + 1)
    if max_new_tokens is not None:
        _check_context(rows, max_new_tokens, depth, target.max_length, "target", named)
        if draft is not None:
            _check_context(rows, max_new_tokens, depth, draft.max_length, "draft", named)
    eos_ids = set(request.eos)
    configs = [sampling] if per_row is None else [c for c, _ in per_row.groups]
    for config in configs:
        verifier.check_sampling(config)  # temperature-dependent compatibility, before any forward
    device = target.device
    options = StepOptions() if request.options is None else request.options
    # one path for every row: the paths differ by configuration only in what the fused kernel fuses, which
    # it decides row by row in its one launch (per-row sampling: specdec.engine.row_sampling)
    paths = {config: choose_verification(verifier, config, request.kernel, device,
                                         rows=options.rows, draws_tables=all(s.draws_tables for s in sources))
             for config in configs}
    clock = options.clock if options.clock != "auto" else ("cuda_events" if device.type == "cuda" else "perf_counter")
    tallies = [StepTally() for _ in rows] if tallies is None else tallies
    label = paths[sampling].label
    for tally in tallies:
        tally.clock, tally.kernel_path = clock, label
    return _Plan(Roles(target, draft, builder, verifier), request, rows, sampling, per_row, paths, options, clock,
                 steps_cap, eos_ids, tallies)


def _start(plan: _Plan, t0: float) -> _Batch:
    """The rows begin: their sources (the kernel's streams too), their contexts for a logits
    processor, the KV caches sized and filled (prefill; a feature draft from the target's
    prompt features), the roots; the prefill's time since ``t0`` on the first row's tally."""
    request, rows, target, draft = plan.request, plan.rows, plan.roles.target, plan.roles.draft
    sources, B, device = request.sources, len(plan.rows), target.device
    verification = plan.paths[plan.sampling]
    rng: RandomSource = sources[0] if B == 1 else RowStreams(sources)
    verify_rng = None
    if verification.path == "triton":  # the kernel's streams: the rows' own counter streams, or one per row seeded alike
        if all(type(s) is CounterRandom for s in sources):
            verify_rng = RowStreams(sources)
        else:
            seeds = list(request.verify_seeds) if request.verify_seeds is not None else [None] * B
            verify_rng = RowStreams([CounterRandom.seeded(s) for s in seeds])
    contexts = ([torch.tensor(r, dtype=torch.int64, device=device) for r in rows]
                if request.logits_processor is not None else None)
    # size the preallocated KV caches once: the committed context plus one step's tree nodes
    builder = plan.roles.builder
    positions = max(len(r) for r in rows) + plan.steps_cap + builder.max_nodes + builder.max_depth
    with torch.inference_mode():
        target.prefill_batch(rows, positions=positions)
        if draft is not None:  # feature-level drafts (EAGLE) start from the target's prompt features
            draft.begin_rows(rows, target.hidden_rows() if draft.needs_target_hidden else None,
                             positions=positions)
        # [B], once; an inference tensor like every later root (a compiled step sees one kind of tensor)
        roots = torch.tensor([r[-1] for r in rows], dtype=torch.int64, device=device)
    plan.tallies[0].time_prefill += time.perf_counter() - t0
    return _Batch(list(range(B)), [0] * B, roots, rng, verify_rng, plan.sampling, plan.per_row, verification,
                  contexts)


def _step(plan: _Plan, batch: _Batch) -> StepOutcome:
    """One step of the live rows (:func:`~specdec.engine.step.step_rows`); the first checks the trees."""
    request, active = plan.request, batch.active
    inputs = StepInputs(
        row_rngs=[request.sources[r] for r in active], verify_rng=batch.verify_rng, options=plan.options,
        clock=plan.clock, check_tree=batch.steps == 0, compiler=request.compiler,
        logits_processor=(tuple(request.logits_processor[r] for r in active)  # the live rows' own
                          if isinstance(request.logits_processor, tuple) else request.logits_processor),
        contexts=batch.contexts, logprobs=request.logprobs, top_logprobs=request.top_logprobs,
        rows=active if request.named else None,
    )
    with torch.inference_mode():  # per step, never across a yield (the caller's code runs between yields)
        outcome = step_rows(plan.roles, batch.verification, batch.sampling if batch.per_row is None else batch.per_row,
                            batch.rng, batch.roots, inputs)
    batch.steps += 1
    return outcome


def _stop(plan: _Plan, batch: _Batch, outcome: StepOutcome) -> tuple[StepReport, list[int]]:
    """Each row's tally, and the tokens it keeps (length, then EOS, applied): the step's report,
    and the batch rows that go on (not stopped by EOS, length or ``max_steps``)."""
    max_new_tokens, max_steps = plan.request.max_new_tokens, plan.request.max_steps
    tallies, produced = plan.tallies, batch.produced
    kept: dict[int, list[int]] = {}
    row_logprobs: dict[int, torch.Tensor] = {}
    row_top: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    keep: list[int] = []
    for b, r in enumerate(batch.active):
        result = outcome.results[b]
        tallies[r].record(result, outcome.tree_nodes[b], outcome.time_draft, outcome.time_target, outcome.time_verify,
                          None if outcome.optimum is None else outcome.optimum[b], tree_depth=outcome.tree_depths[b])
        tokens = list(result.tokens)
        if max_new_tokens is not None:
            tokens = tokens[: max_new_tokens - produced[r]]
        for i, tok in enumerate(tokens):
            if tok in plan.eos:
                tokens = tokens[: i + 1]
                tallies[r].stop_reason = "eos"
                break
        produced[r] += len(tokens)
        kept[r] = tokens
        if outcome.logprobs is not None:
            row_logprobs[r] = outcome.logprobs[b, : len(tokens)]
        if outcome.top_logprobs is not None and outcome.top_ids is not None:
            row_top[r] = (outcome.top_logprobs[b, : len(tokens)], outcome.top_ids[b, : len(tokens)])
        if tallies[r].stop_reason != "eos" and (max_new_tokens is None or produced[r] < max_new_tokens) and (
            max_steps is None or batch.steps < max_steps
        ):
            keep.append(b)
    return StepReport(tuple(batch.active), kept, outcome, row_logprobs, row_top), keep


def _retire(plan: _Plan, batch: _Batch, outcome: StepOutcome, keep: list[int]) -> None:
    """After the report: the step is committed, the emitted tokens join the contexts, the bonus
    tokens become the roots, and the rows not in ``keep`` leave the batch (the target's and the
    draft's rows, the sources, the per-row sampling, the kernel's streams)."""
    target, draft, device = plan.roles.target, plan.roles.draft, plan.roles.target.device
    active, contexts = batch.active, batch.contexts
    t1 = time.perf_counter()
    decision = outcome.decision
    with torch.inference_mode():
        commit_step(target, draft, outcome)
        if contexts is not None:  # the emitted tokens join every later node's context (on the device)
            contexts = [torch.cat([contexts[b], decision.tokens[b, : len(outcome.results[b].tokens)].to(device)])
                        for b in range(len(active))]
        roots = decision.tokens.gather(1, decision.num_accepted.unsqueeze(-1)).squeeze(-1)  # [B] the bonus tokens
        if len(keep) < len(active):
            index = torch.tensor(keep, dtype=torch.int64, device=roots.device)
            target.keep_rows(keep)
            if draft is not None and draft is not target:  # one object in both roles keeps both in one call
                draft.keep_rows(keep)
            if isinstance(batch.rng, RowStreams):
                batch.rng.keep(keep, index)
            if batch.per_row is not None:  # the configurations of the rows that stay
                batch.per_row = batch.per_row.keep(keep, index)
                if batch.per_row.uniform:
                    batch.sampling, batch.per_row = batch.per_row.configs[0], None
                    batch.verification = plan.paths[batch.sampling]
            if batch.verify_rng is not None and batch.verify_rng is not batch.rng:
                batch.verify_rng.keep(keep, index)
            roots = roots.index_select(0, index)
            if contexts is not None:
                contexts = [contexts[b] for b in keep]
    batch.roots, batch.contexts = roots, contexts
    for r in active:
        plan.tallies[r].time_draft += (time.perf_counter() - t1) / len(active)
    batch.active = [active[b] for b in keep]


def profile_steps(
    roles: Roles,
    prompts: Iterable[Sequence[int]],
    sampling: SamplingConfig,
    rng: RandomSource,
    steps_per_prompt: int,
    *,
    room: int,
    name: str,
) -> Iterator[StepOutcome]:
    """The profiles' loop (Sequoia's acceptance, the bench's positional acceptance, Rheo's
    calibrated proxy): for each prompt, ``steps_per_prompt`` steps of :func:`decode_rows` with
    ``roles`` (a draft, the builder, the verifier: the tensor rule, or its walk), each committed, so
    later steps profile generated text; every prompt draws from the one source ``rng``.
    Yields each step's outcome (its ``tree`` and ``result``).

    Raises:
        InvalidConfigError: an empty prompt.
        ContextOverflowError: a prompt plus ``2 * steps_per_prompt + room`` tokens exceeds a
            model's ``max_length``.
    """
    for prompt in prompts:
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise InvalidConfigError("prompts must be non-empty")
        assert roles.draft is not None  # the profiles draft
        for limit in (roles.target.max_length, roles.draft.max_length):
            if limit is not None and len(prompt) + 2 * steps_per_prompt + room > limit:
                raise ContextOverflowError(
                    f"a {len(prompt)}-token prompt plus {steps_per_prompt} profiling steps of {room} nodes "
                    f"exceeds max_length {limit} ({name})")
        request = RowsRequest([prompt], sampling, [rng], None, max_steps=steps_per_prompt, kernel="torch", what=name)
        for report in decode_rows(roles, request):
            yield report.outcome
