"""Fused tree verification: every node's decision in one kernel launch.

Words (see :mod:`specdec.verify.base`): *accepted* child, *bonus* token,
*residual* ``P``; ``q'`` is the recorded law of a node's sampled children.

The reference is the registered verifiers of docs/verifiers.md rules 2-5 --
``match``, ``rejection-iid``, ``rejection-wor``, ``mixed`` -- run by
:meth:`Verifier.verify <specdec.verify.base.Verifier.verify>` with a
:class:`~specdec.rng.CounterRandom`. With that source, node
``i``'s draws are the uniforms ``U(seed, walk, i, t)``, so node ``i``'s
decision (accept child ``c`` after ``t`` tests, or draw the bonus) depends only
on its own row ``p[i]``, children and ``q'``. :func:`fused_verify` therefore
computes every node's decision in parallel
(:mod:`specdec.kernels.verify_triton`, one program per node) and follows the
accepted children from the root on the host: the same
:class:`~specdec.verify.base.VerifyResult`, and the source left at the same
position, as the sequential walk. Discrete outputs agree exactly except when a
uniform falls within float rounding of a decision threshold (the kernel sums
over the vocabulary in a different order than torch; about ``1e-7`` relative
for float32 rows).

What runs where:

- ``inputs="probs"``: ``p`` is given (from :func:`~specdec.sampling.process_logits`,
  torch); the kernel fuses the normalisation, every child test, the residual
  updates of rules 2-4, the without-replacement updates and the bonus
  inverse-CDF draw, for all nodes, in one launch.
- ``inputs="logits"``: the kernel also fuses temperature, the top-k mask and
  the softmax (the top-k threshold, the smallest logit of
  :func:`~specdec.sampling.process_logits`' top-k set, comes from one batched
  ``torch.topk`` on ``logits / T``: :func:`~specdec.sampling.top_k_logit_threshold`). Top-p needs a sort per row and stays
  in torch: use ``inputs="probs"`` for it (the generation loop does).

The generation loop runs :func:`fused_verify_batch` on the device's tree batch when its
one dispatch (:mod:`specdec.engine.dispatch`) chooses the kernel. The kernel takes the
rule's descriptor (:class:`~specdec.verify.base.FusedRule`, declared by each verifier as
:attr:`Verifier.fused <specdec.verify.base.Verifier.fused>`), never a verifier class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from specdec.errors import InvalidConfigError, InvalidDistributionError, VocabMismatchError
from specdec.kernels.select import triton_available
from specdec.rng import CounterRandom, RowStreams
from specdec.sampling import (
    RowSampling,
    SamplingConfig,
    process_logits_rows,
    top_k_logit_threshold,
    top_k_logit_threshold_rows,
)
from specdec.tree import DraftTree, SampleMode
from specdec.verify.base import FusedRule, Verifier, VerifyResult
from specdec.verify.fast import TreeDecision, children_table

__all__ = [
    "FusedRule",
    "DecisionTables",
    "build_tables",
    "fused_rule",
    "fused_verify",
    "fused_verify_many",
    "fused_verify_batch",
    "batch_tables",
    "NodeDecision",
    "node_decisions",
]

def fused_rule(verifier: Verifier) -> FusedRule | None:
    """The rule ``verifier`` declares (:attr:`Verifier.fused <specdec.verify.base.Verifier.fused>`),
    or None. The kernel runs any declared rule; a subclass that does not declare one itself
    has none (it may change the rule, as the tests' mutants do), so the kernel never silently
    replaces a different verifier."""
    return verifier.fused


def _kernels() -> Any:
    if not triton_available():
        raise InvalidConfigError(
            "the fused verification kernel needs Triton: pip install 'specdec-trees[kernels]' (triton>=3.0)"
        )
    from specdec.kernels import verify_triton

    return verify_triton


def _next_pow2(n: int) -> int:
    return 1 << max(1, (n - 1).bit_length())


@attrs.frozen(eq=False)
class DecisionTables:
    """The kernel's view of one or more trees stacked row-wise (``R`` rows).

    Attributes:
        child_tokens: ``[R, CMAX]`` int32 children tokens in test order
            (rejection children in draw order, then matched children), -1 pad.
        child_rows: ``[R, CMAX]`` int32 their rows.
        num_children: ``[R]`` int32 children tested at the row.
        num_rejection: ``[R]`` int32 the first ones tested by rejection.
        without_replacement: ``[R]`` int32 rule 4's ``q`` update applies.
        law_row: ``[R]`` int32 row of :attr:`q_dense`, -1 without rejection children.
        walk: ``[R]`` int32 the walk index of each row's tree.
        node: ``[R]`` int32 the row's node index inside its tree.
        q_dense: ``[L, V]`` the laws ``q'`` (the ``law.dense`` of the torch
            rules, in the compute dtype), or None.
        offsets: first row of each tree.
    """

    child_tokens: torch.Tensor
    child_rows: torch.Tensor
    num_children: torch.Tensor
    num_rejection: torch.Tensor
    without_replacement: torch.Tensor
    law_row: torch.Tensor
    walk: torch.Tensor
    node: torch.Tensor
    q_dense: torch.Tensor | None
    offsets: tuple[int, ...]


def build_tables(
    rule: FusedRule,
    trees: Sequence[DraftTree],
    walks: Sequence[int],
    *,
    device: torch.device | str,
    dtype: torch.dtype,
) -> DecisionTables:
    """Lay out the children and laws of ``trees`` for the kernel (host side, torch only).

    Args:
        rule: from :func:`fused_rule`.
        trees: the trees, stacked in order.
        walks: the walk index (``CounterRandom.walk``) each tree is verified under.
        device: where the kernel runs.
        dtype: compute dtype of the laws (float32, or float64 for float64 rows).
    """
    tokens_rows: list[list[int]] = []
    child_rows: list[list[int]] = []
    n_rej: list[int] = []
    wor: list[int] = []
    law_row: list[int] = []
    walk_col: list[int] = []
    node_col: list[int] = []
    law_ids: list[torch.Tensor] = []
    law_probs: list[torch.Tensor] = []
    offsets: list[int] = []
    offset = 0
    for tree, walk in zip(trees, walks, strict=True):
        offsets.append(offset)
        toks = tree.tokens.tolist()
        for node in range(tree.num_nodes):
            sampled = tree.sampled_children(node)
            determ = tree.deterministic_children(node) if rule.match_deterministic else ()
            order = list(sampled) + list(determ)  # the verifiers' test order
            rej = len(sampled) if rule.rejection else 0
            w = 0
            lrow = -1
            if rej:
                law = tree.law_of(sampled[0])
                lrow = len(law_ids)
                law_ids.append(law.indices)
                law_probs.append(law.probs)
                if rule.without_replacement is None:
                    w = int(law.mode == SampleMode.WITHOUT_REPLACEMENT)
                else:
                    w = int(rule.without_replacement)
            tokens_rows.append([toks[c] for c in order])
            child_rows.append([offset + c for c in order])
            n_rej.append(rej)
            wor.append(w)
            law_row.append(lrow)
            walk_col.append(walk)
            node_col.append(node)
        offset += tree.num_nodes
    cmax = _next_pow2(max((len(r) for r in tokens_rows), default=0) + 1)
    pad_tok = torch.full((offset, cmax), -1, dtype=torch.int32)
    pad_row = torch.full((offset, cmax), -1, dtype=torch.int32)
    for r, (tk, cr) in enumerate(zip(tokens_rows, child_rows)):
        if tk:
            pad_tok[r, : len(tk)] = torch.tensor(tk, dtype=torch.int32)
            pad_row[r, : len(cr)] = torch.tensor(cr, dtype=torch.int32)
    q_dense = None
    if law_ids:
        vocab = trees[0].vocab_size
        rows = torch.cat([torch.full((ids.numel(),), i, dtype=torch.int64) for i, ids in enumerate(law_ids)])
        cols = torch.cat([ids.to(torch.int64) for ids in law_ids])
        vals = torch.cat([pr.to(dtype) for pr in law_probs])
        q_dense = torch.zeros((len(law_ids), vocab), dtype=dtype, device=device)
        q_dense[rows.to(device), cols.to(device)] = vals.to(device)

    def col(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device)

    return DecisionTables(
        child_tokens=pad_tok.to(device),
        child_rows=pad_row.to(device),
        num_children=col([len(r) for r in tokens_rows]),
        num_rejection=col(n_rej),
        without_replacement=col(wor),
        law_row=col(law_row),
        walk=col(walk_col),
        node=col(node_col),
        q_dense=q_dense,
        offsets=tuple(offsets),
    )


_STATUS_TEXT = (
    (1, "contains NaN"),
    (2, "contains +inf (logits) or inf (probabilities)"),
    (4, "has negative probabilities, or its logits are all -inf"),
    (8, "does not sum to 1"),
    (16, "leaves an empty residual"),
)


def _raise_status(status: list[int], what: str) -> None:
    for row, code in enumerate(status):
        if code:
            reasons = ", ".join(text for bit, text in _STATUS_TEXT if code & bit)
            raise InvalidDistributionError(f"{what} row {row} {reasons}")


def _check_inputs(x: torch.Tensor, trees: Sequence[DraftTree], inputs: str) -> None:
    if inputs not in ("probs", "logits"):
        raise InvalidConfigError(f"inputs must be 'probs' or 'logits', got {inputs!r}")
    what = "p" if inputs == "probs" else "logits"
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not torch.is_floating_point(x):
        got = getattr(x, "shape", type(x))
        raise InvalidDistributionError(f"{what} must be a floating-point [n, V] tensor, got {got}")
    rows = sum(t.num_nodes for t in trees)
    if x.shape[0] != rows:
        raise InvalidDistributionError(f"{what} has {x.shape[0]} rows but the tree(s) have {rows} nodes")
    for tree in trees:
        if x.shape[1] != tree.vocab_size:
            raise VocabMismatchError(f"{what} has vocabulary {x.shape[1]} but the tree's is {tree.vocab_size}")


@attrs.frozen
class NodeDecision:
    """What a node's rule decides on its own uniforms (exactly one token field is set).

    Attributes:
        accepted_child: the accepted child (a node of the same tree), or None.
        bonus_token: the bonus token drawn at the node, or None.
        draws: uniforms the rule used at the node (tests + 1 for a bonus).
    """

    accepted_child: int | None
    bonus_token: int | None
    draws: int


def node_decisions(
    verifier: Verifier,
    trees: Sequence[DraftTree],
    x: torch.Tensor,
    *,
    seed: int,
    walks: Sequence[int],
    nodes: Sequence[Sequence[int]] | None = None,
    inputs: str = "probs",
    sampling: SamplingConfig | None = None,
    block: int | None = None,
) -> list[dict[int, NodeDecision]]:
    """Every requested node's decision, computed by one kernel launch.

    Node ``i`` of tree ``k`` decides with the uniforms ``U(seed, walks[k], i, t)``,
    exactly as ``verifier.verify_node`` does with a :class:`CounterRandom` at
    position ``(walks[k], i, 0)``.

    Args:
        verifier: a ``match``, ``rejection-iid``, ``rejection-wor`` or ``mixed`` verifier.
        trees: the trees (same vocabulary).
        x: ``[sum n_k, V]`` the trees' rows stacked in order: processed
            probabilities ``p`` (``inputs="probs"``) or raw target logits
            (``inputs="logits"``).
        seed: the :class:`CounterRandom` seed.
        walks: the walk index of each tree.
        nodes: per tree, the nodes to decide (default: all). Only their rows are checked.
        inputs: ``"probs"`` or ``"logits"``.
        sampling: required for ``inputs="logits"`` (temperature > 0, ``top_p == 1``).
        block: vocabulary block of the kernel (power of two in ``[16, 4096]``; default 1024).

    Returns:
        Per tree, ``{node: NodeDecision}``.

    Raises:
        InvalidConfigError: Triton missing, an unsupported verifier, or a
            sampling configuration the logits mode does not fuse.
        UnsupportedTreeError: as :meth:`Verifier.verify`.
        InvalidDistributionError, VocabMismatchError: bad rows.
    """
    rule = fused_rule(verifier)
    if rule is None:
        raise InvalidConfigError(
            f"verifier {type(verifier).__name__} ({getattr(verifier, 'registry_name', '?')!r}) has no fused kernel "
            "(it declares no Verifier.fused rule)"
        )
    if not trees:
        return []
    _check_inputs(x, trees, inputs)
    for tree in trees:
        verifier.check_tree(tree)
    if block is None:
        block = 1024
    if not isinstance(block, int) or not 16 <= block <= 4096 or block & (block - 1):
        raise InvalidConfigError(f"block must be a power of two in [16, 4096], got {block!r}")
    temperature = 1.0
    if inputs == "logits":
        if not isinstance(sampling, SamplingConfig):
            raise InvalidConfigError("inputs='logits' needs the SamplingConfig")
        if sampling.greedy or sampling.reads_mass:
            raise InvalidConfigError(
                "inputs='logits' fuses temperature > 0 and top-k only; process top-p / min-p / greedy rows with "
                "process_logits and pass inputs='probs'"
            )
        temperature = float(sampling.temperature)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    tables = build_tables(rule, trees, walks, device=x.device, dtype=compute)
    if nodes is None:
        rows = None
        selected = [(k, i) for k, tree in enumerate(trees) for i in range(tree.num_nodes)]
    else:
        selected = [(k, int(i)) for k, wanted in enumerate(nodes) for i in wanted]
        for k, i in selected:
            if not 0 <= i < trees[k].num_nodes:
                raise ValueError(f"node {i} outside tree {k} of {trees[k].num_nodes} nodes")
        rows = torch.tensor([tables.offsets[k] + i for k, i in selected], dtype=torch.int64, device=x.device)

    def pick(t: torch.Tensor) -> torch.Tensor:
        return t if rows is None else t.index_select(0, rows)

    xs = pick(x)
    if xs.stride(1) != 1:
        xs = xs.contiguous()
    kth = None
    if inputs == "logits" and sampling is not None:  # (checked above: logits come with their SamplingConfig)
        # the smallest raw logit in process_logits' top-k set (taken on logits / T, docs/generation.md)
        kth = top_k_logit_threshold(xs, sampling).contiguous()
    out = _kernels().launch_decisions(
        xs,
        logits=inputs == "logits",
        temperature=temperature,
        kth=kth,
        q_dense=tables.q_dense,
        law_row=pick(tables.law_row),
        child_tokens=pick(tables.child_tokens),
        child_rows=pick(tables.child_rows),
        num_children=pick(tables.num_children),
        num_rejection=pick(tables.num_rejection),
        without_replacement=pick(tables.without_replacement),
        walk=pick(tables.walk),
        node=pick(tables.node),
        seed=seed,
        atol=1e-9 if compute == torch.float64 and inputs == "probs" else 1e-4,
        block=block,
    ).tolist()
    _raise_status([row[3] for row in out], "p" if inputs == "probs" else "logits")
    decisions: list[dict[int, NodeDecision]] = [{} for _ in trees]
    for (k, i), (child, bonus, draws, _) in zip(selected, out):
        start = tables.offsets[k]
        decisions[k][i] = NodeDecision(
            accepted_child=child - start if child >= 0 else None,
            bonus_token=bonus if child < 0 else None,
            draws=draws,
        )
    return decisions


def fused_verify_many(
    verifier: Verifier,
    trees: Sequence[DraftTree],
    x: torch.Tensor,
    rng: CounterRandom,
    *,
    inputs: str = "probs",
    sampling: SamplingConfig | None = None,
    block: int | None = None,
) -> list[VerifyResult]:
    """Verify several trees in one launch, as ``[verifier.verify(t, p_t, rng) for t in trees]``
    would with a :class:`CounterRandom` (tree ``k`` gets walk ``rng.walk + k + 1``).

    Args:
        verifier: a ``match``, ``rejection-iid``, ``rejection-wor`` or ``mixed`` verifier.
        trees: the trees (same vocabulary).
        x: ``[sum n_k, V]`` the trees' rows stacked in order (see :func:`node_decisions`).
        rng: the counter-based source; left where the sequential walks leave it.
        inputs, sampling, block: see :func:`node_decisions`.

    Returns:
        One :class:`~specdec.verify.base.VerifyResult` per tree.

    Raises:
        InvalidConfigError: ``rng`` is not a :class:`CounterRandom`, or as :func:`node_decisions`.
        UnsupportedTreeError: as :meth:`Verifier.verify`.
        InvalidDistributionError: a bad row (every row is checked, not only the visited ones).
    """
    if not isinstance(rng, CounterRandom):
        raise InvalidConfigError(f"the fused kernel draws from a CounterRandom, got {type(rng).__name__}")
    walks = [rng.walk + 1 + k for k in range(len(trees))]
    decisions = node_decisions(
        verifier, trees, x, seed=rng.seed, walks=walks, inputs=inputs, sampling=sampling, block=block
    )
    results = []
    for tree, walk, decided in zip(trees, walks, decisions):
        accepted: list[int] = []
        attempted = 0
        node = 0
        while True:
            if tree.children(node):
                attempted += 1
            d = decided[node]
            if d.accepted_child is None:
                tokens = [int(tree.tokens[i]) for i in accepted] + [int(d.bonus_token)]  # type: ignore[arg-type]
                results.append(VerifyResult(tuple(accepted), tuple(tokens), attempted))
                rng.set_position(walk, node, d.draws)
                break
            accepted.append(d.accepted_child)
            node = d.accepted_child
    return results


def fused_verify(
    verifier: Verifier,
    tree: DraftTree,
    x: torch.Tensor,
    rng: CounterRandom,
    *,
    inputs: str = "probs",
    sampling: SamplingConfig | None = None,
    block: int | None = None,
) -> VerifyResult:
    """``verifier.verify(tree, p, rng)`` computed by the fused kernel.

    Args:
        verifier: a ``match``, ``rejection-iid``, ``rejection-wor`` or ``mixed`` verifier.
        tree: the draft tree (``n`` nodes).
        x: ``[n, V]`` processed target probabilities ``p`` (``inputs="probs"``)
            or raw target logits (``inputs="logits"``, needs ``sampling``).
        rng: a :class:`CounterRandom`; the walk uses ``rng.walk + 1`` and the
            source ends where :meth:`Verifier.verify` would leave it.
        inputs, sampling, block: see :func:`fused_verify_many`.

    Returns:
        The :class:`~specdec.verify.base.VerifyResult` of the sequential walk.

    Example (needs Triton; on a CPU set ``TRITON_INTERPRET=1``):

        rng_a, rng_b = CounterRandom(seed=1), CounterRandom(seed=1)
        assert fused_verify(MixedVerifier(), tree, p, rng_a) == MixedVerifier().verify(tree, p, rng_b)
    """
    return fused_verify_many(verifier, [tree], x, rng, inputs=inputs, sampling=sampling, block=block)[0]


def batch_tables(rule: FusedRule, tree: Any, dtype: torch.dtype) -> DecisionTables:
    """:func:`build_tables` for a :class:`~specdec.tree_batch.TreeBatch`, as
    device tensor ops (no host read): ``R = B * n`` rows, row ``b * n + i``
    is node slot ``i`` of tree ``b`` (padding slots have no children). The
    children, in the verifiers' test order, are those of
    :func:`specdec.verify.fast.decide_tree_batch`; ``child_rows`` holds slot
    indices inside the tree. ``q_dense`` is ``[R, V]`` (a zero row where a
    node has no rejection children) and ``walk`` / ``node`` are left to the caller.
    """
    B, n = tree.tokens.shape
    C, dev, R = tree.max_children, tree.device, B * n
    table, n_sampled = children_table(tree, rule)  # [B, n, C] child slots in test order, [B, n]
    has = table >= 0
    n_tested = has.sum(dim=-1) if rule.match_deterministic or not rule.rejection else n_sampled  # [B, n]
    cmax = _next_pow2(C + 1)
    child_tok = torch.where(has, tree.tokens.gather(1, table.clamp_min(0).reshape(B, -1)).reshape(B, n, C), -1)
    pad = torch.full((B, n, cmax - C), -1, dtype=torch.int64, device=dev)
    n_rej = n_sampled if rule.rejection else torch.zeros_like(n_sampled)
    if rule.without_replacement is None:
        wor = tree.law_wor.to(torch.int32)
    else:
        wor = torch.full((B, n), int(rule.without_replacement), dtype=torch.int32, device=dev)
    q_dense = None
    law_row = torch.full((R,), -1, dtype=torch.int32, device=dev)
    ids = tree.law_ids.reshape(R, -1)  # [R, L]
    if rule.rejection and ids.shape[-1] > 0:
        V = tree.vocab_size
        q_dense = torch.zeros((R, V + 1), dtype=dtype, device=dev)  # column V takes the padding of the laws
        q_dense.scatter_(1, torch.where(ids >= 0, ids, V), tree.law_probs.reshape(R, -1).to(dtype))
        q_dense = q_dense[:, :V]
        law_row = torch.where(n_rej.reshape(R) > 0, torch.arange(R, device=dev), -1).to(torch.int32)
    return DecisionTables(
        child_tokens=torch.cat([child_tok, pad], -1).reshape(R, cmax).to(torch.int32),
        child_rows=torch.cat([table, pad], -1).reshape(R, cmax).to(torch.int32),
        num_children=n_tested.reshape(R).to(torch.int32),
        num_rejection=n_rej.reshape(R).to(torch.int32),
        without_replacement=wor.reshape(R),
        law_row=law_row,
        walk=torch.empty(0, dtype=torch.int32, device=dev),
        node=torch.arange(n, dtype=torch.int64, device=dev).repeat(B),
        q_dense=q_dense.contiguous() if q_dense is not None else None,
        offsets=(),
    )


def fused_verify_batch(
    rule: FusedRule,
    tree: Any,
    x: torch.Tensor,
    rng: Any,
    *,
    inputs: str = "probs",
    sampling: SamplingConfig | RowSampling | None = None,
    bad_rows: torch.Tensor | None = None,
    block: int | None = None,
) -> Any:
    """Verify every tree of a batch in ONE launch of the fused kernel, each row
    drawing from its own counter-based stream; no host read.

    Row ``b``'s node ``i`` decides with ``U(seed_b, w_b, i, t)``, where
    ``seed_b`` is row ``b``'s :class:`~specdec.rng.CounterRandom` and ``w_b``
    its next walk (:meth:`~specdec.rng.RowStreams.begin_walks`): exactly the
    uniforms of :meth:`RowStreams.verify_uniforms <specdec.rng.RowStreams.verify_uniforms>`
    (the batched torch reference, :func:`specdec.verify.fast.decide_tree_batch`)
    and of row ``b``'s batch-1 :func:`fused_verify`. So a row's tokens depend
    on its own tree, rows of ``x`` and seed only, never on the other rows.
    The accepted path of every tree is then followed on the device, as
    :func:`~specdec.verify.fast.decide_tree_batch` does.

    Args:
        rule: the verifier's declared rule (:attr:`Verifier.fused <specdec.verify.base.Verifier.fused>`).
        tree: a :class:`~specdec.tree_batch.TreeBatch` of ``B`` trees, ``n`` node slots.
        x: ``[B, n, V]`` processed probabilities ``p`` (``inputs="probs"``) or
            raw target logits (``inputs="logits"``, needs ``sampling``:
            temperature > 0, ``top_p == 1``).
        rng: a :class:`~specdec.rng.RowStreams` of ``B`` :class:`~specdec.rng.CounterRandom`
            (each row's walk advances by one).
        inputs, sampling, block: see :func:`node_decisions`. ``sampling`` may be a
            :class:`~specdec.sampling.RowSampling` of several configurations, with
            ``inputs="logits"`` (raw logits): still one launch, each row in its own mode with its
            own temperature and top-k threshold: the rows its configuration fuses (``T > 0``,
            ``top_p == 1``) in ``logits`` mode, the others (greedy, top-p) on their ``p``
            (:func:`~specdec.sampling.process_logits_rows`), as each row's batch-1 launch.
        bad_rows: ``[B, n]`` bool rows known bad (:func:`~specdec.sampling.row_is_bad`);
            a visited row that is bad, or that the kernel flags, sets ``bad_visited``.

    Returns:
        A :class:`~specdec.verify.fast.TreeDecision` on ``x``'s device.

    Raises:
        InvalidConfigError: Triton missing, an unsupported verifier or
            sampling, or ``rng`` not counter-based per row.
    """
    if not isinstance(rule, FusedRule):
        raise InvalidConfigError(f"rule must be a FusedRule (a verifier's declared Verifier.fused), got {type(rule).__name__}")
    if not isinstance(rng, RowStreams) or not rng.counter_based:
        raise InvalidConfigError("the batched fused kernel draws from RowStreams of CounterRandom (one per row)")
    if inputs not in ("probs", "logits"):
        raise InvalidConfigError(f"inputs must be 'probs' or 'logits', got {inputs!r}")
    B, n = tree.tokens.shape
    if x.dim() != 3 or tuple(x.shape[:2]) != (B, n) or x.shape[2] != tree.vocab_size:
        raise InvalidDistributionError(f"x must be [{B}, {n}, {tree.vocab_size}], got {tuple(x.shape)}")
    if len(rng.sources) != B:
        raise InvalidConfigError(f"{len(rng.sources)} row streams for a batch of {B} trees")
    block = 1024 if block is None else block
    if not isinstance(block, int) or not 16 <= block <= 4096 or block & (block - 1):
        raise InvalidConfigError(f"block must be a power of two in [16, 4096], got {block!r}")
    if isinstance(sampling, RowSampling):
        if len(sampling.configs) != B:
            raise InvalidConfigError(f"per-row sampling: {len(sampling.configs)} configurations for a batch of {B} trees")
        if sampling.uniform:
            sampling = sampling.configs[0]
            if inputs == "logits" and (sampling.greedy or sampling.reads_mass):  # the rows' own p, as batch-1 launches
                x, inputs = process_logits_rows(x, RowSampling.of(sampling, B, x.device)), "probs"
        elif inputs != "logits":
            raise InvalidConfigError("per-row sampling in the fused kernel takes the raw logits (inputs='logits')")
    mode: bool | torch.Tensor = inputs == "logits"
    temperature: float | torch.Tensor = 1.0
    kth = None
    V, R, dev = x.shape[2], B * n, x.device
    if isinstance(sampling, RowSampling):  # each row in its own mode (docstring): one launch
        fused = sampling.fused().to(dev)  # [B]
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        p = process_logits_rows(x, sampling)  # [B, n, V] the rows not fused (greedy, top-p) verify their p
        x = torch.where(fused.view(B, 1, 1), wide.to(p.dtype), p)
        mode = fused.repeat_interleave(n)  # [R]
        temperature = torch.where(sampling.greedy, 1.0, sampling.temperature).to(dev).repeat_interleave(n)
    elif inputs == "logits":
        if not isinstance(sampling, SamplingConfig) or sampling.greedy or sampling.reads_mass:
            raise InvalidConfigError(
                "inputs='logits' fuses temperature > 0 and top-k only, no top-p or min-p (needs the SamplingConfig)")
        temperature = float(sampling.temperature)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    tables = batch_tables(rule, tree, compute)
    keys, walk = rng.begin_walks(dev)  # [B, 2]; int, or [B] when the rows' walks differ
    xs = x.reshape(R, V)
    if xs.stride(1) != 1:
        xs = xs.contiguous()
    if isinstance(sampling, RowSampling):
        kth = top_k_logit_threshold_rows(xs, sampling, n).contiguous()  # each row's, as process_logits
    elif inputs == "logits" and sampling is not None:  # (checked above: logits come with their SamplingConfig)
        kth = top_k_logit_threshold(xs, sampling).contiguous()  # as process_logits
    walk_rows = (walk.view(B, 1).expand(B, n).reshape(R) if isinstance(walk, torch.Tensor)
                 else torch.full((R,), walk, dtype=torch.int64, device=dev))
    out = _kernels().launch_decisions(
        xs, logits=mode, temperature=temperature, kth=kth, q_dense=tables.q_dense,
        law_row=tables.law_row, child_tokens=tables.child_tokens, child_rows=tables.child_rows,
        num_children=tables.num_children, num_rejection=tables.num_rejection,
        without_replacement=tables.without_replacement, walk=walk_rows, node=tables.node, seed=0,
        atol=1e-9 if compute == torch.float64 and mode is not True else 1e-4, block=block,
        keys=keys.view(B, 1, 2).expand(B, n, 2).reshape(R, 2),
    ).view(B, n, 4).long()  # [B, n, 4]: accepted child slot or -1, bonus or -1, draws, status
    child = out[..., 0]  # [B, n]
    # the accepted path (as decide_tree_batch): node j is reached when every node on its path is its parent's child
    D = tree.max_depth
    node_ids = torch.arange(n, device=dev)
    picked = (child.gather(1, tree.parents.clamp_min(0)) == node_ids) | (node_ids == 0)  # [B, n]
    reached = ~(tree.ancestors & ~picked.unsqueeze(1)).any(dim=-1)  # [B, n]
    depth_at = torch.where(reached, tree.depths, D + 1)
    by_depth = torch.full((B, D + 2), -1, dtype=torch.int64, device=dev).scatter_(1, depth_at, node_ids.expand(B, n))
    accepted = by_depth[:, 1 : D + 1]  # [B, D]
    num_accepted = reached.sum(dim=-1) - 1  # [B]
    stop = torch.where(reached, tree.depths, -1).argmax(dim=-1)  # [B] the deepest reached node
    has_kids = (tables.child_rows.view(B, n, -1) >= 0).any(dim=-1)  # [B, n]
    attempted = num_accepted + has_kids.gather(1, stop.unsqueeze(-1)).squeeze(-1)
    flagged = out[..., 3] != 0
    if bad_rows is not None:
        flagged = flagged | bad_rows
    bad = (reached & flagged).any(dim=-1)
    bonus = out[..., 1].gather(1, stop.unsqueeze(-1)).squeeze(-1)  # [B]
    path_tok = torch.where(accepted >= 0, tree.tokens.gather(1, accepted.clamp_min(0)), -1)  # [B, D]
    tokens = torch.cat([path_tok, torch.full((B, 1), -1, dtype=torch.int64, device=dev)], dim=-1)
    tokens = tokens.scatter(1, num_accepted.unsqueeze(-1), bonus.unsqueeze(-1))
    return TreeDecision(accepted, num_accepted, tokens, bonus, attempted, bad, stop)
