"""Verification for serving engines: one call, per-row sampling, per-row failure flags.

A serving engine owns its model runner, its KV cache and its batch; it has the
:class:`~specdec.tree_batch.TreeBatch` it drafted and the target's logits at every node.
:func:`verify_for_engine` takes those, the verifier (by registry name or instance), one
:class:`~specdec.sampling.SamplingConfig` per row and the rows' random sources, and:

1. checks every input before it changes any state (shapes, devices, the number of
   per-row configurations and sources, an empty batch, the verifier's support for each
   row's tree), naming the argument and the row;
2. checks, per row, that the verifier can serve the row's sampling exactly
   (:meth:`Verifier.check_sampling <specdec.verify.base.Verifier.check_sampling>`: a
   greedy-only rule at ``T > 0``); a row it cannot serve is *refused*: flagged
   (:data:`FLAG_REFUSED`, its reason naming the rule), nothing drawn from its source,
   the other rows untouched;
3. decides each configuration group's rows through the step's own decision
   (:data:`specdec.engine.step.decide_rows`, the path from
   :func:`~specdec.engine.dispatch.choose_verification`): the rule's tensor form, its
   path-level form or the verifier's walk, each row's logits processed under its own
   configuration and its uniforms drawn from its own source. One executor: the step and the
   serving call run the same code, so a row emits what specdec's own loop would emit;
4. returns :class:`EngineVerification`: device tensors, accepted slots and emitted tokens
   padded with ``-1``, counts, and per-row ``bad`` flags with their cause (``flag``,
   :meth:`EngineVerification.reasons`): a row whose target logits were NaN / +inf / all -inf
   at a node the verifier visited, whose draft was flagged while building, whose tree holds
   a token outside the vocabulary, or that the rule cannot serve, emits nothing; the other
   rows are verified as usual.

The tensor paths make no host read (the caller reads what it needs); the walk reads each
row's tree. Every row's output law is its own configuration's target law (exact by
enumeration, ``tests/engine/test_serving.py``) and a row of a batch emits exactly what it
emits verified alone with the same source.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from specdec.engine.dispatch import choose_verification
from specdec.engine.options import StepOptions
from specdec.engine.row_sampling import RowSampling, scatter_decisions
from specdec.engine.step import StepInputs, decide_rows
from specdec.errors import InvalidConfigError, InvalidDistributionError, MalformedTreeError, UnsupportedTreeError
from specdec.registry import get
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch
from specdec.verify.base import Verifier
from specdec.verify.decision import TreeDecision

__all__ = ["EngineVerification", "FLAG_CAUSES", "RowSampling", "verify_for_engine"]

FLAG_NONE, FLAG_REFUSED, FLAG_TOKENS, FLAG_DRAFT, FLAG_TARGET = range(5)
FLAG_CAUSES = (
    None,
    "refused: the verifier cannot serve the row's sampling exactly",
    "the row's tree holds a token outside the vocabulary",
    "the draft's logits were bad at a node the builder expanded",
    "the target's logits were NaN, +inf or all -inf at a node the verifier visited",
)
"""Why a row was flagged, by :attr:`EngineVerification.flag` code (``0``: not flagged); when several
apply, the lowest code is given (a refused row is never verified)."""

_SERVE_OPTIONS = StepOptions(validate=False)


@attrs.frozen(eq=False)
class EngineVerification:
    """What :func:`verify_for_engine` decided, as device tensors (``D = tree.max_depth``).

    Attributes:
        accepted: ``[B, D]`` int64 accepted slots, root's child first, ``-1`` padded (all ``-1`` on a bad row).
        tokens: ``[B, D + 1]`` int64 emitted tokens (accepted tokens, then the bonus), ``-1`` padded.
        num_accepted: ``[B]`` int64 (0 on a bad row).
        num_emitted: ``[B]`` int64 ``num_accepted + 1``, 0 on a bad row.
        bad: ``[B]`` bool: the row was flagged (``flag > 0``) and emitted nothing.
        path: the verification path taken (``"tensor"``, or ``"walk"``).
        flag: ``[B]`` int64 why each row was flagged, a code of :data:`FLAG_CAUSES` (0: not flagged).
        refusals: per row, the message of the verifier's refusal (naming the rule and the row's
            temperature) for a row it cannot serve, None for the others (host values: no read).
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor
    bad: torch.Tensor
    path: str
    flag: torch.Tensor
    refusals: tuple[str | None, ...] = ()

    def reasons(self) -> list[str | None]:
        """Per row, why it was flagged (``"row b: ..."``), or None; one host read of :attr:`flag`."""
        out: list[str | None] = []
        for b, code in enumerate(self.flag.tolist()):
            refusal = self.refusals[b] if b < len(self.refusals) else None
            if code == FLAG_NONE:
                out.append(None)
            elif code == FLAG_REFUSED and refusal is not None:
                out.append(f"row {b}: refused: {refusal}")
            else:
                out.append(f"row {b}: {FLAG_CAUSES[code]}")
        return out


def _check_trees(tree: TreeBatch, verifier: Verifier, outside: torch.Tensor) -> None:
    """The verifier supports every row's tree (host reads), naming the row. A row with a token
    outside the vocabulary (``outside[b]``, read only then) has no valid host tree: it is left to
    its flag; any other malformed tree raises, naming the row."""
    for b in range(tree.batch_size):
        try:
            host = tree.tree(b)
        except MalformedTreeError as exc:
            if bool(outside[b]):
                continue
            raise MalformedTreeError(f"row {b}: {exc}") from exc
        try:
            verifier.check_tree(host)
        except UnsupportedTreeError as exc:
            raise UnsupportedTreeError(f"row {b}: {exc}") from exc


def verify_for_engine(
    tree: TreeBatch,
    logits: torch.Tensor,
    verifier: str | Verifier,
    sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling,
    rng: RandomSource,
    *,
    check_trees: bool = True,
) -> EngineVerification:
    """Verify a drafted tree batch against the target's logits (module docstring).

    Runs without autograd (``torch.no_grad``): logits that require grad are verified as their values.

    Args:
        tree: ``B >= 1`` trees, ``n`` slots each (the builder's :class:`~specdec.tree_batch.TreeBatch`).
        logits: ``[B, n, V]`` the target's raw logits at every slot, on the tree's device.
        verifier: a registry name (``"rejection-wor"``, ``"mixed"``, ...) or a verifier.
        sampling: one configuration for every row, one per row, or a :class:`RowSampling`
            (made once per batch: no host-to-device copy per step).
        rng: a :class:`~specdec.rng.RowStreams` of one source per row (or, for ``B = 1``, one source).
        check_trees: check that the verifier supports every row's tree (host reads of the trees;
            a caller that drafted with the verifier's own builder may skip it).

    Raises:
        InvalidConfigError: an empty batch; logits of the wrong shape, device or dtype; per-row
            configurations or sources of the wrong length; an unknown verifier name.
        UnsupportedTreeError: (``check_trees``) a row's tree has children the verifier cannot
            verify losslessly, naming the row.
    """
    with torch.no_grad():
        return _verify(tree, logits, verifier, sampling, rng, check_trees)


def _verify(tree: TreeBatch, logits: torch.Tensor, verifier: str | Verifier,
            sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling, rng: RandomSource,
            check_trees: bool) -> EngineVerification:
    rule_of = get("verifier", verifier)() if isinstance(verifier, str) else verifier
    B = tree.batch_size
    if B == 0:
        raise InvalidConfigError("tree: an empty batch (0 rows); verify_for_engine needs at least one row")
    sources = len(rng.sources) if isinstance(rng, RowStreams) else (None if B == 1 else 1)
    _check_shapes(tree, logits, sources)
    rows = RowSampling.of(sampling, B, tree.device)
    oov = _tokens_outside(tree)  # [B, n] valid slots whose token is outside [0, V)
    oov_rows = oov.any(dim=-1)  # [B]
    if check_trees:
        _check_trees(tree, rule_of, oov_rows)
    refusals = _refusals(rule_of, rows)
    # the rows' tokens, outside-vocabulary ones replaced (those rows are flagged): no gather leaves the vocabulary
    served = attrs.evolve(tree, tokens=torch.where(oov, 0, tree.tokens))
    # the torch paths do not depend on the configuration (only the fused kernel's does): one path for every row
    verification = choose_verification(rule_of, rows.configs[0], "torch", logits.device, draws_tables=rng.draws_tables)
    row_rngs: list[RandomSource] = list(rng.sources) if isinstance(rng, RowStreams) else [rng]
    refused = torch.zeros(B, dtype=torch.bool, device=tree.device)
    kept: list[torch.Tensor] = []  # the rows verified: all but those whose configuration the verifier refuses
    for (_, index), g_rows in zip(rows.groups, rows.group_rows()):
        if refusals[g_rows[0]] is not None:  # refused (a configuration's rows all alike), nothing drawn
            refused.index_fill_(0, index, True)
        else:
            kept.append(index)
    ok = [b for b in range(B) if refusals[b] is None]
    parts: list[tuple[torch.Tensor, TreeDecision]] = []
    if len(ok) == B:  # one pass over every row, each under its own configuration
        decision, _ = decide_rows(verification, rule_of, served, logits, rows, rng,
                                  StepInputs(row_rngs=row_rngs, options=_SERVE_OPTIONS, rows=ok), flag_bad=True)
        parts.append((torch.arange(B, device=tree.device), decision))
    elif ok:  # one pass over the rows not refused
        index = torch.sort(torch.cat(kept)).values  # their row numbers, in row order, on the device
        o_rng = rng.subset(ok) if isinstance(rng, RowStreams) else rng
        decision, _ = decide_rows(verification, rule_of, _rows_of(served, index, ok), logits.index_select(0, index),
                                  rows.keep(ok, index), o_rng,
                                  StepInputs(row_rngs=[row_rngs[r] for r in ok], options=_SERVE_OPTIONS, rows=ok),
                                  flag_bad=True)
        parts.append((index, decision))
    decision = _assemble(parts, refused, tree)
    draft_bad = tree.draft_bad.to(refused.device) if tree.draft_bad is not None else torch.zeros_like(refused)
    target_bad = decision.bad_visited.to(refused.device)
    flag = torch.where(refused, FLAG_REFUSED, torch.where(oov_rows, FLAG_TOKENS, torch.where(
        draft_bad, FLAG_DRAFT, torch.where(target_bad, FLAG_TARGET, FLAG_NONE))))
    bad = (flag > 0).to(decision.accepted.device)
    keep = ~bad.view(B, 1)
    return EngineVerification(
        accepted=torch.where(keep, decision.accepted, -1),
        tokens=torch.where(keep, decision.tokens, -1),
        num_accepted=torch.where(bad, 0, decision.num_accepted),
        num_emitted=torch.where(bad, 0, decision.num_accepted + 1),
        bad=bad,
        path=verification.path,
        flag=flag,
        refusals=refusals,
    )


def _refusals(verifier: Verifier, rows: RowSampling) -> tuple[str | None, ...]:
    """Per row, the verifier's refusal of the row's sampling (host values, no read), or None."""
    message: dict[SamplingConfig, str | None] = {}
    for config, _ in rows.groups:
        try:
            verifier.check_sampling(config)
            message[config] = None
        except (InvalidConfigError, InvalidDistributionError) as exc:
            message[config] = str(exc)
    return tuple(message[c] for c in rows.configs)


def _tokens_outside(tree: TreeBatch) -> torch.Tensor:
    """``[B, n]`` bool: valid slots (root included) whose token is outside ``[0, V)`` (no host read)."""
    slots = torch.arange(tree.node_slots, device=tree.device).view(1, -1)
    valid = slots < tree.num_nodes.view(-1, 1)
    return valid & ((tree.tokens < 0) | (tree.tokens >= tree.vocab_size))


def _rows_of(tree: TreeBatch, index: torch.Tensor, rows: Sequence[int]) -> TreeBatch:
    """Rows ``rows`` of ``tree`` (``index`` on the device): the host trees, if any, picked by the host
    row numbers (no device read)."""
    if tree.host_trees is None:
        return tree.select_rows(index)
    hosts = tree.host_trees
    return attrs.evolve(attrs.evolve(tree, host_trees=None).select_rows(index), host_trees=tuple(hosts[r] for r in rows))


def _assemble(parts: list[tuple[torch.Tensor, TreeDecision]], refused: torch.Tensor, tree: TreeBatch) -> TreeDecision:
    """The groups' decisions in row order; refused rows get an empty decision (they are flagged)."""
    B, D = tree.batch_size, tree.max_depth
    if len(parts) == 1 and parts[0][0].numel() == B:
        return parts[0][1]
    dev = refused.device
    none = TreeDecision(torch.full((B, D), -1, dtype=torch.int64, device=dev), torch.zeros(B, dtype=torch.int64, device=dev),
                        torch.full((B, D + 1), -1, dtype=torch.int64, device=dev), torch.full((B,), -1, dtype=torch.int64, device=dev),
                        torch.zeros(B, dtype=torch.int64, device=dev), torch.zeros(B, dtype=torch.bool, device=dev),
                        torch.zeros(B, dtype=torch.int64, device=dev))
    if not parts:
        return none
    return scatter_decisions([(torch.arange(B, device=dev), none), *parts], B)


def _check_shapes(tree: TreeBatch, logits: torch.Tensor, sources: int | None) -> None:
    """Shapes, device and dtype of the logits; one source per row (no host read)."""
    B, n = tree.batch_size, tree.node_slots
    if not isinstance(logits, torch.Tensor):
        raise InvalidConfigError(f"logits must be a [B, n, V] tensor, got {type(logits).__name__}")
    if logits.dim() != 3 or tuple(logits.shape) != (B, n, tree.vocab_size):
        raise InvalidConfigError(
            f"logits must be [B, n, V] = [{B}, {n}, {tree.vocab_size}] for this tree batch, got {tuple(logits.shape)}"
        )
    if logits.device != tree.device:
        raise InvalidConfigError(f"logits are on {logits.device} but the tree batch is on {tree.device}")
    if not logits.is_floating_point():
        raise InvalidConfigError(f"logits must be floating point, got {logits.dtype}")
    if sources is not None and sources != B:
        raise InvalidConfigError(f"rng: {sources} row streams for {B} rows (one source per row: RowStreams)")
