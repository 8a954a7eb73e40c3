"""The step's own work as fixed-shape pure functions: what a CUDA graph can capture (docs/cuda_graphs.md).

A serving engine owns the draft and target forwards (each its own graph). Between them,
specdec's part of one step is

- per level, the tree-growing work between two draft forwards: the draft's logits of the
  level's expanded nodes -> their laws -> their children (draws from a uniform table drawn
  beforehand) -> scores -> the beam the draft expands next (:meth:`FixedStep.level`);
- once, the rerank and layout of the kept nodes: the :class:`~specdec.tree_batch.TreeBatch`
  the target scores (:meth:`FixedStep.finish`);
- once, the verification: the target's logits -> accepted nodes and tokens, the bonus and
  the KV keep indices, packed for the step's one read (:meth:`FixedStep.verify`).

Each is a function of tensors only, every shape fixed by the budget (:class:`StepBudget`:
``B`` rows, ``n`` node slots, depth ``D``, ``C`` child slots, ``L`` law slots, ``V``), with
no host read, no data-dependent shape and no random state inside: the draws come in as
tables (:class:`~specdec.rng.UniformTable`), drawn outside from the same sources and in
the same order as the eager step draws them, so that the two give the same trees and the
same decisions draw for draw (``tests/engine/test_fixed_shape.py``, against
:func:`~specdec.engine.step.step_rows`). Each compiles with ``torch.compile(fullgraph=True)``
(:meth:`FixedStep.compiled`); :func:`run_fixed_step` is the engine's side of the loop, in the
order the functions run (the draft forwards, the tables and the one read stay outside).

Served: the constant-length chain (``sd``) and the level-wise builders (``eagle2``,
``eagle3``, ``rheo``) under one :class:`~specdec.sampling.SamplingConfig`, verified by a
rule with a tensor form; the rest is refused by name (docs/cuda_graphs.md, "What is not captured").
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import attrs
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import laws_and_flags
from specdec.engine.layouts import kv_moves
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource, UniformTable
from specdec.sampling import SamplingConfig, greedy_law, row_is_bad
from specdec.tree import NodeKind, SampleMode
from specdec.tree_batch import PAD, TreeBatch
from specdec.trees._common import draft_law, draw_rows, law_total
from specdec.trees.base import TreeBuilder
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.dynamic import DynamicTreeBuilder
from specdec.trees.levelwise import LevelFn, LevelStep, _shape_constants, finish_levels, level_step
from specdec.verify.base import FusedRule, Verifier
from specdec.verify.decision import pack_decision
from specdec.verify.fast import decide_from_scores, decide_tree_batch, decide_tree_walk, step_scores

__all__ = ["FixedLevel", "FixedStep", "FixedVerify", "StepBudget", "fixed_step", "run_fixed_step"]


@attrs.frozen
class StepBudget:
    """The shapes every fixed-shape function of one :class:`FixedStep` has (docs/cuda_graphs.md, "Shapes").

    Attributes:
        batch: ``B`` rows.
        vocab: ``V``, the target's vocabulary.
        draft_vocab: ``Vd``, the draft logits' columns (``V``, or the size of its proposal vocabulary).
        nodes: ``n`` node slots per tree, the root included (padding past a row's ``num_nodes``).
        depth: ``D``, the levels drawn (the most tokens accepted per step; ``D + 1`` emitted).
        children: ``C``, child slots per node (the verification table is ``[B, n, C + 1]``).
        law_slots: ``L``, the support slots of each node's sampled-children law (``[B, n, L]``).
        level_rows: per level ``d = 1 .. D``, the rows it expands per tree (``1``, then the beam's width).
        draws: uniforms per expanded row per level (``[B * R, draws]`` tables; 0: the level draws nothing).
    """

    batch: int
    vocab: int
    draft_vocab: int
    nodes: int
    depth: int
    children: int
    law_slots: int
    level_rows: tuple[int, ...]
    draws: int


class FixedLevel(NamedTuple):
    """What one level's function returns (tensors, or None where the level has none).

    Attributes:
        step: the level-wise builders' :class:`~specdec.trees.levelwise.LevelStep` (None for the chain).
        bad: ``[B]`` (level 1) or ``[B, R]`` bool: the expanded rows whose draft law was not a law.
        tokens: ``[B, k]`` int64 the next draft request's nodes' tokens (None after the last level).
        live: ``[B, k]`` bool: they are real nodes (None after the last level).
        parents: ``[B, k]`` int64 their parents' draft ids (None after the last level).
        chain: the chain's level (``[B]`` token, ``[B]`` float64 weight, ``[B, V]`` float64 law,
            ``[B]`` bool drawn); None for the level-wise builders.
    """

    step: LevelStep | None
    bad: torch.Tensor
    tokens: torch.Tensor | None
    live: torch.Tensor | None
    parents: torch.Tensor | None
    chain: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None


class FixedVerify(NamedTuple):
    """The verification's outputs (``B`` rows, depth ``D``), every shape fixed: first the seven fields of a
    :class:`~specdec.verify.decision.TreeDecision` (``accepted`` ``[B, D]``, ``num_accepted`` ``[B]``, ``tokens``
    ``[B, D + 1]``, ``bonus``, ``attempted``, ``bad_visited``, ``stop`` ``[B]``), then the KV keep indices.

    Attributes:
        kv_src: ``[B, D]`` int64 KV position of the ``d``-th accepted node (``prefix + slot``), ``-1`` padded.
        kv_dst: ``[B, D]`` int64 where it moves (``prefix + d``), ``-1`` padded.
        kv_lens: ``[B]`` int64 KV lengths after compaction (``prefix + 1 + num_accepted``).
        packed: ``[B, 2D + 5]`` int64 the decision in one tensor, the step's one read
            (:meth:`~specdec.verify.decision.TreeDecision.packed`'s layout).
    """

    accepted: torch.Tensor
    num_accepted: torch.Tensor
    tokens: torch.Tensor
    bonus: torch.Tensor
    attempted: torch.Tensor
    bad_visited: torch.Tensor
    stop: torch.Tensor
    kv_src: torch.Tensor
    kv_dst: torch.Tensor
    kv_lens: torch.Tensor
    packed: torch.Tensor


ROWS = ("all", "path")
"""The verification's forms: every node at once (the GPU's) or the walk over depths (the CPU's)."""


@attrs.frozen(eq=False)
class FixedStep:
    """The fixed-shape functions of one step (module docstring), made by :func:`fixed_step`: the
    ``budget`` (:class:`StepBudget`), ``builder``, the verifier's tensor ``rule``, the rows'
    ``sampling``, the verification's form ``rows`` (:data:`ROWS`) and the draft's ``proposal_ids``."""

    budget: StepBudget
    builder: TreeBuilder
    rule: FusedRule
    sampling: SamplingConfig
    rows: str = "all"
    proposal_ids: torch.Tensor | None = None
    _level: LevelFn | None = None
    _configs: tuple[SamplingConfig, ...] = ()
    _constants: dict[torch.device, dict[str, torch.Tensor]] = attrs.field(factory=dict, init=False, repr=False)

    @property
    def chain(self) -> bool:
        """The builder is the chain (else a level-wise builder)."""
        return isinstance(self.builder, ChainTreeBuilder)

    def table_shape(self, d: int) -> tuple[int, int]:
        """``(B * R, draws)``: level ``d``'s uniform table (``d = 1 .. D``)."""
        return self.budget.batch * self.budget.level_rows[d - 1], self.budget.draws

    @property
    def verify_table_shape(self) -> tuple[int, int, int]:
        """``(B, n, C + 1)``: the verification's uniform table."""
        return self.budget.batch, self.budget.nodes, self.budget.children + 1

    def constants(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        """The budget's constant tensors on ``device`` (made once per device; never written to),
        an input of :meth:`level` and :meth:`finish`: ``vocab_map`` ``[Vd + 1]`` (draft id ->
        target id, ``-1`` -> ``-1``; the level-wise builders with a proposal vocabulary) and the
        shape's index tensors."""
        dev = torch.device(device)
        if dev in self._constants:
            return self._constants[dev]
        out = self._constants[dev] = {}
        if self.proposal_ids is not None:
            ids = self.proposal_ids.to(dev)
            out["vocab_map"] = torch.cat([ids, torch.full((1,), -1, dtype=ids.dtype, device=dev)])
        if not self.chain:
            C, rows = self.budget.children, self.budget.level_rows
            shape = _shape_constants((1, *(r * C for r in rows)), rows[1:], dev)
            out.update(levels=shape.levels, first_index=shape.first_index, root_parent=shape.root_parent)
        return out

    def start(self, roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Level 1's carry from the rows' roots ``[B]``: ``(root [B, 1], live [B], parent_score [B, 1])``."""
        root = roots.to(torch.int64).reshape(-1, 1)
        dev, B = root.device, root.shape[0]
        return root, torch.ones(B, dtype=torch.bool, device=dev), torch.zeros(B, 1, dtype=torch.float64, device=dev)

    def level(self, d: int, logits: torch.Tensor, u: torch.Tensor, root: torch.Tensor, live: torch.Tensor,
              parent_score: torch.Tensor, constants: dict[str, torch.Tensor]) -> FixedLevel:
        """Level ``d`` (``1 .. D``, a Python int: one graph per level) from the draft's logits of
        its expanded nodes, ``[B, Vd]`` at level 1 and ``[B, R, Vd]`` after, and its uniform
        table ``u`` (:meth:`table_shape`). ``live`` ``[B * R]`` and ``parent_score``
        ``[B * R, 1]``: the carry (:meth:`start`, then :meth:`carry` of the level before)."""
        if self.chain:
            return self._chain_level(d, logits, u, root, live)
        B, R = self.budget.batch, self.budget.level_rows[d - 1]
        qs, bad = laws_and_flags(logits, self._configs)  # [B, (R,) Vd] per config, [B, (R,)]
        laws = [draft_law(q.reshape(B * R, -1), bad) for q in qs]  # [B * R, Vd]
        table = UniformTable(u)  # [B * R, draws]
        assert self._level is not None
        lv = self._level(laws[0], table, live) if len(laws) == 1 else self._level(laws[0], table, live, laws[1])
        width = 0 if d == self.budget.depth else int(self.builder.B)  # type: ignore[attr-defined]
        step = level_step(lv, parent_score, constants.get("vocab_map"), root, width)
        if step.beam is None:
            return FixedLevel(step, bad, None, None, None, None)
        first_id = sum(self.budget.level_rows[: d - 1])  # the draft id of this level's first expanded row
        parents = step.beam // self.budget.children + first_id  # [B, W]
        return FixedLevel(step, bad, step.beam_tokens, step.beam_live, parents, None)

    def carry(self, out: FixedLevel) -> tuple[torch.Tensor, torch.Tensor]:
        """``(live [B * R], parent_score [B * R, 1])`` for the next level (no op: views)."""
        if out.chain is not None:
            return out.chain[3], out.chain[3]  # the chain carries the rows that drew (parent_score unused)
        assert out.step is not None and out.step.beam_live is not None and out.step.beam_scores is not None
        return out.step.beam_live.reshape(-1), out.step.beam_scores

    def _chain_level(self, d: int, logits: torch.Tensor, u: torch.Tensor, root: torch.Tensor,
                     alive: torch.Tensor) -> FixedLevel:
        """The chain's level ``d``: one draw per live row from its node's law ``q`` (as
        :func:`~specdec.trees.static.static_build` draws a chain)."""
        x = logits if d == 1 else logits[:, 0]  # [B, V]
        (q,), bad = laws_and_flags(x, self._configs)  # [B, V], [B]
        law = torch.where(bad.unsqueeze(-1), 0.0, q.to(torch.float64) / law_total(q))  # [B, V] normalised_law's bits
        col = draw_rows(law, 1, SampleMode.IID, UniformTable(u), alive)[:, 0]  # [B], -1: no draw
        drawn = col >= 0
        r = root.view(-1)
        token = torch.where(drawn, col, r)
        weight = torch.where(drawn, law.gather(1, col.clamp_min(0).unsqueeze(1)).squeeze(1), 0.0)
        if d == self.budget.depth:
            return FixedLevel(None, bad, None, None, None, (token, weight, law, drawn))
        B = r.shape[0]
        parents = torch.full((B, 1), d - 1, dtype=torch.int64, device=r.device)
        return FixedLevel(None, bad, token.unsqueeze(1), drawn.unsqueeze(1), parents, (token, weight, law, drawn))

    def finish(self, levels: Sequence[FixedLevel], root: torch.Tensor,
               constants: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tree batch's tensor fields (by name, :meth:`tree` wraps them) from every level's output."""
        if self.chain:
            return _chain_finish(levels, root)
        steps = [lv.step for lv in levels if lv.step is not None]
        lives = [s.beam_live for s in steps[:-1] if s.beam_live is not None]
        shape = _ShapeView(constants["levels"], constants["first_index"], constants["root_parent"])
        return finish_levels(steps, lives, [lv.bad for lv in levels], shape,  # type: ignore[arg-type]
                             root, num_keep=int(self.builder.N), depth=self.budget.depth)  # type: ignore[attr-defined]

    def tree(self, fields: dict[str, torch.Tensor]) -> TreeBatch:
        """The :class:`~specdec.tree_batch.TreeBatch` of :meth:`finish`'s fields (metadata only: no op)."""
        b = self.budget
        return TreeBatch(**fields, vocab_size=b.vocab, max_children=b.children, max_depth=b.depth,
                         max_sampled=1 if self.chain else b.draws, host_trees=None)

    def verify(self, tree: TreeBatch, logits: torch.Tensor, u: torch.Tensor, prefix_lens: torch.Tensor) -> FixedVerify:
        """The verification of ``tree`` from the target's ``logits`` ``[B, n, V]`` with the table
        ``u`` (:attr:`verify_table_shape`), and the KV keep indices for ``prefix_lens`` ``[B]``
        (:func:`~specdec.engine.layouts.kv_compaction`'s, without its input checks)."""
        s = self.sampling
        if self.rows == "path":
            fields = decide_tree_walk(self.rule, tree, logits, u, s)
        elif s.greedy:
            wide = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
            fields = decide_tree_batch(self.rule, tree, greedy_law(wide), u, row_is_bad(logits))
        else:
            scores, temperature = step_scores(logits, s)  # the warped scores and 1, or the logits and T
            fields = decide_from_scores(self.rule, tree, scores, u, temperature)
        accepted, num, tokens, bonus, attempted, bad, stop = fields
        src, dst, kv_lens = kv_moves(accepted, num, prefix_lens.to(torch.int64))
        packed = pack_decision(accepted, num, tokens, bonus, attempted, bad, stop)
        return FixedVerify(accepted, num, tokens, bonus, attempted, bad, stop, src, dst, kv_lens, packed)

    def compiled(self, backend: str = "inductor") -> "FixedFns":
        """:meth:`level` (one graph per level), :meth:`finish` and :meth:`verify`, each through
        ``torch.compile(fullgraph=True)``: a graph break raises instead of splitting the graph."""
        return FixedFns(
            levels=tuple(_compiled(_level_fn(self, d), backend, f"fixed_level_{d}")
                         for d in range(1, self.budget.depth + 1)),
            finish=_compiled(self.finish, backend, "fixed_finish"),
            verify=_compiled(self.verify, backend, "fixed_verify"),
        )

    def eager(self) -> "FixedFns":
        """The same functions, uncompiled (the compiled ones' reference)."""
        return FixedFns(levels=tuple(_level_fn(self, d) for d in range(1, self.budget.depth + 1)),
                        finish=self.finish, verify=self.verify)


class _ShapeView(NamedTuple):
    """:func:`~specdec.trees.levelwise.finish_levels`' shape constants (``[T]``, ``[E]``, ``[1]``), as inputs."""

    levels: torch.Tensor
    first_index: torch.Tensor
    root_parent: torch.Tensor


@attrs.frozen(eq=False)
class FixedFns:
    """The functions :func:`run_fixed_step` calls: per level ``fn(logits, u, root, live,
    parent_score, constants)``, ``finish(levels, root, constants)`` and ``verify(tree, logits,
    u, prefix_lens)`` (compiled: :meth:`FixedStep.compiled`; plain: :meth:`FixedStep.eager`)."""

    levels: tuple[Callable[..., FixedLevel], ...]
    finish: Callable[..., dict[str, torch.Tensor]]
    verify: Callable[..., FixedVerify]


def _level_fn(step: FixedStep, d: int) -> Callable[..., FixedLevel]:
    """Level ``d``'s function: ``fn(logits, u, root, live, parent_score, constants)``."""
    return lambda *args: step.level(d, *args)


def _compiled(fn: Callable[..., Any], backend: str, name: str) -> Any:
    """``torch.compile(fullgraph=True)`` of ``fn`` under a code object of its own (dynamo caches
    graphs per code object: each level, the finish and the verification keep their own)."""
    if isinstance(fn, types.MethodType):
        bound, inner = fn.__self__, fn.__func__
        fn = lambda *args: inner(bound, *args)  # noqa: E731 (a function of its own, renamed below)
    code = fn.__code__.replace(co_name=name)
    own = types.FunctionType(code, fn.__globals__, name, None, fn.__closure__)
    return torch.compile(own, fullgraph=True, backend=backend)


def _chain_finish(levels: Sequence[FixedLevel], root: torch.Tensor) -> dict[str, torch.Tensor]:
    """The chain's tree fields from its ``D`` levels: :func:`~specdec.trees.static.static_build`'s
    packing and layout for the chain shape (node ``d`` at depth ``d``, its parent ``d - 1``)."""
    r = root.view(-1)
    B, D, dev = r.shape[0], len(levels), r.device
    n = D + 1
    chains = [lv.chain for lv in levels if lv.chain is not None]
    tokens = torch.stack([r, *(c[0] for c in chains)], dim=1)  # [B, n]
    weights = torch.stack([torch.ones_like(chains[0][1]), *(c[1] for c in chains)], dim=1)  # [B, n]
    valid = torch.stack([torch.ones_like(chains[0][3]), *(c[3] for c in chains)], dim=1)  # [B, n]
    law_probs = torch.stack([*(c[2] for c in chains), torch.zeros_like(chains[0][2])], dim=1)  # [B, n, V]
    draft_bad = levels[0].bad.reshape(B)
    for lv, c in zip(levels[1:], chains):  # level d + 1 expands level d's drawn nodes
        draft_bad = draft_bad | (lv.bad.reshape(B) & c[3])
    index = torch.arange(n, device=dev).expand(B, n)
    order = torch.sort(torch.where(valid, index, index + n), dim=1).values
    order = torch.where(order >= n, order - n, order)  # [B, n] (a chain's drawn nodes are a prefix: the identity)
    live = valid.gather(1, order)
    position = torch.empty(B, n, dtype=torch.int64, device=dev).scatter_(1, order, index)  # [B, n]
    full_par = (torch.arange(n, device=dev) - 1)[order]  # [B, n] the chain's parents: d - 1, the root's -1
    parents = torch.where(live & (full_par >= 0), position.gather(1, full_par.clamp_min(0)), -1)
    kinds = torch.where(live, int(NodeKind.SAMPLED), PAD)
    kinds = torch.cat([torch.full_like(kinds[:, :1], int(NodeKind.ROOT)), kinds[:, 1:]], dim=1)
    has_kids = torch.zeros(B, n, dtype=torch.int64, device=dev).scatter_add(
        1, parents.clamp_min(0), (parents >= 0).long()) > 0  # [B, n]
    V = law_probs.shape[-1]
    probs = torch.where(has_kids.unsqueeze(-1), law_probs.gather(1, order.unsqueeze(-1).expand(B, n, V)), 0.0)
    ids = torch.where(probs > 0, torch.arange(V, device=dev), -1)  # [B, n, V]
    anc = (eye := torch.eye(n, dtype=torch.bool, device=dev)).expand(B, n, n)  # [B, n, n]
    up = parents.clamp_min(0).unsqueeze(-1).expand(B, n, n)
    for _ in range(D):
        anc = eye | torch.where((parents >= 0).unsqueeze(-1), anc.gather(1, up), False)
    return dict(
        tokens=torch.where(live, tokens.gather(1, order), r.unsqueeze(1)), parents=parents,
        depths=torch.where(live, torch.arange(n, device=dev)[order], 0), kinds=kinds, draw_order=torch.zeros(B, n, dtype=torch.int64, device=dev),
        weights=torch.where(live, weights.gather(1, order), 0.0), num_nodes=live.sum(dim=1), law_ids=ids,
        law_probs=probs, law_wor=has_kids & False, ancestors=anc, draft_bad=draft_bad,
    )


def fixed_step(
    builder: TreeBuilder,
    verifier: Verifier,
    sampling: SamplingConfig,
    *,
    batch: int,
    vocab: int,
    proposal_ids: torch.Tensor | None = None,
    rows: str = "all",
) -> FixedStep:
    """The fixed-shape functions of a step of ``batch`` rows (module docstring).

    Args:
        builder: the chain at a constant length (``sd``) or a level-wise builder (``eagle2/3``, ``rheo``).
        verifier: a verifier with a tensor rule (:attr:`~specdec.verify.base.Verifier.fused`).
        sampling: every row's configuration.
        batch, vocab: ``B``; ``V``, the target's vocabulary.
        proposal_ids: ``[Vd]`` ascending target ids of the draft's proposal vocabulary (EAGLE-3), or None.
        rows: ``"all"`` (every node at once: the GPU's form, the default) or ``"path"`` (the walk).

    Raises:
        InvalidConfigError: naming what has no fixed shape (a chain with a confidence stop, a schedule,
            ``proposal_top_k`` or a proposal vocabulary; a builder without a level-wise tensor form; a
            verifier without a tensor rule), or a bad ``batch``, ``vocab`` or ``rows``.
    """
    for name, value in (("batch", batch), ("vocab", vocab)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidConfigError(f"fixed_step: {name} must be a positive integer, got {value!r}")
    if rows not in ROWS:
        raise InvalidConfigError(f"fixed_step: rows must be one of {ROWS}, got {rows!r}")
    rule = verifier.fused
    if rule is None:
        raise InvalidConfigError(
            f"fixed_step: verifier {verifier.registry_name!r} declares no tensor rule (Verifier.fused): its walk reads "
            "the host at every node, so it has no fixed-shape form"
        )
    draft_vocab = vocab if proposal_ids is None else int(proposal_ids.shape[0])
    if isinstance(builder, ChainTreeBuilder):
        if builder.adaptive or builder.proposal_top_k or proposal_ids is not None:
            raise InvalidConfigError(
                "fixed_step: the chain has a fixed shape at a constant length over the full vocabulary only: a "
                "confidence stop or a schedule makes its length depend on the draws, and proposal_top_k and a "
                f"proposal vocabulary are not served (got {builder!r}, proposal_ids "
                f"{'set' if proposal_ids is not None else 'None'})"
            )
        D = builder.depth
        budget = StepBudget(batch, vocab, vocab, D + 1, D, 1, vocab, (1,) * D, 1)
        return FixedStep(budget, builder, rule, sampling, rows, None, None, (sampling,))
    if not isinstance(builder, DynamicTreeBuilder) or not builder.grows_batches(sampling):
        raise InvalidConfigError(
            f"fixed_step: builder {type(builder).__name__} has no fixed-shape form (served: the constant-length "
            "chain and the level-wise builders eagle and rheo; docs/cuda_graphs.md)"
        )
    level = builder.level_fn(sampling)
    assert level is not None
    draw = builder.draw_config(sampling)
    configs = (builder.construction(sampling),) if draw is None else (builder.construction(sampling), draw)
    C, W, D = builder.children_per_node, int(builder.B), builder.depth  # type: ignore[arg-type]
    level_rows = tuple(itertools.accumulate(range(D - 1), lambda r, _: min(W, r * C), initial=1))  # [1, W', ...]
    created = sum(r * C for r in level_rows)
    m = builder.draws_per_node(sampling)
    n = min(int(builder.N), created) + 1
    budget = StepBudget(batch, vocab, draft_vocab, n, D, C, _law_slots(builder, sampling, draft_vocab), level_rows, m)
    return FixedStep(budget, builder, rule, sampling, rows, proposal_ids, level, configs)


def _law_slots(builder: DynamicTreeBuilder, sampling: SamplingConfig, vd: int) -> int:
    """``L``: the law slots of a level-wise builder's nodes (0: nothing sampled)."""
    if builder.draws_per_node(sampling) == 0:
        return 0
    K, m, M = builder.K, builder.m, builder.M  # type: ignore[attr-defined]
    if builder.draw_config(sampling) is not None:  # ranks by one law, draws by another
        return max(0, min(M - (K - m), min(M, vd)))
    return max(0, min(max(K, M), vd, M) - (K - m))


def run_fixed_step(
    step: FixedStep,
    fns: FixedFns,
    draft_forward: Callable[[DraftRequest], torch.Tensor],
    target_forward: Callable[[TreeBatch], torch.Tensor],
    rng: RandomSource,
    roots: torch.Tensor,
    prefix_lens: torch.Tensor,
) -> tuple[TreeBatch, FixedVerify]:
    """One step driven by the engine's side (docs/cuda_graphs.md): per level the draft forward (the
    engine's), the level's table drawn from ``rng`` and the level's function; the finish; the target
    forward (the engine's); the verification's table and the verification. No host read; the caller
    reads ``packed`` once. ``rng`` draws what the eager step draws, in its order (a
    :class:`~specdec.rng.RowStreams` for ``B > 1``): each level's table, then the verification's.

    Raises:
        InvalidConfigError: ``roots``, ``prefix_lens`` or a forward's logits off the budget's shapes.
    """
    b = step.budget
    for name, x in (("roots", roots), ("prefix_lens", prefix_lens)):
        if not isinstance(x, torch.Tensor) or x.shape != (b.batch,):
            raise InvalidConfigError(f"run_fixed_step: {name} must be a [{b.batch}] tensor (the budget's rows), got "
                                     f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    root, live, parent_score = step.start(roots)
    dev = root.device
    constants = step.constants(dev)
    proposal = step.proposal_ids is not None and not step.chain
    request = DraftRequest(0, b.batch, b.draft_vocab, proposal)
    levels: list[FixedLevel] = []
    earlier: list[torch.Tensor] = []
    first_id = 1
    for d in range(1, b.depth + 1):
        logits = _shaped(draft_forward(request), request.expected_shape, "draft_forward")
        rows, draws = step.table_shape(d)
        u = rng.uniforms((rows, draws), device=dev) if draws else torch.empty(rows, 0, dtype=torch.float64, device=dev)
        out = fns.levels[d - 1](logits, u, root, live, parent_score, constants)
        levels.append(out)
        if out.parents is not None and out.tokens is not None:
            request = DraftRequest(d, b.batch, b.draft_vocab, proposal, out.parents, out.tokens, out.live,
                                   first_id, tuple(earlier))
            earlier.append(out.parents)
            first_id += out.parents.shape[1]
            live, parent_score = step.carry(out)
    tree = step.tree(fns.finish(levels, root, constants))
    logits = _shaped(target_forward(tree), (b.batch, b.nodes, b.vocab), "target_forward")
    u = rng.verify_uniforms(step.verify_table_shape, device=logits.device)
    return tree, fns.verify(tree, logits, u, prefix_lens)


def _shaped(logits: torch.Tensor, shape: tuple[int, ...], name: str) -> torch.Tensor:
    """``logits`` if it has ``shape`` (a fixed-shape function cannot take another)."""
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != tuple(shape):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise InvalidConfigError(f"run_fixed_step: {name} returned logits of shape {got}; the budget's is {tuple(shape)}")
    return logits
