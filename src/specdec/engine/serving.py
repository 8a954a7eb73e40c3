"""Verification for serving engines: one call, per-row sampling, per-row failure flags.

A serving engine owns its model runner, its KV cache and its batch; it has the
:class:`~specdec.tree_batch.TreeBatch` it drafted and the target's logits at every node.
:func:`verify_for_engine` takes those, the verifier (by registry name or instance), one
:class:`~specdec.sampling.SamplingConfig` per row and the rows' random sources, and:

1. checks every input before it changes any state (shapes, devices, the number of
   per-row configurations and sources, the verifier's support for each row's tree),
   naming the row;
2. processes each row's logits with its own configuration (:class:`RowSampling`: rows
   with the same configuration are processed together, each row exactly as it would be
   alone, so a row's ``p`` is bit-identical to its batch-1 ``p``);
3. picks the verifier's rule itself (:func:`~specdec.engine.dispatch.choose_verification`):
   its per-node tensor form (:func:`specdec.verify.fast.decide_tree_batch`), its path-level
   tensor form (:func:`specdec.verify.fast_block.decide_block_batch`) or its walk, and
   sizes the uniform table ``[B, n, C + 1]`` from the tree;
4. returns :class:`EngineVerification`: device tensors, accepted slots and emitted tokens
   padded with ``-1``, counts, and a per-row ``bad`` flag: a row whose target logits were
   NaN / +inf / all -inf at a node the verifier visited (or whose draft was flagged while
   building) emits nothing and is flagged; the other rows are verified as usual.

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
from specdec.engine.row_sampling import RowSampling
from specdec.engine.step import walk_decision
from specdec.errors import InvalidConfigError, InvalidDistributionError, UnsupportedTreeError
from specdec.registry import get
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig, process_logits, row_is_bad
from specdec.tree_batch import TreeBatch
from specdec.verify.base import Verifier, VerifyResult
from specdec.verify.fast import TreeDecision, verify_tree_batch
from specdec.verify.fast_block import decide_block_batch

__all__ = ["EngineVerification", "RowSampling", "verify_for_engine"]


@attrs.frozen(eq=False)
class EngineVerification:
    """What :func:`verify_for_engine` decided, as device tensors (``D = tree.max_depth``).

    Attributes:
        accepted: ``[B, D]`` int64 accepted slots, root's child first, ``-1`` padded (all ``-1`` on a bad row).
        tokens: ``[B, D + 1]`` int64 emitted tokens (accepted tokens, then the bonus), ``-1`` padded.
        num_accepted: ``[B]`` int64 (0 on a bad row).
        num_emitted: ``[B]`` int64 ``num_accepted + 1``, 0 on a bad row.
        bad: ``[B]`` bool: the row's target logits were bad at a visited node, or its draft was
            flagged while building (:attr:`TreeBatch.draft_bad <specdec.tree_batch.TreeBatch.draft_bad>`);
            the row emitted nothing.
        path: the verification path taken (``"tensor"``, or ``"walk"``).
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor
    bad: torch.Tensor
    path: str


def _check_trees(tree: TreeBatch, verifier: Verifier) -> None:
    """The verifier supports every row's tree (host reads), naming the row."""
    for b in range(tree.batch_size):
        try:
            verifier.check_tree(tree.tree(b))
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

    Args:
        tree: ``B`` trees, ``n`` slots each (the builder's :class:`~specdec.tree_batch.TreeBatch`).
        logits: ``[B, n, V]`` the target's raw logits at every slot, on the tree's device.
        verifier: a registry name (``"rejection-wor"``, ``"mixed"``, ...) or a verifier.
        sampling: one configuration for every row, one per row, or a :class:`RowSampling`
            (made once per batch: no host-to-device copy per step).
        rng: a :class:`~specdec.rng.RowStreams` of one source per row (or, for ``B = 1``, one source).
        check_trees: check that the verifier supports every row's tree (host reads of the trees;
            a caller that drafted with the verifier's own builder may skip it).

    Raises:
        InvalidConfigError: logits of the wrong shape, device or dtype; per-row configurations or
            sources of the wrong length; an unknown verifier name.
        UnsupportedTreeError: (``check_trees``) a row's tree has children the verifier cannot
            verify losslessly, naming the row.
    """
    rule_of = get("verifier", verifier)() if isinstance(verifier, str) else verifier
    B = tree.batch_size
    sources = len(rng.sources) if isinstance(rng, RowStreams) else (None if B == 1 else 1)
    _check_shapes(tree, logits, sources)
    if check_trees:
        _check_trees(tree, rule_of)
    rows = RowSampling.of(sampling, B, tree.device)
    bad_rows = row_is_bad(logits)  # [B, n]
    p = rows.process(torch.where(bad_rows.unsqueeze(-1), torch.zeros_like(logits), logits))  # [B, n, V]
    verification = choose_verification(rule_of, rows.configs[0], "torch", logits.device, draws_tables=rng.draws_tables)
    if verification.path == "walk":
        decision = _walk(rule_of, tree, p, bad_rows, rng)
    else:
        u = rng.verify_uniforms((B, tree.node_slots, tree.max_children + 1), device=logits.device)
        if verification.path_rule is not None:
            decision = decide_block_batch(tree, p, u, bad_rows)
        else:
            assert verification.rule is not None
            decision = verify_tree_batch(verification.rule, tree, p, u, bad_rows)
    bad = decision.bad_visited
    if tree.draft_bad is not None:
        bad = bad | tree.draft_bad.to(bad.device)
    keep = ~bad.view(B, 1)
    return EngineVerification(
        accepted=torch.where(keep, decision.accepted, -1),
        tokens=torch.where(keep, decision.tokens, -1),
        num_accepted=torch.where(bad, 0, decision.num_accepted),
        num_emitted=torch.where(bad, 0, decision.num_accepted + 1),
        bad=bad,
        path=verification.path,
    )


def _check_shapes(tree: TreeBatch, logits: torch.Tensor, sources: int | None) -> None:
    """Shapes, device and dtype of the logits; one source per row (no host read)."""
    B, n = tree.batch_size, tree.node_slots
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


def _walk(verifier: Verifier, tree: TreeBatch, p: torch.Tensor, bad_rows: torch.Tensor,
          rng: RandomSource) -> TreeDecision:
    """The verifier's own walk on each row's host tree, each row with its own source; a row whose
    visited logits are bad is flagged (its outputs -1), the others verified."""
    sources = rng.sources if isinstance(rng, RowStreams) else [rng]
    flags = bad_rows.cpu()
    results: list[VerifyResult | None] = []
    for b in range(tree.batch_size):
        host = tree.tree(b)
        row_p = p[b, : host.num_nodes].clone()
        row_p[flags[b, : host.num_nodes]] = float("nan")  # a bad row raises where the walk reads it
        try:
            results.append(verifier.verify(host, row_p, sources[b]))
        except InvalidDistributionError:
            results.append(None)
    return walk_decision(results, tree.max_depth, p.device)
