"""One generation request: the options record every public entry point builds, and its run.

The public generation entry points (:meth:`SpeculativeGenerator.generate
<specdec.generate.SpeculativeGenerator.generate>`, ``stream``, ``generate_batch``,
``stream_batch``, :func:`~specdec.generate.autoregressive_generate` and the batch functions
of :mod:`specdec.batch`) take the same arguments with the same meaning. Each builds one
:class:`GenerateOptions` from what its caller gave, resolves it once for its prompts
(:meth:`GenerateOptions.resolve`: a :class:`Request`) and runs it with
:func:`stream_request` on a :class:`Decoder` (the models, the composed builder and verifier,
and how the step runs) through the one engine loop
(:func:`specdec.engine.loop.decode_rows`).

The rules, for one prompt or ``B`` (docs/generation.md, "Seeds"):

- ``seeds``: one int per prompt; ``seed=s``: the prompts' seeds are ``s, s + 1, ...,
  s + B - 1`` (a single generation: ``s``). Both at once is an error. With neither, a single
  generation seeds from entropy, and a batch's rows take ``0 .. B - 1``.
- ``sampling``: a :class:`~specdec.sampling.SamplingConfig` (default: temperature 1), one per
  prompt, or a ``transformers.GenerationConfig`` (:mod:`specdec.hf_generation`: the sampling,
  length, EOS and processors it implies, for every prompt alike).
- ``logits_processor``: applied to every tree node's target logits in that node's own
  context (:mod:`specdec.processors`), each row in its own; the implied processors of a
  ``GenerationConfig`` run first. A batch may give one per prompt instead (a plain ``list``
  or ``tuple`` of processors or None, one entry per prompt): row ``b`` is processed by entry
  ``b`` alone (e.g. per-row :class:`~specdec.logit_bias.LogitBias` or
  :class:`~specdec.penalties.OutputPenalties`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.engine.compiler import StepCompiler
from specdec.engine.loop import RowsRequest, StepReport, check_prompts, decode_rows
from specdec.engine.options import StepOptions
from specdec.engine.stats import StepTally
from specdec.engine.step import Roles
from specdec.errors import InvalidConfigError
from specdec.hf_generation import from_generation_config_rows, is_generation_config
from specdec.inputs import as_eos_ids, as_seed, as_token_ids
from specdec.processors import LogitsProcessorLike, check_processor
from specdec.rng import seeded_sources
from specdec.sampling import SamplingConfig
from specdec.targets.base import TargetModel
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier

__all__ = ["Decoder", "GenerateOptions", "Request", "chain_processors", "row_seeds", "stream_request"]


def chain_processors(first: LogitsProcessorLike, then: LogitsProcessorLike) -> LogitsProcessorLike:
    """``then(ids, first(ids, scores))``: a ``GenerationConfig``'s processors, then the caller's."""

    def chained(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return then(input_ids, first(input_ids, scores))

    return chained


def row_seeds(seed: Any, seeds: Any, rows: int, batch: bool) -> tuple[int | None, ...]:
    """One seed per row from the caller's ``seed`` / ``seeds`` (module docstring).

    Args:
        rows: the number of prompts.
        batch: a batched call (with neither argument its rows take ``0 .. rows - 1``; a
            single generation seeds from entropy).

    Raises:
        InvalidConfigError: both ``seed`` and ``seeds``; ``seeds`` not ``rows`` ints; ``seed``
            not an int, or ``seed + rows - 1`` outside the seed range.
    """
    if seed is not None and seeds is not None:
        raise InvalidConfigError(
            f"give seed or seeds, not both (seed=s means seeds s, s + 1, ...): got seed={seed!r} and seeds={seeds!r}")
    if seeds is not None:
        if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
            raise InvalidConfigError(f"seeds must be a sequence of {rows} ints, one per prompt, got {seeds!r}")
        if len(seeds) != rows:
            raise InvalidConfigError(f"seeds must be {rows} ints, one per prompt, got {len(seeds)}: {list(seeds)!r}")
        out = []
        for b, s in enumerate(seeds):
            value = as_seed(s, f"seeds[{b}]")
            if value is None:
                raise InvalidConfigError(f"seeds must be ints (a row's tokens depend only on its seed), got {list(seeds)!r}")
            out.append(value)
        return tuple(out)
    first = as_seed(seed)
    if first is None:
        return tuple(range(rows)) if batch else (None,) * rows
    return tuple(as_seed(first + b, f"seed + {b} (the seed of prompt {b})") for b in range(rows))


@attrs.frozen
class Request:
    """A :class:`GenerateOptions` resolved for its prompts: what the engine loop runs.

    Attributes:
        max_new_tokens: per row.
        sampling: one configuration for every row, or one per row.
        seeds: one per row (None: from entropy).
        eos_token_id: the ids that stop a row (checked against the target's vocabulary when run).
        logits_processor: checked callable (a ``GenerationConfig``'s processors chained first), or
            None; or one of those per row (a tuple).
        return_logprobs: the loop reports the kept tokens' log-probabilities.
        top_logprobs: ``n > 0``: the loop also reports, per kept token, the ``n`` largest
            log-probabilities of its law and their ids (0: not).
    """

    max_new_tokens: int | None
    sampling: SamplingConfig | tuple[SamplingConfig, ...]
    seeds: tuple[int | None, ...]
    eos_token_id: Any = None
    logits_processor: LogitsProcessorLike | tuple[LogitsProcessorLike | None, ...] | None = None
    return_logprobs: bool = False
    top_logprobs: int = 0


def _check_top_logprobs(n: Any) -> int:
    """``top_logprobs`` as given: an int ``>= 0`` (the vocabulary bound is checked when run).

    Raises:
        InvalidConfigError: a bool, not an int, or negative.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidConfigError(f"top_logprobs must be an int >= 0 (0: none), got {n!r}")
    return n


def _row_processors(given: Any, rows: int, batch: bool) -> tuple[LogitsProcessorLike | None, ...] | None:
    """One checked processor (or None) per row when ``given`` is a plain list or tuple (a
    transformers ``LogitsProcessorList`` is one processor: callable), else None.

    Raises:
        InvalidConfigError: a list outside a batch, not one entry per prompt, or an entry that is
            not a callable (naming its index).
    """
    if callable(given) or not isinstance(given, (list, tuple)):
        return None
    if not batch:
        raise InvalidConfigError("logits_processor must be a callable (input_ids [b, len], scores [b, V]) -> [b, V], "
                                 f"got {type(given).__name__} (one per prompt is for batches)")
    if len(given) != rows:
        raise InvalidConfigError(f"logits_processor: {len(given)} entries for {rows} prompts (one per prompt, or None)")
    return tuple(check_processor(p, f"logits_processor[{b}]") for b, p in enumerate(given))


@attrs.frozen
class GenerateOptions:
    """The arguments every public generation entry point takes, as its caller gave them.

    Attributes:
        max_new_tokens: new tokens per prompt (None: from a ``GenerationConfig``).
        sampling: a ``SamplingConfig`` (None: temperature 1), one per prompt, or a
            ``transformers.GenerationConfig``.
        seed: the first prompt's seed; prompt ``b`` gets ``seed + b``.
        seeds: one seed per prompt (not with ``seed``).
        eos_token_id: an id or ids that stop a row (kept as its last token).
        logits_processor: a callable ``(input_ids [b, len], scores [b, V]) -> [b, V]``; in a
            batch, or one (or None) per prompt (a plain list or tuple).
        return_logprobs: report each kept token's log-probability.
        top_logprobs: ``n >= 1``: also report, per kept token, the ``n`` largest
            log-probabilities of the law it was drawn from and their ids (implies
            ``return_logprobs``; 0: not).
    """

    max_new_tokens: int | None = None
    sampling: Any = None
    seed: Any = None
    seeds: Any = None
    eos_token_id: Any = None
    logits_processor: Any = None
    return_logprobs: bool = False
    top_logprobs: Any = 0

    def resolve(self, prompts: Sequence[Sequence[int]], device: Any, *, batch: bool) -> Request:
        """The :class:`Request` these options make for ``prompts`` (module docstring).

        Args:
            prompts: the prompts (a single generation: a list of its one prompt).
            device: the target's device (where a ``GenerationConfig``'s processors keep their tensors).
            batch: a batched call (errors name the prompt; default seeds ``0 .. B - 1``).

        Raises:
            InvalidConfigError: an argument is invalid (named), or a ``GenerationConfig`` that
                counts from the prompt's length meets prompts of different lengths.
        """
        if batch:
            check_prompts(prompts)
        seeds = row_seeds(self.seed, self.seeds, len(prompts), batch)
        per_row = _row_processors(self.logits_processor, len(prompts), batch)
        processor: Any = check_processor(self.logits_processor) if per_row is None else per_row
        sampling, max_new, eos = self.sampling, self.max_new_tokens, self.eos_token_id
        if sampling is None:
            sampling = SamplingConfig()
        elif is_generation_config(sampling):
            lengths = [len(as_token_ids(p, f"prompt {b}" if batch else "the prompt")) for b, p in enumerate(prompts)]
            hf = from_generation_config_rows(sampling, lengths, max_new_tokens=max_new, eos_token_id=eos, device=device)
            implied = check_processor(hf.processors)
            if implied is not None and per_row is not None:
                processor = tuple(implied if p is None else chain_processors(implied, p) for p in per_row)
            elif implied is not None:
                processor = implied if processor is None else chain_processors(implied, processor)
            sampling, max_new, eos = hf.sampling, hf.max_new_tokens, hf.eos_token_id
        elif not isinstance(sampling, SamplingConfig) and isinstance(sampling, Sequence) and not isinstance(sampling, str):
            sampling = tuple(sampling)
        if isinstance(processor, tuple) and all(p is None for p in processor):
            processor = None
        top = _check_top_logprobs(self.top_logprobs)
        return Request(max_new, sampling, seeds, eos, processor, self.return_logprobs or top > 0, top)


@attrs.frozen
class Decoder:
    """What decodes a request: the models, the composed builder and verifier, how the step runs.

    Attributes:
        target, draft: the models (no draft: plain decoding with a root-only tree).
        builder, verifier: the composition.
        kernel: ``"auto"``, ``"torch"`` or ``"triton"`` (:mod:`specdec.engine.dispatch`).
        compiler: a :class:`~specdec.engine.compiler.StepCompiler`, or None.
        random: ``"torch"`` or ``"counter"`` (:data:`~specdec.rng.RANDOM_CHOICES`).
        step: :class:`~specdec.engine.options.StepOptions` (None: ``StepOptions()``).
    """

    target: TargetModel
    draft: DraftModel | None
    builder: TreeBuilder
    verifier: Verifier
    kernel: str = "auto"
    compiler: StepCompiler | None = None
    random: str = "torch"
    step: StepOptions | None = None


def stream_request(
    decoder: Decoder,
    prompts: Sequence[Sequence[int]],
    request: Request,
    tallies: Sequence[StepTally],
    *,
    what: str,
    batch: bool,
) -> Iterator[StepReport]:
    """Run ``request`` for ``prompts`` through the engine loop; yield each step's report.

    Row ``b`` draws from ``seeded_sources(decoder.random, request.seeds)[b]`` only (and the
    fused kernel from ``CounterRandom.seeded(request.seeds[b])``), so it emits what its
    batch-1 run with the same options emits wherever the models' logits agree across batch
    sizes. ``tallies``: one :class:`~specdec.engine.stats.StepTally` per row, filled as it goes.

    Raises:
        InvalidConfigError: ``request.top_logprobs`` larger than the target's vocabulary.
    """
    if request.top_logprobs > decoder.target.vocab_size:
        raise InvalidConfigError(f"top_logprobs must be at most the vocabulary size V = {decoder.target.vocab_size}, "
                                 f"got {request.top_logprobs}")
    seeds = list(request.seeds)
    rows = RowsRequest(
        prompts, request.sampling, seeded_sources(decoder.random, seeds), request.max_new_tokens,
        eos=as_eos_ids(request.eos_token_id, decoder.target.vocab_size), kernel=decoder.kernel,
        verify_seeds=seeds, options=decoder.step, compiler=decoder.compiler,
        logits_processor=request.logits_processor, logprobs=request.return_logprobs, what=what, named=batch,
        top_logprobs=request.top_logprobs,
    )
    yield from decode_rows(Roles(decoder.target, decoder.draft, decoder.builder, decoder.verifier), rows, tallies)
