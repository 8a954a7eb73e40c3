"""Honest accounting of a generation: per-row running totals and the frozen stats.

*tau* (mean accepted length) is the mean over steps of (accepted drafts + 1 bonus), i.e.
tokens emitted per target forward; the times split each step into drafting, the target's
forward and verification (docs/concepts.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from specdec.verify.base import VerifyResult
from specdec.verify.optimum import NodeOptimum

__all__ = ["AcceptanceCounts", "BatchChunk", "GenerationStats", "StepTally", "StreamChunk"]


def _padded(counts: Sequence[int], width: int) -> tuple[int, ...]:
    """``counts`` padded with zeros to ``width`` entries (per-depth lists grow as deeper depths occur)."""
    return tuple(counts) + (0,) * (width - len(counts))


@attrs.frozen
class AcceptanceCounts:
    """A request's acceptance so far, per position (docs/generation.md, "Acceptance metrics").

    The counts vLLM's ``num_accepted_tokens_per_pos`` / ``num_drafts`` and SGLang's per-request
    accept length report, for trees: position ``d`` (0-based) is tree depth ``d + 1``.

    Attributes:
        steps: steps (target forwards) of the request.
        emitted: tokens the verifier emitted (accepted drafts + one bonus per step), before truncation.
        drafted: ``[D]`` per position, the steps whose tree had a node at depth ``d + 1``.
        accepted: ``[D]`` per position, the steps that accepted a token at depth ``d + 1``.
        attempted: ``[D]`` per position, the steps whose walk tested a node at depth ``d + 1``
            (:attr:`GenerationStats.depth_attempted`).
    """

    steps: int = 0
    emitted: int = 0
    drafted: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()
    attempted: tuple[int, ...] = ()

    @property
    def tau(self) -> float:
        """Mean accepted length: tokens emitted per step (accepted drafts + 1 bonus); 0 before any step."""
        return self.emitted / self.steps if self.steps else 0.0

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        """Per position ``d``: ``accepted[d] / drafted[d]`` (0 where nothing was drafted)."""
        return tuple(a / n if n else 0.0 for a, n in zip(self.accepted, self.drafted))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, ``tau`` and ``acceptance_by_position`` included."""
        return dict(steps=self.steps, emitted=self.emitted, drafted=list(self.drafted), accepted=list(self.accepted),
                    attempted=list(self.attempted), tau=self.tau,
                    acceptance_by_position=list(self.acceptance_by_position))


class StreamChunk(list[int]):
    """One step of a stream (``SpeculativeGenerator.stream``): the tokens the request kept, a
    ``list`` as before, with :attr:`acceptance`, the request's :class:`AcceptanceCounts` so far
    (host values of the step's one read: no device read).

    Attributes:
        acceptance: the counts after this step (empty counts: none given).
    """

    acceptance: AcceptanceCounts

    def __init__(self, tokens: Sequence[int] = (), acceptance: AcceptanceCounts | None = None) -> None:
        super().__init__(tokens)
        self.acceptance = AcceptanceCounts() if acceptance is None else acceptance


class BatchChunk(dict[int, list[int]]):
    """One step of a batched stream (``stream_batch``): ``{row: new tokens}``, a ``dict`` as before,
    with :attr:`acceptance`, each stepped row's :class:`AcceptanceCounts` so far.

    Attributes:
        acceptance: ``{row: counts}`` after this step, for the rows of the step.
    """

    acceptance: dict[int, AcceptanceCounts]

    def __init__(self, rows: dict[int, list[int]] | None = None,
                 acceptance: dict[int, AcceptanceCounts] | None = None) -> None:
        super().__init__(rows or {})
        self.acceptance = {} if acceptance is None else acceptance

    @classmethod
    def of(cls, kept: dict[int, list[int]], tallies: Sequence["StepTally"]) -> "BatchChunk":
        """A step's chunk: ``kept`` (``{row: tokens}``) with each of its rows' counts from ``tallies``."""
        return cls(kept, {r: tallies[r].counts() for r in kept})


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
        time_prefill: seconds of the prefill (the prompt through the target, and the draft's
            start), with the KV caches sized.
        time_draft: seconds building the trees (draft forwards included).
        time_target: seconds in the target's tree forwards.
        time_verify: seconds processing the target logits and verifying.
        time_total: seconds of the whole generation.
        kernel_path: how verification ran, chosen once per generation
            (:func:`specdec.engine.dispatch.choose_verification`): ``"torch"`` (the
            verifier's parallel rule in torch, or its walk) or ``"triton"`` (the fused
            kernel on the device tree batch, :func:`specdec.kernels.verify_fused.fused_verify_batch`).
        clock: what measured the step path's time split: ``"perf_counter"``
            (host clock) or ``"cuda_events"`` (a target on CUDA;
            :data:`specdec.engine.options.CLOCKS`).
        depth_optimum: ``[D]`` (with ``StepOptions(optimum=True)``, else empty) the best
            lossless acceptance at the node tested at depth ``d+1``, summed over the steps
            that tested one there (:mod:`specdec.verify.optimum`).
        optimum_bound: some node's value in ``depth_optimum`` is an upper bound (a support
            too large for the exact min-cut), not the optimum itself.
        depth_drafted: ``[D]`` count of steps whose tree had a node at depth ``d+1`` (drafted
            there, whether or not the walk reached it); with ``depth_accepted`` the per-position
            acceptance (:attr:`acceptance_by_position`, docs/generation.md "Acceptance metrics").
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
    depth_optimum: tuple[float, ...] = ()
    optimum_bound: bool = False
    depth_drafted: tuple[int, ...] = ()

    @property
    def acceptance(self) -> AcceptanceCounts:
        """The per-position counts (:class:`AcceptanceCounts`; every list ``len(depth_drafted)`` long)."""
        width = max(len(self.depth_drafted), len(self.depth_attempted))
        return AcceptanceCounts(self.steps, self.emitted, _padded(self.depth_drafted, width),
                                _padded(self.depth_accepted, width), _padded(self.depth_attempted, width))

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        """Per position ``d`` (tree depth ``d+1``): steps that accepted a token there / steps whose tree
        drafted a node there (vLLM's per-position acceptance rate; 0 where nothing was drafted).
        :attr:`acceptance_by_depth` conditions on the walk reaching the depth instead."""
        return self.acceptance.acceptance_by_position

    @property
    def optimum_by_depth(self) -> tuple[float, ...]:
        """Per depth: the mean best lossless acceptance at the nodes tested there (empty unless
        measured; an upper bound where :attr:`optimum_bound`)."""
        return tuple(o / t if t else 0.0 for o, t in zip(self.depth_optimum, self.depth_attempted))

    @property
    def gap_by_depth(self) -> tuple[float, ...]:
        """Per depth: :attr:`optimum_by_depth` minus :attr:`acceptance_by_depth`, the acceptance the
        rule left on the table at the nodes it tested (an estimate: the acceptance is counted)."""
        return tuple(o - a for o, a in zip(self.optimum_by_depth, self.acceptance_by_depth))

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
            acceptance_by_position=list(self.acceptance_by_position),
            tokens_per_second=self.tokens_per_second,
            optimum_by_depth=list(self.optimum_by_depth),
            gap_by_depth=list(self.gap_by_depth),
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
        clock: how the times were measured (:data:`specdec.engine.options.CLOCKS`).
        depth_optimum, optimum_bound: per depth, the summed best lossless acceptance at the
            tested nodes, and whether one was a bound (``StepOptions(optimum=True)``).
        depth_drafted: per depth ``d`` (0-based), steps whose tree had a node at depth ``d + 1``.
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
    depth_optimum: list[float] = attrs.field(factory=list)
    optimum_bound: bool = False
    depth_drafted: list[int] = attrs.field(factory=list)

    def record(self, result: VerifyResult, tree_nodes: int, time_draft: float, time_target: float, time_verify: float,
               optimum: Sequence[NodeOptimum] | None = None, tree_depth: int | None = None) -> None:
        """Add one step's outcome (``optimum``: per tested depth, :func:`~specdec.engine.step.step_optimum`'s row;
        ``tree_depth``: the depth of the row's deepest tree node; None: the walk's tested depths, a lower bound)."""
        # a tested depth was drafted; max() keeps the counts consistent for a tree batch whose depths are wrong
        # (caught in validate mode, StepOptions(validate=True); the step path does not pay for that check)
        drafted = result.attempted_depths if tree_depth is None else max(tree_depth, result.attempted_depths)
        while len(self.depth_drafted) < drafted:
            self.depth_drafted.append(0)
        for d in range(drafted):
            self.depth_drafted[d] += 1
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
        if optimum is not None:
            while len(self.depth_optimum) < len(self.depth_attempted):
                self.depth_optimum.append(0.0)
            for d, node in enumerate(optimum):
                self.depth_optimum[d] += node.value
                self.optimum_bound |= not node.exact

    def stats(self, new_tokens: int, time_total: float) -> GenerationStats:
        """The :class:`GenerationStats` of these totals."""
        return GenerationStats(
            steps=self.steps, new_tokens=new_tokens, emitted=self.emitted, accepted=self.accepted,
            depth_attempted=tuple(self.depth_attempted), depth_accepted=tuple(self.depth_accepted),
            tree_nodes=self.tree_nodes, time_prefill=self.time_prefill, time_draft=self.time_draft,
            time_target=self.time_target, time_verify=self.time_verify, time_total=time_total,
            kernel_path=self.kernel_path, clock=self.clock,
            depth_optimum=tuple(self.depth_optimum), optimum_bound=self.optimum_bound,
            depth_drafted=tuple(self.depth_drafted),
        )

    def counts(self) -> AcceptanceCounts:
        """The per-position counts so far (host values: no device read)."""
        width = max(len(self.depth_drafted), len(self.depth_attempted))
        return AcceptanceCounts(self.steps, self.emitted, _padded(self.depth_drafted, width),
                                _padded(self.depth_accepted, width), _padded(self.depth_attempted, width))
