"""Tensor verification of a tree batch: every node decided at once, no host read.

The torch reference of a verification rule is its :class:`~specdec.verify.base.Verifier`
(the walk from the root, one node at a time). Its :class:`FusedRule`
(docs/verifiers.md, rules 2-5) also has this tensor form, which the step path
runs: node ``i`` of tree ``b`` tests its children with its own uniforms
``u[b, i, t]`` (the ``t``-th test at the node; ``u[b, i, tests]`` draws the
bonus), so every node's decision depends only on its own row of ``p``, its
children and ``q'``, and all nodes are decided in parallel; the accepted
path is then followed from the root with ``max_depth`` gathers. With the same
uniforms this gives what the walk gives (tested against it with a source
that replays the table, ``tests/verify/test_verify_fast.py``), except when a
uniform falls within float rounding of a threshold.

The residual is never made dense: after rejections it differs from ``p``
only on the support of ``q'`` (``L`` entries), and rule 2 only removes the
tested tokens, so each rule runs on ``[B, n, L]`` and ``[B, n, C]`` tensors;
the bonus row alone is rebuilt over the vocabulary.

On a CPU the step verifies by a walk instead (:func:`decide_tree_walk`): the
same rules (:func:`_node_rules`), decided only at the nodes visited, one depth at
a time, so only ``max_depth + 1`` rows of ``p`` are made (docs/kernels.md,
"Verification on a CPU: the walk").

Workspace: on a CPU, uncompiled, :func:`decide_from_scores` writes the
target's ``[B, n, V]`` tempered scores and law (torch's softmax, the same
bits) into buffers kept per thread, sized by the largest law verified, instead
of new tensors each step (:func:`release_workspace` frees them), and at
``T = 0`` :func:`decide_from_logits` its one-hot rows. Compiled, the law at
``T > 0`` is never written; on CUDA the caching allocator reuses memory already.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import torch

from specdec.sampling import (
    RowSampling,
    SamplingConfig,
    greedy_law,
    law_is_bad,
    process_logits,
    process_logits_rows,
    row_is_bad,
    temperature_scores,
    warped_scores,
    warped_scores_rows,
)
from specdec.errors import InvalidConfigError
from specdec.tree_batch import TreeBatch
from specdec.verify.base import FusedRule
from specdec.verify.decision import TreeDecision, _arange, child_tokens, children_table, emitted_tokens, reached_path
from specdec.verify.greedy_decision import decide_greedy

__all__ = ["VERIFY_ROWS", "TreeDecision", "children_table", "resolve_rows", "decide_from_logits", "decide_from_scores", "decide_tree_batch", "decide_tree_walk",
           "release_workspace", "step_scores", "target_weights", "verify_tree_batch"]


def verify_tree_batch(
    rule: FusedRule, tree: TreeBatch, p: torch.Tensor, u: torch.Tensor, bad_rows: torch.Tensor | None = None
) -> TreeDecision:
    """Verify every tree of ``tree`` by ``rule`` with the uniforms ``u``
    (:func:`decide_tree_batch`, wrapped in a :class:`TreeDecision`)."""
    return TreeDecision(*decide_tree_batch(rule, tree, p, u, bad_rows))


def target_weights(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The processed target law up to a factor per row, and the rows that are not a law.

    The rows :func:`~specdec.sampling.row_is_bad` flags have a non-finite
    max score: eagerly the flag is read from the law's first column
    (:func:`~specdec.sampling.law_is_bad`), compiled from the max, with no
    pass of its own over the vocabulary.

    Eager, ``p = softmax(s)`` (torch's fused kernel: one ``[..., V]`` write).
    Compiled (:class:`specdec.engine.compiler.StepCompiler`), ``w = exp(s - max s)``,
    the softmax before its division by the row's sum, which
    :func:`decide_tree_batch` makes itself on the few entries it reads: the
    max and the exp-sum are the only passes over the vocabulary.

    Args:
        scores: ``[..., V]`` warped scores (:func:`~specdec.sampling.warped_scores`), float32 or float64.

    Returns:
        ``w [..., V]`` (``scores``' dtype) and ``bad [...]`` bool.
    """
    if torch.compiler.is_compiling():
        top, bad = _max_and_bad(scores)  # [..., 1], [...]
        return torch.exp(scores - top), bad
    p = torch.softmax(scores, dim=-1)  # [..., V]
    return p, law_is_bad(p)


def _max_and_bad(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., 1]`` each row's max score and ``[...]`` the rows where it is not finite: the
    rows :func:`~specdec.sampling.row_is_bad` flags (NaN, +inf or all -inf), with no pass of their own."""
    top = scores.amax(dim=-1, keepdim=True)  # [..., 1]
    return top, ~torch.isfinite(top.squeeze(-1))


def decide_from_scores(
    rule: FusedRule, tree: TreeBatch, scores: torch.Tensor, u: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, ...]:
    """:func:`decide_tree_batch` on the law of ``scores / temperature``
    (:func:`~specdec.sampling.temperature_scores`, then :func:`target_weights`):
    the step's verification from the target's logits at ``T > 0`` without
    top-k or top-p (``temperature = T``), or from warped scores (``1``).
    Returns the :class:`TreeDecision` fields with ``bad_visited`` from the
    scores' own flags."""
    if torch.compiler.is_compiling():  # the law is never written: decide_tree_batch reads exp(s - max s) where it looks
        scores = temperature_scores(scores, temperature)  # [B, n, V]
        return decide_tree_batch(rule, tree, scores, u, None, scores=True)
    if not _in_workspace(scores):
        w, bad = target_weights(temperature_scores(scores, temperature))  # [B, n, V], [B, n]
    else:  # the same ops into this thread's buffers (module docstring, "Workspace")
        if temperature != 1.0:  # (T = 1: the scores themselves, no buffer)
            scores = temperature_scores(scores, temperature, out=_WORKSPACE.take("scores", scores))  # [B, n, V]
        w = torch.ops.aten._softmax.out(scores, -1, False, out=_WORKSPACE.take("law", scores))  # torch.softmax's bits
        bad = law_is_bad(w)  # [B, n]
    return decide_tree_batch(rule, tree, w, u, bad)


WORKSPACE_MIN_ENTRIES = 1 << 18
"""Laws of at least this many entries (1 MiB of float32) are written to :data:`_WORKSPACE` on a CPU."""

WORKSPACE_MAX_ENTRIES = 1 << 26
"""...and of at most this many (256 MiB of float32, a batch of about 8 trees of 61 nodes at
``V = 128256``): a thread keeps no larger buffers; larger laws are new tensors each step."""


def _in_workspace(x: torch.Tensor) -> bool:
    """Whether the law of ``x`` is written to this thread's buffers (a CPU tensor of
    :data:`WORKSPACE_MIN_ENTRIES` to :data:`WORKSPACE_MAX_ENTRIES` entries)."""
    return x.device.type == "cpu" and WORKSPACE_MIN_ENTRIES <= x.numel() <= WORKSPACE_MAX_ENTRIES


class _Workspace(threading.local):
    """Per-thread CPU buffers for :func:`decide_from_scores`' ``[B, n, V]`` law and scores.

    A new ``[B, n, V]`` tensor per step (61 rows at ``V = 128256`` are 31 MB)
    is memory glibc gives back to the system between steps (mmap'd, or heap
    trimmed after the free), whose pages fault in again at every step; on this
    project's CPU that cost more than the softmax. The
    buffers grow to the largest law verified in the thread and are reused;
    nothing they hold outlives the call (the decision is new tensors).
    """

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def take(self, slot: str, like: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU tensor of ``like``'s shape and dtype, reusing ``slot``'s buffer."""
        n = like.numel()
        buf = self.buffers.get(slot)
        if buf is None or buf.numel() < n or buf.dtype != like.dtype:
            buf = self.buffers[slot] = torch.empty(n, dtype=like.dtype)
        return buf[:n].view(like.shape)


_WORKSPACE = _Workspace()


def release_workspace() -> None:
    """Free this thread's verification buffers (rule 4's every-node form and traversal's tensor
    form keep up to two and six, each of at most :data:`WORKSPACE_MAX_ENTRIES` entries; they are made
    again at the next large CPU verification)."""
    _WORKSPACE.buffers.clear()


def step_scores(logits: torch.Tensor, sampling: SamplingConfig) -> tuple[torch.Tensor, float]:
    """``(scores, temperature)`` for :func:`decide_from_scores` at ``T > 0``: the
    logits themselves and ``T`` when only a temperature applies (the division
    then runs inside the, possibly compiled, decision), else the warped scores
    (top-k, top-p: :func:`~specdec.sampling.warped_scores`, eager) and ``1``."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if 0 < sampling.top_k < logits.shape[-1] or sampling.reads_mass:
        return warped_scores(logits, sampling), 1.0
    return logits, sampling.temperature


VERIFY_ROWS = ("auto", "all", "path")
"""The verification's choices of rows (:func:`decide_from_logits`)."""


def resolve_rows(rows: str, device: torch.device) -> str:
    """``"all"`` or ``"path"`` for ``rows`` (:data:`VERIFY_ROWS`) on ``device``: ``"auto"`` is the
    walk for CPU logits (the work over the vocabulary, not the number of ops, sets the time there)
    and every node at once on other devices. The generation loop resolves it once per generation
    (:func:`specdec.engine.dispatch.choose_verification`).

    Raises:
        InvalidConfigError: ``rows`` is not one of :data:`VERIFY_ROWS`.
    """
    if rows not in VERIFY_ROWS:
        raise InvalidConfigError(f"rows must be one of {VERIFY_ROWS}, got {rows!r}")
    if rows == "auto":
        return "path" if device.type == "cpu" else "all"
    return rows


def decide_from_logits(
    rule: FusedRule,
    tree: TreeBatch,
    logits: torch.Tensor,
    u: torch.Tensor,
    sampling: SamplingConfig | RowSampling,
    decide: Callable[..., tuple[torch.Tensor, ...]] | None = None,
    decide_scores: Callable[..., tuple[torch.Tensor, ...]] | None = None,
    *,
    rows: str = "auto",
    decide_walk: Callable[..., tuple[torch.Tensor, ...]] | None = None,
) -> TreeDecision:
    """The step's verification of ``tree`` from the target's ``logits`` ``[B, n, V]``.

    ``rows="all"``: every node decided at once, at ``T = 0`` by
    :func:`decide_tree_batch` on the one-hot rows, at ``T > 0`` by
    :func:`decide_from_scores` (the law up to a factor per row); ``decide`` and
    ``decide_scores`` replace those two (compiled: :class:`specdec.engine.compiler.StepCompiler`).
    ``rows="path"``: :func:`decide_tree_walk` (``decide_walk`` replaces it, compiled),
    only the visited rows processed. ``rows="auto"`` (the step's choice): the walk
    for CPU logits, where the work over the vocabulary, not the number of ops,
    sets the time (at 61 nodes and ``V = 128256``, at most 7 rows instead of 61);
    every node at once on other devices (a GPU runs the ``n`` rows in parallel in
    about the time of one, and launches fewer kernels). The same decisions either
    way, with the same uniforms, except when a uniform falls within float rounding
    of a threshold (``tests/verify/test_verify_walk.py``).

    A chain (no more node slots than depths, ``node_slots <= max_depth + 1``) is decided
    every node at once even with ``rows="path"``: the walk would process every row anyway,
    in more operations (at 2 nodes on a 2-core CPU, 1.25 against 1.8 ms).

    At ``T = 0`` with nothing compiled, whatever ``rows``, the decision is
    :func:`~specdec.verify.greedy_decision.decide_greedy`'s: the same fields from the rows'
    argmax alone (every lossless rule decides the same at ``T = 0``; compared field for
    field with :func:`decide_tree_batch` on the one-hot rows and with
    :func:`decide_tree_walk`, ``tests/verify/test_greedy_decision.py``); a compiled step
    (``decide``, ``decide_walk`` given) keeps the general forms.

    ``sampling`` may be a :class:`~specdec.sampling.RowSampling` (each row its own
    configuration): one decision over every row, ``p`` processed per row
    (:func:`~specdec.sampling.process_logits_rows`; the walk per visited row), a greedy row's
    law one-hot (its decision the greedy one); rows all greedy take :func:`decide_greedy`.
    Each row decides what it decides under its own configuration alone (uncompiled).
    """
    if isinstance(sampling, RowSampling):
        if sampling.uniform:
            sampling = sampling.configs[0]
        else:
            return _decide_rows(rule, tree, logits, u, sampling, rows)
    if sampling.greedy and decide is None and decide_walk is None:
        return TreeDecision(*decide_greedy(rule, tree, logits))  # one pass over the vocabulary (specdec.verify.greedy_decision)
    rows = resolve_rows(rows, logits.device)
    if rows == "path" and decide_walk is None and tree.node_slots <= tree.max_depth + 1:
        rows = "all"  # a chain: the walk would visit every row anyway, in more ops (issue 48: 1.8 -> 1.25 ms at 2 nodes)
    if rows == "path":
        return TreeDecision(*(decide_walk or decide_tree_walk)(rule, tree, logits, u, sampling))
    if sampling.greedy:  # one-hot rows
        if _in_workspace(logits):  # process_logits' one-hot rows, in this thread's buffer
            wide = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
            p = greedy_law(wide, out=_WORKSPACE.take("law", wide))  # [B, n, V]
        else:
            p = process_logits(logits, sampling, check=False)  # [B, n, V]
        return TreeDecision(*(decide or decide_tree_batch)(rule, tree, p, u, row_is_bad(logits)))
    scores, temperature = step_scores(logits, sampling)  # [B, n, V]
    return TreeDecision(*(decide_scores or decide_from_scores)(rule, tree, scores, u, temperature))


def _decide_rows(rule: FusedRule, tree: TreeBatch, logits: torch.Tensor, u: torch.Tensor, sampling: RowSampling,
                 rows: str) -> TreeDecision:
    """:func:`decide_from_logits` of rows under their own configurations (several), in one pass."""
    if all(c.greedy for c in sampling.configs):
        return TreeDecision(*decide_greedy(rule, tree, logits))
    rows = resolve_rows(rows, logits.device)
    if rows == "path" and tree.node_slots <= tree.max_depth + 1:
        rows = "all"  # a chain, as decide_from_logits
    if rows == "path":
        return TreeDecision(*decide_tree_walk(rule, tree, logits, u, sampling))
    p = process_logits_rows(logits, sampling)  # [B, n, V]
    return TreeDecision(*decide_tree_batch(rule, tree, p, u, law_is_bad(p) | row_is_bad(logits)))


def decide_tree_batch(
    rule: FusedRule,
    tree: TreeBatch,
    p: torch.Tensor,
    u: torch.Tensor,
    bad_rows: torch.Tensor | None = None,
    *,
    scores: bool = False,
) -> tuple[torch.Tensor, ...]:
    """The body of :func:`verify_tree_batch`: tensors in, the :class:`TreeDecision`
    fields out, in order, with no host read and no Python object built, so that
    it compiles as one graph (``torch.compile(..., fullgraph=True)``).

    Args:
        rule: the verifier's :class:`~specdec.verify.base.FusedRule`.
        tree: ``B`` trees of ``n`` node slots.
        p: ``[B, n, V]`` the processed target law of each node, up to a positive
            factor per row (probabilities, or :func:`target_weights`'
            ``exp(s - max s)``): every entry read is divided by its row's sum.
            Rows of padding slots are ignored.
        u: ``[B, n, C + 1]`` float64 uniforms, ``C = tree.max_children``.
        bad_rows: ``[B, n]`` bool rows whose logits were not a distribution
            (:func:`~specdec.sampling.row_is_bad`).
        scores: ``p`` holds (warped, tempered) scores ``s`` instead: the law is
            ``exp(s - max s)`` up to a factor per row, read only where the rule
            looks (its sum, the gathers, the bonus row), so compiled the
            ``[B, n, V]`` law is never written; ``bad_rows`` is then the rows
            whose max score is not finite (:func:`target_weights`' rule) and
            the argument is ignored.

    Returns:
        The :class:`TreeDecision` fields, on ``p``'s device.
    """
    B, n, V = p.shape
    C, D = tree.max_children, tree.max_depth
    dev = p.device
    table, n_sampled = children_table(tree, rule)  # [B, n, C], [B, n]
    has = table >= 0  # [B, n, C]
    child_tok = child_tokens(tree, table, has)  # [B, n, C]
    top = None
    if scores:
        top, bad_rows = _max_and_bad(p)  # [B, n, 1], [B, n]
    wor = tree.law_wor if rule.without_replacement is None else torch.full_like(tree.law_wor, rule.without_replacement)
    nodes = _node_rules(rule, p, top, child_tok, has, n_sampled, tree.law_ids, tree.law_probs, wor,
                        _sampled_tests(tree), u)
    first = nodes.first  # [B, n]
    child = torch.where(first < C, table.gather(-1, first.clamp(max=C - 1).unsqueeze(-1)).squeeze(-1), -1)  # [B, n]
    reached, accepted, num_accepted, node = reached_path(tree, child)
    bad = (reached & bad_rows).any(dim=-1) if bad_rows is not None else torch.zeros(B, dtype=torch.bool, device=dev)
    # the bonus, from the stop node's row
    rows = node.view(B, 1, 1)
    row = p.gather(1, rows.expand(B, 1, V)).squeeze(1)  # [B, V] the stop node's row
    if top is not None:  # scores
        row = torch.exp(row - top.gather(1, rows).squeeze(-1))

    def at_stop(x: torch.Tensor) -> torch.Tensor:  # [B, n, k] -> [B, k]: the stop node's entries
        return x.gather(1, rows.expand(B, 1, x.shape[-1])).squeeze(1)

    stop = _StopRow(row, at_stop(nodes.p_total), at_stop(tree.law_ids), None if nodes.r_s is None else at_stop(nodes.r_s),
                    n_sampled.gather(1, node.unsqueeze(-1)), at_stop(child_tok), at_stop(nodes.matched), at_stop(has),
                    at_stop(u))
    return _finish(rule, tree, stop, accepted, num_accepted, bad, node)


class _NodeRules(NamedTuple):
    """What rules 2-5 decide at a set of nodes (``[B, r]`` rows: every node, or the walk's current one)."""

    first: torch.Tensor  # [B, r] the accepted child's slot in test order (C: none)
    matched: torch.Tensor  # [B, r, C] the children rule 2 tested
    r_s: torch.Tensor | None  # [B, r, L] float64 the residual on q''s support after rules 3/4 (None: no rejection)
    p_total: torch.Tensor  # [B, r, 1] float64 each row's sum (the law's factor)


def _sampled_tests(tree: TreeBatch) -> int:
    """How many sampled children rules 3/4 test at most per node."""
    C, L = tree.max_children, tree.law_ids.shape[-1]
    return min(C if tree.max_sampled is None else tree.max_sampled, L)


def _node_rules(
    rule: FusedRule,
    p: torch.Tensor,
    top: torch.Tensor | None,
    child_tok: torch.Tensor,
    has: torch.Tensor,
    n_sampled: torch.Tensor,
    ids: torch.Tensor,
    law_probs: torch.Tensor,
    wor: torch.Tensor,
    S: int,
    u: torch.Tensor,
) -> _NodeRules:
    """Rules 2-5 (docs/verifiers.md) at ``r`` nodes of each tree, each from its own row alone.

    Args:
        rule: the verifier's fused rule.
        p: ``[B, r, V]`` the nodes' target laws up to a factor per row, or their
            scores when ``top`` (``[B, r, 1]``, the rows' max) is given: the law
            is then ``exp(p - top)``, read only where the rules look.
        child_tok: ``[B, r, C]`` the children's tokens in test order (``-1`` padded); ``has`` where a child is.
        n_sampled: ``[B, r]`` sampled children per node (tested first).
        ids, law_probs: ``[B, r, L]`` ``q'``'s support (``-1`` padded) and probabilities; ``wor`` ``[B, r]``
            whether ``q'`` is drawn without replacement; ``S`` the most sampled children tested.
        u: ``[B, r, C + 1]`` float64 the nodes' uniforms.
    """
    C = child_tok.shape[-1]
    work = torch.float64

    def weights_at(index: torch.Tensor) -> torch.Tensor:  # [B, r, k] the law, up to its row's factor, at index
        at = p.gather(-1, index)
        return torch.exp(at - top) if top is not None else at

    p_total = (torch.exp(p - top) if top is not None else p).sum(dim=-1, keepdim=True).to(work)  # [B, r, 1]
    P_child = weights_at(child_tok.clamp_min(0)).to(work) / p_total  # [B, r, C] normalised p at the children
    slots = _arange(C, p.device)
    rejecting = rule.rejection and ids.shape[-1] > 0
    Z: torch.Tensor | float = 1.0  # the residual's mass: 1 (p normalised) until rules 3/4 reject
    first: torch.Tensor | None = None  # first accepted slot by rules 3/4, [B, r] (C = none)
    matched = has  # the children tested by rule 2
    r_s = None
    if rejecting:
        on = ids >= 0
        r_s = torch.where(on, weights_at(ids.clamp_min(0)).to(work) / p_total, 0.0)  # [B, r, L] residual on q's support
        off = (1.0 - r_s.sum(dim=-1)).clamp_min(0.0)  # [B, r] residual mass outside it
        q = law_probs.to(work)  # [B, r, L] q' (updated by rule 4)
        for t in range(S):  # rules 3/4 on the t-th sampled child of every node at once
            testing = t < n_sampled if first is None else (t < n_sampled) & (first == C)  # [B, r]
            pos = (ids == child_tok[..., t : t + 1]).long().argmax(dim=-1, keepdim=True)  # [B, r, 1]
            Z = (off + r_s.sum(dim=-1)).unsqueeze(-1)  # [B, r, 1]
            ratio = (r_s.gather(-1, pos) / (Z * q.gather(-1, pos)).clamp_min(1e-300)).clamp(max=1.0).squeeze(-1)
            accept = testing & (u[..., t] < ratio)
            first = torch.where(accept, t, C if first is None else first)
            rejected = (testing & ~accept).unsqueeze(-1)  # [B, r, 1]
            r_s = torch.where(rejected, (r_s - Z * q).clamp_min(0.0), r_s)
            if t + 1 < S:  # q' for the next test (no later use after the last)
                q_wor = q.scatter(-1, pos, 0.0)
                q_wor = q_wor / q_wor.sum(dim=-1, keepdim=True).clamp_min(1e-300)
                q = torch.where(rejected & wor.unsqueeze(-1), q_wor, q)
        Z = off + r_s.sum(dim=-1)  # [B, r]
        matched = has & (slots >= n_sampled.unsqueeze(-1))  # the children after the sampled ones
    # rule 2 over the matched children (all of them for "match"; the deterministic ones after rule 5's rejections)
    if not (rule.match_deterministic or not rule.rejection):  # rules 3/4 alone: rule 2 tests no child
        none = torch.full(has.shape[:-1], C, dtype=torch.int64, device=has.device)  # [B, r]
        return _NodeRules(none if first is None else first, torch.zeros_like(has), r_s, p_total)
    if r_s is not None:  # rejecting: after rejections the residual differs from p on q's support
        in_support = ids.unsqueeze(-2) == child_tok.unsqueeze(-1)  # [B, r, C, L]
        r_child = torch.where(in_support.any(dim=-1), (in_support * r_s.unsqueeze(-2)).sum(dim=-1), P_child)
    else:
        r_child = P_child  # [B, r, C]
    repeat = ((child_tok.unsqueeze(-1) == child_tok.unsqueeze(-2)) & matched.unsqueeze(-2)).tril(-1).any(dim=-1)
    r_child = torch.where(matched & ~repeat, r_child, 0.0)
    before = torch.cumsum(r_child, dim=-1) - r_child
    Z_col = Z.unsqueeze(-1) if isinstance(Z, torch.Tensor) else Z  # [B, r, 1]
    accept = matched & (u[..., :C] * (Z_col - before) < r_child)  # u < P(x) on the current residual
    match_first = torch.where(accept, slots, C).amin(dim=-1)  # [B, r]
    first = match_first if first is None else torch.where(first < C, first, match_first)
    return _NodeRules(first, matched, r_s, p_total)


class _StopRow(NamedTuple):
    """The stop node's entries, where the bonus is drawn (``[B, ...]``)."""

    row: torch.Tensor  # [B, V] its law up to its factor
    p_total: torch.Tensor  # [B, 1] float64 the factor (the row's sum)
    ids: torch.Tensor  # [B, L] q''s support
    r_s: torch.Tensor | None  # [B, L] the residual there (None: no rejection)
    n_sampled: torch.Tensor  # [B, 1]
    tok: torch.Tensor  # [B, C] children's tokens in test order
    matched: torch.Tensor  # [B, C]
    has: torch.Tensor  # [B, C]
    u: torch.Tensor  # [B, C + 1]


def _finish(
    rule: FusedRule,
    tree: TreeBatch,
    stop: _StopRow,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    bad: torch.Tensor,
    node: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The bonus (the stop node's final residual over the vocabulary, inverse CDF with the
    node's next uniform) and the :class:`TreeDecision` fields."""
    B, V = stop.row.shape
    D = tree.max_depth
    dev = stop.row.device
    work = torch.float64
    attempted = num_accepted + stop.has.any(dim=-1)  # the stop node's failed tests too
    P = stop.row.to(work) / stop.p_total  # [B, V]
    if stop.r_s is not None:
        tested_rej = stop.n_sampled > 0  # [B, 1]
        delta = torch.where((stop.ids >= 0) & tested_rej, stop.r_s - P.gather(-1, stop.ids.clamp_min(0)), 0.0)
        P = P.scatter_add(-1, stop.ids.clamp_min(0), delta)
    # the matched children's tokens leave the residual: min with 0 there (with +inf at the other slots, padding included)
    zap = torch.where(stop.matched, 0.0, float("inf")).to(work)  # [B, C]
    P = P.clamp_min(0.0).scatter_reduce(-1, stop.tok.clamp_min(0), zap, "amin")
    cdf = torch.cumsum(P, dim=-1)  # [B, V]
    n_tested = stop.has.sum(dim=-1, keepdim=True) if rule.match_deterministic or not rule.rejection else stop.n_sampled
    u_bonus = stop.u.gather(-1, n_tested)  # [B, 1]
    bonus = torch.searchsorted(cdf, u_bonus * cdf[:, -1:], right=True).squeeze(-1)
    last_positive = torch.where(P > 0, _arange(V, dev), -1).amax(dim=-1)
    bonus = torch.minimum(bonus, last_positive)
    tokens = emitted_tokens(tree, accepted, num_accepted, bonus)  # [B, D + 1]
    return accepted, num_accepted, tokens, bonus, attempted, bad, node


def decide_tree_walk(
    rule: FusedRule, tree: TreeBatch, logits: torch.Tensor, u: torch.Tensor, sampling: SamplingConfig | RowSampling
) -> tuple[torch.Tensor, ...]:
    """:func:`decide_tree_batch` from the target's logits by a walk: the same decisions with
    the same uniforms, made only at the nodes the verification visits.

    A node's decision depends on its own row alone, so instead of deciding all
    ``n`` nodes at once and then following the accepted path, the walk decides
    the root, moves to its accepted child, and so on, ``max_depth + 1`` times
    with fixed shapes (a tree that has stopped decides its stop node again, which
    decides the same); only the visited rows are processed (temperature, top-k,
    top-p, softmax: at most ``max_depth + 1`` of the ``n`` rows over the
    vocabulary instead of all of them). No host read; more, smaller ops in
    sequence, which is the better trade on a CPU (:func:`decide_from_logits`'
    choice). A row that is not a law (NaN, +inf, all -inf) is flagged only
    where it is visited, as in the batch form.

    Args:
        rule: the verifier's fused rule.
        tree: ``B`` trees of ``n`` node slots.
        logits: ``[B, n, V]`` the target's logits (after any logits processor).
        u: ``[B, n, C + 1]`` float64 uniforms, as :func:`decide_tree_batch`.
        sampling: the processing of ``p`` (greedy: one-hot rows), or each row's own
            (:class:`~specdec.sampling.RowSampling`).

    Returns:
        The :class:`TreeDecision` fields, on ``logits``' device.
    """
    B, n, V = logits.shape
    C, D = tree.max_children, tree.max_depth
    table, n_sampled = children_table(tree, rule)  # [B, n, C], [B, n]
    has = table >= 0  # [B, n, C]
    child_tok = child_tokens(tree, table, has)  # [B, n, C]
    wor = tree.law_wor if rule.without_replacement is None else torch.full_like(tree.law_wor, rule.without_replacement)
    S = _sampled_tests(tree)
    cur = torch.zeros(B, 1, dtype=torch.int64, device=logits.device)  # [B, 1] the node deciding: the root first
    bad = torch.zeros(B, dtype=torch.bool, device=logits.device)
    path: list[torch.Tensor] = []  # per depth: [B, 1] the accepted child (-1 once stopped)
    tree_ids = _arange(B, logits.device)  # [B]
    offsets = (tree_ids * n).unsqueeze(-1)  # [B, 1] each tree's first row in [B * n, V]
    flat_rows = logits.view(B * n, V) if logits.is_contiguous() else None
    for d in range(D + 1):
        rows = cur.unsqueeze(-1)  # [B, 1, 1]
        if flat_rows is not None:  # (index_select copies B rows; an index of V entries per row would be built)
            x = flat_rows.index_select(0, (cur + offsets).squeeze(-1)).unsqueeze(1)  # [B, 1, V]
        else:
            x = logits[tree_ids, cur.squeeze(-1)].unsqueeze(1)
        w, bad_row = _row_law(x, sampling)  # [B, 1, V], [B, 1]
        cur_tok, cur_has, cur_ids, cur_u = (_at(t, rows) for t in (child_tok, has, tree.law_ids, u))  # [B, 1, k]
        cur_sampled = n_sampled.gather(1, cur)  # [B, 1]
        nodes = _node_rules(rule, w, None, cur_tok, cur_has, cur_sampled, cur_ids, _at(tree.law_probs, rows),
                            wor.gather(1, cur), S, cur_u)
        first = nodes.first  # [B, 1]
        child = torch.where(first < C, _at(table, rows).squeeze(1).gather(-1, first.clamp(max=C - 1)), -1)  # [B, 1]
        bad = bad | bad_row.squeeze(-1)
        if d == D:  # no node at depth D has a child: every tree has stopped, at cur
            stop = _StopRow(w.squeeze(1), nodes.p_total.squeeze(1), cur_ids.squeeze(1),
                            None if nodes.r_s is None else nodes.r_s.squeeze(1), cur_sampled, cur_tok.squeeze(1),
                            nodes.matched.squeeze(1), cur_has.squeeze(1), cur_u.squeeze(1))
            break
        path.append(child)
        cur = torch.where(child >= 0, child, cur)
    accepted = torch.cat(path, dim=-1) if path else torch.empty(B, 0, dtype=torch.int64, device=logits.device)  # [B, D]
    num_accepted = (accepted >= 0).sum(dim=-1)  # [B]
    return _finish(rule, tree, stop, accepted, num_accepted, bad, cur.squeeze(-1))


def _at(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``[B, n, k]`` -> ``[B, 1, k]``: the entries of the nodes ``rows`` ``[B, 1, 1]``."""
    return x.gather(1, rows.expand(x.shape[0], 1, x.shape[-1]))


def _row_law(x: torch.Tensor, sampling: SamplingConfig | RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk's law of logits rows ``x`` ``[B, 1, V]``: ``exp(s - max s)`` of the
    processed scores (one-hot rows at ``T = 0``) and the rows that are not a law."""
    if isinstance(sampling, RowSampling):  # each row its own: warped per row, greedy rows one-hot
        if sampling.uniform:
            return _row_law(x, sampling.configs[0])
        s = warped_scores_rows(x, sampling)  # [B, 1, V] (float32 or float64)
        top, bad = _max_and_bad(s)
        w = torch.exp(s - top)
        if any(c.greedy for c in sampling.configs):
            w = torch.where(sampling.greedy.to(w.device).view(-1, 1, 1), greedy_law(s), w)
        return w, bad
    if x.dtype in (torch.float16, torch.bfloat16):
        bad = row_is_bad(x)
        x = x.float()
        if sampling.greedy:
            return greedy_law(x), bad
    elif sampling.greedy:
        return greedy_law(x), row_is_bad(x)
    s, temperature = step_scores(x, sampling)  # [B, 1, V]
    s = temperature_scores(s, temperature)
    top, bad = _max_and_bad(s)  # [B, 1, 1], [B, 1]
    return torch.exp(s - top), bad
