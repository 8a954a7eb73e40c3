"""The speculative step: one pure function over a batch of rows, tensors in and out.

:func:`step_rows` is the only step body in specdec (:func:`run_step`, its compatibility form,
calls it); every loop (single, streamed and batched generation, the profiles, the bench, the
CLI demo) runs it through :func:`specdec.engine.loop.decode_rows`. For ``B`` rows (``B = 1`` is a batch of one):

    roots [B] -> build_trees(builder, ...)     # TreeBatch on the draft's device
              -> target.score_batch(tree)       # logits [B, n, V], one forward
              -> logits processor per row       # each node in its own context (optional)
              -> the dispatched verification    # tensor rule, fused kernel or walk (dispatch.py)
              -> one device-to-host read        # every row's path, tokens and flags (read_step)

NaN / +inf / all -inf logits are flagged per row and raise only when the verifier
visits the row. Committing (KV caches, the draft's context) is :func:`commit_step`,
which the caller runs after taking the emitted tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.engine.dispatch import Verification
from specdec.engine.options import StepOptions
from specdec.engine.records import Roles, StepInputs
from specdec.engine.row_sampling import RowSampling, build_groups, group_sources
from specdec.errors import InvalidConfigError, InvalidDistributionError
from specdec.kernels.verify_fused import fused_verify_batch
from specdec.verify.path_forms import decide_path_batch, decide_path_from_logits
from specdec.processors import LogitsProcessorLike, process_batch_row
from specdec.regions import model_call
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig, check_distribution, process_logits, process_logits_rows, row_is_bad
from specdec.targets.base import TargetModel
from specdec.tree_batch import TreeBatch
from specdec.trees.base import TreeBuilder, build_trees
from specdec.verify.base import Verifier, VerifyResult
from specdec.verify.fast import TreeDecision, decide_from_logits
from specdec.verify.optimum import NodeOptimum, tree_node_optimum

__all__ = [
    "Roles",
    "StepClock",
    "StepInputs",
    "StepOutcome",
    "commit_step",
    "decide_rows",
    "emitted_laws",
    "emitted_logprobs",
    "emitted_top_logprobs",
    "law_logprobs",
    "read_rows",
    "read_step",
    "run_step",
    "step_rows",
]


class StepClock:
    """Marks the boundaries of a step's parts and returns the seconds between them
    (:data:`~specdec.engine.options.CLOCKS`: ``"perf_counter"`` or ``"cuda_events"``)."""

    def __init__(self, kind: str = "perf_counter") -> None:
        if kind not in ("perf_counter", "cuda_events"):
            raise InvalidConfigError(f"clock must be 'perf_counter' or 'cuda_events', got {kind!r}")
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


@attrs.frozen(eq=False)
class StepOutcome:
    """What one step of ``B`` rows produced.

    Attributes:
        tree: the scored :class:`~specdec.tree_batch.TreeBatch` (``B`` trees, ``n`` slots).
        decision: the verification's device tensors (:class:`~specdec.verify.fast.TreeDecision`):
            ``accepted [B, D]``, ``num_accepted [B]``, ``tokens [B, D + 1]`` (``-1`` padded), ...
        results: per row, the host values of the step's one read: accepted node slots,
            emitted tokens (accepted + bonus), attempted depths.
        tree_nodes: per row, the nodes of the scored tree (root included, padding excluded).
        time_draft, time_target, time_verify: seconds spent building the tree (draft
            forwards included), in the target's forward, and processing ``p`` + verifying
            + the read (``perf_counter``, or CUDA events for a target on CUDA).
        logprobs: ``[B, D + 1]`` float64 log-probability of each emitted token under the law
            it was drawn from (:func:`emitted_logprobs`), on the device; None unless asked.
        top_logprobs, top_ids: ``[B, D + 1, k]`` float64 / int64 the ``k`` largest
            log-probabilities of that law and their ids (:func:`emitted_top_logprobs`), on the
            device; None unless asked (``StepInputs.top_logprobs = k > 0``).
        optimum: per row, per tested depth, the best lossless acceptance at the node the path
            tested there (:func:`step_optimum`); None unless :attr:`StepOptions.optimum`.
        tree_depths: per row, the depth of the scored tree's deepest node (0: a root-only tree),
            read with the step's one read (:func:`read_rows`); the per-position drafted counts.
    """

    tree: TreeBatch
    decision: TreeDecision
    results: tuple[VerifyResult, ...]
    tree_nodes: tuple[int, ...]
    time_draft: float = 0.0
    time_target: float = 0.0
    time_verify: float = 0.0
    logprobs: torch.Tensor | None = None
    optimum: tuple[tuple[NodeOptimum, ...], ...] | None = None
    tree_depths: tuple[int, ...] = ()
    top_logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None

    @property
    def result(self) -> VerifyResult:
        """Row 0's result (a one-row step)."""
        return self.results[0]


def emitted_logprobs(logits: torch.Tensor, decision: TreeDecision, sampling: SamplingConfig | RowSampling) -> torch.Tensor:
    """``[B, D + 1]`` float64 log-probability of each emitted token under the law it was
    drawn from, on the device (docs/generation.md, "Log-probabilities"); entries past a
    row's ``num_accepted + 1`` tokens are meaningless.

    Emitted token ``t`` was drawn from the processed target law at its parent node (the
    root, then the accepted nodes). At ``T > 0`` that is ``log p`` (processors,
    temperature, top-k, top-p). At ``T = 0`` ``p`` is one-hot; the log-probability is then
    that of the processed logits' softmax (processors applied; no temperature, top-k or
    top-p), as vLLM's processed log-probs under greedy sampling.

    Args:
        logits: ``[B, n, V]`` the target's logits after the logits processors.
        decision: the step's verification.
        sampling: the rows' configuration, or each row's own (a
            :class:`~specdec.engine.row_sampling.RowSampling`: every row as above under its own).
    """
    return emitted_laws(logits, decision, sampling).gather(2, decision.tokens.clamp_min(0).unsqueeze(-1)).squeeze(-1)


def emitted_top_logprobs(logits: torch.Tensor, decision: TreeDecision, sampling: SamplingConfig | RowSampling,
                         k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B, D + 1, k] float64, [B, D + 1, k] int64)``: the ``k`` (``1 <= k <= V``) largest
    log-probabilities of each emitted token's law (:func:`emitted_laws`, the law of
    :func:`emitted_logprobs`) and their ids, largest first, on the device; entries past a row's
    ``num_accepted + 1`` tokens are meaningless. Arguments: :func:`emitted_logprobs`."""
    values, ids = torch.topk(emitted_laws(logits, decision, sampling), k, dim=-1)  # [B, D + 1, k]
    return values, ids


def law_logprobs(law: torch.Tensor, decision: TreeDecision,
                 k: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """From the emitted tokens' laws ``[B, D + 1, V]`` (:func:`emitted_laws`), computed once: each
    emitted token's log-probability ``[B, D + 1]`` and, for ``k > 0``, the ``k`` largest
    log-probabilities of its law with their ids (``[B, D + 1, k]`` each; None at ``k = 0``)."""
    sampled = law.gather(2, decision.tokens.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # [B, D + 1]
    if k <= 0:
        return sampled, None
    values, ids = torch.topk(law, k, dim=-1)  # [B, D + 1, k]
    return sampled, (values, ids)


def emitted_laws(logits: torch.Tensor, decision: TreeDecision, sampling: SamplingConfig | RowSampling) -> torch.Tensor:
    """``[B, D + 1, V]`` float64 log of the law each emitted token was drawn from, at its parent
    node (the root, then the accepted nodes), on the device: ``log p`` at ``T > 0``, the
    processed logits' log-softmax at ``T = 0`` (:func:`emitted_logprobs`)."""
    B = logits.shape[0]
    chain = torch.cat([decision.accepted.new_zeros(B, 1), decision.accepted.clamp_min(0)], dim=1)  # [B, D + 1]
    rows = logits.gather(1, chain.to(logits.device).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [B, D + 1, V]
    if isinstance(sampling, RowSampling) and sampling.uniform:
        sampling = sampling.configs[0]
    if isinstance(sampling, SamplingConfig):
        if sampling.greedy:
            return torch.log_softmax(rows.to(torch.float64), dim=-1)
        return process_logits(rows, sampling, check=False).to(torch.float64).log()
    sampled = process_logits_rows(rows, sampling).to(torch.float64).log()
    if not any(c.greedy for c in sampling.configs):
        return sampled
    greedy = torch.log_softmax(rows.to(torch.float64), dim=-1)
    return torch.where(sampling.greedy.to(sampled.device).view(B, 1, 1), greedy, sampled)


def _prefix(rows: Sequence[int] | None, b: int) -> str:
    return "" if rows is None else f"row {rows[b]}: "


def _draft_bad(rows: Sequence[int] | None, b: int) -> InvalidDistributionError:
    return InvalidDistributionError(
        f"{_prefix(rows, b)}the draft's logits contain NaN or +inf, or a row is all -inf, or give probability "
        "outside the draft's proposal_ids, at a node the tree builder expanded"
    )


def read_step(decision: TreeDecision, tree: TreeBatch, rows: Sequence[int] | None = None) -> tuple[list[VerifyResult], list[int]]:
    """The step's one device-to-host read, decoded in one place: per row, the
    :class:`~specdec.verify.base.VerifyResult` and the tree's node count (:func:`read_rows`
    without the trees' depths).

    Args:
        rows: the rows' names for error messages (None: a single generation, unnamed).

    Raises:
        InvalidDistributionError: a row's draft logits were bad at a node the builder expanded,
            or its target logits at a node the verifier visited.
    """
    results, nodes, _depths = read_rows(decision, tree, rows)
    return results, nodes


def read_rows(decision: TreeDecision, tree: TreeBatch,
              rows: Sequence[int] | None = None) -> tuple[list[VerifyResult], list[int], list[int]]:
    """The step's one device-to-host read (:func:`read_step`), with per row the depth of its
    tree's deepest node (the per-position drafted counts, docs/generation.md "Acceptance metrics"):
    one more column of the same read.

    Raises:
        InvalidDistributionError: as :func:`read_step`.
    """
    B, D = tree.batch_size, tree.max_depth
    # on the tree's device (the decision's may differ)
    draft_bad = tree.draft_bad.long() if tree.draft_bad is not None else torch.zeros_like(tree.num_nodes)  # [B]
    device = decision.accepted.device
    # [B, 3] each tree's deepest node (padding is 0), its node count, its draft flag: no more ops than the two
    # columns without the depth took (two views and a conversion)
    extra = torch.stack([tree.depths.amax(1), tree.num_nodes, draft_bad], dim=1)
    packed = torch.cat([decision.packed(), extra if extra.device == device else extra.to(device)], dim=-1)
    read = packed.tolist()  # the one read: [B, 2D + 8]
    results, nodes, depths = [], [], []
    for b, row in enumerate(read):
        num, _bonus, attempted, bad_visited, stop = row[:5]
        if row[-1]:
            raise _draft_bad(rows, b)
        if bad_visited:
            raise InvalidDistributionError(
                f"{_prefix(rows, b)}the target's logits at a node the verifier visited (the path ending at node {stop}) "
                "contain NaN or +inf, or are all -inf: no token can be produced"
            )
        results.append(VerifyResult(tuple(row[5 : 5 + num]), tuple(row[5 + D : 5 + D + num + 1]), attempted))
        nodes.append(row[-2])
        depths.append(row[-3])
    return results, nodes, depths


def _walk(
    verifier: Verifier, tree: TreeBatch, logits: torch.Tensor, sampling: SamplingConfig | RowSampling,
    rngs: Sequence[RandomSource], rows: Sequence[int] | None, flag_bad: bool = False,
) -> tuple[TreeDecision, list[VerifyResult | None], list[int], list[int]]:
    """The walk path: the verifier's own :meth:`~specdec.verify.base.Verifier.verify` on each
    row's host view, each row with its own source; host reads (its cost per step: the tree's
    host view and the visited rows of ``p``). ``flag_bad`` (the serving call): a row whose
    visited target logits are bad is flagged in ``bad_visited`` (result None) instead of raising,
    and a row whose draft was flagged is walked like the others (the caller flags it).
    Returns the decision, the results, and per row the tree's node count and deepest node's depth
    (empty with ``flag_bad``)."""
    B, D = tree.batch_size, tree.max_depth
    results: list[VerifyResult | None] = []
    nodes = []
    # [B] each tree's deepest node: one more read of the walk's (not the serving call's: it keeps no tallies)
    depths: list[int] = [] if flag_bad else tree.depths.amax(1).tolist()
    for b in range(B):
        host = tree.tree(b)
        if not flag_bad and tree.draft_bad is not None and bool(tree.draft_bad[b]):
            raise _draft_bad(rows, b)
        config = sampling.configs[b] if isinstance(sampling, RowSampling) else sampling  # the row's own
        p = process_logits(logits[b, : host.num_nodes], config, check=False)  # visited rows checked by the walk
        try:
            results.append(verifier.verify(host, p, rngs[b]))
        except InvalidDistributionError as exc:
            if flag_bad:
                results.append(None)
            elif rows is None:
                raise
            else:
                raise InvalidDistributionError(f"{_prefix(rows, b)}{exc}") from exc
        nodes.append(host.num_nodes)
    return walk_decision(results, D, logits.device), results, nodes, depths


def walk_decision(results: Sequence[VerifyResult | None], max_depth: int, device: torch.device) -> TreeDecision:
    """The walks' :class:`~specdec.verify.fast.TreeDecision` (``B = len(results)``, ``D = max_depth``) on
    ``device``; a None result is a row flagged bad (``bad_visited``; its outputs ``-1``, nothing accepted)."""
    B, D = len(results), max_depth
    accepted = torch.full((B, D), -1, dtype=torch.int64)
    tokens = torch.full((B, D + 1), -1, dtype=torch.int64)
    num = torch.zeros(B, dtype=torch.int64)
    attempted = torch.zeros(B, dtype=torch.int64)
    stop = torch.zeros(B, dtype=torch.int64)
    bad = torch.zeros(B, dtype=torch.bool)
    for b, r in enumerate(results):
        if r is None:
            bad[b] = True
            continue
        accepted[b, : r.num_accepted] = torch.tensor(r.accepted_nodes, dtype=torch.int64)
        tokens[b, : len(r.tokens)] = torch.tensor(r.tokens, dtype=torch.int64)
        num[b], attempted[b] = r.num_accepted, r.attempted_depths
        stop[b] = r.accepted_nodes[-1] if r.accepted_nodes else 0
    return TreeDecision(accepted.to(device), num.to(device), tokens.to(device),
                        tokens.gather(1, num.view(B, 1)).view(B).to(device), attempted.to(device), bad.to(device),
                        stop.to(device))


def run_step(
    target: TargetModel,
    draft: DraftModel | None,
    builder: TreeBuilder,
    verifier: Verifier,
    verification: Verification | Sequence[Verification],
    sampling: SamplingConfig | RowSampling,
    rng: RandomSource,
    roots: torch.Tensor,
    *,
    row_rngs: Sequence[RandomSource] | None = None,
    verify_rng: RowStreams | None = None,
    options: StepOptions = StepOptions(validate=False),
    clock: str = "perf_counter",
    check_tree: bool = True,
    compiler: Any = None,
    logits_processor: LogitsProcessorLike | None = None,
    contexts: Sequence[torch.Tensor] | None = None,
    logprobs: bool = False,
    rows: Sequence[int] | None = None,
) -> StepOutcome:
    """One speculative step of ``B`` rows: the compatibility form of :func:`step_rows`.

    The engine path is the record form, :func:`step_rows` (``Roles(target, draft, builder,
    verifier)`` and a :class:`StepInputs` of the keyword arguments); this form builds the two
    records and calls it, with the same results (arguments: :func:`step_rows`, :class:`StepInputs`).
    """
    return step_rows(
        Roles(target, draft, builder, verifier), verification, sampling, rng, roots,
        StepInputs(row_rngs=row_rngs, verify_rng=verify_rng, options=options, clock=clock, check_tree=check_tree,
                   compiler=compiler, logits_processor=logits_processor, contexts=contexts, logprobs=logprobs,
                   rows=rows),
    )


def step_rows(
    roles: Roles,
    verification: Verification | Sequence[Verification],
    sampling: SamplingConfig | RowSampling,
    rng: RandomSource,
    roots: torch.Tensor,
    inputs: StepInputs = StepInputs(),
) -> StepOutcome:
    """One speculative step of ``B`` rows (module docstring); the engine path's step.

    Args:
        roles: the target, draft, builder and verifier.
        verification: the generation's path (:func:`~specdec.engine.dispatch.choose_verification`),
            one for every row whatever their configurations (a sequence: its first).
        sampling: the rows' configuration, or a :class:`~specdec.engine.row_sampling.RowSampling`
            of one per row (several: each group built under its own, every row verified in one
            pass under its own, :mod:`specdec.engine.row_sampling`).
        rng: the builder's source (a :class:`~specdec.rng.RowStreams` of one source per row
            for ``B > 1``); the tensor rule draws its ``[B, n, C + 1]`` uniform table from it.
        roots: ``[B]`` int64 the rows' last committed tokens, on the device.
        inputs: the step's other inputs (:class:`StepInputs`: per-row sources, options, clock,
            logits processor and contexts, log-probabilities, row names).

    Raises:
        UnsupportedTreeError: (``check_tree``) the verifier cannot verify a tree losslessly.
        MalformedTreeError: (validate mode) the tree batch breaks an invariant.
        InvalidDistributionError: a row's target logits at a visited node, or its draft's at an
            expanded node, are NaN, +inf or all -inf.
    """
    builder, verifier, options = roles.builder, roles.verifier, inputs.options
    timer = StepClock(inputs.clock)
    timer.mark()
    if isinstance(sampling, RowSampling) and sampling.uniform:
        sampling = sampling.configs[0]
    if isinstance(sampling, RowSampling):  # several configurations: one build per group, one draft call per level
        tree = build_groups(builder, roots, roles.draft, sampling, group_sources(rng, sampling.group_rows()))
    else:
        tree = build_trees(builder, roots, roles.draft, sampling, rng, compiler=inputs.compiler)
    timer.mark()
    with model_call():
        logits = roles.target.score_batch(tree)  # [B, n, V]
    timer.mark()
    B = tree.batch_size
    if options.validate:
        tree.validate()
        for b in range(B):
            verifier.check_tree(tree.tree(b))
    elif inputs.check_tree:
        verifier.check_batch(tree)
    if inputs.logits_processor is not None:  # each node's row in its own context (specdec.processors)
        contexts = inputs.contexts
        if contexts is None or len(contexts) != B:
            raise InvalidConfigError("a logits processor needs the committed context of every row")
        lp = inputs.logits_processor  # one for every row, or one (or None) per row
        procs = lp if isinstance(lp, tuple) else (lp,) * B
        if len(procs) != B:
            raise InvalidConfigError(f"{len(procs)} logits processors for {B} rows")
        logits = torch.stack([row if proc is None else process_batch_row(proc, row, contexts[b], tree, b)
                              for b, (proc, row) in enumerate(zip(procs, logits))])
    step_logprobs: torch.Tensor | None = None
    top: tuple[torch.Tensor, torch.Tensor] | None = None
    # one verification for every row, each under its own configuration (a RowSampling: [B] tensors)
    single = verification if isinstance(verification, Verification) else verification[0]
    decision, walked = _decide(single, verifier, tree, logits, sampling, rng, inputs)
    results, nodes, depths = walked if walked is not None else read_rows(decision, tree, inputs.rows)
    timer.mark()
    if inputs.logprobs or inputs.top_logprobs > 0:  # one law for both ([B, D + 1, V])
        step_logprobs, top = law_logprobs(emitted_laws(logits, decision, sampling), decision, inputs.top_logprobs)
    optimum = step_optimum(tree, logits, results, sampling) if options.optimum else None
    time_draft, time_target, time_verify = timer.splits()
    return StepOutcome(tree, decision, tuple(results), tuple(nodes), time_draft, time_target, time_verify,
                       logprobs=step_logprobs, optimum=optimum, tree_depths=tuple(depths),
                       top_logprobs=None if top is None else top[0], top_ids=None if top is None else top[1])


def _decide(
    verification: Verification, verifier: Verifier, tree: TreeBatch, logits: torch.Tensor,
    sampling: SamplingConfig | RowSampling, rng: RandomSource, inputs: StepInputs, *, flag_bad: bool = False,
) -> tuple[TreeDecision, tuple[list[VerifyResult], list[int], list[int]] | None]:
    """The dispatched verification of the rows, each under its configuration (``sampling``: one
    for every row, or a :class:`~specdec.engine.row_sampling.RowSampling`, one pass over all rows
    on every path, one launch of the fused kernel): the decision, and the walk's results, node
    counts and trees' depths (None on the tensor paths: :func:`read_rows` decodes them).
    ``flag_bad``: the walk flags a row with bad visited logits instead of raising (the tensor
    paths always flag, in ``bad_visited``); the serving call's mode (:data:`decide_rows`).
    ``inputs``: the walk's per-row sources (``row_rngs``, default ``[rng]``), the kernel's streams
    (``verify_rng``), the options, the compiler and the rows' names (:class:`StepInputs`)."""
    B = tree.batch_size
    row_rngs, verify_rng, options, compiler, rows = (inputs.row_rngs or [rng], inputs.verify_rng, inputs.options,
                                                     inputs.compiler, inputs.rows)
    if isinstance(sampling, RowSampling) and sampling.uniform:
        sampling = sampling.configs[0]
    per_row = isinstance(sampling, RowSampling)
    if verification.path == "walk":
        decision, walked, nodes, depths = _walk(verifier, tree, logits, sampling, row_rngs, rows, flag_bad)
        if flag_bad:
            return decision, None
        return decision, ([r for r in walked if r is not None], nodes, depths)
    if verification.path_rule is not None:  # a path-level rule's tensor form (rules 7 and 8)
        u = rng.verify_uniforms((B, tree.node_slots, tree.max_children + 1), device=logits.device)
        if isinstance(sampling, RowSampling):  # each row's law (row-wise: the rows the rule reads have their bits)
            flags = row_is_bad(logits)
            p = process_logits_rows(torch.where(flags.unsqueeze(-1), torch.zeros_like(logits), logits), sampling)
            return decide_path_batch(verification.path_rule, tree, p, u, flags), None
        return decide_path_from_logits(verification.path_rule, tree, logits, u, sampling), None
    assert verification.rule is not None
    if options.validate:  # every node's row that is not flagged bad (those raise only where visited)
        flags = row_is_bad(logits)
        p_check = (process_logits_rows(logits, sampling) if isinstance(sampling, RowSampling)
                   else process_logits(logits, sampling, check=False))
        for b in range(B):
            n = int(tree.num_nodes[b])
            check_distribution(p_check[b, :n][~flags[b, :n]], "p")
    if verification.path == "triton":
        if verify_rng is None:
            raise InvalidConfigError("the fused kernel needs the rows' counter streams (verify_rng)")
        if isinstance(sampling, RowSampling):  # one launch, each row in its own mode (fused_verify_batch)
            return fused_verify_batch(verification.rule, tree, logits, verify_rng, inputs="logits",
                                      sampling=sampling, bad_rows=row_is_bad(logits)), None
        x = logits if verification.fuse_logits else process_logits(logits, sampling, check=False)
        return fused_verify_batch(verification.rule, tree, x, verify_rng,
                                  inputs="logits" if verification.fuse_logits else "probs",
                                  sampling=sampling, bad_rows=row_is_bad(logits)), None
    u = rng.verify_uniforms((B, tree.node_slots, tree.max_children + 1), device=logits.device)
    compiled: tuple[Any, ...] = () if compiler is None or per_row else (compiler.decide, compiler.decide_scores)
    return decide_from_logits(verification.rule, tree, logits, u, sampling, *compiled, rows=verification.rows,
                              decide_walk=None if compiler is None or per_row else compiler.decide_walk), None


decide_rows = _decide
"""The step's decision of the rows, one pass under their configurations (:func:`_decide`), shared with the serving call
(:func:`specdec.engine.serving.verify_for_engine`, ``flag_bad=True``): one executor for both."""


def step_optimum(tree: TreeBatch, logits: torch.Tensor, results: Sequence[VerifyResult],
                 sampling: SamplingConfig | RowSampling) -> tuple[tuple[NodeOptimum, ...], ...]:
    """Per row, per tested depth ``d`` (0-based), the best lossless acceptance at the node the
    row's path tested there (:func:`~specdec.verify.optimum.tree_node_optimum`): the root, then
    each accepted node that has children. Host work: the visited rows of ``p`` are read."""
    out: list[tuple[NodeOptimum, ...]] = []
    for b, result in enumerate(results):
        host = tree.tree(b)
        path = [0, *result.accepted_nodes][: result.attempted_depths]
        if not path:
            out.append(())
            continue
        config = sampling.configs[b] if isinstance(sampling, RowSampling) else sampling  # the row's own
        p = process_logits(logits[b, path], config, check=False).to("cpu", torch.float64)
        out.append(tuple(tree_node_optimum(host, node, p[i]) for i, node in enumerate(path)))
    return tuple(out)


def commit_step(
    target: TargetModel, draft: DraftModel | None, outcome: StepOutcome, emitted: Sequence[Sequence[int]] | None = None
) -> None:
    """The caller's bookkeeping after a step: each row's target keeps its root and accepted
    path in its KV cache (:meth:`~specdec.targets.base.TargetModel.accept_rows`), and the
    draft appends the emitted tokens (:meth:`~specdec.drafts.base.DraftModel.commit_rows`),
    with the target's features at the root and the accepted nodes for feature drafts.
    The device path and tokens go along, so that nothing is copied back and forth.

    Args:
        emitted: per row, the tokens the verifier emitted (default: the outcome's).
    """
    decision = outcome.decision
    emitted = [list(r.tokens) for r in outcome.results] if emitted is None else emitted
    nodes = [r.accepted_nodes for r in outcome.results]
    target.accept_rows(decision.accepted, decision.num_accepted, emitted, nodes=nodes)
    if draft is None:
        return
    feats = None
    if draft.needs_target_hidden:  # [B, D + 1, L, H]: the target's features at the root and the accepted nodes
        hidden = target.hidden_rows()  # [B, n, L, H]
        if hidden is None:
            raise InvalidConfigError(f"the draft needs the target's hidden states, but {type(target).__name__} captured none")
        B = decision.accepted.shape[0]
        path = torch.cat([decision.accepted.new_zeros(B, 1), decision.accepted.clamp_min(0)], dim=1).to(hidden.device)
        feats = hidden.gather(1, path[..., None, None].expand(-1, -1, *hidden.shape[2:]))
    draft.commit_rows(emitted, feats, device_tokens=decision.tokens, device_counts=decision.num_accepted + 1)
