"""Generation: ``SpeculativeGenerator`` and plain decoding, on the one engine loop.

One speculative *step* (:func:`specdec.engine.step.run_step`), for ``B`` rows (a single
generation is a batch of one):

    roots [B] (each row's last committed token)
      -> builder.build_batch(roots, draft, sampling, rng)  # tree batch on the draft's device
      -> target.score_batch(tree) -> logits [B, n, V]      # one target forward
      -> the dispatched verification                       # tensor rule, fused kernel or walk
      -> one host read                                     # accepted paths + bonus tokens
      -> commit_step: target.accept_rows, draft.commit_rows  # caches follow the accepted paths

*tau* (mean accepted length) is the mean over steps of (accepted drafts + 1
bonus), i.e. tokens emitted per target forward. Plain autoregressive decoding
is the same loop with a root-only tree, so the baseline and the speculative
methods share every line that touches the target's law.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch

from specdec.batch import BatchOutput, collect_batch, speculative_stream_batch
from specdec.drafts.base import DraftModel
from specdec.engine.compiler import StepCompiler
from specdec.engine.dispatch import KERNEL_CHOICES
from specdec.engine.loop import check_prompts, run_rows
from specdec.engine.options import StepOptions
from specdec.engine.stats import GenerationStats, StepTally
from specdec.errors import InvalidConfigError, VocabMismatchError
from specdec.inputs import as_eos_ids, as_seed, as_token_ids
from specdec.processors import LogitsProcessorLike, check_processor
from specdec.rng import RANDOM_CHOICES, seeded_sources
from specdec.sampling import SamplingConfig
from specdec.targets.base import TargetModel
from specdec.trees.base import TreeBuilder
from specdec.trees.root_only import RootOnlyBuilder
from specdec.verify.base import Verifier

__all__ = [
    "GenerationOutput",
    "GenerationStats",
    "RANDOM_CHOICES",
    "SpeculativeGenerator",
    "StepTally",
    "autoregressive_generate",
    "RootOnlyBuilder",
]


@attrs.frozen
class GenerationOutput:
    """Result of :meth:`SpeculativeGenerator.generate`.

    Attributes:
        tokens: the new tokens (prompt excluded).
        stats: :class:`GenerationStats`.
        stop_reason: ``"eos"`` or ``"length"``.
        logprobs: with ``return_logprobs=True``, one float per token: its
            log-probability under the processed target law it was drawn from
            (docs/generation.md, "Log-probabilities"); else None.
    """

    tokens: list[int]
    stats: GenerationStats
    stop_reason: str
    logprobs: tuple[float, ...] | None = None


def _stream(
    target: TargetModel,
    draft: DraftModel | None,
    builder: TreeBuilder,
    verifier: Verifier,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int | None,
    eos_token_id: int | Sequence[int] | None,
    tally: StepTally,
    kernel: str = "auto",
    compiler: StepCompiler | None = None,
    random: str = "torch",
    what: str = "a generation",
    logits_processor: LogitsProcessorLike | None = None,
    logprob_sink: list[torch.Tensor] | None = None,
    options: StepOptions | None = None,
) -> Iterator[list[int]]:
    """One row through the engine loop (:func:`specdec.engine.loop.run_rows`); yields the tokens
    kept at each step; with ``logprob_sink``, each step appends the kept tokens'
    log-probabilities there (a device tensor, read by the caller once at the end)."""
    seed = as_seed(seed)
    for report in run_rows(
        target, draft, builder, verifier, [prompt_ids], sampling, seeded_sources(random, [seed]),
        max_new_tokens=max_new_tokens, eos=as_eos_ids(eos_token_id, target.vocab_size), kernel=kernel, verify_seeds=[seed],
        options=options, compiler=compiler, logits_processor=check_processor(logits_processor),
        logprobs=logprob_sink is not None, tallies=[tally], what=what,
    ):
        if logprob_sink is not None:
            logprob_sink.append(report.logprobs[0])
        yield report.kept[0]


def _generate(
    target: TargetModel,
    draft: DraftModel | None,
    builder: TreeBuilder,
    verifier: Verifier,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingConfig,
    seed: int | None,
    eos_token_id: int | Sequence[int] | None,
    callback: Callable[[list[int]], None] | None,
    kernel: str = "auto",
    compiler: StepCompiler | None = None,
    random: str = "torch",
    what: str = "a generation",
    logits_processor: LogitsProcessorLike | None = None,
    return_logprobs: bool = False,
    options: StepOptions | None = None,
) -> GenerationOutput:
    tally = StepTally()
    start = time.perf_counter()
    tokens: list[int] = []
    sink: list[torch.Tensor] | None = [] if return_logprobs else None
    for chunk in _stream(target, draft, builder, verifier, prompt_ids, max_new_tokens, sampling, seed,
                         eos_token_id, tally, kernel, compiler, random, what, logits_processor, sink, options):
        tokens.extend(chunk)
        if callback is not None and chunk:
            callback(chunk)
    logprobs = None
    if sink is not None:  # the one read of every step's log-probabilities
        logprobs = tuple(torch.cat(sink).to("cpu", torch.float64).tolist()) if sink else ()
    total = time.perf_counter() - start
    return GenerationOutput(tokens=tokens, stats=tally.stats(len(tokens), total), stop_reason=tally.stop_reason,
                            logprobs=logprobs)


def _chain(first: LogitsProcessorLike, then: LogitsProcessorLike) -> LogitsProcessorLike:
    def chained(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return then(input_ids, first(input_ids, scores))

    return chained


def _resolve(
    sampling: Any,
    max_new_tokens: int | None,
    eos_token_id: int | Sequence[int] | None,
    logits_processor: Any,
    prompt_ids: Sequence[int],
    target: TargetModel,
) -> tuple[SamplingConfig, Any, Any, LogitsProcessorLike | None]:
    """``(sampling, max_new_tokens, eos_token_id, logits_processor)`` from the
    caller's arguments: ``sampling`` may be a ``SamplingConfig``, None
    (temperature 1) or a ``transformers.GenerationConfig``
    (:mod:`specdec.hf_generation`: its processors run first, then the caller's)."""
    from specdec.hf_generation import from_generation_config, is_generation_config

    processor = check_processor(logits_processor)
    if sampling is None:
        return SamplingConfig(), max_new_tokens, eos_token_id, processor
    if not is_generation_config(sampling):
        return sampling, max_new_tokens, eos_token_id, processor
    hf = from_generation_config(sampling, len(as_token_ids(prompt_ids)), max_new_tokens=max_new_tokens,
                                eos_token_id=eos_token_id, device=target.device)
    implied = check_processor(hf.processors)
    if implied is not None:
        processor = implied if processor is None else _chain(implied, processor)
    return hf.sampling, hf.max_new_tokens, hf.eos_token_id, processor


def _is_hf_model(model: Any) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, PreTrainedModel)


def _as_target(model: Any, capture_layers: tuple[int, ...] = ()) -> TargetModel:
    if isinstance(model, TargetModel):
        captured = tuple(model.capture_layers)
        if capture_layers and captured != capture_layers:
            raise InvalidConfigError(
                f"the draft needs the target's hidden states {capture_layers}, but the target captures {captured}: "
                f"build it with HFTarget(model, capture_layers={capture_layers}) or pass the Hugging Face model itself"
            )
        return model
    if _is_hf_model(model):
        from specdec.targets.hf import HFTarget

        return HFTarget(model, capture_layers=capture_layers)
    raise InvalidConfigError(f"target must be a TargetModel or a transformers PreTrainedModel, got {type(model).__name__}")


def _as_draft(model: Any) -> DraftModel | None:
    if model is None or isinstance(model, DraftModel):
        return model
    if _is_hf_model(model):
        from specdec.drafts.hf import HFDraft

        return HFDraft(model)
    raise InvalidConfigError(f"draft must be a DraftModel or a transformers PreTrainedModel, got {type(model).__name__}")




class SpeculativeGenerator:
    """Lossless speculative generation with a named method or an explicit composition.

    Args:
        target: a :class:`~specdec.targets.base.TargetModel` or a Hugging Face
            causal LM (wrapped in :class:`~specdec.targets.hf.HFTarget`).
        draft: a :class:`~specdec.drafts.base.DraftModel` or a Hugging Face
            causal LM (wrapped in :class:`~specdec.drafts.hf.HFDraft`).
        method: registered method name (``specdec list method``; default
            ``"rheo"``), or None to compose ``tree`` (and ``verifier``) by name.
        tree: tree builder name, when composing (overrides the method's). Given
            without ``verifier``, it is composed with the builder's own
            ``default_verifier``, never the method's verifier (a builder
            without one is an error listing the verifiers that fit).
        verifier: verifier name, when composing (overrides the method's).
            Given without ``tree``, it is composed with the method's tree (the
            default method's, ``rheo``, unless ``method`` names another); errors
            say so. The rule in full: :func:`specdec.methods.resolve_composition`.
        kernel: ``"auto"`` (default: the fused Triton verification kernel when
            Triton is installed and the target's logits are on CUDA, the torch
            reference otherwise), ``"torch"`` or ``"triton"`` (an error where
            it cannot run); see ``docs/kernels.md``. The path taken is in
            ``GenerationStats.kernel_path``.
        compile: ``True`` (the ``inductor`` backend) or a ``torch.compile``
            backend name: run the step's verification and the level-wise
            builders' level functions compiled as whole graphs
            (:class:`~specdec.engine.compiler.StepCompiler`). Default False. The law is the
            same; Rheo's sampled slots then read the random stream in another
            order, so seeded outputs differ from an uncompiled run.
        random: ``"torch"`` (default: draws from a seeded ``torch.Generator``)
            or ``"counter"``: every draw of builder and verifier comes from one
            :class:`~specdec.rng.CounterRandom` stream keyed by (walk, node,
            draw), the stream the fused Triton kernel draws from, so that
            ``kernel="torch"`` and ``kernel="triton"`` emit the same tokens for
            a seed (tested). It costs some 300 small integer ops per table
            (Philox in torch ops; ``compile=True`` fuses them).
        options: :class:`~specdec.engine.options.StepOptions` (validate mode, the tensor
            rule's rows, the clock); default ``StepOptions()``.
        **method_options: tree builder parameters overriding the defaults.

    Example:
        >>> import torch, specdec
        >>> from specdec.models import CallableLM
        >>> lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)
        >>> gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method="sd", depth=3)
        >>> out = gen.generate([0], max_new_tokens=8, sampling=specdec.SamplingConfig(temperature=1.0), seed=0)
        >>> len(out.tokens), out.stats.tau > 1
        (8, True)
    """

    def __init__(
        self,
        target: Any,
        draft: Any,
        method: str | None = "rheo",
        *,
        tree: str | None = None,
        verifier: str | None = None,
        kernel: str = "auto",
        compile: bool | str = False,
        random: str = "torch",
        options: StepOptions | None = None,
        **method_options: Any,
    ) -> None:
        from specdec.methods import resolve_composition

        if kernel not in KERNEL_CHOICES:
            raise InvalidConfigError(f"kernel must be one of {', '.join(KERNEL_CHOICES)}, got {kernel!r}")
        self.kernel = kernel
        if random not in RANDOM_CHOICES:
            raise InvalidConfigError(f"random must be one of {', '.join(RANDOM_CHOICES)}, got {random!r}")
        self.random = random
        if options is not None and not isinstance(options, StepOptions):
            raise InvalidConfigError(f"options must be a StepOptions, got {type(options).__name__}")
        self.options = options
        if compile is True:
            compile = "inductor"
        if compile is not False and not (isinstance(compile, str) and compile):
            raise InvalidConfigError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")
        # torch.compile(fullgraph=True) of the step's verification and level functions (docs/kernels.md)
        self.compiler = StepCompiler(compile) if compile else None

        self.draft = _as_draft(draft)
        # a feature-level draft (EAGLE) needs the target to capture its layers
        layers = tuple(self.draft.target_layers) if self.draft is not None and self.draft.needs_target_hidden else ()
        self.target = _as_target(target, capture_layers=layers)
        if self.draft is None:
            raise InvalidConfigError("a draft model is required (use autoregressive_generate for plain decoding)")
        if self.draft.vocab_size != self.target.vocab_size:
            raise VocabMismatchError(
                f"the draft's vocabulary ({self.draft.vocab_size}) differs from the target's ({self.target.vocab_size})"
            )
        for name, value in (("method", method), ("tree", tree), ("verifier", verifier)):
            if value is not None and not isinstance(value, str):
                raise InvalidConfigError(f"{name} must be a registered name (a str) or None, got {type(value).__name__} {value!r}")
        # the composition rule: specdec.methods.resolve_composition (docs/generation.md)
        self.method_name, self.builder, self.verifier = resolve_composition(method, tree, verifier, method_options)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int | None = None,
        sampling: Any = None,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        callback: Callable[[list[int]], None] | None = None,
        *,
        logits_processor: LogitsProcessorLike | None = None,
        return_logprobs: bool = False,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` new tokens after ``prompt_ids``.

        The output law equals the target's (sampled with ``sampling``, after
        ``logits_processor``) exactly.

        Args:
            prompt_ids: the prompt's token ids (non-empty).
            max_new_tokens: positive number of tokens to produce (may be left
                out when ``sampling`` is a GenerationConfig that gives a length).
            sampling: a :class:`~specdec.sampling.SamplingConfig` (default:
                temperature 1) or a ``transformers.GenerationConfig``
                (:func:`specdec.hf_generation.from_generation_config`: its
                sampling, lengths, EOS and the processors it implies).
            seed: seeds the one generator behind every random draw.
            eos_token_id: id(s) that end generation (kept in the output).
            callback: called with each step's new tokens as they are emitted.
            logits_processor: transformers' ``LogitsProcessorList`` (or any
                callable ``(input_ids [b, len], scores [b, V]) -> [b, V]``),
                applied to the target's logits at every tree node with that
                node's own context, before temperature / top-k / top-p
                (:mod:`specdec.processors`; docs/generation.md, "Logits processors").
            return_logprobs: fill :attr:`GenerationOutput.logprobs` (docs/generation.md, "Log-probabilities").
        """
        sampling, max_new_tokens, eos_token_id, processor = _resolve(sampling, max_new_tokens, eos_token_id,
                                                                     logits_processor, prompt_ids, self.target)
        return _generate(self.target, self.draft, self.builder, self.verifier, prompt_ids, max_new_tokens,
                         sampling, seed, eos_token_id, callback, self.kernel, self.compiler,
                         self.random, "SpeculativeGenerator.generate", processor, return_logprobs, self.options)

    def stream(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int | None = None,
        sampling: Any = None,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> Iterator[list[int]]:
        """Yield each step's new tokens as soon as they are verified (arguments as :meth:`generate`)."""
        sampling, max_new_tokens, eos_token_id, processor = _resolve(sampling, max_new_tokens, eos_token_id,
                                                                     logits_processor, prompt_ids, self.target)
        yield from _stream(self.target, self.draft, self.builder, self.verifier, prompt_ids, max_new_tokens,
                           sampling, seed, eos_token_id, StepTally(), self.kernel, self.compiler,
                           self.random, "SpeculativeGenerator.stream", processor, options=self.options)

    def stream_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingConfig | Sequence[SamplingConfig] | None = None,
        seeds: Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> Iterator[dict[int, list[int]]]:
        """Decode every prompt at once (batched); yield ``{row: new tokens}``
        after each step (:func:`specdec.batch.speculative_stream_batch`: the
        requirements and the per-row guarantees). Logits processors are not
        supported with batches yet (an :class:`~specdec.errors.InvalidConfigError`)."""
        self._check_batch_options(logits_processor, sampling)
        yield from speculative_stream_batch(self.target, self.draft, self.builder, self.verifier, prompts,
                                            max_new_tokens, (SamplingConfig() if sampling is None else sampling), seeds, eos_token_id,
                                            kernel=self.kernel, random=self.random, options=self.options)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingConfig | Sequence[SamplingConfig] | None = None,
        seeds: Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> BatchOutput:
        """:meth:`stream_batch`, collected: a :class:`~specdec.batch.BatchOutput`
        (one tuple of new tokens per prompt, in order; per-row stop reasons;
        steps, tau and throughput summed over the rows).

        Each row's output law is the target's, and row ``b`` draws only from
        ``seeds[b]`` (default ``0 .. B - 1``), so it equals the row's
        :meth:`generate` with that seed wherever the models' logits agree
        across batch sizes (at T = 0: token for token). ``kernel`` and
        ``random`` apply as in :meth:`generate`, per row: with the kernel, one
        launch verifies every row's tree, each row on its own counter stream
        (docs/generation.md, "Batched decoding"); ``compile=`` is refused.

        ``sampling`` may be one :class:`~specdec.sampling.SamplingConfig` per row (temperature,
        top-k and top-p of each request): row ``b`` is drafted and verified under
        ``sampling[b]``, its law is that configuration's, and it emits what its batch-1
        :meth:`generate` with ``sampling[b]`` and ``seeds[b]`` emits wherever the models'
        logits agree across batch sizes (docs/generation.md, "Per-request sampling"; verified
        on the torch path, ``kernel="triton"`` is refused for such a batch)."""
        self._check_batch_options(logits_processor, sampling)
        check_prompts(prompts)
        return collect_batch(
            lambda tallies: speculative_stream_batch(self.target, self.draft, self.builder, self.verifier, prompts,
                                                     max_new_tokens, (SamplingConfig() if sampling is None else sampling),
                                                     seeds, eos_token_id, kernel=self.kernel, random=self.random,
                                                     options=self.options, _tallies=tallies),
            len(prompts),
        )

    def _check_batch_options(self, logits_processor: Any = None, sampling: Any = None) -> None:
        from specdec.hf_generation import is_generation_config

        if check_processor(logits_processor) is not None or is_generation_config(sampling):
            raise InvalidConfigError(
                "batched generation (generate_batch, stream_batch) does not apply logits processors or "
                "take a GenerationConfig yet: each row would need its own contexts; decode the prompts "
                "one at a time with generate(..., logits_processor=) (docs/generation.md, \"Logits processors\")"
            )
        if self.compiler is not None:
            raise InvalidConfigError(
                "batched generation does not compile the step yet: compile= is not supported with batches "
                "(kernel= and random= are: the fused kernel verifies every row in one launch)"
            )


def autoregressive_generate(
    target: Any,
    prompt_ids: Sequence[int],
    max_new_tokens: int | None = None,
    sampling: Any = None,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    callback: Callable[[list[int]], None] | None = None,
    *,
    logits_processor: LogitsProcessorLike | None = None,
    return_logprobs: bool = False,
) -> GenerationOutput:
    """Plain decoding from the target: the baseline and the reference law.

    The same loop as :class:`SpeculativeGenerator` with a root-only tree: each
    step draws one token from the processed ``p`` (``argmax`` at temperature 0).
    ``sampling``, ``logits_processor`` and ``return_logprobs`` as in
    :meth:`SpeculativeGenerator.generate` (the processor sees the sequence so far).
    """
    from specdec.registry import get

    model = _as_target(target)
    sampling, max_new_tokens, eos_token_id, processor = _resolve(sampling, max_new_tokens, eos_token_id,
                                                                 logits_processor, prompt_ids, model)
    verifier = get("verifier", "match")()  # with no children: the bonus is drawn from p itself
    return _generate(model, None, RootOnlyBuilder(model.vocab_size), verifier, prompt_ids, max_new_tokens,
                     sampling, seed, eos_token_id, callback, what="autoregressive_generate",
                     logits_processor=processor, return_logprobs=return_logprobs)
