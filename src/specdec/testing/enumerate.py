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

import math
from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

from specdec.errors import InvalidDistributionError
from specdec.rng_sources import RandomSource, check_bernoulli, check_categorical

__all__ = ["EXACT_MASS_TOLERANCE", "EnumeratingRandom", "exact_law", "TooManyBranchesError"]

R = TypeVar("R", bound=Hashable)


class TooManyBranchesError(RuntimeError):
    """The program has more random branches than the enumeration limit."""


EXACT_MASS_TOLERANCE = 1e-9
"""How far from 1 the total mass of the law :func:`exact_law` returns may be."""


class EnumeratingRandom(RandomSource):
    """Replays a fixed prefix of outcomes, then takes the first outcome of each
    new draw while recording the alternatives (used by :func:`exact_law`).

    Draws follow every source's contract: :meth:`categorical` refuses a law
    that is not normalised and :meth:`bernoulli` a probability outside
    ``[0, 1]`` (:class:`~specdec.errors.InvalidDistributionError`, naming the
    draw, e.g. ``categorical draw #3 of this run``, and its call site).
    """

    def __init__(self, prefix: list[int]) -> None:
        self.prefix = prefix
        self.position = 0
        self.prob = 1.0
        # per draw: (outcomes, probabilities, index chosen)
        self.trace: list[tuple[list[int], list[float], int]] = []

    @property
    def run_label(self) -> str:
        """``this run (exact_law branch [i, j, ...])``: the run's replayed prefix of outcome indices."""
        return f"this run (exact_law branch {self.prefix})"

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
        p = check_bernoulli(self, prob)  # clamped to [0, 1] within rounding
        if p >= 1.0:
            return True
        if p <= 0.0:
            return False
        return bool(self._choose([1, 0], [p, 1.0 - p]))

    def categorical(self, probs: torch.Tensor) -> int:
        _, total = check_categorical(self, probs)
        values = probs.detach().to("cpu", torch.float64)
        support = torch.nonzero(values > 0).flatten().tolist()
        weights = (values[support] / total).tolist()  # the law the inverse-CDF draw samples
        return self._choose(support, weights)


def exact_law(program: Callable[[RandomSource], R], *, max_branches: int = 200_000) -> dict[R, float]:
    """The exact law of ``program(rng)`` over every random branch.

    Args:
        program: a function of a :class:`RandomSource` returning a hashable
            result. It must draw only through that source and be otherwise
            deterministic.
        max_branches: raise :class:`TooManyBranchesError` beyond this many runs.

    Returns:
        ``{result: probability}``; the probabilities sum to 1 within
        :data:`EXACT_MASS_TOLERANCE`.

    Raises:
        InvalidDistributionError: a draw's law is not normalised (from the
            draw, naming it and its call site), or the branches' total mass is
            not 1 (the program is not deterministic given its draws: a replay
            drew differently than the run it repeats).
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
            return _checked_total(dict(law), runs)
        prefix = [t[2] for t in trace[:-1]] + [trace[-1][2] + 1]


def _checked_total(law: dict[R, float], runs: int) -> dict[R, float]:
    """``law``, after checking its total mass is 1 within :data:`EXACT_MASS_TOLERANCE`."""
    mass = math.fsum(law.values())
    if abs(mass - 1.0) <= EXACT_MASS_TOLERANCE:
        return law
    raise InvalidDistributionError(
        f"exact_law: the {runs} branches' probabilities sum to {mass!r}, not 1 (tolerance {EXACT_MASS_TOLERANCE:g}). "
        "Every draw was a normalised law, so the program is not deterministic given its draws: a replay of a "
        "branch drew differently than the run it repeats (draw only through the RandomSource, with no state "
        "kept between runs)"
    )
