"""Tree budgets: the mapping onto every method, ``--budget auto``'s choice, the profiles."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdec.bench.auto_budget import choose_budget, linear_level_time, profile_positional_acceptance, smooth_acceptance
from specdec.bench.budget import (
    Budget,
    budget_text,
    dynamic_width,
    method_options,
    parse_budget,
    specinfer_expansion,
    supports_budget,
)
from specdec.errors import InvalidConfigError
from specdec.methods import resolve_method
from specdec.models import CallableLM
from specdec.registry import list_registered
from specdec.sampling import SamplingConfig


def test_parse_budget():
    assert parse_budget("60") == Budget(60, 6)
    assert parse_budget("3") == Budget(3, 3)
    assert parse_budget("10", depth=4) == Budget(10, 4)
    assert parse_budget(" AUTO ") == "auto"
    for bad in ("0", "-2", "ten", "4.5", ""):
        with pytest.raises(InvalidConfigError, match="--budget"):
            parse_budget(bad)
    with pytest.raises(InvalidConfigError, match="--depth"):
        parse_budget("auto", depth=3)
    with pytest.raises(InvalidConfigError):
        Budget(0, 1)


def test_a_budget_reads_in_words_with_one_node_singular():
    assert str(Budget(60, 6)) == "60 nodes, depth 6"
    assert str(Budget(1, 1)) == "1 node, depth 1"
    per_t = {0.8: Budget(1, 1), 1.0: Budget(3, 1)}
    assert budget_text(per_t, {0.8: 2}) == "T=0.8: 1 node, depth 1 (rheo m=2); T=1: 3 nodes, depth 1"


def _size(widths):
    total, level = 0, 1
    for k in widths:
        level *= k
        total += level
    return total


@given(st.integers(1, 200), st.integers(1, 10))
def test_specinfer_expansion_fills_the_budget(nodes, depth):
    w = specinfer_expansion(Budget(nodes, depth))
    assert 1 <= len(w) <= depth and _size(w) <= nodes
    assert all(a >= b >= 1 for a, b in zip(w, w[1:]))
    # maximal: no single width can grow without breaking a rule
    for i in range(len(w)):
        trial = list(w)
        trial[i] += 1
        assert (i > 0 and trial[i] > trial[i - 1]) or _size(trial) > nodes


def test_known_mappings():
    assert dynamic_width(Budget(60, 6)) == 10  # EAGLE-2's own setting: 60 nodes, depth 6, top-10
    assert method_options("eagle2", Budget(60, 6)) == {"N": 60, "depth": 6, "K": 10, "B": 10}
    assert method_options("eagle3", Budget(8, 4)) == {"N": 8, "depth": 4, "K": 2, "B": 2}
    assert method_options("rheo", Budget(24, 4)) == {"N": 24, "depth": 4, "K": 6, "B": 6}
    assert method_options("sd", Budget(3, 6)) == {"depth": 3}
    assert method_options("specinfer", Budget(60, 6)) == {"expansion": (3, 2, 2, 1, 1, 1)}
    assert method_options("sequoia", Budget(16, 5), acceptance=[0.5, 0.2]) == {
        "num_nodes": 16, "max_depth": 5, "acceptance": (0.5, 0.2)}


@pytest.mark.parametrize("method", list_registered("method"))
@pytest.mark.parametrize("budget", [Budget(1, 1), Budget(4, 2), Budget(8, 6), Budget(24, 4), Budget(60, 6)])
def test_every_method_respects_the_budget(method, budget):
    assert supports_budget(method)
    builder, _ = resolve_method(method).build(**method_options(method, budget, acceptance=[0.6, 0.2, 0.1]))
    assert builder.max_nodes - 1 <= budget.nodes  # draft nodes, root excluded
    assert builder.max_depth <= budget.depth
    if resolve_method(method).tree in ("eagle", "rheo", "sequoia"):
        assert builder.max_nodes - 1 == budget.nodes or budget.nodes == 1  # uses the whole budget


def test_choose_budget_follows_the_cost_model():
    acc = {"lm@T=0": ("lm", [0.7, 0.1, 0.05])}
    free = {"lm": lambda w: 0.0}
    # forward time independent of size and free drafting: the biggest tree wins
    choice = choose_budget(lambda t: 1.0, free, acc, candidates=(2, 8, 32), depths=(2, 4, 8))
    assert choice.budget == Budget(32, 8)
    # forward time proportional to the tokens: a tree never pays for itself beyond a few nodes
    choice = choose_budget(lambda t: 1.0 * t, free, acc, candidates=(1, 2, 8, 32), depths=(1, 2, 4))
    assert choice.budget.nodes <= 2
    # the value is the mean over profiles of G / cost, checked by hand for one entry
    from specdec.trees.sequoia import sequoia_tree

    _, g = sequoia_tree([0.7, 0.1, 0.05], 8, 2)
    both = {"a": ("lm", [0.7, 0.1, 0.05]), "b": ("fast", [0.0, 0.0])}
    choice = choose_budget(lambda t: 0.1 + 0.01 * t, {"lm": lambda w: 0.02, "fast": lambda w: 0.0}, both,
                           candidates=(8,), depths=(2,))
    want = 0.5 * (g / (2 * 0.02 + 0.1 + 0.09) + 1.0 / (0.1 + 0.09))
    assert math.isclose(choice.table[(8, 2)], want, rel_tol=1e-12)
    # a table missing a size is an error, d > N is skipped
    with pytest.raises(InvalidConfigError, match="no forward time"):
        choose_budget({3: 1.0}, free, acc, candidates=(4,), depths=(2,))
    assert set(choose_budget({3: 1.0}, free, acc, candidates=(2,), depths=(1, 2, 5)).table) == {(2, 1), (2, 2)}


def test_linear_level_time():
    fn = linear_level_time({1: 1.0, 10: 10.0})
    assert fn(1) == 1.0 and fn(10) == 10.0 and math.isclose(fn(4), 4.0) and math.isclose(fn(20), 20.0)
    assert linear_level_time({3: 2.0})(7) == 2.0


def test_smooth_acceptance():
    assert smooth_acceptance([1.0, 0.0], 9, prior=[0.5, 0.3]) == pytest.approx((0.95, 0.03))
    out = smooth_acceptance([0.0] * 8, 4)
    assert out[0] > 0 and sum(out) <= 1


def _table_lm(rows):
    """A CallableLM whose next-token logits depend on the last token only."""
    table = torch.tensor(rows, dtype=torch.float64)
    return CallableLM(lambda prefixes: table[[p[-1] for p in prefixes]], vocab_size=table.shape[1])


def test_profile_topk_measures_ranks():
    # the target (almost surely) emits token 2; the draft ranks 1 first, 2 second, 0 third
    target = _table_lm([[0.0, 0.0, 40.0]] * 3)
    draft = _table_lm([[0.0, 2.0, 1.0]] * 3)
    a = profile_positional_acceptance(target, draft, [[0], [1, 2]], SamplingConfig(temperature=1.0), 3,
                                      steps_per_prompt=3)
    assert a == (0.0, 1.0, 0.0)
    # at T = 0 the children are ranked by the draft's untempered law, as in the tree builders
    # (construction_config): the target's greedy token 2 is the draft's second choice
    greedy = SamplingConfig(temperature=0)
    assert profile_positional_acceptance(target, draft, [[0]], greedy, 3) == (0.0, 1.0, 0.0)
    assert profile_positional_acceptance(target, _table_lm([[0.0, 1.0, 3.0]] * 3), [[0]], greedy, 2) == (1.0, 0.0)


def test_profile_at_temperature_one_matches_the_exact_law():
    # target p = (0.5, 0.3, 0.2) after every token; draft q = p: rule 2 (top-k + match) accepts
    # the k-th ranked token with probability p of that token
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    lm = lambda: _table_lm([p.log().tolist()] * 3)  # noqa: E731
    a = profile_positional_acceptance(lm(), lm(), [[0]] * 50, SamplingConfig(temperature=1.0), 3,
                                      steps_per_prompt=40, seed=1)
    assert a == pytest.approx((0.5, 0.3, 0.2), abs=0.03)  # 2000 steps: 3 sigma ~ 0.034 on a1
    # without replacement from q = p, rule 4 accepts the first draw whenever ... it always accepts one
    b = profile_positional_acceptance(lm(), lm(), [[0]] * 20, SamplingConfig(temperature=1.0), 3,
                                      children="wor", steps_per_prompt=20, seed=2)
    assert sum(b) == pytest.approx(1.0) and b[0] == pytest.approx(1.0)  # q = p: the first draw is accepted
    with pytest.raises(InvalidConfigError):
        profile_positional_acceptance(lm(), lm(), [[0]], SamplingConfig(), 2, children="iid")
    with pytest.raises(InvalidConfigError):
        profile_positional_acceptance(lm(), lm(), [], SamplingConfig(), 2)


# ------------------------------------------------ issue 15: the budget per batch size
def test_forward_and_level_times_of_b_rows_use_the_batch_modes():
    from specdec.trees.sequoia import measure_draft_level_time, measure_forward_times

    calls = {"rows": [], "trees": 0}

    def fn(prefixes):
        calls["rows"].append(len(prefixes))
        return torch.zeros(len(prefixes), 5)

    lm = CallableLM(fn, vocab_size=5)
    times = measure_forward_times(lm, [1, 2], [1, 3], repeats=2, warmup=0, batch_size=4)
    assert set(times) == {1, 3} and all(t >= 0 for t in times.values())
    assert 4 * 3 in calls["rows"]  # one call scoring 4 trees of 3 nodes
    calls["rows"].clear()
    assert measure_draft_level_time(lm, [1, 2], 2, repeats=2, batch_size=3) >= 0
    assert 3 * 2 in calls["rows"]  # one call expanding 2 nodes of each of 3 rows
    with pytest.raises(InvalidConfigError, match="no batch mode"):
        measure_forward_times(_NoBatch(), [1], [1], batch_size=2)


class _NoBatch(CallableLM):
    def __init__(self):
        super().__init__(lambda p: torch.zeros(len(p), 5), vocab_size=5)

    @property
    def supports_batch(self) -> bool:  # the declared contract (TargetModel.supports_batch), not probed
        return False


def test_the_chosen_tree_shrinks_when_forwards_cost_grows_with_the_rows():
    """Sequoia's hardware-aware rule with B-row costs: where a forward's cost
    grows with the tokens it carries (B x tree size, as on this CPU), the best
    tree for B = 16 is no larger than for B = 1, and smaller here."""
    acceptance = {"eagle3@T=0": ("eagle3", (0.6, 0.15, 0.05))}
    chosen = {}
    for b in (1, 4, 16):
        forward = lambda tokens, b=b: 0.05 + 0.002 * b * tokens  # noqa: E731 - a cost model
        level = {"eagle3": lambda width, b=b: 0.002 + 0.0002 * b * width}
        chosen[b] = choose_budget(forward, level, acceptance).budget.nodes
    assert chosen[16] <= chosen[4] <= chosen[1] and chosen[16] < chosen[1]
