"""Tree budgets for ``specdec bench``: one size for every method, fixed or measured.

A *budget* is ``(N, d)``: ``N`` draft nodes per tree (the root, i.e. the last
committed token, is not counted) and a depth bound ``d``. Every method gets
the same budget, mapped onto its own parameters by :func:`method_options`:

======================  ==========================================================
tree builder (methods)  parameters for budget ``(N, d)``
======================  ==========================================================
``eagle`` (eagle2/3)    ``N = N``, ``depth = d``, ``K = B = clamp(round(N / d), 2, 10)``
``rheo`` (rheo)         as ``eagle`` (``m = 1`` sampled slot, ``M = 64``)
``sequoia`` (sequoia)   ``num_nodes = N``, ``max_depth = d``, ``acceptance`` profiled
``static`` (specinfer)  ``expansion`` = :func:`specinfer_expansion` ``(N, d)``
``chain`` (sd)          ``depth = min(N, d)``
======================  ==========================================================

``K = N / d`` reproduces EAGLE-2's published setting at its own budget
(60 nodes, depth 6, top-10). The static SpecInfer shape fills ``N`` as evenly
as possible from the root down (:func:`specinfer_expansion`); a chain can only
use ``d`` of the ``N`` nodes, which is what classic speculative sampling does.

``--budget auto`` (:func:`choose_budget`) follows Sequoia's hardware-aware
choice: it measures on this machine the target's forward time ``t(n + 1)`` for
trees of ``n + 1`` tokens (:func:`~specdec.trees.sequoia.measure_forward_times`)
and each draft's time for one level of ``w`` nodes, profiles the *positional
acceptance* ``a_k`` (the probability that the target's token is the draft's
``k``-th ranked proposal, :func:`profile_positional_acceptance`) for every
draft and temperature in the run, and picks the ``(N, d)`` maximising the mean
over (draft, temperature) of the expected tokens per second::

    G(N, d) / (d * t_level(K(N, d)) + t(N + 1))

where ``G`` is the expected tokens per step (accepted + bonus) of the best
tree of ``N`` nodes and depth ``<= d`` under the positional model (Sequoia's
DP, :func:`~specdec.trees.sequoia.sequoia_tree`). This is an estimate: it
assumes the acceptance at a node does not depend on its depth or its
ancestors, and the dynamic trees are not exactly the DP's tree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.errors import ContextOverflowError, InvalidConfigError
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.step import commit_step, speculative_step
from specdec.targets.base import TargetModel
from specdec.tree import SampleMode
from specdec.trees.base import TreeBuilder
from specdec.trees.dynamic import EagleTreeBuilder

__all__ = [
    "Budget",
    "BudgetChoice",
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
        return f"{self.nodes} nodes, depth {self.depth}"


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
    from specdec.lease import hold
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
    with hold("profile_positional_acceptance", target=target, draft=draft):  # one generation per model at a time
        for prompt in prompts:
            prompt = [int(t) for t in prompt]
            for model in (target, draft):
                limit = getattr(model, "max_length", None)
                if limit is not None and len(prompt) + 2 * steps_per_prompt + k_max + 1 > limit:
                    raise ContextOverflowError(f"a {len(prompt)}-token prompt leaves no room to profile (max_length {limit})")
            with torch.inference_mode():
                target.prefill(prompt)
                draft.begin(prompt)
                root = prompt[-1]
                for _ in range(steps_per_prompt):
                    outcome, tree = speculative_step(target, draft, builder, verifier, sampling, rng, root,
                                                     check_tree=trials == 0)
                    result = outcome.result
                    trials += 1
                    if result.accepted_nodes:
                        first = result.accepted_nodes[0]
                        counts[int(tree.draw_order[0, first])] += 1  # draw position (wor) or rank (topk)
                    commit_step(target, draft, outcome)
                    root = result.bonus_token
    return tuple(c / trials for c in counts)
