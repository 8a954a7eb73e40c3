"""Exact enumeration of every random branch of a program.

:class:`EnumeratingRandom` is a :class:`~specdec.rng.RandomSource` that, run
repeatedly by :func:`exact_law`, walks every sequence of outcomes of the
program's Bernoulli and categorical draws (depth first), with each
sequence's probability. Because builders and verifiers draw *only* through a
``RandomSource``, this turns the production code itself into an exact
probability computation: the law of whatever the program returns.

Example:
    >>> import torch
    >>> def program(rng):
    ...     first = rng.categorical(torch.tensor([0.5, 0.5], dtype=torch.float64))
    ...     return first + int(rng.bernoulli(0.25))
    >>> law = exact_law(program)
    >>> sorted(law.items())
    [(0, 0.375), (1, 0.5), (2, 0.125)]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

from specdec.rng import RandomSource

__all__ = ["EnumeratingRandom", "exact_law", "TooManyBranchesError"]

R = TypeVar("R", bound=Hashable)


class TooManyBranchesError(RuntimeError):
    """The program has more random branches than the enumeration limit."""


class EnumeratingRandom(RandomSource):
    """Replays a fixed prefix of outcomes, then takes the first outcome of each
    new draw while recording the alternatives (used by :func:`exact_law`)."""

    def __init__(self, prefix: list[int]) -> None:
        self.prefix = prefix
        self.position = 0
        self.prob = 1.0
        # per draw: (outcomes, probabilities, index chosen)
        self.trace: list[tuple[list[int], list[float], int]] = []

    def _choose(self, outcomes: list[int], probs: list[float]) -> int:
        if self.position < len(self.prefix):
            index = self.prefix[self.position]
        else:
            index = 0
        self.position += 1
        self.trace.append((outcomes, probs, index))
        self.prob *= probs[index]
        return outcomes[index]

    def bernoulli(self, prob: float | torch.Tensor) -> bool:
        p = min(max(float(prob), 0.0), 1.0)
        if p >= 1.0:
            return True
        if p <= 0.0:
            return False
        return bool(self._choose([1, 0], [p, 1.0 - p]))

    def categorical(self, probs: torch.Tensor) -> int:
        values = probs.detach().to("cpu", torch.float64).clamp_min(0)
        support = torch.nonzero(values > 0).flatten().tolist()
        if not support:
            raise ValueError("categorical draw from an all-zero distribution")
        weights = values[support].tolist()
        return self._choose(support, weights)


def exact_law(program: Callable[[RandomSource], R], *, max_branches: int = 200_000) -> dict[R, float]:
    """The exact law of ``program(rng)`` over every random branch.

    Args:
        program: a function of a :class:`RandomSource` returning a hashable
            result. It must draw only through that source and be otherwise
            deterministic.
        max_branches: raise :class:`TooManyBranchesError` beyond this many runs.

    Returns:
        ``{result: probability}``; the probabilities sum to 1 up to rounding.
    """
    law: dict[R, float] = defaultdict(float)
    prefix: list[int] = []
    runs = 0
    while True:
        runs += 1
        if runs > max_branches:
            raise TooManyBranchesError(f"more than {max_branches} random branches")
        rng = EnumeratingRandom(prefix)
        result = program(rng)
        law[result] += rng.prob
        # backtrack: the deepest draw with an untried outcome
        trace = rng.trace
        while trace and trace[-1][2] + 1 >= len(trace[-1][0]):
            trace.pop()
        if not trace:
            return dict(law)
        prefix = [t[2] for t in trace[:-1]] + [trace[-1][2] + 1]
