"""Verification for serving engines: one call, per-row sampling, per-row failure flags.

A serving engine owns its model runner, its KV cache and its batch; it has the
:class:`~specdec.tree_batch.TreeBatch` it drafted and the target's logits at every node.
:func:`verify_for_engine` takes those, the verifier (by registry name or instance), one
:class:`~specdec.sampling.SamplingConfig` per row and the rows' random sources, and:

1. checks every input before it changes any state (shapes, devices, the number of
   per-row configurations and sources, an empty batch, the grammar mask), naming the argument;
2. checks every row's tree ON THE DEVICE (:mod:`specdec.engine.tree_checks`, with
   ``check_trees``, the default): a batch holding a tensor that is no tree at all raises
   :class:`~specdec.errors.MalformedTreeError` naming the row, decided from ONE host read of a
   ``[B]`` code; children the verifier cannot verify losslessly, a recorded law that is not a
   distribution and an id outside the vocabulary flag their row (``[B]`` tensors, no read);
3. checks, per row, that the verifier can serve the row's sampling exactly
   (:meth:`Verifier.check_sampling <specdec.verify.base.Verifier.check_sampling>`: a
   greedy-only rule at ``T > 0``); a row it cannot serve is *refused*: flagged
   (:data:`FLAG_REFUSED`, its reason naming the rule), nothing drawn from its source,
   the other rows untouched;
4. decides each configuration group's rows through the step's own decision
   (:data:`specdec.engine.step.decide_rows`, the path from
   :func:`~specdec.engine.dispatch.choose_verification`): the rule's tensor form, its
   path-level form or the verifier's walk, each row's logits processed under its own
   configuration (and masked by its grammar, ``allowed``) and its uniforms drawn from its own
   source. One executor: the step and the serving call run the same code, so a row emits what
   specdec's own loop would emit;
5. returns :class:`EngineVerification`: device tensors, accepted slots and emitted tokens
   padded with ``-1``, counts, and per-row ``bad`` flags with their cause (``flag``, codes of
   :data:`FLAG_CAUSES`, :meth:`EngineVerification.reasons`): a flagged row emits nothing; the
   other rows are verified as usual, bit for bit as in a batch without it.

The default call makes at most one host read (the structure check's) on the tensor paths
(``check_trees=False``: none); the walk reads each row's tree. Every row's output law is its own
configuration's target law (exact by enumeration, ``tests/engine/test_serving.py``) and a row of a
batch emits exactly what it emits verified alone with the same source.

:func:`engine_feed` is the serving path's :class:`~specdec.trees.feed.TreeFeed`: the same build,
with the builders' proposal laws recorded sparsely by default (``laws="sparse"``: the top
:data:`SERVING_LAW_TOP_K` ids of each law, ``proposal_top_k``; a different, still exact, draft
law), the full ones when asked (``laws="dense"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from specdec.engine.dispatch import choose_verification
from specdec.engine.options import StepOptions
from specdec.engine.row_sampling import RowSampling, scatter_decisions
from specdec.engine.step import StepInputs, decide_rows, emitted_laws, law_logprobs
from specdec.engine.tree_checks import check_batch_on_device, unsupported_message
from specdec.errors import InvalidConfigError, InvalidDistributionError, MalformedTreeError, UnsupportedTreeError
from specdec.logit_bias import logit_bias_rows
from specdec.penalties import Penalties, apply_penalties
from specdec.registry import get
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig, row_is_bad
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import DraftSpec, FeedBuilder, TreeFeed
from specdec.verify.base import Verifier
from specdec.verify.decision import TreeDecision

__all__ = ["EngineVerification", "FLAG_CAUSES", "RowSampling", "SERVING_LAW_TOP_K", "engine_feed", "verify_for_engine"]

FLAG_NONE, FLAG_REFUSED, FLAG_TOKENS, FLAG_DRAFT, FLAG_TARGET, FLAG_GRAMMAR = range(6)
FLAG_CAUSES = (
    None,
    "refused: the rule cannot serve this row",
    "an id of the row's tree (a token, its root included, or a law id) is outside the vocabulary",
    "the row's draft law is bad (the draft's logits were bad at a node the builder expanded, or a recorded law "
    "is not a distribution)",
    "the target's logits were NaN, +inf or all -inf at a node the verifier visited",
    "the row's grammar allows no token at a node the verifier visited",
)
"""Why a row was flagged, by :attr:`EngineVerification.flag` code (``0``: not flagged); when several
apply, the lowest code is given (a refused row is never verified). :meth:`EngineVerification.reasons`
adds the rule's own words to code 1 (the sampling it refuses, or the children it cannot verify)."""

SERVING_LAW_TOP_K = 256
"""The law width :func:`engine_feed` records by default (``proposal_top_k`` of the builders that have
it): a SpecInfer tree of 45 nodes keeps 0.18 MB of laws per row at any vocabulary, against 92 MB in
full at ``V = 128,256`` (``benchmarks/results/static_law_memory.md``)."""

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
        unsupported: ``[B]`` int64, or None: the children the verifier cannot verify losslessly,
            bits of :data:`specdec.engine.tree_checks.UNSUPPORTED` (0: none; code 1 when set).
        verifier: the verifier (for :meth:`reasons`), or None.
        logprobs: ``[B, D + 1]`` float64 log-probability of each emitted token under the law it was
            drawn from (:func:`~specdec.engine.step.emitted_logprobs`: the processed ``p`` at its
            parent node; at ``T = 0`` the processed logits' softmax), NaN past ``num_emitted``;
            None unless asked (``logprobs=`` of :func:`verify_for_engine`).
        top_logprobs: ``[B, D + 1, k]`` float64 the ``k`` largest log-probabilities of that law at
            each emitted position (descending, NaN past ``num_emitted``), or None.
        top_ids: ``[B, D + 1, k]`` int64 their token ids (``-1`` past ``num_emitted``), or None.
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    num_accepted: torch.Tensor
    num_emitted: torch.Tensor
    bad: torch.Tensor
    path: str
    flag: torch.Tensor
    refusals: tuple[str | None, ...] = ()
    unsupported: torch.Tensor | None = None
    verifier: Verifier | None = attrs.field(default=None, repr=False)
    logprobs: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None

    def reasons(self) -> list[str | None]:
        """Per row, why it was flagged (``"row b: ..."``), or None; one host read of :attr:`flag`
        (and :attr:`unsupported`)."""
        codes = self.flag.view(-1, 1)
        if self.unsupported is not None:
            codes = torch.cat([codes, self.unsupported.to(codes.device).view(-1, 1)], dim=1)
        out: list[str | None] = []
        for b, (code, *bits) in enumerate(codes.tolist()):
            refusal = self.refusals[b] if b < len(self.refusals) else None
            if code == FLAG_NONE:
                out.append(None)
            elif code == FLAG_REFUSED and refusal is not None:
                out.append(f"row {b}: {FLAG_CAUSES[code]}: {refusal}")
            elif code == FLAG_REFUSED and bits and bits[0] and self.verifier is not None:
                out.append(f"row {b}: {FLAG_CAUSES[code]}: {unsupported_message(self.verifier, bits[0])}")
            else:
                out.append(f"row {b}: {FLAG_CAUSES[code]}")
        return out


def _host_check_trees(tree: TreeBatch, verifier: Verifier) -> None:
    """A verifier whose tree check is its own (it overrides :meth:`~specdec.verify.base.Verifier.check_tree`
    or :meth:`~specdec.verify.base.Verifier.check_node_mix`): every row's host tree, checked by it (host reads),
    naming the row."""
    for b in range(tree.batch_size):
        try:
            host = tree.tree(b)
        except MalformedTreeError as exc:
            raise MalformedTreeError(f"row {b}: {exc}") from exc
        try:
            verifier.check_tree(host)
        except UnsupportedTreeError as exc:
            raise UnsupportedTreeError(f"row {b}: {exc}") from exc


def engine_feed(builder: FeedBuilder, roots: torch.Tensor, sampling: SamplingConfig | Sequence[SamplingConfig],
                rng: RandomSource, spec: DraftSpec, *, laws: str = "sparse", top_k: int = SERVING_LAW_TOP_K,
                compiler: Any = None) -> TreeFeed:
    """The serving path's :class:`~specdec.trees.feed.TreeFeed` (arguments as there): sparse laws by default.

    A builder with a ``proposal_top_k`` option left at 0 (``static``, ``chain``, ``sequoia``: the
    full law, ``[B, n, V]`` per step) draws each node's children from, and records, its law's top
    ``top_k`` ids renormalised (:func:`~specdec.trees.static.truncate_proposal`): ``[B, n, top_k]``.
    That is the draft law of the method now, a different one than the full law, and still exact:
    every verifier is lossless for any recorded proposal law (docs/trees.md, "Sparse proposals");
    the acceptance it gives up is measured in ``benchmarks/results/static_law_memory.md``. A builder
    whose ``proposal_top_k`` is set keeps its own; the others (``eagle``, ``rheo``,
    ``sampled-dynamic``) record their laws as they do. ``generate`` is not changed: it keeps
    each builder's own option.

    Args:
        laws: ``"sparse"`` (default) or ``"dense"`` (the builder as given: full laws where its
            ``proposal_top_k`` is 0).
        top_k: the law width of ``"sparse"``, an integer ``>= 1``.

    Raises:
        InvalidConfigError: ``laws`` is neither, ``top_k`` is not a positive integer; and what
            :class:`~specdec.trees.feed.TreeFeed` raises.
    """
    if laws not in ("sparse", "dense"):
        raise InvalidConfigError(f"laws must be 'sparse' or 'dense', got {laws!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InvalidConfigError(f"top_k must be a positive integer, got {top_k!r}")
    if laws == "sparse" and attrs.has(type(builder)) and getattr(builder, "proposal_top_k", None) == 0:
        builder = attrs.evolve(builder, proposal_top_k=top_k)  # type: ignore[misc]
    return TreeFeed(builder, roots, sampling, rng, spec, compiler=compiler)


def verify_for_engine(
    tree: TreeBatch,
    logits: torch.Tensor,
    verifier: str | Verifier,
    sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling,
    rng: RandomSource,
    *,
    check_trees: bool = True,
    allowed: torch.Tensor | None = None,
    logit_bias: Sequence[Mapping[int, float] | None] | None = None,
    logprobs: int | None = None,
    penalties: Penalties | None = None,
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
        check_trees: check every row's tree on the device (:mod:`specdec.engine.tree_checks`): a
            tensor that is no tree raises (one host read of a ``[B]`` code for the whole batch);
            children the verifier cannot verify losslessly flag the row (code 1), a recorded law
            that is not a distribution code 3, a law id outside the vocabulary code 2. False: no
            tree check and no read (a caller that drafted with the verifier's own builder may skip
            it); tokens outside the vocabulary are flagged either way. A verifier with its own
            tree check (one that overrides ``check_tree`` or ``check_node_mix``) is checked on the
            host trees instead (host reads; raises ``UnsupportedTreeError``, naming the row).
        allowed: ``[B, n, V]`` bool, or None: the tokens each row's grammar allows after each
            node's path (an engine's grammar mask, e.g. xgrammar's bitmask unpacked); the target's
            logits are masked by it (``-inf`` elsewhere) before they are processed, and a row whose
            grammar allows no token at a node the verifier visited is flagged (code 5).
        logit_bias: one ``{token id: bias}`` map (or None) per row, added to the row's raw logits
            at every node before they are processed (OpenAI's and vLLM's ``logit_bias``;
            :mod:`specdec.logit_bias`): the row's law is that of ``logits + bias``. The draft
            law is left as drafted (every rule is exact for any proposal law).
        logprobs: None (no log-probabilities, nothing computed), or ``k >= 0``: fill
            :attr:`EngineVerification.logprobs` (each emitted token's), and for ``k > 0`` the
            ``k`` most likely tokens of each emitted position's law (vLLM's sampled and top-``k``
            log-probs, ``processed_logprobs``), computed on the device (no host read).
        penalties: each row's repetition, presence and frequency penalties and its history
            (:class:`~specdec.penalties.Penalties`), applied after ``logit_bias`` at every node with
            the node's own history (the committed tokens, then its path:
            :func:`~specdec.penalties.apply_penalties`), as vLLM applies them.

    Raises:
        InvalidConfigError: an empty batch; logits of the wrong shape, device or dtype; per-row
            configurations or sources of the wrong length; an unknown verifier name; ``allowed``
            of the wrong shape, dtype or device; ``logit_bias`` not one map per row, or a token id
            outside the vocabulary or a bias that is not finite (naming the row); ``logprobs`` not
            None nor an int in ``[0, V]``.
        MalformedTreeError: (``check_trees``) a row's tensors are not a tree, naming the row and
            what is broken.
        UnsupportedTreeError: (``check_trees``, a verifier with its own tree check) a row's tree has
            children the verifier cannot verify losslessly, naming the row.
    """
    with torch.no_grad():
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= logits.shape[-1]):
            raise InvalidConfigError(f"logprobs must be None or an int in [0, V = {logits.shape[-1]}], got {logprobs!r}")
        if penalties is not None and not isinstance(penalties, Penalties):
            raise InvalidConfigError(f"penalties must be a specdec.penalties.Penalties, got {type(penalties).__name__}")
        return _verify(tree, logits, verifier, sampling, rng, check_trees, allowed, logit_bias, logprobs, penalties)


def _verify(tree: TreeBatch, logits: torch.Tensor, verifier: str | Verifier,
            sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling, rng: RandomSource,
            check_trees: bool, allowed: torch.Tensor | None,
            logit_bias: Sequence[Mapping[int, float] | None] | None = None,
            logprobs: int | None = None, penalties: Penalties | None = None) -> EngineVerification:
    rule_of = get("verifier", verifier)() if isinstance(verifier, str) else verifier
    B = tree.batch_size
    if B == 0:
        raise InvalidConfigError("tree: an empty batch (0 rows); verify_for_engine needs at least one row")
    sources = len(rng.sources) if isinstance(rng, RowStreams) else (None if B == 1 else 1)
    _check_shapes(tree, logits, sources)
    _check_allowed(tree, allowed)
    bias = None if logit_bias is None else logit_bias_rows(logit_bias, B, logits.shape[-1], logits.device)  # [B, V]
    if penalties is not None and tuple(penalties.output_counts.shape) != (B, logits.shape[-1]):
        raise InvalidConfigError(f"penalties: a history of {tuple(penalties.output_counts.shape)} for {B} rows of "
                                 f"V = {logits.shape[-1]}")
    rows = RowSampling.of(sampling, B, tree.device)
    own_check = type(rule_of).check_tree is not Verifier.check_tree or rule_of.host_checks
    if check_trees and own_check:
        _host_check_trees(tree, rule_of)
    checked = check_batch_on_device(tree, rule_of, structure=check_trees and not own_check)  # the one host read
    refusals = _refusals(rule_of, rows)
    served = checked.tree  # ids outside the vocabulary replaced (those rows are flagged): no gather leaves it
    grammar_empty: torch.Tensor | None = None  # [B, n] nodes whose grammar allows no token
    target_bad: torch.Tensor | None = None  # [B, n] nodes whose raw logits are bad
    if allowed is not None:
        grammar_empty = ~allowed.any(dim=-1)
        target_bad = row_is_bad(logits)
        logits = logits.masked_fill(~allowed, float("-inf"))
    if bias is not None:  # finite: a bad row stays bad, a banned token banned
        logits = logits + bias.to(logits.dtype).unsqueeze(1)  # [B, n, V]
    if penalties is not None:  # each node under its own history (vLLM's order: bias, then penalties)
        logits = apply_penalties(logits, served, penalties)  # [B, n, V]
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
    excluded = [r is not None for r in refusals]
    if verification.path == "walk" and check_trees and not own_check:  # the walk reads each row's host tree, which
        flagged = ((checked.unsupported > 0) | checked.outside | checked.law_bad).tolist()  # a flagged row may not have
        excluded = [e or bool(f) for e, f in zip(excluded, flagged)]  # (a read, as the walk's): it is not walked
    ok = [b for b in range(B) if not excluded[b]]
    walk_skips = any(e and r is None for e, r in zip(excluded, refusals))
    parts: list[tuple[torch.Tensor, TreeDecision]] = []
    if len(ok) == B:  # one pass over every row, each under its own configuration
        decision, _ = decide_rows(verification, rule_of, served, logits, rows, rng,
                                  StepInputs(row_rngs=row_rngs, options=_SERVE_OPTIONS, rows=ok), flag_bad=True)
        parts.append((torch.arange(B, device=tree.device), decision))
    elif ok:  # one pass over the rows not refused
        index = (torch.tensor(ok, dtype=torch.int64, device=tree.device) if walk_skips
                 else torch.sort(torch.cat(kept)).values)  # their row numbers, in row order, on the device
        o_rng = rng.subset(ok) if isinstance(rng, RowStreams) else rng
        decision, _ = decide_rows(verification, rule_of, _rows_of(served, index, ok), logits.index_select(0, index),
                                  rows.keep(ok, index), o_rng,
                                  StepInputs(row_rngs=[row_rngs[r] for r in ok], options=_SERVE_OPTIONS, rows=ok),
                                  flag_bad=True)
        parts.append((index, decision))
    decision = _assemble(parts, refused, tree)
    dev = refused.device
    draft_bad = tree.draft_bad.to(dev) if tree.draft_bad is not None else torch.zeros_like(refused)
    visited_bad = decision.bad_visited.to(dev)
    grammar = torch.zeros_like(refused)
    if grammar_empty is not None and target_bad is not None:  # the cause at the path that met the bad node
        if verification.path == "walk":  # a flagged walk keeps no stop node: every node of the row
            path = torch.arange(tree.node_slots, device=dev).view(1, -1) < tree.num_nodes.to(dev).view(B, 1)
        else:
            path = tree.ancestors.gather(1, decision.stop.to(dev).clamp(0, tree.node_slots - 1).view(B, 1, 1)
                                         .expand(B, 1, tree.node_slots)).squeeze(1)  # [B, n] the root .. stop
        grammar = visited_bad & (path & grammar_empty).any(-1) & ~(path & target_bad).any(-1)
    flag = torch.where(refused | (checked.unsupported > 0), FLAG_REFUSED, torch.where(
        checked.outside, FLAG_TOKENS, torch.where(draft_bad | checked.law_bad, FLAG_DRAFT, torch.where(
            grammar, FLAG_GRAMMAR, torch.where(visited_bad, FLAG_TARGET, FLAG_NONE)))))
    bad = (flag > 0).to(decision.accepted.device)
    keep = ~bad.view(B, 1)
    lp = None if logprobs is None else _logprobs(logits, decision, rows, logprobs, bad)
    return EngineVerification(
        accepted=torch.where(keep, decision.accepted, -1),
        tokens=torch.where(keep, decision.tokens, -1),
        num_accepted=torch.where(bad, 0, decision.num_accepted),
        num_emitted=torch.where(bad, 0, decision.num_accepted + 1),
        bad=bad,
        path=verification.path,
        flag=flag,
        refusals=refusals,
        unsupported=checked.unsupported,
        verifier=rule_of,
        logprobs=None if lp is None else lp[0],
        top_logprobs=None if lp is None else lp[1],
        top_ids=None if lp is None else lp[2],
    )


def _logprobs(logits: torch.Tensor, decision: TreeDecision, rows: RowSampling, k: int,
              bad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``([B, D + 1], [B, D + 1, k], [B, D + 1, k])``: each emitted token's log-probability
    (:func:`~specdec.engine.step.emitted_logprobs` of the processed ``logits``), and the ``k``
    largest of the same law with their ids (None at ``k = 0``); NaN / ``-1`` past ``num_emitted``
    and on bad rows."""
    B, D1 = decision.tokens.shape
    sampling: SamplingConfig | RowSampling = rows.configs[0] if rows.uniform else rows
    emitted = (torch.arange(D1, device=bad.device).view(1, D1) <= decision.num_accepted.to(bad.device).view(B, 1))
    emitted &= ~bad.view(B, 1)  # [B, D + 1]
    sampled, top = law_logprobs(emitted_laws(logits, decision, sampling), decision, k)  # one law for both
    lp = torch.where(emitted, sampled.to(bad.device), float("nan"))
    if top is None:
        return lp, None, None
    values, ids = top  # [B, D + 1, k] the same law as lp
    keep = emitted.to(values.device).unsqueeze(-1)
    return lp, torch.where(keep, values, float("nan")).to(bad.device), torch.where(keep, ids, -1).to(bad.device)


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


def _check_allowed(tree: TreeBatch, allowed: torch.Tensor | None) -> None:
    """The grammar mask's shape, dtype and device (no host read)."""
    if allowed is None:
        return
    want = (tree.batch_size, tree.node_slots, tree.vocab_size)
    if not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool or tuple(allowed.shape) != want:
        raise InvalidConfigError(
            f"allowed must be a [B, n, V] = {list(want)} bool tensor (the tokens each row's grammar allows at each "
            f"node), got {getattr(allowed, 'dtype', type(allowed).__name__)} {list(getattr(allowed, 'shape', []))}"
        )
    if allowed.device != tree.device:
        raise InvalidConfigError(f"allowed is on {allowed.device} but the tree batch is on {tree.device}")
