"""Tree budgets for ``specdec bench``: one size for every method, fixed or measured.

A *budget* is ``(N, d)``: ``N`` draft nodes per tree (the root, i.e. the last
committed token, is not counted) and a depth bound ``d``. Every method gets
the same budget at a temperature (``--budget N``: the same at every
temperature; ``--budget auto``: one per temperature, below), mapped onto its
own parameters by :func:`method_options`:

======================  ==========================================================
tree builder (methods)  parameters for budget ``(N, d)``
======================  ==========================================================
``eagle`` (eagle2/3)    ``N = N``, ``depth = d``, ``K = B = clamp(round(N / d), 2, 10)``
``rheo`` (rheo)         as ``eagle`` (``m = 1`` sampled slot unless ``auto`` chose one)
``sequoia`` (sequoia)   ``num_nodes = N``, ``max_depth = d``, ``acceptance`` profiled
``static`` (specinfer)  ``expansion`` = :func:`specinfer_expansion` ``(N, d)``
``chain`` (sd)          ``depth = min(N, d)``
======================  ==========================================================

``K = N / d`` reproduces EAGLE-2's published setting at its own budget
(60 nodes, depth 6, top-10). The static SpecInfer shape fills ``N`` as evenly
as possible from the root down (:func:`specinfer_expansion`); a chain can only
use ``d`` of the ``N`` nodes, which is what classic speculative sampling does.

``--budget auto`` follows Sequoia's hardware-aware choice, **per temperature**
(:func:`choose_budgets`): it measures on this machine the target's forward
time ``t(n + 1)`` for trees of ``n + 1`` tokens
(:func:`~specdec.trees.sequoia.measure_forward_times`) and each draft's time
for one level of ``w`` nodes, profiles the *positional acceptance* ``a_k``
(the probability that the target's token is the draft's ``k``-th ranked
proposal, :func:`profile_positional_acceptance`) for every draft and
temperature in the run, and picks, for each temperature ``T`` of the run, the
``(N, d)`` maximising the mean over the drafts of the expected tokens per
second at ``T`` (:func:`choose_budget` on ``T``'s profiles only)::

    G(N, d) / (d * t_level(K(N, d)) + t(N + 1))

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
``m <= K`` and for ``m = K`` (every slot sampled, no deterministic child),
and the largest ``tau`` wins (ties go to the smaller ``m``). A row's
own ``m`` (``rheo[m=2]``) overrides the choice, as every row option overrides
the budget's mapping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.step import profile_steps
from specdec.targets.base import TargetModel
from specdec.tree import SampleMode
from specdec.trees.base import TreeBuilder
from specdec.trees.dynamic import EagleTreeBuilder

__all__ = [
    "Budget",
    "BudgetChoice",
    "SlotsChoice",
    "SLOT_CANDIDATES",
    "budget_at",
    "budget_text",
    "choose_budgets",
    "choose_sampled_slots",
    "pilot_tau",
    "DEFAULT_DEPTH",
    "AUTO_CANDIDATES",
    "AUTO_DEPTHS",
    "parse_budget",
    "dynamic_width",
    "specinfer_expansion",
    "method_options",
    "supports_budget",
    "method_tree",
    "choose_budget",
    "profile_positional_acceptance",
    "smooth_acceptance",
]

DEFAULT_DEPTH = 6
"""Depth bound used with ``--budget N`` unless ``--depth`` is given (EAGLE-2's 6)."""

AUTO_CANDIDATES: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Node budgets ``N`` that ``--budget auto`` considers."""

AUTO_DEPTHS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)
"""Depth bounds ``d`` that ``--budget auto`` considers (with ``d <= N``)."""


SLOT_CANDIDATES: tuple[int, ...] = (1, 2, 3)
"""Sampled slots ``m`` of RheoSampling that ``--budget auto`` tries at ``T > 0`` (those with ``m <= K``, and ``m = K``)."""


@attrs.frozen
class Budget:
    """A tree budget: ``nodes`` draft nodes (root excluded), depth ``<= depth``."""

    nodes: int
    depth: int

    def __attrs_post_init__(self) -> None:
        for name in ("nodes", "depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidConfigError(f"budget {name} must be an int >= 1, got {value!r}")

    def __str__(self) -> str:
        """``"4 nodes, depth 2"``; ``"1 node, depth 1"``."""
        return f"{self.nodes} node{'' if self.nodes == 1 else 's'}, depth {self.depth}"


def parse_budget(text: str, depth: int | None = None) -> Budget | str:
    """``"auto"`` or a :class:`Budget` from ``--budget N`` (and ``--depth``).

    The depth bound is ``depth`` when given, else ``min(N, 6)``.

    Example:
        >>> parse_budget("60"), parse_budget("8"), parse_budget("auto")
        (Budget(nodes=60, depth=6), Budget(nodes=8, depth=6), 'auto')
    """
    if text.strip().lower() == "auto":
        if depth is not None:
            raise InvalidConfigError("--depth cannot be combined with --budget auto (auto chooses the depth too)")
        return "auto"
    try:
        nodes = int(text)
    except ValueError:
        raise InvalidConfigError(f"--budget must be a positive integer (draft nodes per tree) or 'auto', got {text!r}") from None
    if nodes < 1:
        raise InvalidConfigError(f"--budget must be >= 1 draft node, got {nodes}")
    return Budget(nodes, depth if depth is not None else min(nodes, DEFAULT_DEPTH))


def budget_at(budget: Budget | Mapping[float, Budget], temperature: float) -> Budget:
    """The budget at ``temperature``: ``budget`` itself, or its entry for that temperature.

    Raises:
        InvalidConfigError: a per-temperature mapping without ``temperature``.

    Example:
        >>> budget_at(Budget(4, 2), 1.0), budget_at({0.0: Budget(8, 4), 1.0: Budget(4, 2)}, 1)
        (Budget(nodes=4, depth=2), Budget(nodes=4, depth=2))
    """
    if isinstance(budget, Budget):
        return budget
    try:
        return budget[float(temperature)]
    except KeyError:
        have = ", ".join(f"T={t:g}" for t in sorted(budget))
        raise InvalidConfigError(f"no tree budget for T={float(temperature):g} (budgets for {have})") from None


def budget_text(budget: Budget | Mapping[float, Budget], slots: Mapping[float, int] | None = None) -> str:
    """One line saying the budget, per temperature when it is a mapping (with rheo's ``m`` when given).

    Example:
        >>> budget_text(Budget(4, 2))
        '4 nodes, depth 2'
        >>> budget_text({0.0: Budget(8, 4), 1.0: Budget(4, 2)}, {0.0: 1, 1.0: 2})
        'T=0: 8 nodes, depth 4 (rheo m=1); T=1: 4 nodes, depth 2 (rheo m=2)'
    """
    if isinstance(budget, Budget):
        return str(budget)
    slots = slots or {}
    return "; ".join(f"T={t:g}: {budget[t]}" + (f" (rheo m={slots[t]})" if t in slots else "") for t in sorted(budget))


def dynamic_width(budget: Budget) -> int:
    """``K`` (and beam ``B``) of the dynamic trees: ``clamp(round(N / d), 2, 10)``.

    Example:
        >>> dynamic_width(Budget(60, 6)), dynamic_width(Budget(8, 4)), dynamic_width(Budget(200, 4))
        (10, 2, 10)
    """
    return max(2, min(10, int(math.floor(budget.nodes / budget.depth + 0.5))))


def specinfer_expansion(budget: Budget) -> tuple[int, ...]:
    """Children per depth of the static SpecInfer tree for a budget.

    Start from a chain of ``min(N, d)`` nodes; then, in rounds, try to add one
    child per node at each depth from the root down, keeping the widths
    non-increasing with depth and the node count ``<= N``; stop when a round
    adds nothing. Shallow levels fill first (their nodes are the most likely
    to be reached).

    Example:
        >>> specinfer_expansion(Budget(60, 6)), specinfer_expansion(Budget(8, 4)), specinfer_expansion(Budget(3, 6))
        ((3, 2, 2, 1, 1, 1), (2, 1, 1, 1), (1, 1, 1))
    """
    widths = [1] * min(budget.nodes, budget.depth)

    def size(w: Sequence[int]) -> int:
        total, level = 0, 1
        for k in w:
            level *= k
            total += level
        return total

    grew = True
    while grew:
        grew = False
        for i in range(len(widths)):
            trial = list(widths)
            trial[i] += 1
            if (i == 0 or trial[i] <= trial[i - 1]) and size(trial) <= budget.nodes:
                widths = trial
                grew = True
    return tuple(widths)


_BUDGET_TREES = ("chain", "static", "sequoia", "eagle", "rheo")


def method_tree(method: str) -> str:
    """Registry name of the tree builder of registered ``method``."""
    from specdec.methods import resolve_method

    return resolve_method(method).tree


def supports_budget(method: str) -> bool:
    """Whether :func:`method_options` can map a budget onto ``method``'s tree builder."""
    from specdec.trees.dynamic import DynamicTreeBuilder

    tree = method_tree(method)
    if tree in _BUDGET_TREES:
        return True
    cls = get("tree", tree)
    return isinstance(cls, type) and issubclass(cls, DynamicTreeBuilder)


def method_options(method: str, budget: Budget, *, acceptance: Sequence[float] | None = None) -> dict[str, Any]:
    """The builder options that give registered ``method`` the tree budget ``budget``.

    Args:
        method: registered method name.
        budget: the budget.
        acceptance: Sequoia's positional acceptance vector (used by builders
            of type ``sequoia`` only; None keeps the builder's prior).

    Raises:
        InvalidConfigError: the method's tree builder has no budget mapping.

    Example:
        >>> method_options("rheo", Budget(60, 6))
        {'N': 60, 'depth': 6, 'K': 10, 'B': 10}
        >>> method_options("sd", Budget(60, 6)), method_options("specinfer", Budget(8, 4))
        ({'depth': 6}, {'expansion': (2, 1, 1, 1)})
    """
    from specdec.trees.dynamic import DynamicTreeBuilder

    tree = method_tree(method)
    cls = get("tree", tree)
    if tree == "chain":
        return {"depth": min(budget.nodes, budget.depth)}
    if tree == "static":
        return {"expansion": specinfer_expansion(budget)}
    if tree == "sequoia":
        out: dict[str, Any] = {"num_nodes": budget.nodes, "max_depth": budget.depth}
        if acceptance is not None:
            out["acceptance"] = tuple(float(a) for a in acceptance)
        return out
    if isinstance(cls, type) and issubclass(cls, DynamicTreeBuilder):
        k = dynamic_width(budget)
        return {"N": budget.nodes, "depth": budget.depth, "K": k, "B": k}
    raise InvalidConfigError(
        f"method {method!r} uses tree builder {tree!r}, which has no budget mapping in specdec bench "
        f"(supported builders: {', '.join(_BUDGET_TREES)} and EAGLE-style dynamic builders)"
    )


# ------------------------------------------------------------------ auto
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
    from specdec.trees.sequoia import sequoia_tree

    if not acceptance:
        raise InvalidConfigError("choose_budget needs at least one acceptance profile")
    if isinstance(forward_time, Mapping):
        table_t = dict(forward_time)

        def t_target(tokens: int) -> float:
            if tokens not in table_t:
                raise InvalidConfigError(f"no forward time measured for {tokens} tokens; measured {sorted(table_t)}")
            return float(table_t[tokens])
    else:
        t_target = forward_time  # type: ignore[assignment]
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
) -> dict[float, BudgetChoice]:
    """:func:`choose_budget` for every temperature, on that temperature's profiles only.

    Args:
        forward_time, level_time, candidates, depths: as :func:`choose_budget`
            (the costs do not depend on the temperature).
        acceptance: per temperature, the profiles of :func:`choose_budget`
            (per key, ``(draft kind, a_1, a_2, ...)``) measured at it.

    Returns:
        per temperature, its :class:`BudgetChoice` (the mean over its drafts).

    Raises:
        InvalidConfigError: no temperature, or a temperature without a profile.

    Example:
        >>> cost = lambda t: 1.0 + 0.1 * t
        >>> out = choose_budgets(cost, {"lm": lambda w: 0.05}, {0.0: {"lm@T=0": ("lm", [0.9, 0.05])},
        ...                      1.0: {"lm@T=1": ("lm", [0.3, 0.25, 0.2])}}, candidates=(2, 4, 8), depths=(1, 2, 4))
        >>> out[0.0].budget, out[1.0].budget
        (Budget(nodes=4, depth=4), Budget(nodes=4, depth=2))
    """
    if not acceptance:
        raise InvalidConfigError("choose_budgets needs at least one temperature")
    out = {}
    for t in sorted(acceptance):
        if not acceptance[t]:
            raise InvalidConfigError(f"choose_budgets: no acceptance profile at T={t:g}")
        out[float(t)] = choose_budget(forward_time, level_time, acceptance[t], candidates, depths)
    return out


@attrs.frozen
class SlotsChoice:
    """Result of :func:`choose_sampled_slots`.

    Attributes:
        m: the chosen sampled slots.
        candidates: the ``m`` tried (those of the candidates with ``m <= K``, and ``K``).
        tau: measured tokens per step per ``m`` (empty when one candidate
            was left: nothing to measure).
    """

    m: int
    candidates: tuple[int, ...]
    tau: Mapping[int, float]


def choose_sampled_slots(pilot: Callable[[int], float], width: int,
                         candidates: Sequence[int] = SLOT_CANDIDATES) -> SlotsChoice:
    """RheoSampling's ``m``: the candidate with ``m <= width`` (``width`` itself, every slot sampled,
    always among them) whose pilot measures the most tokens per step.

    Args:
        pilot: ``m -> tau``, the measured tokens per step with ``m`` sampled
            slots (:func:`pilot_tau`); called once per candidate, never when a
            single candidate is left.
        width: ``K``, the children per node (``m <= K`` is required).
        candidates: the ``m`` to try.

    Returns:
        the :class:`SlotsChoice`; ties go to the smaller ``m``.

    Example:
        >>> choose_sampled_slots({1: 2.0, 2: 2.3, 3: 2.3, 10: 2.1}.__getitem__, 10).m
        2
        >>> choose_sampled_slots({1: 1.2, 2: 1.4}.__getitem__, 2)  # K = 2: m = 1 or every slot sampled
        SlotsChoice(m=2, candidates=(1, 2), tau={1: 1.2, 2: 1.4})
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 2:
        raise InvalidConfigError(f"the width K must be an int >= 2, got {width!r}")
    tried = tuple(sorted({int(m) for m in candidates if 1 <= int(m) <= width} | {width}))
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
    from specdec.generate import SpeculativeGenerator

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
    from specdec.trees.sequoia import DEFAULT_ACCEPTANCE

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
    from specdec.trees.static import StaticTreeBuilder

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
    for outcome, tree in profile_steps(target, draft, prompts, builder, verifier, sampling, rng, steps_per_prompt,
                                       room=k_max + 1, name="profile_positional_acceptance"):
        result = outcome.result
        trials += 1
        if result.accepted_nodes:
            first = result.accepted_nodes[0]
            counts[int(tree.draw_order[0, first])] += 1  # draw position (wor) or rank (topk)
    return tuple(c / trials for c in counts)
