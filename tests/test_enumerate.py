"""specdec.testing.exact_law: exact enumeration of every random branch of a program."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.rng import TorchRandom
from specdec.testing import EnumeratingRandom, TooManyBranchesError, exact_law

f64 = torch.float64


def total(law):
    return math.fsum(law.values())


def test_deterministic_program_has_one_outcome():
    assert exact_law(lambda rng: "x") == {"x": 1.0}


def test_docstring_example():
    def program(rng):
        first = rng.categorical(torch.tensor([0.5, 0.5], dtype=f64))
        return first + int(rng.bernoulli(0.25))

    assert sorted(exact_law(program).items()) == [(0, 0.375), (1, 0.5), (2, 0.125)]


def test_two_dice():
    die = torch.full((6,), 1 / 6, dtype=f64)
    law = exact_law(lambda rng: rng.categorical(die) + rng.categorical(die) + 2)
    for s in range(2, 13):
        assert law[s] == pytest.approx((6 - abs(s - 7)) / 36, abs=1e-15)
    assert total(law) == pytest.approx(1.0, abs=1e-15)


def test_dependent_number_of_draws_geometric():
    def flips_until_heads(rng, cap=8):
        for n in range(1, cap + 1):
            if rng.bernoulli(0.3):
                return n
        return "none"

    law = exact_law(flips_until_heads)
    for n in range(1, 9):
        assert law[n] == pytest.approx(0.7 ** (n - 1) * 0.3, abs=1e-15)
    assert law["none"] == pytest.approx(0.7**8, abs=1e-15)
    assert total(law) == pytest.approx(1.0, abs=1e-14)


def test_certain_bernoulli_and_zero_probabilities_do_not_branch():
    calls = []

    def program(rng):
        calls.append(1)
        a = rng.bernoulli(1.0)
        b = rng.bernoulli(0.0)
        c = rng.bernoulli(torch.tensor(1.0 + 1e-7))  # 1 up to float32 rounding: clamped to 1
        d = rng.categorical(torch.tensor([0.0, 1.0, 0.0], dtype=f64))
        return a, b, c, d

    assert exact_law(program) == {(True, False, True, 1): 1.0}
    assert len(calls) == 1
    assert exact_law(lambda rng: rng.categorical(torch.tensor([0.0, 0.25, 0.0, 0.75], dtype=f64))) == {
        1: 0.25, 3: 0.75}


def test_all_zero_categorical_is_an_error():
    with pytest.raises(ValueError, match="all-zero"):
        exact_law(lambda rng: rng.categorical(torch.zeros(3, dtype=f64)))


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=8).filter(lambda w: sum(w) > 0))
def test_single_categorical_law_is_its_probabilities(weights):
    probs = torch.tensor(weights, dtype=f64) / sum(weights)
    law = exact_law(lambda rng: rng.categorical(probs))
    assert set(law) == {i for i, w in enumerate(weights) if w > 0}
    for i, w in enumerate(weights):
        if w:
            assert law[i] == pytest.approx(w / sum(weights), abs=1e-15)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=2, max_size=5),
       st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=2, max_size=5))
def test_sums_to_one_on_nested_programs(a, b):
    pa = torch.tensor(a, dtype=f64) / sum(a)
    pb = torch.tensor(b, dtype=f64) / sum(b)

    def program(rng):
        x = rng.categorical(pa)
        if rng.bernoulli(float(pa[x])):
            return (x, rng.categorical(pb))
        return (x, None)

    law = exact_law(program)
    assert total(law) == pytest.approx(1.0, abs=1e-12)
    for x in range(len(a)):
        assert law[(x, None)] == pytest.approx(float(pa[x] * (1 - pa[x])), abs=1e-14)


def speculative_sampling_step(p, q, rng, use_residual=True):
    """Classic one-token speculative sampling (docs/verifiers.md rule 3 with one child)."""
    x = rng.categorical(q)
    if rng.bernoulli(min(1.0, float(p[x] / q[x]))):
        return x
    residual = (p - q).clamp_min(0) if use_residual else p
    return rng.categorical(residual / residual.sum())


@settings(deadline=None, max_examples=40)
@given(st.integers(min_value=0, max_value=10_000))
def test_speculative_sampling_is_exactly_lossless(seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(5, generator=gen, dtype=f64)
    q = torch.rand(5, generator=gen, dtype=f64)
    p, q = p / p.sum(), q / q.sum()
    law = exact_law(lambda rng: speculative_sampling_step(p, q, rng))
    assert max(abs(law.get(i, 0.0) - float(p[i])) for i in range(5)) < 1e-12


def test_exact_law_catches_a_lossy_mutant():
    """Resampling the bonus from p instead of the residual is a classic lossy bug."""
    p = torch.tensor([0.6, 0.3, 0.1], dtype=f64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=f64)
    law = exact_law(lambda rng: speculative_sampling_step(p, q, rng, use_residual=False))
    assert max(abs(law.get(i, 0.0) - float(p[i])) for i in range(3)) > 1e-2


def test_exact_rational_check():
    """With dyadic probabilities the enumeration is exact in floating point."""
    def program(rng):
        return rng.categorical(torch.tensor([0.5, 0.25, 0.25], dtype=f64)) * 2 + int(rng.bernoulli(0.125))

    law = exact_law(program)
    expected = {0: Fraction(7, 16), 1: Fraction(1, 16), 2: Fraction(7, 32), 3: Fraction(1, 32),
                4: Fraction(7, 32), 5: Fraction(1, 32)}
    assert {k: Fraction(v) for k, v in law.items()} == expected


def test_too_many_branches():
    die = torch.full((4,), 0.25, dtype=f64)

    def program(rng):
        return tuple(rng.categorical(die) for _ in range(3))  # 64 branches

    assert len(exact_law(program, max_branches=64)) == 64
    with pytest.raises(TooManyBranchesError, match="more than 63"):
        exact_law(program, max_branches=63)


def test_enumerating_random_replays_its_prefix():
    rng = EnumeratingRandom([1, 2])
    assert rng.bernoulli(0.25) is False  # outcome index 1 = False
    assert rng.categorical(torch.tensor([0.5, 0.0, 0.25, 0.25], dtype=f64)) == 3  # support [0, 2, 3][2]
    assert rng.categorical(torch.tensor([0.5, 0.5], dtype=f64)) == 0  # beyond the prefix: first outcome
    assert rng.prob == pytest.approx(0.75 * 0.25 * 0.5)
    assert [t[2] for t in rng.trace] == [1, 2, 0]


def test_torch_random_matches_the_exact_law_statistically():
    """The production RandomSource samples the law exact_law computes (seeded, loose check)."""
    p = torch.tensor([0.6, 0.3, 0.1], dtype=f64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=f64)
    rng = TorchRandom.seeded(1234)
    n = 20_000
    counts = [0, 0, 0]
    for _ in range(n):
        counts[speculative_sampling_step(p, q, rng)] += 1
    for i in range(3):
        sd = math.sqrt(p[i] * (1 - p[i]) / n)
        assert abs(counts[i] / n - float(p[i])) < 5 * sd


def test_docstring_examples_of_the_module():
    import doctest

    import specdec.testing.enumerate as module

    failures, tried = doctest.testmod(module, verbose=False)
    assert tried > 0 and failures == 0
