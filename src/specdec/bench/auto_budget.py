"""``--budget auto``: the tree budget of each temperature and draft kind, and rheo's sampled slots, measured.

The budget ``(N, d)`` and its mapping onto every method's builder options are
:mod:`specdec.bench.budget`'s. ``--budget auto`` follows Sequoia's hardware-aware choice, **per temperature
and draft kind** (:func:`choose_budgets`): it measures on this machine the target's forward
time ``t(n + 1)`` for trees of ``n + 1`` tokens
(:func:`~specdec.trees.sequoia.measure_forward_times`) and each draft's time
for one level of ``w`` nodes, profiles the *positional acceptance* ``a_k``
(the probability that the target's token is the draft's ``k``-th ranked
proposal, :func:`profile_positional_acceptance`) for every draft and
temperature in the run, on the profile prompts (tuning data: prompts of the
set that the run does not report on), and picks, for each temperature ``T``
and each draft kind, the ``(N, d)`` maximising that kind's expected tokens per
second at ``T`` (:func:`choose_budget` on that kind's profile at ``T`` only; the
rows of one draft kind share its budget):

    G(N, d) / (d * t_level(K(N, d)) + t(N + 1))

(A single budget for every kind, the mean of their rates, flipped between near-tied optima of
different drafts from run to run: a draft LM at 1 node and an EAGLE-3 head at 4, issue 59.)

where ``G`` is the expected tokens per step (accepted + bonus) of the best
tree of ``N`` nodes and depth ``<= d`` under the positional model (Sequoia's
DP, :func:`~specdec.trees.sequoia.sequoia_tree`). This is an estimate: it
assumes the acceptance at a node does not depend on its depth or its
ancestors, and the dynamic trees are not exactly the DP's tree. Sampling
flattens the draft's law, so at ``T > 0`` the acceptance spreads over the
lower ranks and the best tree can be wider than at ``T = 0``.

RheoSampling's sampled slots ``m`` are then chosen per temperature from a
measurement (:func:`choose_sampled_slots`): at ``T = 0`` rheo builds
EAGLE-2's tree and ``m`` stays 1; at each ``T > 0``, short seeded pilot
generations of the rheo rows at ``T``'s budget (:func:`pilot_tau`) measure the
tokens per step ``tau`` for every ``m`` in :data:`SLOT_CANDIDATES` with
``m < K`` (rheo keeps a deterministic slot: ``m = K``, every slot sampled, is the
``sampled-dynamic`` method, a row of its own), and the largest ``tau`` wins (ties go to
the smaller ``m``; with ``K = 2`` only ``m = 1`` is left and nothing is piloted). A row's
own ``m`` (``rheo[m=2]``) overrides the choice, as every row option overrides
the budget's mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from specdec.bench.budget import Budget, dynamic_width
from specdec.drafts.base import DraftModel
from specdec.bench.forward_timing import time_tree_forwards
from specdec.errors import InvalidConfigError
from specdec.generate import SpeculativeGenerator
from specdec.kernels.tuning_scope import rows_up_to
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.engine.loop import profile_steps
from specdec.engine.step import Roles
from specdec.targets.base import TargetModel
from specdec.tree import SampleMode
from specdec.trees.base import TreeBuilder
from specdec.trees.dynamic import EagleTreeBuilder
from specdec.trees.sequoia import DEFAULT_ACCEPTANCE, sequoia_tree
from specdec.trees.static import StaticTreeBuilder

__all__ = [
    "AUTO_CANDIDATES",
    "AUTO_DEPTHS",
    "SLOT_CANDIDATES",
    "BudgetChoice",
    "SlotsChoice",
    "choose_budget",
    "choose_budgets",
    "choose_sampled_slots",
    "pilot_tau",
    "linear_level_time",
    "linear_rows",
    "smooth_acceptance",
    "profile_positional_acceptance",
    "time_tree_forwards",
]

AUTO_CANDIDATES: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Node budgets ``N`` that ``--budget auto`` considers."""

AUTO_DEPTHS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)
"""Depth bounds ``d`` that ``--budget auto`` considers (with ``d <= N``)."""


SLOT_CANDIDATES: tuple[int, ...] = (1, 2, 3)
"""Sampled slots ``m`` of RheoSampling that ``--budget auto`` tries at ``T > 0`` (those with ``m < K``)."""

@attrs.frozen
class BudgetChoice:
    """Result of :func:`choose_budget`.

    Attributes:
        budget: the chosen ``(N, d)``.
        expected_tokens_per_s: the objective at the chosen budget.
        table: ``(N, d) -> expected tokens/s`` (mean over profiles) for every candidate.
        expected_tokens: ``(N, d) -> G`` per profile key, at the chosen budget.
    """

    budget: Budget
    expected_tokens_per_s: float
    table: Mapping[tuple[int, int], float]
    expected_tokens: Mapping[str, float]


def choose_budget(
    forward_time: Mapping[int, float] | Callable[[int], float],
    level_time: Mapping[str, Callable[[int], float]],
    acceptance: Mapping[str, tuple[str, Sequence[float]]],
    candidates: Sequence[int] = AUTO_CANDIDATES,
    depths: Sequence[int] = AUTO_DEPTHS,
) -> BudgetChoice:
    """Pick the budget maximising the mean expected tokens per second.

    Args:
        forward_time: ``t(tokens)``: the target's seconds to score a tree of
            ``tokens`` nodes (root included), a table keyed by ``N + 1`` or a function.
        level_time: per draft kind, ``width -> seconds`` of one draft level.
        acceptance: per profile key (e.g. ``"eagle3@T=1"``), ``(draft kind,
            positional acceptance a_1, a_2, ...)``.
        candidates, depths: the ``N`` and ``d`` to try (``d <= N`` only).

    Returns:
        the :class:`BudgetChoice`; ties go to the smaller ``N``, then ``d``.

    Example:
        >>> choice = choose_budget(lambda t: 1.0 + 0.1 * t, {"lm": lambda w: 0.05},
        ...                        {"lm@T=0": ("lm", [0.8, 0.1])}, candidates=(1, 4, 16), depths=(1, 2, 4))
        >>> choice.budget
        Budget(nodes=4, depth=4)
    """
    if not acceptance:
        raise InvalidConfigError("choose_budget needs at least one acceptance profile")
    t_target: Callable[[int], float]
    if isinstance(forward_time, Mapping):
        table_t = dict(forward_time)

        def measured(tokens: int) -> float:
            if tokens not in table_t:
                raise InvalidConfigError(f"no forward time measured for {tokens} tokens; measured {sorted(table_t)}")
            return float(table_t[tokens])

        t_target = measured
    else:
        t_target = forward_time
    table: dict[tuple[int, int], float] = {}
    gains: dict[tuple[int, int], dict[str, float]] = {}
    best: tuple[float, int, int] | None = None
    for n in sorted(set(candidates)):
        for d in sorted(set(depths)):
            if d > n:
                continue
            budget = Budget(n, d)
            width = dynamic_width(budget)
            rates, g_by_key = [], {}
            for key, (kind, a) in acceptance.items():
                if sum(a) <= 0:
                    g = 1.0
                else:
                    _, g = sequoia_tree(list(a), n, d)
                g_by_key[key] = g
                cost = d * float(level_time[kind](width)) + t_target(n + 1)
                rates.append(g / cost)
            value = sum(rates) / len(rates)
            table[(n, d)] = value
            gains[(n, d)] = g_by_key
            if best is None or value > best[0] * (1 + 1e-12):
                best = (value, n, d)
    if best is None:
        raise InvalidConfigError("choose_budget: no candidate (N, d) with d <= N")
    value, n, d = best
    return BudgetChoice(Budget(n, d), value, table, gains[(n, d)])


def choose_budgets(
    forward_time: Mapping[int, float] | Callable[[int], float],
    level_time: Mapping[str, Callable[[int], float]],
    acceptance: Mapping[float, Mapping[str, tuple[str, Sequence[float]]]],
    candidates: Sequence[int] = AUTO_CANDIDATES,
    depths: Sequence[int] = AUTO_DEPTHS,
) -> dict[float, dict[str, BudgetChoice]]:
    """:func:`choose_budget` for every (temperature, draft kind), on that kind's profiles at that temperature
    only: each kind gets its own optimum, never one shared by the kinds.

    Args:
        forward_time, level_time, candidates, depths: as :func:`choose_budget`
            (the costs do not depend on the temperature; ``level_time`` needs every kind profiled).
        acceptance: per temperature, the profiles of :func:`choose_budget`
            (per key, ``(draft kind, a_1, a_2, ...)``) measured at it, on tuning prompts.

    Returns:
        per temperature, per draft kind, its :class:`BudgetChoice`.

    Raises:
        InvalidConfigError: no temperature, a temperature without a profile, or a kind without a level time.

    Example:
        >>> cost = lambda t: 1.0 + 0.1 * t
        >>> level = {"lm": lambda w: 0.05, "eagle3": lambda w: 0.01}
        >>> out = choose_budgets(cost, level, {0.0: {"lm@T=0": ("lm", [0.4, 0.05]),
        ...                      "eagle3@T=0": ("eagle3", [0.9, 0.05])}}, candidates=(1, 2, 4, 8), depths=(1, 2, 4))
        >>> out[0.0]["lm"].budget, out[0.0]["eagle3"].budget
        (Budget(nodes=1, depth=1), Budget(nodes=4, depth=4))
    """
    if not acceptance:
        raise InvalidConfigError("choose_budgets needs at least one temperature")
    out: dict[float, dict[str, BudgetChoice]] = {}
    for t in sorted(acceptance):
        if not acceptance[t]:
            raise InvalidConfigError(f"choose_budgets: no acceptance profile at T={t:g}")
        by_kind: dict[str, dict[str, tuple[str, Sequence[float]]]] = {}
        for key, (kind, a) in acceptance[t].items():
            by_kind.setdefault(kind, {})[key] = (kind, a)
        missing = sorted(set(by_kind) - set(level_time))
        if missing:
            raise InvalidConfigError(f"choose_budgets: no draft level time for draft kind(s) {missing} "
                                     f"(level times for {sorted(level_time)})")
        out[float(t)] = {kind: choose_budget(forward_time, level_time, profiles, candidates, depths)
                         for kind, profiles in sorted(by_kind.items())}
    return out


@attrs.frozen
class SlotsChoice:
    """Result of :func:`choose_sampled_slots`.

    Attributes:
        m: the chosen sampled slots.
        candidates: the ``m`` tried (those of the candidates with ``m < K``).
        tau: measured tokens per step per ``m`` (empty when one candidate
            was left: nothing to measure).
    """

    m: int
    candidates: tuple[int, ...]
    tau: Mapping[int, float]


def choose_sampled_slots(pilot: Callable[[int], float], width: int,
                         candidates: Sequence[int] = SLOT_CANDIDATES) -> SlotsChoice:
    """RheoSampling's ``m``: the candidate with ``m < width`` (at least one deterministic slot; ``m = 1``
    always among them) whose pilot measures the most tokens per step.

    Args:
        pilot: ``m -> tau``, the measured tokens per step with ``m`` sampled
            slots (:func:`pilot_tau`); called once per candidate, never when a
            single candidate is left.
        width: ``K``, the children per node (``m < K`` is required: ``m = K`` is the
            ``sampled-dynamic`` method, not rheo).
        candidates: the ``m`` to try.

    Returns:
        the :class:`SlotsChoice`; ties go to the smaller ``m``.

    Example:
        >>> choose_sampled_slots({1: 2.0, 2: 2.3, 3: 2.3}.__getitem__, 10).m
        2
        >>> choose_sampled_slots({1: 1.2, 2: 1.4}.__getitem__, 2)  # K = 2: m = 1 is all rheo has
        SlotsChoice(m=1, candidates=(1,), tau={})
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 2:
        raise InvalidConfigError(f"the width K must be an int >= 2, got {width!r}")
    tried = tuple(sorted({int(m) for m in candidates if 1 <= int(m) < width} | {1}))
    if len(tried) == 1:
        return SlotsChoice(tried[0], tried, {})
    tau = {m: float(pilot(m)) for m in tried}
    best = tried[0]
    for m in tried[1:]:
        if tau[m] > tau[best]:  # strictly better: ties keep the smaller m
            best = m
    return SlotsChoice(best, tried, tau)


def pilot_tau(
    target: TargetModel,
    draft: DraftModel,
    method: str,
    options: Mapping[str, Any],
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    max_new_tokens: int,
    *,
    seed: int = 0,
) -> tuple[int, int]:
    """Emitted tokens and steps of short pilot generations of ``method`` with builder ``options``.

    One generation of up to ``max_new_tokens`` tokens per prompt (fewer where
    the context is short; a prompt without room is skipped), prompt ``i``
    with seed ``seed + i``, EOS ignored. ``tau`` is ``emitted / steps``.

    Raises:
        InvalidConfigError: no prompt had room for a pilot generation.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> lm = CallableLM(lambda p: torch.tensor([[2.0, 1.0, 0.0]] * len(p)), vocab_size=3)
        >>> pilot_tau(lm, CallableLM(lm.fn, 3), "rheo", {"N": 4, "depth": 2, "K": 2, "B": 2}, [[0]],
        ...           SamplingConfig(temperature=0), 6)  # a perfect draft: 3 tokens per step
        (6, 2)
    """
    gen = SpeculativeGenerator(target=target, draft=draft, method=method, **dict(options))
    emitted = steps = 0
    nodes = int(options.get("N", options.get("num_nodes", 64)))
    for i, prompt in enumerate(prompts):
        prompt = [int(x) for x in prompt]
        room = max_new_tokens
        for model in (target, draft):
            limit = getattr(model, "max_length", None)
            if limit is not None:
                room = min(room, limit - len(prompt) - nodes - 2)
        if room < 1:
            continue
        out = gen.generate(prompt, room, sampling=sampling, seed=seed + i, eos_token_id=None)
        emitted += out.stats.emitted
        steps += out.stats.steps
    if steps == 0:
        raise InvalidConfigError("no pilot prompt leaves room for a pilot generation (context too short)")
    return emitted, steps


def linear_rows(budget: Budget | str, batch_size: int = 1) -> tuple[int, ...]:
    """The row counts a bench run's CPU linear tuning measures (issue 57): those of forwards of up to
    ``B x (N + 1)`` rows, ``N`` the budget's nodes (``--budget auto``: its largest candidate, 64), and at
    least 65 (the acceptance profiles' 9-token trees, the assisted-generation row's verifications):
    :func:`~specdec.kernels.tuning_scope.rows_up_to`.

    Example:
        >>> linear_rows("auto")[-4:], linear_rows(Budget(4, 2), 8)[-4:]
        ((24, 32, 48, 64), (24, 32, 48, 64))
        >>> linear_rows("auto", 4)[-3:]
        (128, 192, 256)
    """
    nodes = budget.nodes if isinstance(budget, Budget) else max(AUTO_CANDIDATES)
    return rows_up_to(max(65, batch_size * (nodes + 1)))


def linear_level_time(times: Mapping[int, float]) -> Callable[[int], float]:
    """``width -> seconds`` by linear interpolation (and extrapolation) of measured widths."""
    points = sorted(times.items())
    if len(points) == 1:
        return lambda w: float(points[0][1])

    def fn(width: int) -> float:
        (w0, t0), (w1, t1) = points[0], points[-1]
        for (a, ta), (b, tb) in zip(points, points[1:]):
            if width <= b:
                (w0, t0), (w1, t1) = (a, ta), (b, tb)
                break
        return max(0.0, t0 + (t1 - t0) * (width - w0) / (w1 - w0))

    return fn


def smooth_acceptance(counts_or_rates: Sequence[float], trials: int, prior: Sequence[float] | None = None) -> tuple[float, ...]:
    """Shrink a measured acceptance vector towards a prior with one pseudo-step.

    ``a_k = (trials * rate_k + prior_k) / (trials + 1)``, with Sequoia's prior
    :data:`~specdec.trees.sequoia.DEFAULT_ACCEPTANCE` by default: a short
    profile in which the draft never hit (all zeros) still gives a usable
    Sequoia tree, and the sum stays ``<= 1``.

    Example:
        >>> smooth_acceptance([0.0, 0.0], 4, prior=[0.5, 0.25])
        (0.1, 0.05)
    """
    prior = list(DEFAULT_ACCEPTANCE if prior is None else prior)
    prior += [0.0] * max(0, len(counts_or_rates) - len(prior))
    return tuple((trials * float(r) + prior[k]) / (trials + 1) for k, r in enumerate(counts_or_rates))


def profile_positional_acceptance(
    target: TargetModel,
    draft: DraftModel,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    k_max: int,
    *,
    children: str = "topk",
    steps_per_prompt: int = 4,
    seed: int | None = 0,
) -> tuple[float, ...]:
    """Positional acceptance ``a_1..a_k_max`` measured with one-level trees.

    Each step drafts ``k_max`` children of the root, the target scores the
    tree, a lossless verifier picks the accepted child (or none), and the
    emitted tokens are committed (so later steps profile generated text).
    ``a_k`` = fraction of steps in which the ``k``-th child was accepted.

    Args:
        target: the target model.
        draft: the draft (feature-level EAGLE drafts receive the target's
            hidden states at commit, as in generation).
        prompts: token-id prompts.
        sampling: the sampling configuration served.
        k_max: children per step.
        children: ``"topk"``: the draft's top-``k_max`` tokens, verified by
            sample-and-match (rule 2; the EAGLE-style trees); ``"wor"``:
            ``k_max`` draws without replacement, verified by rule 4 (Sequoia's
            profile, :func:`specdec.trees.sequoia.profile_acceptance`).
        steps_per_prompt: steps per prompt.
        seed: seed of every draw.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> lm = CallableLM(lambda p: torch.tensor([[2.0, 1.0, 0.0]] * len(p)), vocab_size=3)
        >>> profile_positional_acceptance(lm, CallableLM(lm.fn, 3), [[0]], SamplingConfig(temperature=0), 2)
        (1.0, 0.0)
        >>> flip = CallableLM(lambda p: torch.tensor([[1.0, 2.0, 0.0]] * len(p)), vocab_size=3)
        >>> profile_positional_acceptance(lm, flip, [[0]], SamplingConfig(temperature=0), 2)  # T=0: ranked by softmax
        (0.0, 1.0)
    """
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
        raise InvalidConfigError(f"k_max must be an int >= 1, got {k_max!r}")
    if children not in ("topk", "wor"):
        raise InvalidConfigError(f"children must be 'topk' or 'wor', got {children!r}")
    if not prompts:
        raise InvalidConfigError("profiling needs at least one prompt")
    verifier = get("verifier", "match" if children == "topk" else "rejection-wor")()
    if children == "wor":
        builder: TreeBuilder = StaticTreeBuilder(
            expansion=tuple((i,) for i in range(k_max)), mode=SampleMode.WITHOUT_REPLACEMENT
        )
    else:  # one EAGLE level: the draft's top-k_max, ranked as the dynamic builders rank (untempered at T = 0)
        builder = EagleTreeBuilder(K=k_max, depth=1, N=k_max)
    rng = TorchRandom.seeded(seed)
    counts = [0] * k_max
    trials = 0
    for outcome in profile_steps(Roles(target, draft, builder, verifier), prompts, sampling, rng, steps_per_prompt,
                                 room=k_max + 1, name="profile_positional_acceptance"):
        result, tree = outcome.result, outcome.tree
        trials += 1
        if result.accepted_nodes:
            first = result.accepted_nodes[0]
            counts[int(tree.draw_order[0, first])] += 1  # draw position (wor) or rank (topk)
    return tuple(c / trials for c in counts)


