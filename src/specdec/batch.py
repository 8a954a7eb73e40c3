"""Batched decoding: many prompts (*rows*) decoded together, one target forward per step.

The rows run through the one engine loop (:func:`specdec.engine.loop.decode_rows`), which a
single generation runs too, as a batch of one. Rows keep their own state: their committed
context in the target's batch mode (:meth:`~specdec.targets.hf.HFTarget.prefill_batch`:
one KV slab, ragged per-row lengths), their own random stream (one seed per row) and
their own stops (EOS, length). A row that stops leaves the batch
(:meth:`~specdec.targets.base.TargetModel.keep_rows`) and costs nothing more.

Here: :func:`speculative_stream_batch` (``SpeculativeGenerator.generate_batch``) and the
batched baseline, :func:`autoregressive_generate_batch` and
:func:`autoregressive_stream_batch` (every row a root-only tree per step, through the
same verification as the speculative step). Row ``b`` draws from
``TorchRandom.seeded(seeds[b])`` exactly the uniforms its batch-1 decoding draws, so a
row's tokens depend only on its prompt, its seed and the model: at temperature 0 they
equal its batch-1 output token for token; at T > 0 wherever the model's logits are equal
across batch sizes up to rounding that no uniform falls within (tested on float64 models,
``tests/test_batch.py``). Each step makes one host read and builds nothing on the host
for the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from specdec.drafts.base import DraftModel
from specdec.engine.loop import check_prompts
from specdec.engine.options import StepOptions
from specdec.engine.stats import AcceptanceCounts, BatchChunk, StepTally
from specdec.errors import InvalidConfigError
from specdec.processors import LogitsProcessorLike
from specdec.registry import get
from specdec.request import Decoder, GenerateOptions, stream_request
from specdec.sampling import SamplingConfig
from specdec.targets.base import TargetModel
from specdec.trees.base import TreeBuilder
from specdec.trees.root_only import RootOnlyBuilder
from specdec.verify.base import Verifier

__all__ = [
    "BatchOutput",
    "autoregressive_generate_batch",
    "autoregressive_stream_batch",
    "check_prompts",
    "collect_batch",
    "plain_decoder",
    "speculative_stream_batch",
]


@attrs.frozen
class BatchOutput:
    """Result of a batched generation.

    Attributes:
        tokens: per row (in the order of the prompts), the new tokens.
        stop_reasons: per row, ``"eos"`` or ``"length"``.
        steps: target forwards (one per step for all the rows still running).
        time_total: seconds, prefill included.
        row_steps: steps summed over the rows (a row counts each step it ran).
        tau: tokens emitted per row-step (accepted drafts + the bonus); 1 for plain decoding.
        steps_by_row: per row, the steps it ran.
        emitted_by_row: per row, the tokens the verifier emitted (before EOS / length truncation).
        acceptance_by_row: per row, its per-position counts and tau
            (:class:`~specdec.engine.stats.AcceptanceCounts`; docs/generation.md "Acceptance metrics").
    """

    tokens: tuple[tuple[int, ...], ...]
    stop_reasons: tuple[str, ...]
    steps: int
    time_total: float
    row_steps: int = 0
    tau: float = 1.0
    steps_by_row: tuple[int, ...] = ()
    emitted_by_row: tuple[int, ...] = ()
    acceptance_by_row: tuple[AcceptanceCounts, ...] = ()

    @property
    def new_tokens(self) -> int:
        """New tokens summed over the rows."""
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        """Throughput: new tokens summed over the rows per second of total time."""
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0


def plain_decoder(target: TargetModel) -> Decoder:
    """Plain decoding's composition: a root-only tree, verified by the ``match`` rule with no
    children (the bonus is drawn from ``p`` itself)."""
    return Decoder(target, None, RootOnlyBuilder(target.vocab_size), get("verifier", "match")())


def speculative_stream_batch(
    target: TargetModel,
    draft: DraftModel | None,
    builder: TreeBuilder,
    verifier: Verifier,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | None = None,
    sampling: Any = None,
    seeds: Sequence[int] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    seed: int | None = None,
    logits_processor: LogitsProcessorLike | None = None,
    kernel: str = "auto",
    random: str = "torch",
    options: StepOptions | None = None,
) -> Iterator[BatchChunk]:
    """Decode every prompt at once; yield ``{row: new tokens}`` after each step (what
    :meth:`~specdec.generate.SpeculativeGenerator.stream_batch` runs, for a composition given
    piece by piece; the other arguments as there, :mod:`specdec.request`).

    One step for all running rows: the draft (rows mode) grows every row's tree with the
    builder's tensor form, the target scores all trees in one forward, the verification
    chosen once for the generation (:mod:`specdec.engine.dispatch`: the tensor rule, the
    fused kernel in ONE launch for all rows, or the verifier's walk row by row) decides
    every row, and one read brings back every row's accepted path and bonus. Row ``b``
    draws from ``seeded_sources(random, seeds)[b]`` exactly what its batch-1 generation
    draws (the kernel from ``CounterRandom.seeded(seeds[b])``), so its tokens equal its
    batch-1 output wherever the models' logits agree across batch sizes (at T = 0, token
    for token). ``sampling`` may give each row its own configuration (a sequence of ``B``):
    each row is then drafted and verified under its own, with the same guarantee
    (:mod:`specdec.engine.row_sampling`). ``logits_processor`` runs on each row's nodes in
    that row's own contexts.

    Needs, for several rows: a target with a batch mode (``HFTarget``, ``CallableLM``), a
    draft with a rows mode (:attr:`DraftModel.supports_rows
    <specdec.drafts.base.DraftModel.supports_rows>`) and a builder that grows batches
    (:meth:`TreeBuilder.grows_batches <specdec.trees.base.TreeBuilder.grows_batches>`);
    anything else raises :class:`~specdec.errors.InvalidConfigError` before any forward.
    """
    if not isinstance(target, TargetModel):
        raise InvalidConfigError(f"target must be a TargetModel, got {type(target).__name__}")
    request = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor).resolve(
        prompts, target.device, batch=True)
    decoder = Decoder(target, draft, builder, verifier, kernel=kernel, random=random, step=options)
    tallies = [StepTally() for _ in prompts]
    for report in stream_request(decoder, prompts, request, tallies, what="speculative_stream_batch", batch=True):
        yield BatchChunk.of(report.kept, tallies)


def _stream_plain(target: TargetModel, prompts: Sequence[Sequence[int]], options: GenerateOptions,
                  tallies: list[StepTally]) -> Iterator[BatchChunk]:
    if not isinstance(target, TargetModel):
        raise InvalidConfigError(f"target must be a TargetModel, got {type(target).__name__}")
    request = options.resolve(prompts, target.device, batch=True)
    for report in stream_request(plain_decoder(target), prompts, request, tallies,
                                 what="autoregressive_generate_batch", batch=True):
        yield BatchChunk.of(report.kept, tallies)


def autoregressive_stream_batch(
    target: TargetModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | None = None,
    sampling: Any = None,
    seeds: Sequence[int] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    seed: int | None = None,
    logits_processor: LogitsProcessorLike | None = None,
) -> Iterator[BatchChunk]:
    """Plain decoding of every prompt at once; yields ``{row: new tokens}`` after each step for
    the rows that produced one (``row`` = index into ``prompts``). See the module docstring
    for the per-row guarantees.

    Args:
        target: a target with a batch mode (``HFTarget``, ``CallableLM``).
        prompts: ``B`` non-empty sequences of token ids (lists or 1-D tensors), of any lengths.
        max_new_tokens: per row (may be left out with a ``GenerationConfig`` that gives a length).
        sampling: shared by the rows (default: temperature 1), one per row, or a
            ``transformers.GenerationConfig`` (as in ``autoregressive_generate``).
        seeds: one int per row (default ``0 .. B - 1``).
        eos_token_id: an id or ids that stop a row (kept as its last token).
        seed: instead of ``seeds``: row ``b`` gets ``seed + b``.
        logits_processor: applied to each row's logits in its own context (the sequence so far).

    Raises:
        InvalidConfigError: bad prompts, seeds, ``eos_token_id``, processor or a target without batch mode.
        InvalidDistributionError: a row's target logits are NaN, +inf or all -inf.
    """
    options = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor)
    yield from _stream_plain(target, prompts, options, [StepTally() for _ in prompts])


def autoregressive_generate_batch(
    target: TargetModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | None = None,
    sampling: Any = None,
    seeds: Sequence[int] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    seed: int | None = None,
    logits_processor: LogitsProcessorLike | None = None,
) -> BatchOutput:
    """:func:`autoregressive_stream_batch`, collected: the batched baseline (same arguments).

    Example:
        >>> import torch, transformers
        >>> from specdec.targets.hf import HFTarget
        >>> cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> target = HFTarget(transformers.LlamaForCausalLM(cfg).eval())
        >>> out = autoregressive_generate_batch(target, [[1, 2, 3], [4]], 5, SamplingConfig(temperature=0.0))
        >>> [len(t) for t in out.tokens], out.stop_reasons
        ([5, 5], ('length', 'length'))
    """
    check_prompts(prompts)
    options = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor)
    return collect_batch(lambda tallies: _stream_plain(target, prompts, options, tallies), len(prompts))


def collect_batch(run: Callable[[list[StepTally]], Iterator[dict[int, list[int]]]], num_rows: int) -> BatchOutput:
    """Run a batched stream (``run(tallies)`` yields ``{row: new tokens}`` and fills the
    :class:`~specdec.engine.stats.StepTally` of each row it is given) to its end and collect a
    :class:`BatchOutput`, timed from the first call."""
    start = time.perf_counter()
    tallies = [StepTally() for _ in range(num_rows)]
    tokens: list[list[int]] = [[] for _ in range(num_rows)]
    for chunk in run(tallies):
        for r, new in chunk.items():
            tokens[r].extend(new)
    row_steps = sum(t.steps for t in tallies)
    emitted = sum(t.emitted for t in tallies)
    return BatchOutput(
        tokens=tuple(tuple(t) for t in tokens), stop_reasons=tuple(t.stop_reason for t in tallies),
        steps=max((t.steps for t in tallies), default=0), time_total=time.perf_counter() - start, row_steps=row_steps,
        tau=emitted / row_steps if row_steps else 1.0,
        steps_by_row=tuple(t.steps for t in tallies), emitted_by_row=tuple(t.emitted for t in tallies),
        acceptance_by_row=tuple(t.counts() for t in tallies),
    )
