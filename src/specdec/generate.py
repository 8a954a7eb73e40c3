"""Generation: ``SpeculativeGenerator`` and plain decoding, on the one engine loop.

One speculative *step* (:func:`specdec.engine.step.step_rows`), for ``B`` rows (a single
generation is a batch of one):

    roots [B] (each row's last committed token)
      -> build_trees(builder, roots, draft, sampling, rng)  # tree batch on the draft's device
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

from specdec.batch import BatchOutput, collect_batch, plain_decoder
from specdec.drafts.base import DraftModel
from specdec.engine.compiler import StepCompiler
from specdec.engine.dispatch import KERNEL_CHOICES
from specdec.engine.options import StepOptions
from specdec.engine.stats import BatchChunk, GenerationStats, StepTally, StreamChunk
from specdec.errors import InvalidConfigError, VocabMismatchError
from specdec.processors import LogitsProcessorLike
from specdec.request import Decoder, GenerateOptions, Request, stream_request
from specdec.rng import RANDOM_CHOICES
from specdec.targets.base import TargetModel
from specdec.trees.root_only import RootOnlyBuilder

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
        top_logprobs: with ``top_logprobs=n >= 1``, per token the ``n`` largest
            log-probabilities of that same law as ``(id, log-probability)`` pairs, largest
            first; else None.
    """

    tokens: list[int]
    stats: GenerationStats
    stop_reason: str
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None = None


def _stream(
    decoder: Decoder,
    prompt_ids: Sequence[int],
    request: Request,
    tally: StepTally,
    what: str,
    logprob_sink: list[torch.Tensor] | None = None,
    top_sink: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Iterator[StreamChunk]:
    """One row through the engine loop (:func:`specdec.request.stream_request`); yields the tokens
    kept at each step, with the row's acceptance counts so far (:class:`~specdec.engine.stats.StreamChunk`);
    with ``logprob_sink`` (and ``request.return_logprobs``), each step appends the kept tokens'
    log-probabilities there (a device tensor, read by the caller once at the end); with ``top_sink``
    (and ``request.top_logprobs``), the kept tokens' ``[m, n]`` top log-probabilities and ids."""
    for report in stream_request(decoder, [prompt_ids], request, [tally], what=what, batch=False):
        if logprob_sink is not None:
            logprob_sink.append(report.logprobs[0])
        if top_sink is not None:
            top_sink.append(report.top_logprobs[0])
        yield StreamChunk(report.kept[0], tally.counts())


def _generate(
    decoder: Decoder,
    prompt_ids: Sequence[int],
    request: Request,
    callback: Callable[[list[int]], None] | None,
    what: str,
) -> GenerationOutput:
    """:func:`_stream` collected into a :class:`GenerationOutput`, timed from the first call."""
    tally = StepTally()
    start = time.perf_counter()
    tokens: list[int] = []
    sink: list[torch.Tensor] | None = [] if request.return_logprobs else None
    top_sink: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if request.top_logprobs > 0 else None
    for chunk in _stream(decoder, prompt_ids, request, tally, what, sink, top_sink):
        tokens.extend(chunk)
        if callback is not None and chunk:
            callback(chunk)
    logprobs, top = _read_logprobs(sink, top_sink, request.top_logprobs)
    total = time.perf_counter() - start
    return GenerationOutput(tokens=tokens, stats=tally.stats(len(tokens), total), stop_reason=tally.stop_reason,
                            logprobs=logprobs, top_logprobs=top)


def _read_logprobs(
    sink: list[torch.Tensor] | None, top_sink: list[tuple[torch.Tensor, torch.Tensor]] | None, n: int,
) -> tuple[tuple[float, ...] | None, tuple[tuple[tuple[int, float], ...], ...] | None]:
    """The one read of every step's log-probabilities (and top-``n`` values and ids, packed
    in the same ``[N, 1 + 2n]`` float64 tensor: ids below 2**53 are exact): the output's fields."""
    if sink is None:
        return None, None
    if not sink:
        return (), (() if top_sink is not None else None)
    if top_sink is None:
        return tuple(torch.cat(sink).to("cpu", torch.float64).tolist()), None
    values = torch.cat([v for v, _ in top_sink])  # [N, n] float64
    ids = torch.cat([i for _, i in top_sink]).to(torch.float64)  # [N, n]
    packed = torch.cat([torch.cat(sink).to(values.device, torch.float64).unsqueeze(1), values, ids], dim=1)
    host = packed.to("cpu").tolist()  # [N][1 + 2n]
    logprobs = tuple(row[0] for row in host)
    top = tuple(tuple((int(row[1 + n + j]), row[1 + j]) for j in range(n)) for row in host)
    return logprobs, top


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

    def _decoder(self) -> Decoder:
        """The composition and step settings a call runs with (read at each call: they are attributes)."""
        return Decoder(self.target, self.draft, self.builder, self.verifier, self.kernel, self.compiler,
                       self.random, self.options)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int | None = None,
        sampling: Any = None,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        callback: Callable[[list[int]], None] | None = None,
        *,
        seeds: Sequence[int] | None = None,
        logits_processor: LogitsProcessorLike | None = None,
        return_logprobs: bool = False,
        top_logprobs: int = 0,
    ) -> GenerationOutput:
        """Generate up to ``max_new_tokens`` new tokens after ``prompt_ids``.

        The output law equals the target's (sampled with ``sampling``, after
        ``logits_processor``) exactly. Every generation entry point takes these
        arguments with this meaning (:mod:`specdec.request`).

        Args:
            prompt_ids: the prompt's token ids (non-empty).
            max_new_tokens: positive number of tokens to produce (may be left
                out when ``sampling`` is a GenerationConfig that gives a length).
            sampling: a :class:`~specdec.sampling.SamplingConfig` (default:
                temperature 1) or a ``transformers.GenerationConfig``
                (:func:`specdec.hf_generation.from_generation_config`: its
                sampling, lengths, EOS and the processors it implies).
            seed: seeds the one generator behind every random draw (None: from entropy).
            eos_token_id: id(s) that end generation (kept in the output).
            callback: called with each step's new tokens as they are emitted.
            seeds: ``[seed]``, the batch form (one int per prompt); not with ``seed``.
            logits_processor: transformers' ``LogitsProcessorList`` (or any
                callable ``(input_ids [b, len], scores [b, V]) -> [b, V]``),
                applied to the target's logits at every tree node with that
                node's own context, before temperature / top-k / top-p
                (:mod:`specdec.processors`; docs/generation.md, "Logits processors").
            return_logprobs: fill :attr:`GenerationOutput.logprobs` (docs/generation.md, "Log-probabilities").
            top_logprobs: ``n >= 1``: also fill :attr:`GenerationOutput.top_logprobs` (and
                ``logprobs``): per token the ``n`` largest log-probabilities of its law, with ids.
        """
        options = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor, return_logprobs,
                                  top_logprobs)
        request = options.resolve([prompt_ids], self.target.device, batch=False)
        return _generate(self._decoder(), prompt_ids, request, callback, "SpeculativeGenerator.generate")

    def stream(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int | None = None,
        sampling: Any = None,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        seeds: Sequence[int] | None = None,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> Iterator[StreamChunk]:
        """Yield each step's new tokens as soon as they are verified (arguments as :meth:`generate`): a list,
        with ``.acceptance``, the request's per-position counts so far (:class:`~specdec.engine.stats.StreamChunk`)."""
        options = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor)
        request = options.resolve([prompt_ids], self.target.device, batch=False)
        yield from _stream(self._decoder(), prompt_ids, request, StepTally(), "SpeculativeGenerator.stream")

    def stream_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | None = None,
        sampling: Any = None,
        seeds: Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        seed: int | None = None,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> Iterator[BatchChunk]:
        """Decode every prompt at once (batched); yield ``{row: new tokens}``
        after each step, with ``.acceptance``, each stepped row's per-position counts so far
        (:class:`~specdec.engine.stats.BatchChunk`; :func:`specdec.batch.speculative_stream_batch`: the
        requirements and the per-row guarantees; arguments as :meth:`generate_batch`)."""
        self._check_batch_options()
        request = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor).resolve(
            prompts, self.target.device, batch=True)
        tallies = [StepTally() for _ in prompts]
        for report in stream_request(self._decoder(), prompts, request, tallies,
                                     what="SpeculativeGenerator.generate_batch", batch=True):
            yield BatchChunk.of(report.kept, tallies)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | None = None,
        sampling: Any = None,
        seeds: Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        seed: int | None = None,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> BatchOutput:
        """:meth:`stream_batch`, collected: a :class:`~specdec.batch.BatchOutput`
        (one tuple of new tokens per prompt, in order; per-row stop reasons;
        steps, tau and throughput summed over the rows).

        The arguments are :meth:`generate`'s, per prompt: ``seeds`` gives one int per
        prompt, or ``seed=s`` the seeds ``s, s + 1, ...`` (not both; neither: ``0 .. B - 1``).
        Each row's output law is the target's, and row ``b`` draws only from its own seed,
        so it equals the row's :meth:`generate` with that seed (and the same
        ``logits_processor`` or ``GenerationConfig``) wherever the models' logits agree
        across batch sizes (at T = 0: token for token). ``kernel`` and
        ``random`` apply as in :meth:`generate`, per row: with the kernel, one
        launch verifies every row's tree, each row on its own counter stream
        (docs/generation.md, "Batched decoding"); ``compile=`` is refused.

        ``logits_processor`` runs on every row's tree nodes, each in its own row's context
        (docs/generation.md, "Logits processors"); a ``GenerationConfig`` maps as in
        :meth:`generate`, for every prompt alike (one that counts from the prompt's length is
        refused for prompts of different lengths:
        :func:`~specdec.hf_generation.from_generation_config_rows`).

        ``sampling`` may be one :class:`~specdec.sampling.SamplingConfig` per row (temperature,
        top-k and top-p of each request): row ``b`` is drafted and verified under
        ``sampling[b]``, its law is that configuration's, and it emits what its batch-1
        :meth:`generate` with ``sampling[b]`` and ``seeds[b]`` emits wherever the models'
        logits agree across batch sizes (docs/generation.md, "Per-request sampling"; verified
        on the torch path, ``kernel="triton"`` is refused for such a batch)."""
        self._check_batch_options()
        request = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor).resolve(
            prompts, self.target.device, batch=True)
        decoder = self._decoder()
        return collect_batch(
            lambda tallies: (report.kept for report in stream_request(
                decoder, prompts, request, tallies, what="SpeculativeGenerator.generate_batch",
                batch=True)),
            len(prompts),
        )

    def _check_batch_options(self) -> None:
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
    seeds: Sequence[int] | None = None,
    logits_processor: LogitsProcessorLike | None = None,
    return_logprobs: bool = False,
    top_logprobs: int = 0,
) -> GenerationOutput:
    """Plain decoding from the target: the baseline and the reference law.

    The same loop as :class:`SpeculativeGenerator` with a root-only tree: each
    step draws one token from the processed ``p`` (``argmax`` at temperature 0).
    The arguments (``seed`` / ``seeds``, ``sampling``, ``logits_processor``,
    ``return_logprobs``, ``top_logprobs``) as in :meth:`SpeculativeGenerator.generate` (the processor
    sees the sequence so far).
    """
    model = _as_target(target)
    options = GenerateOptions(max_new_tokens, sampling, seed, seeds, eos_token_id, logits_processor, return_logprobs,
                              top_logprobs)
    request = options.resolve([prompt_ids], model.device, batch=False)
    return _generate(plain_decoder(model), prompt_ids, request, callback, "autoregressive_generate")
