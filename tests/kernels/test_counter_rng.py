"""CounterRandom: the counter-based stream the fused kernel reproduces (no Triton needed).

Known-answer vectors pin the generator; seeded chi-square tests check that the
uniforms, Bernoulli and categorical draws have the right laws and that draws
at different keys (draw index, node, walk) behave independently; the keying
rules (``begin_node``) are what lets a kernel decide every node in parallel.
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec.rng import CounterRandom, counter_uniform, inverse_cdf, philox4x32
from specdec.registry import get
from specdec.testing import chi_square_test
from specdec.tree import SampleMode, SparseLaw, TreeAssembler

ALPHA = 1e-3
M32 = 0xFFFFFFFF


def test_philox_known_answers() -> None:
    """Random123's kat_vectors for philox4x32-10."""
    assert philox4x32(0, 0, 0, 0, 0, 0) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32(M32, M32, M32, M32, M32, M32) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    pi = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)
    assert philox4x32(*pi) == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


def test_uniform_is_a_pure_function_of_the_key() -> None:
    u = counter_uniform(7, 1, 2, 3)
    assert 0.0 <= u < 1.0
    assert counter_uniform(7, 1, 2, 3) == u
    others = {counter_uniform(7, 1, 2, 4), counter_uniform(7, 1, 3, 3), counter_uniform(7, 2, 2, 3),
              counter_uniform(8, 1, 2, 3), counter_uniform(7 + (1 << 32), 1, 2, 3)}
    assert u not in others and len(others) == 5
    assert (counter_uniform(0, 0, 0, 0) * 2**53).is_integer()  # 53-bit grid


def _uniform_chi2(values: list[float], bins: int = 20):
    cells = [min(int(v * bins), bins - 1) for v in values]
    return chi_square_test(cells, {b: 1.0 / bins for b in range(bins)})


@pytest.mark.parametrize("axis", ["draw", "node", "walk", "seed"])
def test_uniforms_are_uniform_along_every_key_axis(axis: str) -> None:
    n = 4000
    keys = {
        "draw": [(3, 1, 2, i) for i in range(n)],
        "node": [(3, 1, i, 0) for i in range(n)],
        "walk": [(3, i, 0, 0) for i in range(n)],
        "seed": [(i, 1, 0, 0) for i in range(n)],
    }[axis]
    values = [counter_uniform(*k) for k in keys]
    assert _uniform_chi2(values).p_value > ALPHA
    mean = sum(values) / n
    assert abs(mean - 0.5) < 4 * math.sqrt(1 / 12 / n)


def test_neighbouring_keys_are_independent() -> None:
    """Pairs (draw t, draw t+1) and (node i, node i+1) fill the unit square evenly."""
    for pair in (lambda i: ((5, i, 0, 0), (5, i, 0, 1)), lambda i: ((5, 2, i, 0), (5, 2, i + 1, 0))):
        cells = []
        for i in range(4000):
            a, b = (counter_uniform(*k) for k in pair(i))
            cells.append((int(a * 5), int(b * 5)))
        law = {(x, y): 1 / 25 for x in range(5) for y in range(5)}
        assert chi_square_test(cells, law).p_value > ALPHA


def test_the_chi_square_check_has_power() -> None:
    """The same check rejects a slightly biased stream (u**1.1) and a lagged copy."""
    values = [counter_uniform(3, 1, 2, i) ** 1.1 for i in range(4000)]
    assert _uniform_chi2(values).p_value < ALPHA
    cells = [(int(counter_uniform(5, i, 0, 0) * 5), int(counter_uniform(5, i, 0, 0) * 5)) for i in range(1000)]
    assert chi_square_test(cells, {(x, y): 1 / 25 for x in range(5) for y in range(5)}).p_value < ALPHA


def test_bernoulli_and_categorical_laws() -> None:
    rng = CounterRandom(11)
    hits = []
    draws = []
    probs = torch.tensor([0.1, 0.0, 0.45, 0.25, 0.2], dtype=torch.float64)
    for node in range(3000):
        rng.begin_node(node)
        hits.append(rng.bernoulli(0.3))
        draws.append(rng.categorical(probs))
    assert chi_square_test(hits, {True: 0.3, False: 0.7}).p_value > ALPHA
    result = chi_square_test(draws, {i: float(p) for i, p in enumerate(probs)})
    assert result.p_value > ALPHA and result.unexpected == 0


def test_bernoulli_always_consumes_one_draw() -> None:
    rng = CounterRandom(1)
    rng.begin_node(0)
    assert rng.bernoulli(1.0) is True and rng.bernoulli(0.0) is False and rng.bernoulli(torch.tensor(1.0 + 1e-7))
    assert rng.position == (1, 0, 3)  # (a probability above 1 beyond rounding is refused: tests/test_rng_contract.py)


def test_begin_node_keys_the_stream() -> None:
    rng = CounterRandom(9)
    assert rng.position == (0, 0, 0)
    rng.begin_node(0)
    rng.uniform()
    rng.begin_node(4)
    assert rng.position == (1, 4, 0)
    assert rng.uniform() == counter_uniform(9, 1, 4, 0)
    rng.begin_node(0)  # a new walk
    assert rng.position == (2, 0, 0)
    rng.set_position(7, 3, 2)
    assert rng.uniform() == counter_uniform(9, 7, 3, 2) and rng.position == (7, 3, 3)
    with pytest.raises(ValueError):
        CounterRandom(-1)
    with pytest.raises(ValueError):
        rng.set_position(2**32, 0, 0)
    assert CounterRandom.seeded(2**64 + 5).seed == 5
    assert CounterRandom.seeded(None).seed != CounterRandom.seeded(None).seed


def test_inverse_cdf_edges() -> None:
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    assert inverse_cdf(probs, 0.0) == 1
    assert inverse_cdf(probs, 0.4999) == 1
    assert inverse_cdf(probs, 0.5) == 3
    assert inverse_cdf(probs, 1.0 - 2**-53) == 3
    assert inverse_cdf(torch.tensor([2.0, 6.0]), 0.3) == 1  # unnormalised weights
    with pytest.raises(ValueError, match="all-zero"):
        inverse_cdf(torch.zeros(3), 0.5)


def test_verifier_walk_keys_draws_by_node() -> None:
    """Verifier.verify calls begin_node before each node's rule: the draws of node i
    are U(seed, walk, i, 0..), whatever happened at the other nodes."""
    asm = TreeAssembler(root_token=0, vocab_size=4)
    law = SparseLaw(torch.tensor([1, 2]), torch.tensor([0.5, 0.5], dtype=torch.float64), SampleMode.IID)
    a = asm.add_sampled(0, token=1, law=law, weight=0.5)
    asm.add_deterministic(a, token=3, weight=0.5)
    tree = asm.build()
    p = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [0.25] * 4], dtype=torch.float64)
    rng = CounterRandom(3, walk=10)
    result = get("verifier", "mixed")().verify(tree, p, rng)
    assert result.accepted_nodes == (1, 2)  # p forces both acceptances
    # node 2 is a leaf: its bonus is its first draw, keyed (walk 11, node 2, draw 0)
    assert rng.position == (11, 2, 1)
    assert result.bonus_token == inverse_cdf(p[2], counter_uniform(3, 11, 2, 0))


def test_docstring_examples() -> None:
    import doctest

    import specdec.rng as rng_module
    import specdec.rng_counter as rng_counter
    import specdec.rng_sources as rng_sources
    import specdec.kernels.select as select

    for module in (rng_module, rng_sources, rng_counter, select):
        failures, tried = doctest.testmod(module, verbose=False)
        assert tried > 0 and failures == 0, module.__name__


def test_tensor_philox_equals_the_python_reference_bit_for_bit() -> None:
    """counter_uniforms (int64 tensor ops, 16-bit halves for the 32x32 products)
    equals counter_uniform on random and extreme keys."""
    from specdec.rng import counter_uniforms

    g = torch.Generator().manual_seed(0)
    for seed in (0, 17, 2**64 - 1, 0x9E3779B97F4A7C15):
        for walk in (0, 1, 2**32 - 1):
            node = torch.cat([torch.tensor([0, 1, 2**31, 2**32 - 1]), torch.randint(0, 2**32, (12,), generator=g)])
            draw = torch.cat([torch.tensor([0, 2**32 - 1]), torch.randint(0, 2**32, (3,), generator=g)])
            u = counter_uniforms(seed, walk, node.unsqueeze(-1), draw.unsqueeze(0))  # [16, 5]
            want = torch.tensor([[counter_uniform(seed, walk, int(a), int(b)) for b in draw] for a in node],
                                dtype=torch.float64)
            assert torch.equal(u, want), (seed, walk)


def test_verification_table_is_the_walks_keys_and_builder_draws_use_their_own() -> None:
    from specdec.rng import AFTER_TABLE_NODE, BUILDER_NODE, counter_uniforms

    rng = CounterRandom(5, walk=3)
    first = rng.uniforms((4,))  # builder draws after walk 3: node BUILDER_NODE + 0
    second = rng.uniforms((2, 2))
    assert torch.equal(first, counter_uniforms(5, 3, torch.tensor(BUILDER_NODE), torch.arange(4)))
    assert torch.equal(second.flatten(), counter_uniforms(5, 3, torch.tensor(BUILDER_NODE + 1), torch.arange(4)))
    table = rng.verify_uniforms((1, 3, 2))  # walk 4
    assert rng.walk == 4 and rng.position == (4, AFTER_TABLE_NODE, 0)
    assert [[table[0, i, t].item() for t in range(2)] for i in range(3)] == [
        [counter_uniform(5, 4, i, t) for t in range(2)] for i in range(3)
    ]
    again = rng.uniforms((4,))  # a new walk restarts the builder calls
    assert torch.equal(again, counter_uniforms(5, 4, torch.tensor(BUILDER_NODE), torch.arange(4)))
    drawn = rng.categorical_rows(torch.tensor([[0.5, 0.5], [0.0, 1.0]]), torch.tensor([True, True]))
    assert drawn[1].item() == 1
    with pytest.raises(NotImplementedError, match="per-row"):
        rng.verify_uniforms((2, 3, 2))


def test_row_streams_of_counter_sources_draw_each_rows_own_table() -> None:
    """RowStreams of CounterRandom computes every row's builder and verification
    tables in one set of Philox ops (per-row keys), bit for bit each source's
    own tables (rows in step, or at different walks), and keeps the device keys
    when rows leave; a subclass of CounterRandom is served row by row."""
    from specdec.rng import RowStreams

    seeds = [3, 2**64 - 5, 17]
    for offset in (0, 2):  # rows in step; row 0 two walks ahead
        fast = RowStreams([CounterRandom(s, walk=offset * (b == 0)) for b, s in enumerate(seeds)])
        slow = [CounterRandom(s, walk=offset * (b == 0)) for b, s in enumerate(seeds)]
        assert fast.counter_based
        for _ in range(2):
            assert torch.equal(fast.uniforms((6, 4)), torch.cat([s.uniforms((2, 4)) for s in slow]))
            probs, active = torch.rand(6, 5), torch.tensor([1, 0, 1, 1, 1, 0], dtype=torch.bool)
            assert torch.equal(fast.categorical_rows(probs, active), torch.cat(
                [s.categorical_rows(probs[2 * b : 2 * b + 2], active[2 * b : 2 * b + 2]) for b, s in enumerate(slow)]))
            table = fast.verify_uniforms((3, 5, 3))
            assert torch.equal(table, torch.cat([s.verify_uniforms((1, 5, 3)) for s in slow]))
            assert table[1, 4, 2].item() == counter_uniform(seeds[1], slow[1].walk, 4, 2)
    keys = fast.counter_keys()
    assert keys.tolist() == [[s & M32, s >> 32] for s in seeds]
    fast.keep([2, 0], torch.tensor([2, 0]))
    assert fast.counter_keys().tolist() == [keys[2].tolist(), keys[0].tolist()]

    class Shifted(CounterRandom):  # not a plain CounterRandom: its own draws, row by row
        def uniforms(self, shape, device="cpu"):
            return super().uniforms(shape, device) * 0.5

    mixed = RowStreams([Shifted(1), CounterRandom(2)])
    assert not mixed.counter_based
    assert torch.equal(mixed.uniforms((2,)), torch.cat([Shifted(1).uniforms((1,)), CounterRandom(2).uniforms((1,))]))
