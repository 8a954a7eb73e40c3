"""The speculative step as one function: draft a tree, score it, verify, read once.

:func:`speculative_step` is the step path of :class:`~specdec.generate.SpeculativeGenerator`
(and of anyone's own loop): the builder's :meth:`~specdec.trees.base.TreeBuilder.build_batch`
grows the tree as a :class:`~specdec.tree_batch.TreeBatch` on the draft's
device, the target scores it (:meth:`~specdec.targets.base.TargetModel.score_batch`),
``p`` is processed where the logits are, the verifier's rule decides every
node at once (:func:`specdec.verify.fast.verify_tree_batch`), and one small
device-to-host copy reads the accepted path and the bonus. NaN / +inf / all
-inf logits are flagged per row and raise only when the verifier visits the
row, so a dead row the verifier never reaches does not stop generation.
Committing (KV caches, the draft's context) is :func:`commit_step`, which
the caller runs after taking the emitted tokens.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError, InvalidDistributionError
from specdec.processors import LogitsProcessorLike, process_batch_row
from specdec.regions import model_call
from specdec.rng import RandomSource, UniformTable
from specdec.sampling import SamplingConfig, check_distribution, process_logits, row_is_bad
from specdec.targets.base import TargetModel
from specdec.tree_batch import TreeBatch
from specdec.trees.base import TreeBuilder
from specdec.trees.levelwise import CompiledLevelFn, LevelFn, LevelStep, finish_levels, level_step
from specdec.verify.base import Verifier, VerifyResult
from specdec.verify.fast import VERIFY_ROWS, decide_from_logits, decide_from_scores, decide_tree_batch, decide_tree_walk

__all__ = [
    "CLOCKS",
    "StepClock",
    "StepCompiler",
    "StepOutcome",
    "commit_step",
    "emitted_logprobs",
    "profile_steps",
    "speculative_step",
    "step_supported",
    "validate_steps",
    "verification_rows",
]

_VALIDATE = os.environ.get("SPECDEC_VALIDATE", "") not in ("", "0")


@contextmanager
def validate_steps(on: bool = True) -> Iterator[None]:
    """Validate mode: within the block (or everywhere with ``SPECDEC_VALIDATE=1``)
    every step checks its tree batch in full (:meth:`TreeBatch.validate`), that
    the verifier supports it (:meth:`Verifier.check_tree`), and every row of
    ``p`` (:func:`~specdec.sampling.check_distribution`), at the cost of host
    reads. Outside it, the verifier's support is checked on the first step
    of each generation only (every registered builder draws the same kinds
    and modes at every step)."""
    global _VALIDATE
    before, _VALIDATE = _VALIDATE, on
    try:
        yield
    finally:
        _VALIDATE = before


_ROWS = "auto"


@contextmanager
def verification_rows(rows: str) -> Iterator[None]:
    """Within the block, the step verifies the rows ``rows`` (:data:`~specdec.verify.fast.VERIFY_ROWS`):
    ``"all"`` every node at once (what a GPU runs), ``"path"`` only the nodes the verification
    visits (:func:`~specdec.verify.fast.decide_tree_walk`), ``"auto"`` (the default) the walk
    for CPU logits and every node at once on other devices. The same decisions either way;
    for benchmarks (the ops of the GPU's form, counted on a CPU) and tests."""
    global _ROWS
    if rows not in VERIFY_ROWS:
        raise InvalidConfigError(f"rows must be one of {VERIFY_ROWS}, got {rows!r}")
    before, _ROWS = _ROWS, rows
    try:
        yield
    finally:
        _ROWS = before


@attrs.frozen
class StepOutcome:
    """What one step emitted (host values, from the step's single read).

    Attributes:
        result: the accepted path, the emitted tokens and per-depth bookkeeping.
        tree_nodes: nodes of the scored tree (root included, padding excluded).
        device_path: ``[k]`` int64 the accepted node slots, on the device (for
            KV compaction and feature selection without a host-to-device copy).
        device_tokens: ``[k + 1]`` int64 the emitted tokens, on the device (the
            last one is the next tree's root).
        time_draft, time_target, time_verify: seconds spent building the tree
            (draft forwards included), in the target's forward, and processing
            ``p`` + verifying + the read (``perf_counter``; on a CPU the ops run
            synchronously, so the split is exact).
        device_logprobs: ``[k + 1]`` float64 log-probability of each emitted
            token under the law it was drawn from, on the device
            (``speculative_step(..., logprobs=True)``; :func:`emitted_logprobs`).
    """

    result: VerifyResult
    tree_nodes: int
    time_draft: float = 0.0
    time_target: float = 0.0
    time_verify: float = 0.0
    device_path: torch.Tensor | None = None
    device_tokens: torch.Tensor | None = None
    device_logprobs: torch.Tensor | None = None


def emitted_logprobs(
    logits: torch.Tensor, p: torch.Tensor | None, chain: torch.Tensor, tokens: torch.Tensor, sampling: SamplingConfig
) -> torch.Tensor:
    """``[k + 1]`` float64 log-probability of each emitted token under the law it was drawn
    from, on the device (docs/generation.md, "Log-probabilities").

    Emitted token ``t`` was drawn from the processed target law at its parent
    node ``chain[t]`` (the root, then the accepted nodes). At ``T > 0`` that is
    ``log p`` (processors, temperature, top-k, top-p). At ``T = 0`` ``p`` is
    one-hot; the log-probability is then that of the processed logits'
    softmax (processors applied; no temperature, top-k or top-p), as vLLM's
    processed log-probs under greedy sampling.

    Args:
        logits: ``[n, V]`` the target's logits after the logits processors.
        p: ``[n, V]`` the processed law (:func:`~specdec.sampling.process_logits` of ``logits``),
            or ``None``: the chain's rows are processed here (row by row the same bits).
        chain: ``[k + 1]`` int64 node of the law of each emitted token (``0`` first).
        tokens: ``[k + 1]`` int64 the emitted tokens.
    """
    chain = chain.to(logits.device)
    tokens = tokens.to(logits.device).view(-1, 1)
    if sampling.greedy:
        rows = torch.log_softmax(logits.index_select(0, chain).to(torch.float64), dim=-1)
        return rows.gather(1, tokens).view(-1)
    rows = process_logits(logits.index_select(0, chain), sampling, check=False) if p is None else p.index_select(0, chain)
    return rows.gather(1, tokens).view(-1).to(torch.float64).log()


CLOCKS = ("perf_counter", "cuda_events")
"""How a step's time split is measured: host ``perf_counter`` (exact on a
CPU, where ops run synchronously), or CUDA events on the current stream (on
a GPU, where the host only enqueues work); read after the step's one
device-to-host copy, which has waited for the events."""


class StepClock:
    """Marks the boundaries of a step's parts and returns the seconds between them (:data:`CLOCKS`)."""

    def __init__(self, kind: str = "perf_counter") -> None:
        if kind not in CLOCKS:
            raise InvalidConfigError(f"clock must be one of {', '.join(CLOCKS)}, got {kind!r}")
        self.kind = kind
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.kind == "cuda_events":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def splits(self) -> list[float]:
        """Seconds between consecutive marks."""
        pairs = zip(self.marks, self.marks[1:])
        if self.kind == "cuda_events":
            return [a.elapsed_time(b) / 1000.0 for a, b in pairs]
        return [b - a for a, b in pairs]


class StepCompiler:
    """``torch.compile(fullgraph=True)`` of the step's device parts between
    model forwards: the verification (:func:`~specdec.verify.fast.decide_from_scores` at
    ``T > 0``, from the target's logits or warped scores, with the law's max and exp-sum
    fused; :func:`~specdec.verify.fast.decide_tree_batch` on one-hot rows at ``T = 0``;
    on a CPU the walk, :func:`~specdec.verify.fast.decide_tree_walk`),
    each level of a level-wise builder (its level function, its draws read from
    a uniform table drawn before each level, :class:`~specdec.rng.UniformTable`,
    and the driver's scoring and beam, :func:`~specdec.trees.levelwise.level_step`)
    and the builder's final rerank and layout
    (:func:`~specdec.trees.levelwise.finish_levels`). Used by
    ``SpeculativeGenerator(..., compile=True)``.

    Args:
        backend: the ``torch.compile`` backend (``"inductor"`` by default;
            ``"aot_eager"`` traces the same graphs without generating code).
    """

    def __init__(self, backend: str = "inductor") -> None:
        self.backend = backend
        self.decide = self._compile(decide_tree_batch)
        self.decide_scores = self._compile(decide_from_scores)
        self.decide_walk = self._compile(decide_tree_walk)
        self._levels: dict[Any, CompiledLevelFn] = {}
        self.finish = self._compile(finish_levels)

    def _compile(self, fn: Any) -> Any:
        return torch.compile(fn, fullgraph=True, backend=self.backend)

    def level(self, level: LevelFn, key: Any) -> CompiledLevelFn:
        """The compiled ``fn(q, u, live, draw, parent_score, vocab_map, root, beam_width)``
        (:data:`~specdec.trees.levelwise.CompiledLevelFn`) of ``level`` followed by
        :func:`~specdec.trees.levelwise.level_step`, one per ``key`` (builder and sampling)."""
        fn = self._levels.get(key)
        if fn is None:
            def one_level(
                q: Any, u: torch.Tensor, live: torch.Tensor, draw: Any, parent_score: torch.Tensor,
                vocab_map: torch.Tensor | None, root: torch.Tensor, beam_width: int,
            ) -> LevelStep:
                table = UniformTable(u)
                lv = level(q, table, live) if draw is None else level(q, table, live, draw)
                return level_step(lv, parent_score, vocab_map, root, beam_width)

            # dynamo caches its graphs per code object: one code object per key, so that each
            # builder's few shapes (root level, middle levels, last level) have a cache of their own
            code = one_level.__code__.replace(co_name=f"one_level_{len(self._levels)}")
            own = types.FunctionType(code, one_level.__globals__, code.co_name, None, one_level.__closure__)
            fn = self._levels[key] = self._compile(own)
        return fn



def step_supported(verifier: Verifier, rng: RandomSource) -> bool:
    """Whether :func:`speculative_step` can run ``verifier`` with ``rng``: the
    verifier declares its parallel rule (:attr:`Verifier.fused`) and the source
    draws uniform tables (:meth:`RandomSource.uniforms`)."""
    return type(verifier).__dict__.get("fused") is not None and type(rng).uniforms is not RandomSource.uniforms


def speculative_step(
    target: TargetModel,
    draft: DraftModel | None,
    builder: TreeBuilder,
    verifier: Verifier,
    sampling: SamplingConfig,
    rng: RandomSource,
    root_token: int,
    compiler: StepCompiler | None = None,
    *,
    check_tree: bool = True,
    clock_kind: str = "perf_counter",
    logits_processor: LogitsProcessorLike | None = None,
    context: torch.Tensor | None = None,
    logprobs: bool = False,
) -> tuple[StepOutcome, TreeBatch]:
    """One speculative step (module docstring); returns the outcome and the scored tree.

    With a :class:`StepCompiler`, the verification and the builder's level
    function run compiled. ``check_tree`` checks that the verifier supports
    the tree's children (kinds and sampling modes) before verifying it (host
    reads; the generation loop asks for it on its first step, and on every
    step in :func:`validate_steps` mode). ``clock_kind`` (:data:`CLOCKS`)
    times the build / score / verify split.

    ``logits_processor`` (:mod:`specdec.processors`) is applied to the
    target's logits of every node with that node's own context: ``context``
    ``[L]`` (the committed sequence, ending with ``root_token``) followed by
    the node's path; ``p`` is then the processed target law. ``logprobs``
    fills :attr:`StepOutcome.device_logprobs` (:func:`emitted_logprobs`, on the device).

    A verifier without a parallel rule (or a source that draws no uniform
    tables, :func:`step_supported`) is run by its walk on the tree's host view
    (host reads; the rows of ``p`` are checked where the walk visits them).

    Raises:
        UnsupportedTreeError: (``check_tree``) the verifier cannot verify the tree losslessly.
        MalformedTreeError: (validate mode) the tree batch breaks an invariant.
        InvalidDistributionError: the target's logits at a visited node, or the
            draft's at an expanded node, are NaN, +inf or all -inf.
    """
    rule = type(verifier).__dict__.get("fused") if step_supported(verifier, rng) else None
    clock = StepClock(clock_kind)
    clock.mark()
    tree = builder.build_batch(root_token, draft, sampling, rng, compiler=compiler)
    clock.mark()
    with model_call():
        logits = target.score_batch(tree)  # [B, n, V]
    clock.mark()
    if _VALIDATE:
        tree.validate()
    if _VALIDATE:
        for b in range(tree.batch_size):
            verifier.check_tree(tree.tree(b))
    elif check_tree:
        verifier.check_batch(tree)
    if logits_processor is not None:  # each node's row in its own context (specdec.processors)
        if context is None or tree.batch_size != 1:
            raise InvalidConfigError("a logits processor needs the committed context of a one-tree batch")
        logits = process_batch_row(logits_processor, logits[0], context, tree).unsqueeze(0)
    if rule is None:  # the verifier's walk, on the host view
        if tree.batch_size != 1:
            raise NotImplementedError("the walk of a verifier without a parallel rule verifies one tree at a time")
        host = tree.tree(0)
        p_host = process_logits(logits[0, : host.num_nodes], sampling, check=False)  # visited rows checked by the walk
        result = verifier.verify(host, p_host, rng)
        walk_logprobs = None
        if logprobs:
            chain = torch.tensor([0, *result.accepted_nodes], dtype=torch.int64)
            walk_logprobs = emitted_logprobs(logits[0, : host.num_nodes], p_host, chain,
                                             torch.tensor(result.tokens, dtype=torch.int64), sampling)
        clock.mark()
        return StepOutcome(result, host.num_nodes, *clock.splits(), device_logprobs=walk_logprobs), tree
    if _VALIDATE:  # every node's row that is not flagged bad (those raise only where visited)
        flags, p_check = row_is_bad(logits), process_logits(logits, sampling, check=False)
        for b in range(tree.batch_size):
            n = int(tree.num_nodes[b])
            check_distribution(p_check[b, :n][~flags[b, :n]], "p")
    u = rng.verify_uniforms((tree.batch_size, tree.node_slots, tree.max_children + 1), device=logits.device)
    compiled = () if compiler is None else (compiler.decide, compiler.decide_scores)
    decision = decide_from_logits(rule, tree, logits, u, sampling, *compiled, rows=_ROWS,
                                  decide_walk=None if compiler is None else compiler.decide_walk)
    D = tree.max_depth
    draft_bad = tree.draft_bad if tree.draft_bad is not None else torch.zeros(1, dtype=torch.bool, device=logits.device)
    row = torch.cat([decision.packed()[0], tree.num_nodes[:1], draft_bad[:1].long()]).tolist()  # the one read
    num_accepted, _bonus, attempted, bad_visited, stop = row[:5]
    if row[-1]:
        raise InvalidDistributionError(
            "the draft's logits contain NaN or +inf, or a row is all -inf, or give probability outside the draft's "
            "proposal_ids, at a node the tree builder expanded"
        )
    if bad_visited:
        raise InvalidDistributionError(
            f"the target's logits at a node the verifier visited (the path ending at node {stop}) "
            "contain NaN or +inf, or are all -inf: no token can be produced"
        )
    accepted = tuple(row[5 : 5 + num_accepted])
    tokens = tuple(row[5 + D : 5 + D + num_accepted + 1])
    clock.mark()
    k = num_accepted
    step_logprobs = None
    if logprobs:  # gathered on the device after the read; the caller reads them once, at the end
        chain = torch.cat([decision.accepted.new_zeros(1), decision.accepted[0, :k]])
        step_logprobs = emitted_logprobs(logits[0], None, chain, decision.tokens[0, : k + 1], sampling)
    return StepOutcome(
        VerifyResult(accepted, tokens, attempted), row[-2], *clock.splits(),
        device_path=decision.accepted[0, :k], device_tokens=decision.tokens[0, : k + 1],
        device_logprobs=step_logprobs,
    ), tree


@functools.lru_cache(maxsize=None)
def _takes(function: Any, name: str) -> bool:
    return name in inspect.signature(function).parameters


def commit_step(target: TargetModel, draft: DraftModel | None, outcome: StepOutcome) -> None:
    """The caller's bookkeeping after a step: the target keeps the root and the
    accepted path in its KV cache, the draft appends the emitted tokens (with
    the target's features at the root and the accepted nodes, for feature
    drafts). The outcome's device path and tokens go to the models that take
    them (``HFTarget.accept(device_path=)``, ``EagleDraft.commit(device_tokens=)``),
    so that nothing is copied back and forth."""
    result, path = outcome.result, outcome.device_path
    if path is not None and _takes(type(target).accept, "device_path"):
        target.accept(result.accepted_nodes, result.bonus_token, path_tokens=result.tokens[:-1], device_path=path)
    else:
        target.accept(result.accepted_nodes, result.bonus_token)
    if draft is None:
        return
    hidden = target.hidden_states()
    if hidden is not None and path is not None:  # features at the root and the accepted nodes
        hidden = hidden.index_select(0, torch.cat([path.new_zeros(1), path]).to(hidden.device))
    elif hidden is not None:
        hidden = hidden[[0, *result.accepted_nodes]]
    if outcome.device_tokens is not None and _takes(type(draft).commit, "device_tokens"):
        draft.commit(result.tokens, target_hidden=hidden, device_tokens=outcome.device_tokens)
    else:
        draft.commit(result.tokens, target_hidden=hidden)


def profile_steps(
    target: TargetModel,
    draft: DraftModel,
    prompts: Any,
    builder: TreeBuilder,
    verifier: Verifier,
    sampling: SamplingConfig,
    rng: RandomSource,
    steps_per_prompt: int,
    *,
    room: int,
    name: str,
) -> Iterator[tuple[StepOutcome, TreeBatch]]:
    """The profiles' loop (Sequoia's acceptance, the bench's positional acceptance, Rheo's
    calibrated proxy): for each prompt, ``steps_per_prompt`` speculative steps with ``builder``
    and ``verifier``, each committed, so later steps profile generated text. Yields each step's
    outcome and scored tree; holds both models (:mod:`specdec.lease`) and runs in inference mode.

    Raises:
        InvalidConfigError: an empty prompt.
        ContextOverflowError: a prompt plus ``2 * steps_per_prompt + room`` tokens exceeds a
            model's ``max_length``.
    """
    from specdec.errors import ContextOverflowError
    from specdec.lease import hold

    trials = 0
    with hold(name, target=target, draft=draft), torch.inference_mode():  # one generation per model at a time
        for prompt in prompts:
            prompt = [int(t) for t in prompt]
            if not prompt:
                raise InvalidConfigError("prompts must be non-empty")
            for model in (target, draft):
                limit = getattr(model, "max_length", None)
                if limit is not None and len(prompt) + 2 * steps_per_prompt + room > limit:
                    raise ContextOverflowError(
                        f"a {len(prompt)}-token prompt plus {steps_per_prompt} profiling steps of {room} nodes "
                        f"exceeds max_length {limit} ({name})")
            target.prefill(prompt)
            draft.begin(prompt)
            root = prompt[-1]
            for _ in range(steps_per_prompt):
                outcome, tree = speculative_step(target, draft, builder, verifier, sampling, rng, root,
                                                 check_tree=trials == 0)
                trials += 1
                yield outcome, tree
                commit_step(target, draft, outcome)
                root = outcome.result.bonus_token
