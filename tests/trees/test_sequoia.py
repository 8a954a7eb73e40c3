"""Sequoia: the DP against brute force, profiling, hardware-aware size choice."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import exact_law
from specdec.tree import SampleMode
from specdec.trees import SequoiaTreeBuilder, choose_size, measure_forward_times, sequoia_tree
from specdec.tune import profile_acceptance
from specdec.trees.sequoia import DEFAULT_ACCEPTANCE, measure_draft_level_time
from specdec.trees.static import StaticTreeBuilder
from specdec.verify.rejection import RejectionWORVerifier
from specdec.trees import build_tree

T1 = SamplingConfig(temperature=1.0)


def tree_value(paths, acceptance) -> float:
    """Expected tokens of a tree under the positional model: sum over nodes of
    the product of a_{slot+1} along the path, plus 1 for the root."""
    total = 1.0
    for path in paths:
        prob = 1.0
        for slot in path:
            prob *= acceptance[slot] if slot < len(acceptance) else 0.0
        total += prob
    return total


@functools.lru_cache(maxsize=None)
def all_forests(nodes: int, depth: int, width: int, max_width: int) -> tuple:
    """Every ordered forest (tuple of subtrees) of exactly ``nodes`` nodes,
    depth <= ``depth``, at most ``width`` trees at this level and ``max_width``
    children per node below."""
    if nodes == 0:
        return ((),)
    if depth == 0 or width == 0:
        return ()
    out = []
    for first in range(1, nodes + 1):  # nodes in the first tree
        for kids in all_forests(first - 1, depth - 1, max_width, max_width):
            for rest in all_forests(nodes - first, depth, width - 1, max_width):
                out.append((kids,) + rest)
    return tuple(out)


def forest_paths(forest, prefix=()):
    for slot, kids in enumerate(forest):
        path = prefix + (slot,)
        yield path
        yield from forest_paths(kids, path)


def brute_force(acceptance, num_nodes, max_depth):
    best = 1.0
    for n in range(1, num_nodes + 1):
        for forest in all_forests(n, max_depth, len(acceptance), len(acceptance)):
            best = max(best, tree_value(list(forest_paths(forest)), acceptance))
    return best


@pytest.mark.parametrize(
    "acceptance,num_nodes,max_depth",
    [
        ((0.5, 0.2), 3, 2),
        ((0.6, 0.25, 0.1), 5, 3),
        ((0.3, 0.3, 0.3), 6, 2),
        ((0.8,), 4, 4),
        ((0.8,), 4, 2),
        ((0.45, 0.3, 0.05, 0.02), 6, 3),
        ((0.9, 0.05, 0.0), 5, 5),
    ],
)
def test_dp_matches_brute_force(acceptance, num_nodes, max_depth):
    paths, gain = sequoia_tree(acceptance, num_nodes, max_depth)
    assert gain == pytest.approx(brute_force(acceptance, num_nodes, max_depth), abs=1e-12)
    assert tree_value(paths, acceptance) == pytest.approx(gain, abs=1e-12)
    assert len(paths) <= num_nodes and max(len(p) for p in paths) <= max_depth


def test_dp_single_child_gives_a_chain():
    paths, gain = sequoia_tree((0.7,), 5, 10)
    assert paths == tuple((0,) * k for k in range(1, 6))
    assert gain == pytest.approx(sum(0.7**k for k in range(6)))


def test_dp_zero_acceptance_positions_are_not_filled():
    paths, _ = sequoia_tree((0.5, 0.0), 10, 1)
    assert paths == ((0,),)


def test_builder_draws_without_replacement_along_the_dp_shape():
    builder = SequoiaTreeBuilder(num_nodes=12, max_depth=3, acceptance=(0.5, 0.2, 0.1))
    assert len(builder.paths) == 12 and builder.max_nodes == 13 and builder.max_depth <= 3
    draft = CallableLM(lambda prefixes: torch.randn(len(prefixes), 30, generator=torch.Generator().manual_seed(1)), 30)
    draft.begin([0])
    tree = build_tree(builder, 0, draft, T1, TorchRandom.seeded(0))
    assert tree.num_nodes == 13
    for node in range(tree.num_nodes):
        kids = tree.sampled_children(node)
        if len(kids) > 1:
            assert tree.law_of(kids[0]).mode == SampleMode.WITHOUT_REPLACEMENT
            assert len({int(tree.tokens[c]) for c in kids}) == len(kids)
    assert builder.default_verifier == "rejection-wor"


def test_builder_defaults_and_explicit_paths():
    default = SequoiaTreeBuilder()
    assert default.num_nodes == 60 and default.acceptance == DEFAULT_ACCEPTANCE
    assert len(default.paths) == 60 and default.max_depth <= 6
    explicit = SequoiaTreeBuilder(paths=[(0,), (1,), (0, 0)])
    assert explicit.paths == ((0,), (1,), (0, 0)) and explicit.max_nodes == 4
    assert math.isnan(explicit.expected_tokens)


# ---------------------------------------------------------------- choose_size
def test_choose_size_minimises_time_per_token():
    acceptance = (0.6, 0.2, 0.1)
    table = {n + 1: 0.010 + 0.0004 * n for n in (1, 2, 4, 8, 16, 32)}
    choice = choose_size(acceptance, table, 0.002, [1, 2, 4, 8, 16, 32], [1, 2, 3, 4])
    manual = {}
    for n in (1, 2, 4, 8, 16, 32):
        for d in (1, 2, 3, 4):
            paths, gain = sequoia_tree(acceptance, n, d)
            manual[(n, d)] = (max(len(p) for p in paths) * 0.002 + table[n + 1]) / gain
    best = min(manual, key=manual.get)
    assert (choice.num_nodes, choice.max_depth) == best
    assert choice.seconds_per_token == pytest.approx(manual[best])
    assert dict(choice.table) == pytest.approx(manual)
    assert choice.paths == sequoia_tree(acceptance, *best)[0]


def test_choose_size_prefers_small_trees_when_the_target_is_expensive():
    acceptance = (0.6, 0.2, 0.1)
    cheap = choose_size(acceptance, lambda t: 1.0, 0.0, [1, 4, 16], [1, 4])
    steep = choose_size(acceptance, lambda t: 0.01 * t**2, 0.0, [1, 4, 16], [1, 4])
    assert cheap.num_nodes == 16 and steep.num_nodes < 16


def test_choose_size_errors():
    with pytest.raises(InvalidConfigError, match="no measurement"):
        choose_size((0.5,), {2: 1.0}, 0.1, [1, 2], [1])
    with pytest.raises(InvalidConfigError):
        choose_size((0.5,), {2: 1.0}, -1.0, [1], [1])
    with pytest.raises(InvalidConfigError):
        choose_size((0.5,), 3.0, 0.1, [1], [1])


def test_measure_forward_times_with_a_callable_target():
    target = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 4), 4)
    times = measure_forward_times(target, [1, 2, 3], [1, 4, 9], repeats=2)
    assert sorted(times) == [1, 4, 9] and all(t >= 0 for t in times.values())
    assert target.calls == 3 * 3  # (warmup + repeats) forwards per size
    draft = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 4), 4)
    assert measure_draft_level_time(draft, [1, 2], width=5, repeats=2) >= 0


class _FakeClock:
    """perf_counter for measure_forward_times: the n-th timed forward lasts ``durations[n]``."""

    def __init__(self, durations):
        self.durations, self.now, self.calls = list(durations), 0.0, 0

    def __call__(self):
        if self.calls % 2:  # the end of a forward
            self.now += self.durations[self.calls // 2]
        self.calls += 1
        return self.now


@pytest.mark.parametrize("interleave,statistic,want", [
    (True, "min", {1: 2.0, 4: 7.0}),  # sizes in turn: 1 gets 9 (warm-up), 3, 2; 4 gets 9, 7, 8
    (True, "median", {1: 3.0, 4: 8.0}),
    (False, "min", {1: 3.0, 4: 2.0}),  # one size after the other: 1 gets 9, 9, 3; 4 gets 7, 2, 8
])
def test_measure_forward_times_interleaved_and_its_statistic(monkeypatch, interleave, statistic, want):
    import specdec.trees.sequoia as sequoia

    monkeypatch.setattr(sequoia, "_clock", _FakeClock([9, 9, 3, 7, 2, 8]))
    target = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 4), 4)
    got = measure_forward_times(target, [1, 2, 3], [1, 4], repeats=2, interleave=interleave, statistic=statistic)
    assert got == want
    with pytest.raises(InvalidConfigError, match="statistic must be"):
        measure_forward_times(target, [1, 2, 3], [1], statistic="mean")


def test_a_forward_that_fails_at_one_size_is_a_clear_error_not_a_guessed_curve():
    """Issue 48, bad input: a model that fails at some row count stops the curve with an error
    naming the size (no silent fallback); specdec's own errors pass through unchanged."""
    from specdec.errors import MeasurementError

    def lm(prefixes):
        if len(prefixes) > 3:
            raise RuntimeError("out of memory at 4 rows")
        return torch.zeros(len(prefixes), 4)

    with pytest.raises(MeasurementError, match=r"forward of a 4-token tree failed .*out of memory at 4 rows"):
        measure_forward_times(CallableLM(lm, 4), [1, 2, 3], [1, 4], repeats=1)
    with pytest.raises(InvalidConfigError, match="has no batch mode"):
        measure_forward_times(_NoBatch(lambda prefixes: torch.zeros(len(prefixes), 4), 4), [1, 2], [1], batch_size=2)


class _NoBatch(CallableLM):
    @property
    def supports_batch(self) -> bool:
        return False


# ---------------------------------------------------------- profile_acceptance
def order0_lm(probs):
    logits = torch.tensor(probs, dtype=torch.float64).log()
    return CallableLM(lambda prefixes: logits.expand(len(prefixes), -1).clone(), len(probs))


def exact_positional_acceptance(p, q, k_max):
    """a_k for a one-level tree of k_max w/o-replacement children, by exact enumeration."""
    target, draft = order0_lm(p), order0_lm(q)
    builder = StaticTreeBuilder(expansion=tuple((i,) for i in range(k_max)), mode="wor")
    verifier = RejectionWORVerifier()

    def program(rng):
        draft.begin([0])
        target.prefill([0])
        tree = build_tree(builder, 0, draft, T1, rng)
        result = verifier.verify(tree, process_logits(target.score_tree(tree), T1), rng)
        return int(tree.draw_order[result.accepted_nodes[0]]) if result.accepted_nodes else -1

    law = exact_law(program)
    return tuple(law.get(k, 0.0) for k in range(k_max))


def test_profile_acceptance_is_one_when_the_draft_is_the_target():
    lm = order0_lm([0.5, 0.3, 0.2])
    a = profile_acceptance(lm, lm, [[0], [1, 2]], T1, k_max=3, steps_per_prompt=5)
    assert a == (1.0, 0.0, 0.0)


def test_profile_acceptance_is_zero_for_disjoint_supports():
    a = profile_acceptance(order0_lm([0.5, 0.5, 0, 0]), order0_lm([0, 0, 0.5, 0.5]), [[0]], T1, k_max=2)
    assert a == (0.0, 0.0)


def test_profile_acceptance_estimates_the_exact_positional_law():
    p, q = [0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]
    exact = exact_positional_acceptance(p, q, 3)
    assert exact[0] > exact[1] > 0
    trials = 400
    est = profile_acceptance(order0_lm(p), order0_lm(q), [[0]] * 8, T1, k_max=3, steps_per_prompt=trials // 8, seed=3)
    for a_hat, a in zip(est, exact):
        sd = math.sqrt(a * (1 - a) / trials)
        assert abs(a_hat - a) < 4 * sd + 1e-12, (est, exact)
    # the same tolerance separates it from a clearly different pair (draft = target)
    assert abs(1.0 - est[0]) > 4 * math.sqrt(exact[0] * (1 - exact[0]) / trials)


def test_profile_acceptance_errors():
    lm = order0_lm([0.5, 0.5])
    with pytest.raises(InvalidConfigError):
        profile_acceptance(lm, lm, [], T1, k_max=2)
    with pytest.raises(InvalidConfigError):
        profile_acceptance(lm, lm, [[0]], T1, k_max=0)
