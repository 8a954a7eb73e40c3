"""The generation loop: draft a tree, score it with the target, verify, commit.

One speculative *step* (:func:`specdec.step.speculative_step`)::

    root (last committed token)
      -> builder.build_batch(root, draft, sampling, rng)  # tree batch on the draft's device
      -> target.score_batch(tree) -> logits [1, n, V]     # one target forward
      -> p = process_logits(logits, sampling)             # the target law at every node
      -> every node decided at once, one host read        # accepted path + bonus
      -> commit_step: target.accept(...), draft.commit(...)  # caches follow the accepted path

*tau* (mean accepted length) is the mean over steps of (accepted drafts + 1
bonus), i.e. tokens emitted per target forward. Plain autoregressive decoding
is the same loop with a root-only tree, so the baseline and the speculative
methods share every line that touches the target's law.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.errors import ContextOverflowError, InvalidConfigError, VocabMismatchError
from specdec.inputs import as_eos_ids, as_seed, as_token_ids
from specdec.kernels.select import triton_available
from specdec.kernels.verify_fused import StepVerifier
from specdec.lease import hold
from specdec.regions import model_call
from specdec.rng import CounterRandom, RandomSource, TorchRandom
from specdec.processors import LogitsProcessorLike, check_processor, process_host_tree
from specdec.sampling import SamplingConfig, process_logits
from specdec.step import StepCompiler, StepOutcome, commit_step, emitted_logprobs, speculative_step, step_supported
from specdec.targets.base import TargetModel
from specdec.tree import DraftTree, NodeKind
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier, VerifyResult

if TYPE_CHECKING:
    from specdec.batch import BatchOutput

__all__ = [
    "GenerationOutput",
    "GenerationStats",
    "SpeculativeGenerator",
    "StepTally",
    "autoregressive_generate",
    "RootOnlyBuilder",
]


@attrs.frozen
class GenerationStats:
    """Honest accounting of one generation.

    Attributes:
        steps: number of speculative steps (= target tree forwards).
        new_tokens: tokens returned (after EOS / length truncation).
        emitted: tokens the verifier emitted, accepted + bonus, before truncation.
        accepted: draft tokens accepted, summed over steps.
        depth_attempted: ``[D]`` count of steps in which a draft at depth ``d+1`` was tested.
        depth_accepted: ``[D]`` count of steps in which the draft at depth ``d+1`` was accepted.
        tree_nodes: total tree nodes scored by the target (root included).
        time_prefill, time_draft, time_target, time_verify, time_total: seconds.
            ``time_draft`` covers tree building (draft forwards included);
            ``time_verify`` covers processing the target logits and verification.
        kernel_path: how logits processing + verification ran: ``"torch"``
            (the step path, :mod:`specdec.step`: the verifier's parallel rule
            in torch, or its walk), ``"triton"`` (the fused kernel,
            :mod:`specdec.kernels.verify_fused`) or ``"torch+triton"`` if steps differed.
        clock: what measured the step path's time split: ``"perf_counter"``
            (host clock) or ``"cuda_events"`` (a target on CUDA;
            :data:`specdec.step.CLOCKS`).
    """

    steps: int
    new_tokens: int
    emitted: int
    accepted: int
    depth_attempted: tuple[int, ...]
    depth_accepted: tuple[int, ...]
    tree_nodes: int
    time_prefill: float
    time_draft: float
    time_target: float
    time_verify: float
    time_total: float
    kernel_path: str = "torch"
    clock: str = "perf_counter"

    @property
    def target_forwards(self) -> int:
        """Target forwards over trees (prefill excluded); one per step."""
        return self.steps

    @property
    def tau(self) -> float:
        """Mean accepted length: mean over steps of (accepted drafts + 1 bonus)."""
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def acceptance_by_depth(self) -> tuple[float, ...]:
        """Per depth ``d`` (1-based index ``d-1``): P(draft at depth d accepted | a draft at depth d was tested)."""
        return tuple(a / t if t else 0.0 for a, t in zip(self.depth_accepted, self.depth_attempted))

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of total generation time (prefill included)."""
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, derived metrics included."""
        out = attrs.asdict(self)
        out.update(
            tau=self.tau,
            target_forwards=self.target_forwards,
            acceptance_by_depth=list(self.acceptance_by_depth),
            tokens_per_second=self.tokens_per_second,
        )
        return out


@attrs.define
class StepTally:
    """Running totals over a generation's steps, typed (the loops' accounting;
    :meth:`stats` makes the frozen :class:`GenerationStats`).

    Attributes:
        steps: steps taken (target tree forwards).
        tree_nodes: nodes scored, roots included.
        emitted: tokens the verifier emitted (accepted + bonus), before truncation.
        accepted: accepted draft tokens.
        depth_attempted, depth_accepted: per depth ``d`` (0-based), steps whose
            walk reached depth ``d`` with children to test, and steps that accepted one there.
        time_prefill, time_draft, time_target, time_verify: seconds per part.
        stop_reason: ``"length"`` or ``"eos"``.
        kernel_path: the verification path of the last step.
        clock: how the times were measured (:data:`specdec.step.CLOCKS`).
    """

    steps: int = 0
    tree_nodes: int = 0
    emitted: int = 0
    accepted: int = 0
    depth_attempted: list[int] = attrs.field(factory=list)
    depth_accepted: list[int] = attrs.field(factory=list)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_target: float = 0.0
    time_verify: float = 0.0
    stop_reason: str = "length"
    kernel_path: str = "torch"
    clock: str = "perf_counter"

    def record(self, result: VerifyResult, tree_nodes: int, time_draft: float, time_target: float, time_verify: float) -> None:
        """Add one step's outcome."""
        self.steps += 1
        self.tree_nodes += tree_nodes
        self.emitted += len(result.tokens)
        self.accepted += result.num_accepted
        self.time_draft += time_draft
        self.time_target += time_target
        self.time_verify += time_verify
        while len(self.depth_attempted) < result.attempted_depths:
            self.depth_attempted.append(0)
            self.depth_accepted.append(0)
        for d in range(result.attempted_depths):
            self.depth_attempted[d] += 1
            self.depth_accepted[d] += int(d < result.num_accepted)

    def stats(self, new_tokens: int, time_total: float) -> GenerationStats:
        """The :class:`GenerationStats` of these totals."""
        return GenerationStats(
            steps=self.steps, new_tokens=new_tokens, emitted=self.emitted, accepted=self.accepted,
            depth_attempted=tuple(self.depth_attempted), depth_accepted=tuple(self.depth_accepted),
            tree_nodes=self.tree_nodes, time_prefill=self.time_prefill, time_draft=self.time_draft,
            time_target=self.time_target, time_verify=self.time_verify, time_total=time_total,
            kernel_path=self.kernel_path, clock=self.clock,
        )


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


class RootOnlyBuilder(TreeBuilder):
    """The empty draft: a tree holding only the root (plain autoregressive decoding)."""

    registry_name = "root-only"
    produces = frozenset()

    @property
    def max_nodes(self) -> int:
        return 1

    @property
    def max_depth(self) -> int:
        return 0

    def build(self, root_token: int, draft: DraftModel | None, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        return DraftTree(
            tokens=[root_token], parents=[-1], kinds=[int(NodeKind.ROOT)], draw_order=[0],
            weights=[1.0], law_index=[-1], laws=(), vocab_size=self._vocab_size,
        )

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size


def _check_prompt(prompt_ids: Sequence[int], vocab_size: int) -> list[int]:
    prompt = as_token_ids(prompt_ids)  # one flat sequence of integer ids, or a clear error (specdec.inputs)
    if not prompt:
        raise InvalidConfigError("the prompt is empty: give at least one token id")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise InvalidConfigError(f"prompt token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    return prompt


def _check_length(prompt_len: int, max_new_tokens: int, tree_depth: int, limit: int | None, who: str) -> None:
    """The deepest tree node of the last step sits at position
    ``prompt_len + max_new_tokens - 2 + tree_depth``; it must exist."""
    if limit is None:
        return
    need = prompt_len + max_new_tokens - 1 + tree_depth
    if need > limit:
        raise ContextOverflowError(
            f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 + tree depth ({tree_depth}) = {need} "
            f"positions exceed the {who}'s context of {limit} tokens"
        )


def _run(
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
) -> Iterator[list[int]]:
    """The step loop; yields the tokens kept at each step. ``what`` names the
    call in a :class:`~specdec.errors.ModelBusyError` of a later caller.
    ``logits_processor`` is applied to every tree node's target logits in
    its own context (:mod:`specdec.processors`); with ``logprob_sink``, each
    step appends the kept tokens' log-probabilities there (a device tensor,
    read by the caller once at the end)."""
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
        raise InvalidConfigError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(sampling, SamplingConfig):
        raise InvalidConfigError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    vocab = target.vocab_size
    if draft is not None and draft.vocab_size != vocab:
        raise VocabMismatchError(f"the draft's vocabulary ({draft.vocab_size}) differs from the target's ({vocab})")
    prompt = _check_prompt(prompt_ids, vocab)
    _check_length(len(prompt), max_new_tokens, builder.max_depth, target.max_length, "target")
    if draft is not None:
        _check_length(len(prompt), max_new_tokens, builder.max_depth, getattr(draft, "max_length", None), "draft")
    eos: set[int] = as_eos_ids(eos_token_id)
    seed = as_seed(seed)
    logits_processor = check_processor(logits_processor)
    # the committed sequence (prompt + emitted), on the target's device: every node's context starts with it
    context = torch.tensor(prompt, dtype=torch.int64, device=_target_device(target)) if logits_processor is not None else None
    verifier.check_sampling(sampling)  # temperature-dependent compatibility, before any forward
    rng: RandomSource = TorchRandom.seeded(seed) if random == "torch" else CounterRandom.seeded(seed)
    # the step (specdec.step: the verifier's parallel rule, or its walk for a verifier without one),
    # or, with kernel="triton" (or "auto" on CUDA with Triton), the fused Triton kernel (specdec.kernels)
    step_verifier = StepVerifier(verifier, sampling, seed, kernel)
    tensor_step = kernel != "triton" and not (
        kernel == "auto" and triton_available() and _on_cuda(target) and step_supported(verifier, rng)
    )
    clock_kind = "cuda_events" if tensor_step and _on_cuda(target) else "perf_counter"
    tally.clock = clock_kind
    clock = time.perf_counter
    t0 = clock()
    # one generation per model at a time (specdec.lease): a second call while this one is open
    # (an unfinished stream, another thread) gets a ModelBusyError instead of corrupting the caches
    with hold(what, target=target, draft=draft):
        # size the preallocated KV caches once (HFTarget, HFDraft, EAGLE heads): the committed context
        # plus one step's tree nodes (the target's forward caches all of them before compaction)
        positions = len(prompt) + max_new_tokens + builder.max_nodes + builder.max_depth
        target.reserve(positions)
        if draft is not None:
            draft.reserve(positions)
        with torch.inference_mode():
            target.prefill(prompt)
            if draft is not None and draft.needs_target_hidden:
                # feature-level drafts (EAGLE) start from the target's prompt features
                draft.begin(prompt, target_hidden=target.hidden_states())
            elif draft is not None:
                draft.begin(prompt)
        tally.time_prefill += clock() - t0
        root = prompt[-1]
        produced = 0
        while produced < max_new_tokens:
            # inference mode per step, never across a yield (the caller's code runs between yields)
            with torch.inference_mode():
                t0 = clock()
                step_logprobs: torch.Tensor | None = None
                if tensor_step:
                    outcome, _ = speculative_step(target, draft, builder, verifier, sampling, rng, root, compiler,
                                                  check_tree=tally.steps == 0, clock_kind=clock_kind,
                                                  logits_processor=logits_processor, context=context,
                                                  logprobs=logprob_sink is not None)
                    step_logprobs = outcome.device_logprobs
                    result, num_nodes = outcome.result, outcome.tree_nodes
                    t1 = t0 + outcome.time_draft
                    t2 = t1 + outcome.time_target
                    t3 = t2 + outcome.time_verify
                else:
                    tree = builder.build(root, draft, sampling, rng)
                    t1 = clock()
                    with model_call():
                        logits = target.score_tree(tree)
                    t2 = clock()
                    if logits_processor is not None:  # before the fused kernel, which takes logits
                        logits = process_host_tree(logits_processor, logits, context, tree)
                    result = step_verifier(tree, logits, rng)
                    if logprob_sink is not None:
                        chain = torch.tensor([0, *result.accepted_nodes], dtype=torch.int64, device=logits.device)
                        rows = logits.index_select(0, chain)
                        step_logprobs = emitted_logprobs(rows, process_logits(rows, sampling, check=False),
                                                         torch.arange(len(result.tokens), device=logits.device),
                                                         torch.tensor(result.tokens, dtype=torch.int64), sampling)
                    t3 = clock()
                    num_nodes = tree.num_nodes
            tally.record(result, num_nodes, t1 - t0, t2 - t1, t3 - t2)
            tally.kernel_path = "torch" if tensor_step else step_verifier.path_label
            kept = list(result.tokens[: max_new_tokens - produced])
            stop = False
            for i, tok in enumerate(kept):
                if tok in eos:
                    kept = kept[: i + 1]
                    stop = True
                    tally.stop_reason = "eos"
                    break
            produced += len(kept)
            if logprob_sink is not None and step_logprobs is not None:
                logprob_sink.append(step_logprobs[: len(kept)])
            yield kept
            if stop or produced >= max_new_tokens:
                return
            if context is not None:  # the emitted tokens join every later node's context (on the device)
                emitted = (outcome.device_tokens if tensor_step and outcome.device_tokens is not None
                           else torch.tensor(result.tokens, dtype=torch.int64))
                context = torch.cat([context, emitted.to(context.device)])
            t0 = clock()
            with torch.inference_mode():
                commit_step(target, draft, outcome if tensor_step else StepOutcome(result, num_nodes))
            tally.time_draft += clock() - t0
            # the next root: on the device for the tensor builders (no host-to-device copy), else the int
            root = outcome.device_tokens[-1:] if tensor_step and outcome.device_tokens is not None else result.bonus_token


def _target_device(target: TargetModel) -> torch.device:
    """Where the target's logits live: its model's first parameter's device, else the CPU."""
    model = getattr(target, "model", None)
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if params is not None else None
    return first.device if first is not None else torch.device("cpu")


def _on_cuda(target: TargetModel) -> bool:
    model = getattr(target, "model", None)
    params = getattr(model, "parameters", None)
    if params is None:
        return False
    first = next(iter(params()), None)
    return first is not None and first.is_cuda


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
) -> GenerationOutput:
    tally = StepTally()
    start = time.perf_counter()
    tokens: list[int] = []
    sink: list[torch.Tensor] | None = [] if return_logprobs else None
    for chunk in _run(target, draft, builder, verifier, prompt_ids, max_new_tokens, sampling, seed,
                      eos_token_id, tally, kernel, compiler, random, what, logits_processor, sink):
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
                                eos_token_id=eos_token_id, device=_target_device(target))
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
        captured = tuple(getattr(model, "capture_layers", ()))
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


RANDOM_CHOICES = ("torch", "counter")
"""The random streams :class:`SpeculativeGenerator` can draw from (``random=``)."""


class SpeculativeGenerator:
    """Lossless speculative generation with a named method or an explicit composition.

    Args:
        target: a :class:`~specdec.targets.base.TargetModel` or a Hugging Face
            causal LM (wrapped in :class:`~specdec.targets.hf.HFTarget`).
        draft: a :class:`~specdec.drafts.base.DraftModel` or a Hugging Face
            causal LM (wrapped in :class:`~specdec.drafts.hf.HFDraft`).
        method: registered method name (``specdec list method``), or None to
            compose ``tree`` and ``verifier`` by name.
        tree: tree builder name, when composing (overrides the method's).
        verifier: verifier name, when composing (overrides the method's).
        kernel: ``"auto"`` (default: the fused Triton verification kernel when
            Triton is installed and the target's logits are on CUDA, the torch
            reference otherwise), ``"torch"`` or ``"triton"`` (an error where
            it cannot run); see ``docs/kernels.md``. The path taken is in
            ``GenerationStats.kernel_path``.
        compile: ``True`` (the ``inductor`` backend) or a ``torch.compile``
            backend name: run the step's verification and the level-wise
            builders' level functions compiled as whole graphs
            (:class:`~specdec.step.StepCompiler`). Default False. The law is the
            same; Rheo's sampled slots then read the random stream in another
            order, so seeded outputs differ from an uncompiled run.
        random: ``"torch"`` (default: draws from a seeded ``torch.Generator``)
            or ``"counter"``: every draw of builder and verifier comes from one
            :class:`~specdec.rng.CounterRandom` stream keyed by (walk, node,
            draw), the stream the fused Triton kernel draws from, so that
            ``kernel="torch"`` and ``kernel="triton"`` emit the same tokens for
            a seed (tested). It costs some 300 small integer ops per table
            (Philox in torch ops; ``compile=True`` fuses them).
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
        **method_options: Any,
    ) -> None:
        from specdec.methods import compose, resolve_method
        from specdec.kernels.verify_fused import KERNEL_CHOICES

        if kernel not in KERNEL_CHOICES:
            raise InvalidConfigError(f"kernel must be one of {', '.join(KERNEL_CHOICES)}, got {kernel!r}")
        self.kernel = kernel
        if random not in RANDOM_CHOICES:
            raise InvalidConfigError(f"random must be one of {', '.join(RANDOM_CHOICES)}, got {random!r}")
        self.random = random
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
        if method is None:
            if tree is None or verifier is None:
                raise InvalidConfigError("give a method name, or both tree= and verifier= to compose one")
            self.method_name = f"{tree}+{verifier}"
            self.builder, self.verifier = compose(tree, verifier, method_options)
        else:
            m = resolve_method(method)
            self.method_name = m.name
            options = {**m.defaults, **method_options}
            self.builder, self.verifier = compose(tree or m.tree, verifier or m.verifier, options,
                                                  context=f"method {m.name!r}")

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
        return _generate(self.target, self.draft, self.builder, self.verifier, prompt_ids, max_new_tokens,  # type: ignore[arg-type]
                         sampling, seed, eos_token_id, callback, self.kernel, self.compiler,
                         self.random, "SpeculativeGenerator.generate", processor, return_logprobs)

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
        yield from _run(self.target, self.draft, self.builder, self.verifier, prompt_ids, max_new_tokens,  # type: ignore[arg-type]
                        sampling, seed, eos_token_id, StepTally(), self.kernel, self.compiler,
                        self.random, "SpeculativeGenerator.stream", processor)

    def stream_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        seeds: Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> Iterator[dict[int, list[int]]]:
        """Decode every prompt at once (batched); yield ``{row: new tokens}``
        after each step (:func:`specdec.batch.speculative_stream_batch`: the
        requirements and the per-row guarantees). Logits processors are not
        supported with batches yet (an :class:`~specdec.errors.InvalidConfigError`)."""
        from specdec.batch import speculative_stream_batch

        self._check_batch_options(logits_processor, sampling)
        yield from speculative_stream_batch(self.target, self.draft, self.builder, self.verifier, prompts,
                                            max_new_tokens, (SamplingConfig() if sampling is None else sampling), seeds, eos_token_id,
                                            kernel=self.kernel, random=self.random)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        seeds: Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        *,
        logits_processor: LogitsProcessorLike | None = None,
    ) -> "BatchOutput":
        """:meth:`stream_batch`, collected: a :class:`~specdec.batch.BatchOutput`
        (one tuple of new tokens per prompt, in order; per-row stop reasons;
        steps, tau and throughput summed over the rows).

        Each row's output law is the target's, and row ``b`` draws only from
        ``seeds[b]`` (default ``0 .. B - 1``), so it equals the row's
        :meth:`generate` with that seed wherever the models' logits agree
        across batch sizes (at T = 0: token for token). ``kernel`` and
        ``random`` apply as in :meth:`generate`, per row: with the kernel, one
        launch verifies every row's tree, each row on its own counter stream
        (docs/generation.md, "Batched decoding"); ``compile=`` is refused."""
        from specdec.batch import check_prompts, collect_batch, speculative_stream_batch

        self._check_batch_options(logits_processor, sampling)
        check_prompts(prompts)
        return collect_batch(
            lambda stats: speculative_stream_batch(self.target, self.draft, self.builder, self.verifier, prompts,
                                                   max_new_tokens, (SamplingConfig() if sampling is None else sampling), seeds, eos_token_id,
                                                   kernel=self.kernel, random=self.random, _stats=stats),
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
    return _generate(model, None, RootOnlyBuilder(model.vocab_size), verifier, prompt_ids, max_new_tokens,  # type: ignore[arg-type]
                     sampling, seed, eos_token_id, callback, what="autoregressive_generate",
                     logits_processor=processor, return_logprobs=return_logprobs)
