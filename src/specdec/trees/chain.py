"""The chain builder: classic speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

One sampled child per node, drawn from the full draft law ``q`` of the node,
``depth`` levels deep. Verified by recursive rejection (docs/verifiers.md rule 3,
verifier ``"rejection-iid"``): on a chain it is the classic
``min(1, p/q)`` test with the ``norm([p - q]+)`` residual. At temperature 0
``q`` is one-hot, so the chain is the draft's greedy continuation.

Adaptive length (issue 48), as transformers' assisted generation does it. Both
change only how many drafts are proposed, never a law or a draw, so the chain
stays lossless (the verifier accepts or rejects each node from the law it was
drawn from; whether a node gets a child depends only on the draft's side):

- ``confidence`` (transformers' ``assistant_confidence_threshold``): a row stops
  drafting after a token whose draft probability is below the threshold (the
  token is kept, as transformers keeps it). The probability is read from the
  draft's untempered law ``softmax(logits)`` at ``T = 0`` (the token is its
  argmax: this is the top probability, as transformers reads it from greedy
  scores) and from the processed law ``q`` the token was drawn from at ``T > 0``.
  Rows of a batch then stop at different depths: the batch's trees are ragged
  (:attr:`~specdec.tree_batch.TreeBatch.num_nodes` per row); a stopped row's
  later slots are padding (the root's token, kind ``PAD``, weight 0, no law, not
  live in the later :class:`~specdec.draft_request.DraftRequest`), and drafting
  ends when every row has stopped: one host read per level (a 1-element
  ``any``), the price of skipping the draft forwards no row needs.
- ``schedule="heuristic"`` (transformers' ``num_assistant_tokens_schedule``):
  a row's next chain is 2 drafts longer after a step that accepted its whole
  chain, 1 shorter (at least 1) otherwise, at most ``max_depth``. The builder
  learns a row's outcome from the draft's committed context: the step appended
  ``len(chain) + 1`` tokens iff it accepted the whole chain. So the draft must
  expose it (``committed_tokens``, or ``committed_rows`` in rows mode:
  :class:`~specdec.drafts.hf.HFDraft`, :class:`~specdec.drafts.ngram.NgramDraft`);
  another draft is refused with a clear error, never run at a fixed depth. A
  context that does not extend the last one by 1 to ``len(chain) + 1`` tokens is a
  new sequence and starts again at ``depth`` (transformers'
  ``"heuristic_transient"``), so a seeded generation is reproducible. The schedule
  is memory of the builder instance: one generation at a time per instance.
  A serving engine's runner (:class:`~specdec.trees.feed.TreeFeed`) has no draft
  to read it from: the fed build refuses the schedule (the confidence stop works there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, cast

import attrs
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel, OneRowDraft, laws_and_flags
from specdec.errors import InvalidConfigError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig, construction_config
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.tree_batch import PAD, TreeBatch
from specdec.trees._common import MAX_TREE_NODES, check_int, draw_children, draw_rows, normalised_law
from specdec.trees.feed import Build, DraftSpec
from specdec.trees.static import ShapedTreeBuilder, check_top_k, truncate_proposal
from specdec.methods import Method, register_method

__all__ = ["ChainTreeBuilder", "SCHEDULES", "chain_build", "chain_reference"]

SCHEDULES: tuple[str, ...] = ("constant", "heuristic")
"""``schedule`` values of :class:`ChainTreeBuilder` (transformers' ``num_assistant_tokens_schedule`` names)."""

DEFAULT_SCHEDULE_CAP = 20
"""The heuristic schedule's default ``max_depth`` (transformers' default ``num_assistant_tokens``)."""


def _check_depth(_inst: object, _attr: object, value: object) -> None:
    check_int("depth", value, 1, MAX_TREE_NODES - 1)  # a chain of depth d has d + 1 nodes


def _check_confidence(_inst: object, _attr: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise InvalidConfigError(f"confidence must be a number in [0, 1) (0 = off), got {value!r}")


def _check_schedule(_inst: object, _attr: object, value: object) -> None:
    if value not in SCHEDULES:
        raise InvalidConfigError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {value!r}")


def _check_cap(_inst: object, _attr: object, value: Any) -> None:
    if value is not None:
        check_int("max_depth", value, 1, MAX_TREE_NODES - 1)


@attrs.define(eq=False)
class _Schedule:
    """The heuristic schedule's memory between steps (mutable; one per builder instance):
    each row's committed context at the last build, the chain it was given, and the length
    of its next chain."""

    contexts: list[tuple[int, ...]] = attrs.field(factory=list)
    built: list[int] = attrs.field(factory=list)
    lengths: list[int] = attrs.field(factory=list)
    pending: list[int] | None = None
    """This step's lengths, read by ``before_build`` for the next ``feed_build``."""


def _committed(draft: DraftModel, rows: int) -> list[tuple[int, ...]]:
    """Each row's committed context, read from the draft (the schedule's feedback).

    Raises:
        InvalidConfigError: the draft does not expose its committed context.
    """
    got: Any
    if not type(draft)._one_row_form or cast(OneRowDraft, draft).rows_mode:  # a batch draft holds rows
        got = getattr(draft, "committed_rows", None)
    else:
        one = getattr(draft, "committed_tokens", None)
        got = None if one is None else (tuple(one),)
    if got is None or len(got) != rows:
        raise InvalidConfigError(
            "schedule='heuristic' reads each row's committed context from the draft (committed_tokens, or "
            f"committed_rows in rows mode), and {type(draft).__name__} "
            f"{'exposes none' if got is None else f'reports {len(got)} rows for {rows} roots'}; "
            "use schedule='constant' (with or without a confidence stop)"
        )
    return [tuple(int(t) for t in r) for r in got]


@register("tree", "chain")
@attrs.frozen
class ChainTreeBuilder(ShapedTreeBuilder):
    """A chain of ``depth`` sampled drafts (classic speculative sampling), optionally of
    adaptive length (module docstring).

    Each node's one child is drawn from the node's processed draft law ``q``;
    the tree records ``q`` (restricted to its support) as the child's law,
    mode i.i.d., and ``q(x)`` as its construction weight. One draft call per
    level: :meth:`DraftModel.root_distribution`, then one
    :meth:`DraftModel.expand` per further level.

    Args:
        depth: number of draft tokens (``1 .. 65535``; default 4, the ``gamma`` range
            3-5 of Leviathan et al. 2023); with ``schedule="heuristic"``, the first
            chain's length (transformers' ``num_assistant_tokens``).
        confidence: stop a row's chain after a draft token whose draft probability is
            below this (``[0, 1)``; 0 = off; transformers' ``assistant_confidence_threshold``,
            0.4 by default there).
        schedule: ``"constant"`` (default) or ``"heuristic"`` (+2 after a fully
            accepted chain, -1 otherwise, at least 1).
        proposal_top_k: ``k > 0``: each draft token drawn from, and its law recorded as, the
            draft law truncated to its top ``k`` and renormalised (docs/trees.md, "Sparse
            proposals"): ``[n, k]`` laws per tree instead of ``[n, V]``; 0 (default): the full law.
        max_depth: the heuristic schedule's longest chain (default ``max(depth, 20)``);
            only with ``schedule="heuristic"``.

    Raises:
        InvalidConfigError: an option out of range, ``max_depth < depth``, or
            ``max_depth`` without the heuristic schedule.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> from specdec.trees import build_tree
        >>> draft = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)
        >>> draft.begin([0, 1])
        >>> tree = build_tree(ChainTreeBuilder(depth=3), 1, draft, SamplingConfig(), TorchRandom.seeded(0))
        >>> tree.num_draft_nodes, int(tree.depths.max())
        (3, 3)
        >>> flat = ChainTreeBuilder(depth=3, confidence=0.5)  # every draft token has q = 0.2 < 0.5
        >>> build_tree(flat, 1, draft, SamplingConfig(temperature=1.0), TorchRandom.seeded(0)).num_draft_nodes
        1
    """

    depth: int = attrs.field(default=4, validator=_check_depth)
    confidence: float = attrs.field(default=0.0, validator=_check_confidence)
    schedule: str = attrs.field(default="constant", validator=_check_schedule)
    depth_cap: int | None = attrs.field(default=None, validator=_check_cap, alias="max_depth")
    proposal_top_k: int = attrs.field(default=0, validator=check_top_k)
    _memory: _Schedule = attrs.field(factory=_Schedule, init=False, eq=False, repr=False)

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.SAMPLED})
    default_verifier: ClassVar[str] = "rejection-iid"
    # the confidence stop's ragged chains are proven exact and fed like every example; the heuristic schedule
    # needs a draft's committed context across steps: tests/trees/test_chain_adaptive.py proves it exact
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"depth": 2}, {"depth": 3}, {"depth": 3, "confidence": 0.3}, {"depth": 4, "confidence": 0.45},
        {"depth": 2, "proposal_top_k": 2}, {"depth": 3, "confidence": 0.3, "proposal_top_k": 2},
    )

    def __attrs_post_init__(self) -> None:
        if self.depth_cap is not None:
            if self.schedule != "heuristic":
                raise InvalidConfigError("max_depth caps the heuristic schedule; with schedule='constant' set depth")
            if self.depth_cap < self.depth:
                raise InvalidConfigError(f"max_depth ({self.depth_cap}) must be at least depth ({self.depth})")

    @property
    def max_nodes(self) -> int:
        return self.max_depth + 1

    @property
    def max_depth(self) -> int:
        """``depth``; with the heuristic schedule, its cap (``max_depth``, default ``max(depth, 20)``)."""
        if self.schedule == "heuristic":
            return self.depth_cap if self.depth_cap is not None else max(self.depth, DEFAULT_SCHEDULE_CAP)
        return self.depth

    @property
    def adaptive(self) -> bool:
        """Whether the chain's length adapts (a confidence stop or the heuristic schedule)."""
        return self.confidence > 0 or self.schedule != "constant"

    construction: ClassVar[bool] = False  # the chain drafts from q as the target processes it (one-hot at T = 0)

    def shape(self) -> tuple[tuple[tuple[int, ...], ...], SampleMode]:
        return tuple((0,) * d for d in range(1, self.depth + 1)), SampleMode.IID

    def law_top_k(self) -> int:
        return self.proposal_top_k

    def before_build(self, draft: DraftModel, rows: int) -> None:
        """The heuristic schedule: this step's chain length of each row, from its committed context
        read from the draft (module docstring); nothing otherwise.

        Raises:
            InvalidConfigError: the draft does not expose its committed context.
        """
        if self.schedule == "heuristic":
            self._memory.pending = self._next_lengths(_committed(draft, rows))

    def feed_build(self, roots: Any, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """The build: :func:`~specdec.trees.static.static_build` of the chain at a constant length
        without a confidence stop (the trees of every earlier release), else :func:`chain_build`,
        with the heuristic schedule at the lengths :meth:`before_build` read (``compiler`` is not used).

        Raises:
            InvalidConfigError: ``schedule="heuristic"`` in a build no draft was read for
                (:class:`~specdec.trees.feed.TreeFeed`: a serving engine's runner has no draft).
        """
        if not self.adaptive:
            return super().feed_build(roots, spec, sampling, rng, compiler=compiler)
        rows = torch.as_tensor(roots).numel()
        if self.schedule == "constant":
            return chain_build(roots, spec, sampling, rng, [self.depth] * rows, self.confidence, self.proposal_top_k)
        lengths, self._memory.pending = self._memory.pending, None
        if lengths is None or len(lengths) != rows:
            raise InvalidConfigError(
                "schedule='heuristic' learns each step's outcome from the draft's committed context: a fed build "
                "(TreeFeed) has no draft to read it from; use schedule='constant' with a confidence stop"
            )
        return self._scheduled(chain_build(roots, spec, sampling, rng, lengths, self.confidence, self.proposal_top_k))

    def _scheduled(self, build: Build) -> Build:
        """``build``, remembering each row's chain length for the schedule's next step."""
        tree = yield from build
        self._memory.built = [int(n) - 1 for n in tree.num_nodes.tolist()]  # one [B] read per step: the outcome's key
        return tree

    def _next_lengths(self, contexts: list[tuple[int, ...]]) -> list[int]:
        """The heuristic schedule: each row's chain length for this step, from how many tokens its
        last step appended (its whole chain + 1 iff the chain was fully accepted)."""
        memory = self._memory
        same = len(memory.contexts) == len(contexts) and all(
            0 < len(now) - len(before) <= built + 1 and now[: len(before)] == before
            for now, before, built in zip(contexts, memory.contexts, memory.built)
        )
        if not same:  # a new sequence (or a new batch): start again
            lengths = [self.depth] * len(contexts)
        else:
            lengths = [
                min(self.max_depth, length + 2) if len(now) - len(before) == built + 1 else max(1, length - 1)
                for now, before, built, length in zip(contexts, memory.contexts, memory.built, memory.lengths)
            ]
        memory.contexts, memory.lengths = contexts, lengths
        return lengths


def chain_reference(builder: ChainTreeBuilder, root_token: int, draft: OneRowDraft, sampling: SamplingConfig,
                    rng: RandomSource) -> DraftTree:
    """The per-node reference of ``builder``'s build (constant length): one draw per level from the
    full draft law (its top ``proposal_top_k``), with the confidence stop when set; the tests compare
    it with the tensor build (:func:`chain_build`).

    Raises:
        InvalidConfigError: ``schedule="heuristic"`` (the schedule needs the draft's committed context).
    """
    if builder.schedule != "constant":
        raise InvalidConfigError("chain_reference is the constant-length chain; the schedule needs build_trees()")
    asm = TreeAssembler(root_token, draft.vocab_size)
    q = normalised_law(draft.root_distribution(sampling))
    conf_config = construction_config(sampling)
    conf = normalised_law(draft.root_distribution(conf_config)) if builder.confidence > 0 else None
    node, token = 0, root_token
    for level in range(builder.depth):
        if level > 0:
            # the node just added gets draft id `level` (root 0, then 1, 2, ...)
            q = normalised_law(draft.expand([level - 1], [token], sampling))[0]
            if builder.confidence > 0:
                conf = normalised_law(draft.expand([level - 1], [token], conf_config))[0]
        if builder.proposal_top_k:  # the top-k truncated law (truncate_proposal), as the tensor build draws it
            cols, probs = truncate_proposal(q.unsqueeze(0), builder.proposal_top_k)
            keep = cols[0] >= 0
            law = SparseLaw(cols[0][keep], probs[0][keep], SampleMode.IID)
        else:
            law = SparseLaw.from_dense(q, SampleMode.IID)
        (index,) = draw_children(law.probs, 1, SampleMode.IID, rng)
        token = int(law.indices[index])
        node = asm.add_sampled(node, token, law, weight=float(law.probs[index]))
        if conf is not None and float(conf[token]) < builder.confidence:
            break
    return asm.build()


def chain_build(
    root_token: int | torch.Tensor,
    spec: DraftSpec,
    sampling: SamplingConfig,
    rng: RandomSource,
    lengths: list[int],
    confidence: float = 0.0,
    proposal_top_k: int = 0,
) -> Build:
    """A build of ``B`` chains of per-row lengths, stopped early by a confidence threshold
    (:class:`ChainTreeBuilder`'s adaptive form; :mod:`specdec.trees.feed` protocol).

    Level ``d`` draws every live row's depth-``d`` token from the law of its depth-``d - 1``
    node (as :func:`~specdec.trees.static.static_build` draws a chain: one draw per row, in
    row order, from the processed law ``q``), then a row stays live while ``d < lengths[b]``
    and, with ``confidence``, while its token's draft probability is at least ``confidence``
    (read from :func:`~specdec.sampling.construction_config`'s law: the untempered draft at
    ``T = 0``, ``q`` itself at ``T > 0``). The next level is requested for the live rows
    (the others are fillers carrying the root's token, ``live`` False) while any row is live.

    Args:
        root_token: ``[B]`` (or one) last committed token(s).
        spec: the drafter (vocabulary).
        sampling: the generation's sampling (the chain draws from its processed draft law).
        rng: the build's random source (a :class:`~specdec.rng.RowStreams` for ``B > 1``).
        lengths: each row's longest chain (``>= 1``).
        confidence: the stop threshold (0: none).
        proposal_top_k: ``k > 0``: each token drawn from, and each law recorded as, its parent's
            law truncated to its top ``k`` (:func:`~specdec.trees.static.truncate_proposal`,
            ``[B, n, k]`` laws instead of ``[B, n, V]``); 0: the full law.

    Returns:
        the :class:`~specdec.tree_batch.TreeBatch`, ragged ``num_nodes`` (root included), with
        ``1 + `` the deepest level drawn slots per row (the target scores every slot: a build
        stopped at level 2 of 20 is scored as 3 tokens, not 21).
    """
    rows = torch.as_tensor(root_token).numel()
    if len(lengths) != rows or any(int(x) < 1 for x in lengths):
        raise InvalidConfigError(f"chain_build: lengths must give each of the {rows} rows a length >= 1, got {lengths}")
    conf_config = construction_config(sampling)
    configs = (sampling, conf_config) if confidence > 0 and conf_config != sampling else (sampling,)
    logits = yield DraftRequest(0, rows, spec.vocab_size, False)  # [B, V]
    laws, bad = laws_and_flags(logits, configs)
    q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(laws[0], on_device=True))  # [B, V]
    dev, (B, vocab) = q.device, q.shape
    D = max(int(x) for x in lengths)
    n = D + 1
    root = torch.as_tensor(root_token, dtype=torch.int64, device=dev).reshape(-1)
    limit = torch.tensor([int(x) for x in lengths], dtype=torch.int64, device=dev)  # [B]
    draft_bad = bad.reshape(B)
    tokens = root.unsqueeze(1).expand(B, n).clone()
    valid = torch.zeros(B, n, dtype=torch.bool, device=dev)
    valid[:, 0] = True
    weights = torch.zeros(B, n, dtype=torch.float64, device=dev)
    weights[:, 0] = 1.0
    levels: list[torch.Tensor] = []  # [B, W] the law of each drawn level's parent (stacked at the end: [B, n, W])
    level_cols: list[torch.Tensor] = []  # [B, k] its columns' tokens (proposal_top_k only)
    alive = torch.ones(B, dtype=torch.bool, device=dev)  # the row draws at this level
    earlier: list[torch.Tensor] = []
    conf_law = laws[-1] if len(configs) > 1 else laws[0]
    drawn_levels = 0
    for d in range(1, D + 1):
        if d > 1:
            parents = torch.full((B, 1), d - 2, dtype=torch.int64, device=dev)
            logits = yield DraftRequest(d - 1, B, vocab, False, parents,
                                        torch.where(alive, tokens[:, d - 1], root).unsqueeze(1), alive.unsqueeze(1),
                                        d - 1, tuple(earlier))  # [B, 1, V]
            earlier.append(parents)
            laws, bad = laws_and_flags(logits[:, 0], configs)
            q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(laws[0], on_device=True))
            conf_law = laws[-1] if len(configs) > 1 else laws[0]
            draft_bad = draft_bad | (bad & alive)
        law = q
        if proposal_top_k:  # the sparse law: [B, k] columns and probabilities
            cols, law = truncate_proposal(q, proposal_top_k)
            level_cols.append(cols)
        levels.append(torch.where(alive.unsqueeze(-1), law, 0.0))
        col = draw_rows(law, 1, SampleMode.IID, rng, alive)[:, 0]  # [B], -1 for stopped rows
        drawn = col >= 0
        tok = col.clamp_min(0)
        if proposal_top_k:  # the drawn column's token
            tok = cols.gather(1, tok.unsqueeze(1)).squeeze(1).clamp_min(0)
        valid[:, d] = drawn
        tokens[:, d] = torch.where(drawn, tok, root)
        weights[:, d] = torch.where(drawn, law.gather(1, col.clamp_min(0).unsqueeze(1)).squeeze(1), 0.0)
        drawn_levels = d
        alive = drawn & (limit > d)
        if confidence > 0:
            p_tok = normalised_law(conf_law, on_device=True).gather(1, tok.unsqueeze(1)).squeeze(1)
            alive = alive & (p_tok >= confidence)
        if d < D and not bool(alive.any()):  # every row has stopped: no draft forward for nobody
            break
    # the slots of the levels drawn only: the target scores every slot, so undrawn levels are not padded on
    n = drawn_levels + 1
    tokens, valid, weights = tokens[:, :n], valid[:, :n], weights[:, :n]
    law_probs = torch.stack([*levels, torch.zeros_like(levels[0])], dim=1)  # [B, n, W]: the last level has no child
    # [B, n, k] each law column's token (sparse), or the column itself (the full law: every id)
    law_cols = torch.stack([*level_cols, level_cols[0]], dim=1) if proposal_top_k else torch.arange(vocab, device=dev)
    num = valid.sum(dim=1)  # [B] nodes, root included (a chain: slots 0 .. num - 1)
    index = torch.arange(n, device=dev)
    parents_out = torch.where(valid & (index > 0), index - 1, -1).expand(B, n).clone()
    kinds = torch.where(valid, int(NodeKind.SAMPLED), PAD)
    kinds[:, 0] = int(NodeKind.ROOT)
    has_kid = torch.zeros(B, n, dtype=torch.bool, device=dev)
    has_kid[:, :-1] = valid[:, 1:]
    probs = torch.where(has_kid.unsqueeze(-1), law_probs, 0.0)
    ids = torch.where(probs > 0, law_cols, -1)
    lower = index.unsqueeze(0) <= index.unsqueeze(1)  # [n, n] j <= i
    anc = (lower.unsqueeze(0) & valid.unsqueeze(1) & valid.unsqueeze(2)) | torch.eye(n, dtype=torch.bool, device=dev)
    return TreeBatch(
        tokens=tokens, parents=parents_out, depths=torch.where(valid, index, 0).expand(B, n).clone(), kinds=kinds,
        draw_order=torch.zeros(B, n, dtype=torch.int64, device=dev), weights=weights, num_nodes=num,
        law_ids=ids, law_probs=probs, law_wor=torch.zeros(B, n, dtype=torch.bool, device=dev), ancestors=anc,
        vocab_size=vocab, max_children=1, max_depth=drawn_levels, draft_bad=draft_bad, max_sampled=1,
    )


# the method(s) this builder serves (docs/methods.md); the defaults typed as Method.defaults (its ``dict``
# converter gives mypy no usable parameter type for a literal)
_SD_DEFAULTS: Mapping[str, Any] = {"depth": 4}
register_method(Method("sd", "chain", "rejection-iid", _SD_DEFAULTS,
                "classic speculative sampling: a chain of sampled drafts, rule 3"))
