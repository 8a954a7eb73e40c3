"""Tree budgets for ``specdec bench``: one size for every method, fixed or measured.

A *budget* is ``(N, d)``: ``N`` draft nodes per tree (the root, i.e. the last
committed token, is not counted) and a depth bound ``d``. Every method gets
the same budget at a temperature (``--budget N``: the same at every
temperature; ``--budget auto``: one per temperature and draft kind, each
from that kind's own profile, so the rows of one draft share it), mapped onto its
own parameters by :func:`method_options`:

======================  ==========================================================
tree builder (methods)  parameters for budget ``(N, d)``
======================  ==========================================================
``eagle`` (eagle2/3)    ``N = N``, ``depth = d``, ``K = B = clamp(round(N / d), 2, 10)``
``rheo`` (rheo)         as ``eagle`` (``m = 1`` sampled slot unless ``auto`` chose one)
``sampled-dynamic``     as ``eagle`` (every one of the ``K`` children sampled)
``sequoia`` (sequoia)   ``num_nodes = N``, ``max_depth = d``, ``acceptance`` profiled
``static`` (specinfer)  ``expansion`` = :func:`specinfer_expansion` ``(N, d)``
``chain`` (sd)          ``depth = min(N, d)``
======================  ==========================================================

``K = N / d`` reproduces EAGLE-2's published setting at its own budget
(60 nodes, depth 6, top-10). The static SpecInfer shape fills ``N`` as evenly
as possible from the root down (:func:`specinfer_expansion`); a chain can only
use ``d`` of the ``N`` nodes, which is what classic speculative sampling does.

``--budget auto`` measures the budget of each (temperature, draft kind) on this
machine, and rheo's sampled slots ``m`` with it: :mod:`specdec.bench.auto_budget`.
A :data:`BudgetPlan` is what a sweep holds: one :class:`Budget`, ``{T: Budget}``
(logs of ``--budget auto`` before it chose per draft kind), or ``{T: {kind: Budget}}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from specdec.errors import InvalidConfigError
from specdec.methods import resolve_method
from specdec.registry import get
from specdec.trees.dynamic import DynamicTreeBuilder

__all__ = [
    "Budget",
    "BudgetPlan",
    "DEFAULT_DEPTH",
    "budget_at",
    "budget_text",
    "parse_budget",
    "dynamic_width",
    "specinfer_expansion",
    "method_options",
    "supports_budget",
    "method_tree",
]

DEFAULT_DEPTH = 6
"""Depth bound used with ``--budget N`` unless ``--depth`` is given (EAGLE-2's 6)."""

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


BudgetPlan: TypeAlias = Budget | Mapping[float, Budget | Mapping[str, Budget]]
"""The tree budget of a sweep: one :class:`Budget` for every row and temperature (``--budget N``),
``{T: Budget}`` (``--budget auto`` logs written before it chose per draft kind), or
``{T: {draft kind: Budget}}`` (``--budget auto``: each draft kind's own choice at each temperature)."""


def budget_at(budget: BudgetPlan, temperature: float, kind: str | None = None) -> Budget:
    """The budget at ``temperature`` of the rows of draft ``kind``: ``budget`` itself, its entry for
    that temperature, or that entry's budget for ``kind``.

    Raises:
        InvalidConfigError: a per-temperature mapping without ``temperature``, or a per-kind entry
            without ``kind`` (None included).

    Example:
        >>> budget_at(Budget(4, 2), 1.0), budget_at({0.0: Budget(8, 4), 1.0: Budget(4, 2)}, 1)
        (Budget(nodes=4, depth=2), Budget(nodes=4, depth=2))
        >>> budget_at({0.0: {"lm": Budget(1, 1), "eagle3": Budget(4, 2)}}, 0.0, "eagle3")
        Budget(nodes=4, depth=2)
    """
    if isinstance(budget, Budget):
        return budget
    try:
        entry = budget[float(temperature)]
    except KeyError:
        have = ", ".join(f"T={t:g}" for t in sorted(budget))
        raise InvalidConfigError(f"no tree budget for T={float(temperature):g} (budgets for {have})") from None
    if isinstance(entry, Budget):
        return entry
    if kind is None or kind not in entry:
        raise InvalidConfigError(f"no tree budget for draft kind {kind!r} at T={float(temperature):g} "
                                 f"(budgets for {', '.join(sorted(entry))})")
    return entry[kind]


def budget_text(budget: BudgetPlan, slots: Mapping[float, int] | None = None) -> str:
    """One line saying the budget, per temperature (and draft kind) when it is a mapping (with rheo's
    ``m`` when given).

    Example:
        >>> budget_text(Budget(4, 2))
        '4 nodes, depth 2'
        >>> budget_text({0.0: Budget(8, 4), 1.0: Budget(4, 2)}, {0.0: 1, 1.0: 2})
        'T=0: 8 nodes, depth 4 (rheo m=1); T=1: 4 nodes, depth 2 (rheo m=2)'
        >>> budget_text({0.0: {"lm": Budget(1, 1), "eagle3": Budget(4, 2)}})
        'T=0: eagle3 4 nodes, depth 2, lm 1 node, depth 1'
    """
    if isinstance(budget, Budget):
        return str(budget)
    slots = slots or {}

    def one(entry: Budget | Mapping[str, Budget]) -> str:
        if isinstance(entry, Budget):
            return str(entry)
        return ", ".join(f"{kind} {entry[kind]}" for kind in sorted(entry))

    return "; ".join(f"T={t:g}: {one(budget[t])}" + (f" (rheo m={slots[t]})" if t in slots else "")
                     for t in sorted(budget))


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


_BUDGET_TREES = ("chain", "static", "sequoia", "eagle", "rheo", "sampled-dynamic", "ddtree")


def method_tree(method: str) -> str:
    """Registry name of the tree builder of registered ``method``."""
    return resolve_method(method).tree


def supports_budget(method: str) -> bool:
    """Whether :func:`method_options` can map a budget onto ``method``'s tree builder."""
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
    if tree == "ddtree":  # (its budget counts every node, sampled slots included)
        return {"budget": budget.nodes, "depth": budget.depth}
    if isinstance(cls, type) and issubclass(cls, DynamicTreeBuilder):
        k = dynamic_width(budget)
        return {"N": budget.nodes, "depth": budget.depth, "K": k, "B": k}
    raise InvalidConfigError(
        f"method {method!r} uses tree builder {tree!r}, which has no budget mapping in specdec bench "
        f"(supported builders: {', '.join(_BUDGET_TREES)} and EAGLE-style dynamic builders)"
    )

