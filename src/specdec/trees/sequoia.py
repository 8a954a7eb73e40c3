"""Sequoia (Chen et al. 2024): the DP-optimal static tree, drawn without replacement.

Given a *positional acceptance vector* ``a_k`` = P(the k-th child drawn
without replacement at a node is the one the verifier accepts), assumed the
same at every node, the expected number of tokens a tree emits per step
(accepted drafts + the bonus) is ``1 + sum over children b of a_b * (tokens of
child b's subtree)``. :func:`sequoia_tree` maximises it over all trees of at
most ``num_nodes`` draft nodes and depth ``<= max_depth`` by the dynamic
programme of docs/trees.md (``sequoia``):

    T[1][l][0] = 1
    T[m][l][b] = max_y  T[y][l][b-1] + a_b * max_b' T[m-y][l-1][b']

(``m`` counts nodes including the subtree's root; the root's ``b``-th child
subtree has ``m - y`` nodes and depth ``<= l - 1``). :func:`specdec.tune.profile_acceptance`
estimates ``a_k`` on real prompts; :func:`choose_size` picks the size and depth
that minimise ``(d * t_draft + t_target(n)) / G(n, d)`` from measured times
(:func:`measure_forward_times`, :func:`measure_draft_level_time`).

The builder draws every node's children without replacement (Sequoia uses
Gumbel-top-k, which has the same law as sequential draws) and is verified by
rule 4 (verifier ``"rejection-wor"``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel, laws_and_flags
from specdec.errors import ContextOverflowError, InvalidConfigError, MeasurementError, SpecDecError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.targets.base import TargetModel
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw
from specdec.tree_batch import TreeBatch
from specdec.trees._common import check_int, check_paths
from specdec.trees.static import ShapedTreeBuilder, check_top_k
from specdec.methods import Method, register_method

__all__ = [
    "DEFAULT_ACCEPTANCE",
    "SequoiaChoice",
    "SequoiaTreeBuilder",
    "choose_size",
    "measure_draft_level_time",
    "measure_forward_times",
    "sequoia_tree",
]

DEFAULT_ACCEPTANCE: tuple[float, ...] = (0.6, 0.12, 0.05, 0.03, 0.02, 0.01, 0.01, 0.01)
"""A prior ``a_k`` used when no profile is given: a decaying vector of the
shape Sequoia reports (most of the mass on the first draw). It is NOT measured
for any model pair; profile yours with :func:`specdec.tune.profile_acceptance`."""

MAX_SEQUOIA_NODES = 2048
"""Largest ``num_nodes`` :func:`sequoia_tree` accepts (the DP is ``O(n^2 d k)``)."""


def _check_acceptance(acceptance: Sequence[float]) -> tuple[float, ...]:
    if isinstance(acceptance, (str, bytes)) or not isinstance(acceptance, Sequence) or len(acceptance) == 0:
        raise InvalidConfigError(f"acceptance must be a non-empty sequence of probabilities, got {acceptance!r}")
    values = []
    for a in acceptance:
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or not 0.0 <= a <= 1.0:
            raise InvalidConfigError(f"acceptance values must be probabilities in [0, 1], got {a!r}")
        values.append(float(a))
    if sum(values) > 1.0 + 1e-6:
        raise InvalidConfigError(
            f"acceptance values are P(the k-th child is the accepted one) and must sum to <= 1, got {sum(values):.6g}"
        )
    return tuple(values)


def sequoia_tree(
    acceptance: Sequence[float], num_nodes: int, max_depth: int
) -> tuple[tuple[tuple[int, ...], ...], float]:
    """The Sequoia tree maximising the expected tokens per step.

    Args:
        acceptance: ``a_1, a_2, ...``: probability that the k-th child (drawn
            without replacement) is the accepted one. Children beyond
            ``len(acceptance)`` are never used.
        num_nodes: budget of draft nodes (root excluded), ``>= 1``.
        max_depth: maximum depth of a draft node (root = 0), ``>= 1``.

    Returns:
        ``(paths, expected_tokens)``: the tree as child-slot paths (breadth
        first; slot ``i`` = the ``i``-th draw) and ``G``, its expected emitted
        tokens per step (accepted + bonus) under the positional model. Among
        equally good trees the one with fewest nodes is returned (zero
        acceptance positions are not filled).

    Example:
        >>> paths, g = sequoia_tree([0.5, 0.2], num_nodes=3, max_depth=2)
        >>> paths, round(g, 3)
        (((0,), (1,), (0, 0)), 1.95)
    """
    a = _check_acceptance(acceptance)
    check_int("num_nodes", num_nodes, 1)
    check_int("max_depth", max_depth, 1)
    if num_nodes > MAX_SEQUOIA_NODES:
        raise InvalidConfigError(f"num_nodes must be <= {MAX_SEQUOIA_NODES}, got {num_nodes}")
    n = num_nodes + 1
    kmax = min(len(a), num_nodes)
    neg = float("-inf")
    # T[l][b][m], best[l][m]; index m = 0 unused (-inf)
    T = torch.full((max_depth + 1, kmax + 1, n + 1), neg, dtype=torch.float64)
    arg_y = torch.zeros((max_depth + 1, kmax + 1, n + 1), dtype=torch.long)
    best = torch.full((max_depth + 1, n + 1), neg, dtype=torch.float64)
    arg_b = torch.zeros((max_depth + 1, n + 1), dtype=torch.long)
    T[:, 0, 1] = 1.0
    ms = torch.arange(n + 1)
    ys = torch.arange(n + 1)
    diff = ms[:, None] - ys[None, :]  # [m, y] -> size of the b-th child's subtree
    valid = diff >= 1
    best[0, 1] = 1.0
    for l in range(1, max_depth + 1):
        prev_best = best[l - 1]
        child = torch.where(valid, prev_best[diff.clamp(0, n)], torch.full_like(diff, neg, dtype=torch.float64))
        for b in range(1, kmax + 1):
            cand = T[l, b - 1][None, :] + a[b - 1] * child  # [m, y]
            # -inf stays -inf (a_b >= 0; 0 * -inf would be nan: guard it)
            cand = torch.where(torch.isnan(cand), torch.full_like(cand, neg), cand)
            values, index = cand.max(dim=1)  # first maximal y
            T[l, b] = values
            arg_y[l, b] = index
        values, index = T[l].max(dim=0)  # first maximal b
        best[l] = values
        arg_b[l] = index
    totals = best[max_depth, 1:]
    size = int(torch.argmax(totals)) + 1  # smallest tree reaching the maximum
    expected = float(totals[size - 1])

    paths: list[tuple[int, ...]] = []

    def emit(prefix: tuple[int, ...], m: int, l: int, b: int) -> None:
        while b > 0:  # children b, b-1, ..., 1 of the subtree rooted at prefix
            y = int(arg_y[l, b, m])
            path = prefix + (b - 1,)
            paths.append(path)
            sub = m - y
            emit(path, sub, l - 1, int(arg_b[l - 1, sub]))
            m, b = y, b - 1

    emit((), size, max_depth, int(arg_b[max_depth, size]))
    if not paths:  # cannot happen for num_nodes >= 1 and a_1 > 0; a_1 = 0 gives a root-only tree
        raise InvalidConfigError("acceptance vector gives no tree with positive gain (a_1 = 0?)")
    return check_paths(paths), expected


@attrs.frozen
class SequoiaChoice:
    """Result of :func:`choose_size`.

    Attributes:
        num_nodes: chosen draft-node budget ``n``.
        max_depth: chosen depth bound ``d``.
        paths: the DP tree for ``(n, d)``.
        expected_tokens: ``G(n, d)``, expected tokens per step.
        seconds_per_token: ``(d' * t_draft + t_target(n + 1)) / G`` with
            ``d'`` the tree's actual depth.
        table: every evaluated ``(n, d) -> seconds_per_token``.
    """

    num_nodes: int
    max_depth: int
    paths: tuple[tuple[int, ...], ...]
    expected_tokens: float
    seconds_per_token: float
    table: Mapping[tuple[int, int], float]


def choose_size(
    acceptance: Sequence[float],
    forward_time: Callable[[int], float] | Mapping[int, float],
    draft_time_per_level: float,
    candidates: Sequence[int],
    depths: Sequence[int],
) -> SequoiaChoice:
    """Sequoia's hardware-aware choice of tree size and depth.

    Minimises ``(d * t_draft + t_target(n + 1)) / G(n, d)`` over
    ``candidates x depths``, where ``G`` is :func:`sequoia_tree`'s expected
    tokens, ``d`` the depth the optimal tree actually reaches (one draft
    forward per level) and ``t_target(n + 1)`` the target's time to score a
    tree of ``n`` draft nodes plus the root.

    Args:
        acceptance: positional acceptance ``a_k`` (:func:`specdec.tune.profile_acceptance`).
        forward_time: ``t_target(tokens)``: a function, or a table measured by
            :func:`measure_forward_times` keyed by tokens per forward
            (``n + 1``); every candidate's ``n + 1`` must be in the table.
        draft_time_per_level: seconds of one draft forward over a level.
        candidates: draft-node budgets ``n`` to try.
        depths: depth bounds ``d`` to try.

    Example:
        >>> choice = choose_size([0.7, 0.1], lambda t: 1.0 + 0.01 * t, 0.1, [1, 4, 16], [1, 2, 4])
        >>> (choice.num_nodes, choice.max_depth)
        (16, 4)
    """
    a = _check_acceptance(acceptance)
    if not isinstance(draft_time_per_level, (int, float)) or not draft_time_per_level >= 0:
        raise InvalidConfigError(f"draft_time_per_level must be a number >= 0, got {draft_time_per_level!r}")
    if not candidates or not depths:
        raise InvalidConfigError("choose_size needs at least one candidate size and one depth")
    if isinstance(forward_time, Mapping):
        table_t = dict(forward_time)

        def t_target(tokens: int) -> float:
            if tokens not in table_t:
                raise InvalidConfigError(
                    f"forward_time has no measurement for {tokens} tokens (n = {tokens - 1}); "
                    f"measured: {sorted(table_t)}"
                )
            return float(table_t[tokens])
    elif callable(forward_time):
        t_target = forward_time  # type: ignore[assignment]
    else:
        raise InvalidConfigError(f"forward_time must be a callable or a mapping, got {type(forward_time).__name__}")
    best: SequoiaChoice | None = None
    table: dict[tuple[int, int], float] = {}
    for n in candidates:
        for d in depths:
            paths, gain = sequoia_tree(a, n, d)
            used_depth = max(len(p) for p in paths)
            cost = used_depth * float(draft_time_per_level) + float(t_target(n + 1))
            per_token = cost / gain
            table[(n, d)] = per_token
            if best is None or per_token < best.seconds_per_token:
                best = SequoiaChoice(n, d, paths, gain, per_token, {})
    assert best is not None
    return attrs.evolve(best, table=table)


def _sync(x: torch.Tensor) -> None:
    float(x.reshape(-1)[0])  # forces completion on asynchronous devices


_clock = time.perf_counter  # the forward-cost curve's clock (a module attribute: the tests replace it)


def timing_chain(prompt_ids: Sequence[int], size: int, vocab: int) -> DraftTree:
    """A chain of ``size`` tokens (root included) after ``prompt_ids``: the tree a forward-cost timing scores."""
    law = SparseLaw.from_dense(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64), SampleMode.IID)
    tokens = [int(prompt_ids[i % len(prompt_ids)]) for i in range(size - 1)]
    return DraftTree.chain(int(prompt_ids[-1]), tokens, [law] * (size - 1), vocab)


def measure_forward_times(
    target: TargetModel,
    prompt_ids: Sequence[int],
    sizes: Sequence[int],
    *,
    repeats: int = 3,
    warmup: int = 1,
    batch_size: int = 1,
    interleave: bool = False,
    statistic: str = "median",
    prefill_once: bool = False,
    on_round: Callable[[int, int, float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> dict[int, float]:
    """Seconds for ``target`` to score a tree of each size on this machine.

    Args:
        target: the target model.
        prompt_ids: a prompt (its last token is the root); the target is
            re-prefilled before each timed forward, so its state is unchanged.
        sizes: tokens per forward (tree nodes including the root), each ``>= 1``.
        repeats: timed forwards per size.
        warmup: untimed forwards per size.
        batch_size: ``B`` rows scored together (``B > 1``: the target's batch
            mode, ``prefill_batch`` + ``score_batch`` of ``B`` trees of the size,
            as batched generation scores them).
        interleave: time the sizes in turn (1, 2, 5, 1, 2, 5, ...), not one after
            another: a spell of load on a shared machine falls on every size alike.
        statistic: ``"median"``, or ``"min"``: interference only adds time, so the fastest
            is the cost on a quiet core (``--budget auto``: ``interleave=True, statistic="min"``).
        prefill_once: prefill once, not before every forward (one row, and a target that
            declares :attr:`~specdec.targets.base.TargetModel.rescores_trees`: scoring again
            discards the previous tree, so the timed forwards are the same).
        on_round: with ``interleave``, called after each round with ``(rounds done, rounds,
            seconds so far)`` (the bench's progress lines).
        clock: the timer (default: this module's ``_clock``, read at the call).

    Returns:
        ``{tokens: seconds}`` (seconds of the whole ``B``-row forward), usable as
        ``forward_time`` in :func:`choose_size`.
    """
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    check_int("batch_size", batch_size, 1)
    if statistic not in ("median", "min"):
        raise InvalidConfigError(f"statistic must be 'median' or 'min', got {statistic!r}")
    if not prompt_ids:
        raise InvalidConfigError("measure_forward_times needs a non-empty prompt")
    if batch_size > 1 and not target.supports_batch:
        raise InvalidConfigError(f"{type(target).__name__} has no batch mode: cannot time {batch_size}-row forwards")
    if prefill_once and (batch_size > 1 or not target.rescores_trees):
        raise InvalidConfigError("prefill_once needs one row and a target that declares rescores_trees")
    timer = _clock if clock is None else clock
    vocab = target.vocab_size
    trees: dict[int, tuple[DraftTree, TreeBatch]] = {}
    for size in sizes:
        check_int("size", size, 1)
        if target.max_length is not None and len(prompt_ids) + size > target.max_length:
            raise ContextOverflowError(
                f"a {size}-token tree after a {len(prompt_ids)}-token prompt exceeds max_length {target.max_length}"
            )
        tree = timing_chain(prompt_ids, size, vocab)
        trees[int(size)] = (tree, TreeBatch.from_trees([tree] * batch_size))
    times: dict[int, list[float]] = {size: [] for size in trees}

    def timed(size: int, keep: bool) -> None:
        _, batch = trees[size]
        if not prefill_once:
            target.prefill_batch([prompt_ids] * batch_size)
        start = timer()
        try:
            _sync(target.score_batch(batch))
        except SpecDecError:
            raise
        except Exception as exc:  # noqa: BLE001 - one clear error naming the size; no curve is guessed
            raise MeasurementError(
                f"the target forward of a {size}-token tree{f' x {batch_size} rows' if batch_size > 1 else ''} "
                f"failed while timing the forward-cost curve ({type(exc).__name__}: {exc}); the curve is not "
                "guessed: fix the model at that size, or give the tree budget by hand (--budget N)"
            ) from exc
        elapsed = timer() - start
        if keep:
            times[size].append(elapsed)

    if prefill_once:
        target.prefill_batch([list(prompt_ids)])
    if interleave:
        started = timer() if on_round is not None else 0.0
        for rep in range(warmup + repeats):
            for size in trees:
                timed(size, rep >= warmup)
            if on_round is not None:
                on_round(rep + 1, warmup + repeats, timer() - started)
    else:
        for size in trees:
            for rep in range(warmup + repeats):
                timed(size, rep >= warmup)
    if statistic == "min":
        return {size: min(t) for size, t in times.items()}
    return {size: sorted(t)[len(t) // 2] for size, t in times.items()}


def measure_draft_level_time(
    draft: DraftModel,
    prompt_ids: Sequence[int],
    width: int,
    sampling: SamplingConfig | None = None,
    *,
    repeats: int = 3,
    batch_size: int = 1,
    target: TargetModel | None = None,
) -> float:
    """Median seconds of one draft call expanding a level of ``width`` nodes.

    Args:
        draft: the draft model (restarted with :meth:`DraftModel.begin_rows`).
        prompt_ids: a prompt.
        width: nodes in the level (children of the root).
        sampling: processing (default ``SamplingConfig()``).
        repeats: timed calls (median reported).
        batch_size: ``B`` rows expanded together (``B > 1``: the draft's rows
            mode, ``begin_rows`` + one ``request_logits`` of ``width`` nodes per
            row, as batched generation grows its trees).
        target: with ``B > 1`` and a feature-level draft (EAGLE), the target
            whose batch prefill gives the rows' features (``capture_layers`` set).
    """
    check_int("width", width, 1)
    check_int("repeats", repeats, 1)
    check_int("batch_size", batch_size, 1)
    sampling = SamplingConfig() if sampling is None else sampling
    if batch_size > 1 and not draft.supports_rows:
        raise InvalidConfigError(f"{type(draft).__name__} has no rows mode: cannot time {batch_size}-row levels")
    if batch_size > 1 and draft.needs_target_hidden and target is None:
        raise InvalidConfigError("timing a feature-level draft's rows mode needs the target (target=)")
    rows = [list(prompt_ids)] * batch_size
    tokens = [int(prompt_ids[i % len(prompt_ids)]) for i in range(width)]
    V = draft.vocab_size
    times = []
    for _ in range(repeats + 1):
        hidden = None
        if batch_size > 1 and draft.needs_target_hidden:
            assert target is not None
            target.prefill_batch(rows)
            hidden = target.hidden_rows()
        draft.begin_rows(rows, hidden)  # the batch contract, as generation drives it (B = 1 included)
        (q,), _ = laws_and_flags(draft.request_logits(DraftRequest(level=0, rows=batch_size, width=V, proposal=False)),
                                 (sampling,))
        _sync(q)
        parents = torch.zeros(batch_size, width, dtype=torch.int64, device=q.device)
        level = torch.tensor([tokens] * batch_size, dtype=torch.int64, device=q.device)
        start = time.perf_counter()
        request = DraftRequest(level=1, rows=batch_size, width=V, proposal=False, parents=parents, tokens=level)
        _sync(laws_and_flags(draft.request_logits(request), (sampling,))[0][0])
        times.append(time.perf_counter() - start)
    times = times[1:]
    return sorted(times)[len(times) // 2]


def _convert_optional_paths(value: object) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    return check_paths(value)  # type: ignore[arg-type]


def _optional_acceptance(value: object) -> tuple[float, ...] | None:
    return None if value is None else _check_acceptance(value)  # type: ignore[arg-type]


@register("tree", "sequoia")
@attrs.frozen
class SequoiaTreeBuilder(ShapedTreeBuilder):
    """Sequoia's DP-optimal tree, children drawn without replacement.

    Give either the DP inputs (``num_nodes``, ``max_depth``, ``acceptance``;
    each defaults as below) or an explicit ``paths`` shape (e.g.
    :attr:`SequoiaChoice.paths` from :func:`choose_size`), not both.

    Args:
        num_nodes: draft-node budget (default 60, EAGLE-2's budget, so that
            methods compare at equal budgets).
        max_depth: depth bound (default 6, idem).
        acceptance: positional acceptance ``a_k`` (default
            :data:`DEFAULT_ACCEPTANCE`, an unmeasured prior; measure yours with
            :func:`specdec.tune.profile_acceptance`).
        paths: an explicit child-slot shape instead of the DP.
        proposal_top_k: ``k > 0``: children drawn from, and recorded as, each node's law
            truncated to its top ``k`` (sparse laws, docs/trees.md "Sparse proposals"); 0 (default): the full law.

    Attributes:
        paths: the tree shape used (child-slot paths, breadth first).
        expected_tokens: the DP's ``G`` (NaN for explicit paths).

    Verified by rule 4 (``"rejection-wor"``).

    Example:
        >>> builder = SequoiaTreeBuilder(num_nodes=3, max_depth=2, acceptance=(0.5, 0.2))
        >>> builder.paths, round(builder.expected_tokens, 3)
        (((0,), (1,), (0, 0)), 1.95)
    """

    num_nodes: int | None = attrs.field(default=None)
    depth_bound: int | None = attrs.field(default=None, alias="max_depth")
    acceptance: tuple[float, ...] | None = attrs.field(default=None, converter=_optional_acceptance)
    explicit_paths: tuple[tuple[int, ...], ...] | None = attrs.field(
        default=None, alias="paths", converter=_convert_optional_paths
    )
    proposal_top_k: int = attrs.field(default=0, validator=check_top_k)
    paths: tuple[tuple[int, ...], ...] = attrs.field(init=False)
    expected_tokens: float = attrs.field(init=False)

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.SAMPLED})
    default_verifier: ClassVar[str] = "rejection-wor"
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"num_nodes": 3, "max_depth": 2, "acceptance": (0.5, 0.2)},
        {"num_nodes": 3, "max_depth": 2, "acceptance": (0.5, 0.2), "proposal_top_k": 2},
    )

    def __attrs_post_init__(self) -> None:
        if self.explicit_paths is not None:
            given = [n for n, v in (("num_nodes", self.num_nodes), ("max_depth", self.depth_bound),
                                    ("acceptance", self.acceptance)) if v is not None]
            if given:
                raise InvalidConfigError(
                    f"give either paths or the DP inputs, not both (got paths and {', '.join(given)})"
                )
            paths, gain = self.explicit_paths, float("nan")
            object.__setattr__(self, "num_nodes", len(paths))
            object.__setattr__(self, "depth_bound", max(len(p) for p in paths))
        else:
            for name, default in (("num_nodes", 60), ("depth_bound", 6), ("acceptance", DEFAULT_ACCEPTANCE)):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, default)
            paths, gain = sequoia_tree(self.acceptance, self.num_nodes, self.depth_bound)  # type: ignore[arg-type]
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "expected_tokens", gain)

    @property
    def max_nodes(self) -> int:
        return len(self.paths) + 1

    @property
    def max_depth(self) -> int:
        return max(len(p) for p in self.paths)

    def shape(self) -> tuple[tuple[tuple[int, ...], ...], SampleMode]:
        return self.paths, SampleMode.WITHOUT_REPLACEMENT

    def law_top_k(self) -> int:
        return self.proposal_top_k


# the method(s) this builder serves (docs/methods.md)
register_method(Method("sequoia", "sequoia", "rejection-wor", {},
                "Sequoia: DP-optimal static tree, children without replacement (rule 4)"))
