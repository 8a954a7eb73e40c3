"""The one generation loop: ``B`` rows around :func:`~specdec.engine.step.run_step`.

Every way of generating runs :func:`run_rows`: ``SpeculativeGenerator.generate`` and
``stream`` (one row), ``generate_batch`` / ``stream_batch`` and the batched baseline (``B``
rows), plain autoregressive decoding (a root-only tree), the profiles behind Sequoia's
acceptance, Rheo's calibration and the bench's budget search (:func:`profile_steps`).
Here, and only here: the checks before any forward, the one verification dispatch
(:func:`~specdec.engine.dispatch.choose_verification`), prefill, EOS and length
handling, the per-row accounting, log-probabilities, committing, and rows leaving the
batch when they stop.
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
from specdec.engine.step import StepOutcome, commit_step, run_step
from specdec.errors import ContextOverflowError, InvalidConfigError, VocabMismatchError
from specdec.inputs import as_token_ids
from specdec.lease import hold
from specdec.processors import LogitsProcessorLike
from specdec.rng import CounterRandom, RandomSource, RowStreams
from specdec.sampling import SamplingConfig
from specdec.targets.base import TargetModel
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier

__all__ = ["StepReport", "check_prompts", "check_rows", "profile_steps", "run_rows"]


@attrs.frozen(eq=False)
class StepReport:
    """What one step of the loop gives its caller.

    Attributes:
        rows: the original row (index into the prompts) of each batch row of this step.
        kept: ``{row: tokens}`` the tokens each row keeps (EOS and length applied).
        outcome: the step's :class:`~specdec.engine.step.StepOutcome` (the scored tree batch,
            the device decision, the per-row results).
        logprobs: ``{row: [len(kept[row])] float64}`` on the device, when asked for.
    """

    rows: tuple[int, ...]
    kept: dict[int, list[int]]
    outcome: StepOutcome
    logprobs: dict[int, torch.Tensor] = attrs.field(factory=dict)


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
    """Generate for every prompt at once; yield a :class:`StepReport` after each step.

    Args:
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
        logits_processor: applied to every node's target logits in its own context.
        logprobs: fill :attr:`StepReport.logprobs`.
        tallies: one :class:`~specdec.engine.stats.StepTally` per row, filled as it goes.
        what: names the call in a :class:`~specdec.errors.ModelBusyError` of a later caller.
        named: a batched call: errors name the row.

    Raises:
        InvalidConfigError, VocabMismatchError, ContextOverflowError: before any forward.
        UnsupportedTreeError: the verifier cannot verify the builder's trees (first step).
        InvalidDistributionError: a row's logits are bad where they are used.
    """
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
    rows = check_rows(prompts, vocab, named)
    B = len(rows)
    per_row: RowSampling | None = None  # several configurations (specdec.engine.row_sampling)
    if not isinstance(sampling, SamplingConfig):
        per_row = RowSampling.of(sampling, B, target.device)
        if per_row.uniform:
            sampling, per_row = per_row.configs[0], None
        else:
            sampling = per_row.configs[0]
    if len(sources) != B:
        raise InvalidConfigError(f"{len(sources)} random sources for {B} rows")
    held_target = target  # a one-row target serves several rows as one copy per row (specdec.adapters)
    target = rows_target(target, B)
    held_draft = draft  # the model object a generation holds (specdec.lease)
    if draft is not None:  # a one-row draft serves several rows as one copy per row (specdec.adapters)
        draft = rows_draft(draft, B)
    if B > 1 and compiler is not None:
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
    eos_ids = set(eos)
    configs = [sampling] if per_row is None else [c for c, _ in per_row.groups]
    for config in configs:
        verifier.check_sampling(config)  # temperature-dependent compatibility, before any forward
    device = target.device
    options = StepOptions() if options is None else options
    # one path for every row: the paths differ by configuration only in what the fused kernel fuses, which
    # it decides row by row in its one launch (per-row sampling: specdec.engine.row_sampling)
    paths = {config: choose_verification(verifier, config, kernel, device,
                                         rows=options.rows, draws_tables=all(s.draws_tables for s in sources))
             for config in configs}
    verification: Verification = paths[sampling]
    clock = options.clock if options.clock != "auto" else ("cuda_events" if device.type == "cuda" else "perf_counter")
    tallies = [StepTally() for _ in rows] if tallies is None else tallies
    label = verification.label
    for tally in tallies:
        tally.clock, tally.kernel_path = clock, label
    rng: RandomSource = sources[0] if B == 1 else RowStreams(sources)
    verify_rng = None
    if verification.path == "triton":  # the kernel's streams: the rows' own counter streams, or one per row seeded alike
        if all(type(s) is CounterRandom for s in sources):
            verify_rng = RowStreams(sources)
        else:
            seeds = list(verify_seeds) if verify_seeds is not None else [None] * B
            verify_rng = RowStreams([CounterRandom.seeded(s) for s in seeds])
    active = list(range(B))
    produced = [0] * B
    contexts = ([torch.tensor(r, dtype=torch.int64, device=device) for r in rows]
                if logits_processor is not None else None)
    t0 = time.perf_counter()
    with hold(what, target=held_target, draft=held_draft):  # one generation per model at a time (specdec.lease)
        # size the preallocated KV caches once: the committed context plus one step's tree nodes
        positions = max(len(r) for r in rows) + steps_cap + builder.max_nodes + depth
        with torch.inference_mode():
            target.prefill_batch(rows, positions=positions)
            if draft is not None:  # feature-level drafts (EAGLE) start from the target's prompt features
                draft.begin_rows(rows, target.hidden_rows() if draft.needs_target_hidden else None,
                                 positions=positions)
            # [B], once; an inference tensor like every later root (a compiled step sees one kind of tensor)
            roots = torch.tensor([r[-1] for r in rows], dtype=torch.int64, device=device)
        tallies[0].time_prefill += time.perf_counter() - t0
        steps = 0
        while active:
            with torch.inference_mode():  # per step, never across a yield (the caller's code runs between yields)
                outcome = run_step(
                    target, draft, builder, verifier,
                    verification, sampling if per_row is None else per_row, rng, roots,
                    row_rngs=[sources[r] for r in active], verify_rng=verify_rng, options=options, clock=clock,
                    check_tree=steps == 0, compiler=compiler, logits_processor=logits_processor, contexts=contexts,
                    logprobs=logprobs, rows=active if named else None,
                )
            steps += 1
            kept: dict[int, list[int]] = {}
            row_logprobs: dict[int, torch.Tensor] = {}
            keep: list[int] = []
            for b, r in enumerate(active):
                result = outcome.results[b]
                tallies[r].record(result, outcome.tree_nodes[b], outcome.time_draft, outcome.time_target, outcome.time_verify,
                                 None if outcome.optimum is None else outcome.optimum[b])
                tokens = list(result.tokens)
                if max_new_tokens is not None:
                    tokens = tokens[: max_new_tokens - produced[r]]
                for i, tok in enumerate(tokens):
                    if tok in eos_ids:
                        tokens = tokens[: i + 1]
                        tallies[r].stop_reason = "eos"
                        break
                produced[r] += len(tokens)
                kept[r] = tokens
                if outcome.logprobs is not None:
                    row_logprobs[r] = outcome.logprobs[b, : len(tokens)]
                if tallies[r].stop_reason != "eos" and (max_new_tokens is None or produced[r] < max_new_tokens) and (
                    max_steps is None or steps < max_steps
                ):
                    keep.append(b)
            yield StepReport(tuple(active), kept, outcome, row_logprobs)
            if not keep:
                return
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
                    if isinstance(rng, RowStreams):
                        rng.keep(keep, index)
                    if per_row is not None:  # the configurations of the rows that stay
                        per_row = per_row.keep(keep, index)
                        if per_row.uniform:
                            sampling, per_row = per_row.configs[0], None
                            verification = paths[sampling]
                    if verify_rng is not None and verify_rng is not rng:
                        verify_rng.keep(keep, index)
                    roots = roots.index_select(0, index)
                    if contexts is not None:
                        contexts = [contexts[b] for b in keep]
            for r in active:
                tallies[r].time_draft += (time.perf_counter() - t1) / len(active)
            active = [active[b] for b in keep]


def profile_steps(
    target: TargetModel,
    draft: DraftModel,
    prompts: Iterable[Sequence[int]],
    builder: TreeBuilder,
    verifier: Verifier,
    sampling: SamplingConfig,
    rng: RandomSource,
    steps_per_prompt: int,
    *,
    room: int,
    name: str,
) -> Iterator[StepOutcome]:
    """The profiles' loop (Sequoia's acceptance, the bench's positional acceptance, Rheo's
    calibrated proxy): for each prompt, ``steps_per_prompt`` steps of :func:`run_rows` with
    ``builder`` and ``verifier`` (the tensor rule, or the verifier's walk), each committed, so
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
        for limit in (target.max_length, draft.max_length):
            if limit is not None and len(prompt) + 2 * steps_per_prompt + room > limit:
                raise ContextOverflowError(
                    f"a {len(prompt)}-token prompt plus {steps_per_prompt} profiling steps of {room} nodes "
                    f"exceeds max_length {limit} ({name})")
        for report in run_rows(target, draft, builder, verifier, [prompt], sampling, [rng], max_new_tokens=None,
                               max_steps=steps_per_prompt, kernel="torch", what=name):
            yield report.outcome
