"""The scalar draws' contract, the same for every random source (specdec.rng_sources):
``categorical`` takes a normalised law, ``bernoulli`` a probability in [0, 1]; anything
else is an InvalidDistributionError naming the draw and its call site. No source
renormalises silently, so the exact law and a production draw of the same code agree."""

from __future__ import annotations

import math
import re

import pytest
import torch

from specdec.errors import InvalidDistributionError
from specdec.rng import CounterRandom, TorchRandom, inverse_cdf
from specdec.rng_sources import RandomSource, check_categorical, law_tolerance
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import EnumeratingRandom, exact_law
from specdec.tree import DraftTree, NodeKind, SampleMode, TreeAssembler
from specdec.verify.base import NodeOutcome, Verifier

f64 = torch.float64

SOURCES = {
    "torch": lambda: TorchRandom.seeded(0),
    "counter": lambda: CounterRandom(7),
    "enumerating": lambda: EnumeratingRandom([]),
}


def here(below: int) -> str:
    """``test_rng_contract.py:<line> in <function>`` of the caller's line ``below`` lines further down."""
    import sys

    frame = sys._getframe(1)
    return f"test_rng_contract.py:{frame.f_lineno + below} in {frame.f_code.co_name}"


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_source_refuses_an_unnormalised_law_naming_the_call(source):
    rng = SOURCES[source]()
    good = torch.tensor([0.25, 0.75], dtype=f64)
    rng.categorical(good)
    rng.categorical(good)
    site = here(2)
    with pytest.raises(InvalidDistributionError) as info:
        rng.categorical(torch.tensor([0.3, 0.4666], dtype=f64))  # a residual left unnormalised
    message = str(info.value)
    assert "categorical draw #3 of this" in message, message
    assert site in message, message
    assert "total mass 0.7666" in message and "do not sum to 1" in message, message


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize(
    ("weights", "problem"),
    [([0.5, -0.1, 0.6], "negative"), ([0.5, float("nan"), 0.5], "NaN or infinite"),
     ([0.5, float("inf"), 0.0], "NaN or infinite"), ([0.0, 0.0], "all zero"), ([0.6, 0.6], "do not sum to 1")],
)
def test_every_source_refuses_bad_weights(source, weights, problem):
    rng = SOURCES[source]()
    with pytest.raises(InvalidDistributionError, match=problem):
        rng.categorical(torch.tensor(weights, dtype=f64))


def test_the_all_zero_law_is_still_a_value_error_saying_so():
    with pytest.raises(ValueError, match="all-zero"):
        TorchRandom.seeded(0).categorical(torch.zeros(3))


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("prob", [1.5, -0.1, float("nan"), torch.tensor(1.01), torch.tensor(float("nan"))])
def test_every_source_refuses_a_bad_bernoulli_probability(source, prob):
    rng = SOURCES[source]()
    rng.bernoulli(0.5)
    site = here(2)
    with pytest.raises(InvalidDistributionError, match=r"bernoulli draw #2 of this .*not in \[0, 1\]") as info:
        rng.bernoulli(prob)
    assert site in str(info.value)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_rounding_is_accepted(source):
    rng = SOURCES[source]()
    assert rng.bernoulli(1.0 + 1e-7) is True
    assert rng.bernoulli(torch.tensor(-1e-8)) is False
    # a float32 softmax over a large vocabulary, normalised as the verifiers normalise it
    p = torch.softmax(torch.randn(50_000, generator=torch.Generator().manual_seed(0)) * 3, dim=0)
    p = p / p.sum()
    if source != "enumerating":  # (50 000 branches: enumerated below on a small law)
        assert 0 <= rng.categorical(p) < 50_000
    small = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float32)  # sums to 1 only up to float32 rounding
    assert 0 <= rng.categorical(small) < 3


def test_the_tolerance_suits_the_dtype():
    assert law_tolerance(torch.float64) == 1e-9 and law_tolerance(torch.float32) == 1e-5
    assert law_tolerance(torch.bfloat16) > law_tolerance(torch.float16) > law_tolerance(torch.float32)
    off = 1e-6
    rng = TorchRandom.seeded(0)
    assert rng.categorical(torch.tensor([0.5, 0.5 + off], dtype=torch.float32)) in (0, 1)
    with pytest.raises(InvalidDistributionError, match="tolerance 1e-09 for torch.float64"):
        rng.categorical(torch.tensor([0.5, 0.5 + off], dtype=f64))
    with pytest.raises(InvalidDistributionError, match="tolerance 1e-05 for torch.float32"):
        rng.categorical(torch.tensor([0.5, 0.5 + 1e-4], dtype=torch.float32))


def test_the_call_site_skips_the_sources_and_the_exact_harness():
    """A draw made through the default batched draw (RandomSource.categorical_rows, row by
    row) inside exact_law names the program's line, not the sources' or the harness's."""

    def program(rng):
        probs = torch.tensor([[0.5, 0.5], [0.2, 0.2]], dtype=f64)
        return tuple(rng.categorical_rows(probs, torch.tensor([True, True])).tolist())

    with pytest.raises(InvalidDistributionError) as info:
        exact_law(program)
    message = str(info.value)
    assert re.search(r"categorical draw #2 of this run \(exact_law branch \[\]\) \(called from "
                     r"\S*test_rng_contract\.py:\d+ in program\)", message), message


def test_the_batched_draws_do_not_check():
    """categorical_rows on a table-drawing source stays on the device: no check (documented)."""
    probs = torch.tensor([[0.3, 0.3]], dtype=f64)  # unnormalised, drawn as given
    assert TorchRandom.seeded(0).categorical_rows(probs, torch.tensor([True])).tolist()[0] in (0, 1)


# ------------------------------------------------- the same outcomes as before
def old_torch_categorical(generator: torch.Generator, probs: torch.Tensor) -> int:
    """TorchRandom.categorical before the contract (it divided by the sum silently)."""
    cdf = torch.cumsum(probs.detach().to(f64).clamp_min(0), dim=0)
    total = float(cdf[-1])
    u = torch.rand((), generator=generator, dtype=f64)
    index = int(torch.searchsorted(cdf, (u * total).reshape(1), right=True).item())
    if index >= cdf.numel():
        index = int(torch.nonzero(probs > 0).flatten()[-1])
    return index


@pytest.mark.parametrize("dtype", [torch.float32, f64])
def test_valid_draws_are_bit_for_bit_what_they_were(dtype):
    g = torch.Generator().manual_seed(3)
    rng, old = TorchRandom.seeded(11), torch.Generator().manual_seed(11)
    counter = CounterRandom(5)
    for _ in range(300):
        w = torch.rand(7, generator=g, dtype=dtype) * (torch.rand(7, generator=g) > 0.3)
        w[int(torch.randint(7, (), generator=g))] += 0.1
        law = w / w.sum()
        assert rng.categorical(law) == old_torch_categorical(old, law)
        u = CounterRandom(5)
        u.set_position(*counter.position)
        assert counter.categorical(law) == inverse_cdf(law, u.uniform())


def test_the_enumerated_law_is_the_law_the_production_draw_samples():
    """A float32 law summing to 1 only up to rounding: both sides draw ``probs / total``."""
    probs = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float32)
    total = math.fsum(probs.to(f64).tolist())
    law = exact_law(lambda rng: rng.categorical(probs))
    for i in range(3):
        assert law[i] == pytest.approx(float(probs[i]) / total, abs=1e-15)
    assert math.fsum(law.values()) == pytest.approx(1.0, abs=1e-15)


# ------------------------------------------------------------ exact_law's total
def test_exact_law_refuses_a_law_whose_total_is_not_one():
    """A program that is not deterministic given its draws (here it keeps state between
    runs) enumerates branches of different programs: the total is not 1."""
    runs = []

    def program(rng):
        runs.append(1)
        weights = [0.5, 0.5] if len(runs) == 1 else [0.9, 0.1]
        return rng.categorical(torch.tensor(weights, dtype=f64))

    with pytest.raises(InvalidDistributionError, match=r"sum to 0\.6.*not deterministic given its draws"):
        exact_law(program)


# -------------------------------------- a verifier with an unnormalised bonus law
class ResidualMatch(Verifier):
    """Rule 2 at one node with deterministic children; the bonus comes from the residual,
    left unnormalised when ``normalise`` is False (a correct rule, a careless law)."""

    supported_kinds = frozenset({NodeKind.DETERMINISTIC})
    supported_modes = frozenset({SampleMode.IID})

    def __init__(self, normalise: bool) -> None:
        self.normalise = normalise

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        P = p_node / p_node.sum()
        for child in tree.children(node):
            x = int(tree.tokens[child])
            if rng.bernoulli(P[x]):
                return NodeOutcome(accepted_child=child)
            P = P.clone()
            P[x] = 0.0
            if self.normalise:
                P = P / P.sum()
        return NodeOutcome(bonus_token=rng.categorical(P))


def one_level_case() -> tuple[DraftTree, torch.Tensor]:
    asm = TreeAssembler(root_token=0, vocab_size=3)
    asm.add_deterministic(0, token=1, weight=0.5)
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]], dtype=f64)
    return asm.build(), p


def test_a_correct_verifier_with_a_normalised_residual_is_exact():
    tree, p = one_level_case()
    law = exact_law(lambda rng: ResidualMatch(normalise=True).verify(tree, p, rng).tokens[0])
    assert {k: round(v, 12) for k, v in law.items()} == {0: 0.5, 1: 0.3, 2: 0.2}


def test_an_unnormalised_bonus_law_is_a_clear_error_not_a_lossy_total():
    """Before the contract the enumeration used the residual's weights as given and reported
    a total mass of 0.79 (0.3 + 0.7 * 0.7): a correct rule looked lossy."""
    tree, p = one_level_case()
    with pytest.raises(InvalidDistributionError) as info:
        exact_law(lambda rng: ResidualMatch(normalise=False).verify(tree, p, rng).tokens[0])
    message = str(info.value)
    assert "categorical draw #1 of this run" in message, message
    assert re.search(r"test_rng_contract\.py:\d+ in verify_node", message), message
    assert "total mass 0.7" in message, message
    errors = []  # the production sources refuse it too, whenever the child is rejected (probability 0.7)
    for seed in range(12):
        for rng in (TorchRandom.seeded(seed), CounterRandom(seed)):
            try:
                ResidualMatch(normalise=False).verify(tree, p, rng)
            except InvalidDistributionError as err:
                errors.append(str(err))
    assert len(errors) >= 6
    assert all(re.search(r"test_rng_contract\.py:\d+ in verify_node.*total mass 0\.7;", e) for e in errors), errors


def test_check_categorical_counts_the_draws_of_its_source():
    rng = TorchRandom.seeded(0)
    for _ in range(4):
        check_categorical(rng, torch.tensor([1.0]))
    assert rng.categorical_draws == 4 and TorchRandom.seeded(0).categorical_draws == 0


def test_a_float32_softmax_over_a_large_vocabulary_is_a_law() -> None:
    """A float32 law normalised in float32 over SmolLM2's 49,152 tokens sums to 1 only within
    float32 rounding (1.00001 for this row): every source takes it; an unnormalised one is still refused."""
    logits = torch.randn(1, 49152, generator=torch.Generator().manual_seed(166)) * 3
    p = process_logits(logits, SamplingConfig(temperature=1.0))[0]
    assert p.dtype == torch.float32 and abs(float(p.double().sum()) - 1) > 1e-5
    for source in (TorchRandom.seeded(0), CounterRandom.seeded(0)):
        assert 0 <= source.categorical(p) < 49152
        with pytest.raises(InvalidDistributionError, match="total mass 0.98"):
            source.categorical(p * 0.98)
