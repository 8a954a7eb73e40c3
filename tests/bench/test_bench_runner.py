"""The benchmark loop: rows, interleaving of the baseline, aggregation."""

from __future__ import annotations


import attrs
import pytest
import torch

import specdec
import specdec.testing

from specdec.bench.budget import Budget
from specdec.bench.models import BenchModels
from specdec.bench.rows import AUTOREGRESSIVE, PEER, RowSpec, parse_rows
from specdec.bench.runner import aggregate, check_rows, run_bench
from specdec.bench.sweep import BenchConfig, RunRecord, bench_units, row_options, unit_order
from specdec.errors import InvalidConfigError, UnknownNameError
from specdec.models import CallableLM

V = 7


def _bigram(seed: int, noise: float = 0.0) -> CallableLM:
    g = torch.Generator().manual_seed(0)
    table = 2.0 * torch.randn(V, V, generator=g, dtype=torch.float64)
    if noise:
        table = table + noise * torch.randn(V, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return CallableLM(lambda prefixes: table[[p[-1] for p in prefixes]], V)


def _models(noise: float = 0.7) -> BenchModels:
    target = _bigram(0)
    draft = _bigram(1, noise)
    return BenchModels(target=target, targets={"lm": target}, drafts={"lm": draft},
                       tokenize=lambda text: [len(w) % V for w in text.split()], eos_token_id=None)


def test_parse_rows_defaults_and_overrides():
    rows = parse_rows("sd,eagle2,eagle3,rheo,rheo@eagle2,hf-assisted", ["lm", "eagle2", "eagle3"])
    assert [(r.name, r.method, r.draft) for r in rows] == [
        (AUTOREGRESSIVE, None, None), ("sd", "sd", "lm"), ("eagle2", "eagle2", "eagle2"),
        ("eagle3", "eagle3", "eagle3"), ("rheo", "rheo", "eagle3"), ("rheo@eagle2", "rheo", "eagle2"),
        (PEER, None, "lm"),
    ]
    # without heads, the EAGLE methods fall back to the draft LM and say so
    rows = parse_rows("eagle3,rheo,specinfer@lm", ["lm"])
    assert [(r.name, r.draft, bool(r.note)) for r in rows[1:]] == [
        ("eagle3", "lm", True), ("rheo", "lm", True), ("specinfer", "lm", False)]
    assert parse_rows("autoregressive,sd", ["lm"])[0].name == AUTOREGRESSIVE and len(parse_rows("sd", ["lm"])) == 2
    # the draft LM over the whole vocabulary is its own row beside the default one
    rows = parse_rows("sd,sd@lm-full", ["lm", "lm-full"], add_baseline=False)
    assert [(r.name, r.draft) for r in rows] == [("sd", "lm"), ("sd@lm-full", "lm-full")]


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        ("sd,foo", UnknownNameError, "unknown method 'foo'"),
        ("", InvalidConfigError, "empty"),
        ("rheo@eagle9", InvalidConfigError, "unknown draft kind"),
        ("rheo@eagle2", InvalidConfigError, "not available"),
        ("sd@lm-full", InvalidConfigError, "not available"),
        ("sd,sd@lm", InvalidConfigError, "twice"),
        ("hf-assisted,hf-assisted", InvalidConfigError, "twice"),
        ("rheo[x=1]", InvalidConfigError, "no option 'x'"),
        ("rheo[m=2", InvalidConfigError, "unclosed"),
        ("rheo]m=2", InvalidConfigError, "unbalanced"),
        ("rheo[m]", InvalidConfigError, "not name=value"),
        ("rheo[]", InvalidConfigError, "method\\[name=value"),
        ("rheo[m=2,m=3]", InvalidConfigError, "twice"),
        ("rheo[m=2],rheo[m=2]@lm", InvalidConfigError, "twice"),
    ],
)
def test_parse_rows_errors(text, error, match):
    with pytest.raises(error, match=match):
        parse_rows(text, ["lm"])


def test_rows_with_builder_options_override_the_budget():
    """``method[k=v,...]`` rows (ablations): parsed values, distinct rows per
    option set, the options layered over the budget's mapping, and the
    options reach the tree builder (rheo at m=1, m=2 and EAGLE-2's tree)."""
    rows = parse_rows("rheo,rheo[m=2,K=3,proxy=residual,threshold=0.05]@lm,rheo[K=4]", ["lm"])
    assert [(r.name, r.options) for r in rows[1:]] == [
        ("rheo", ()), ("rheo[m=2,K=3,proxy=residual,threshold=0.05]@lm", (("m", 2), ("K", 3), ("proxy", "residual"), ("threshold", 0.05))),
        ("rheo[K=4]", (("K", 4),))]
    config = BenchConfig(rows, (1.0,), (0,), max_new_tokens=8, budget=Budget(6, 3), warmup=False)
    options = row_options(config)
    assert options[("rheo", 1.0)] == {"N": 6, "depth": 3, "K": 2, "B": 2}
    assert options[(rows[2].name, 1.0)] == {"N": 6, "depth": 3, "K": 3, "B": 2, "m": 2, "proxy": "residual",
                                            "threshold": 0.05}
    assert options[("rheo[K=4]", 1.0)]["K"] == 4
    from specdec.bench.runner import _generators

    gens = _generators(_models(), config, options)
    assert (gens[("rheo", 1.0)].builder.m, gens[("rheo", 1.0)].builder.K) == (1, 2)
    built = gens[(rows[2].name, 1.0)].builder
    assert (built.m, built.K, built.proxy, built.threshold) == (2, 3, "residual", 0.05)
    runs = run_bench(_models(), config, [[1, 2]])
    assert {r.row for r in runs} == {AUTOREGRESSIVE, "rheo", rows[2].name, "rheo[K=4]"}
    assert RowSpec(**attrs.asdict(rows[2])) == rows[2]  # a JSON-like round trip (meta.json) keeps the row


def test_units_and_rotation():
    assert bench_units(1, [1.0, 0.0], [3, 4]) == [(0, 1.0, 3), (0, 1.0, 4), (0, 0.0, 3)]
    rows = [RowSpec(n, "speculative") for n in "abcd"]
    orders = [[r.name for r in unit_order(rows, u)] for u in range(4)]
    assert orders == [list("abcd"), list("bcda"), list("cdab"), list("dabc")]
    # each row is first exactly once per cycle
    assert sorted(o[0] for o in orders) == list("abcd")


def test_run_bench_interleaves_the_baseline():
    models = _models()
    rows = parse_rows("sd,specinfer,sequoia,eagle2,rheo", ["lm"])
    config = BenchConfig(rows, (0.0, 1.0), (0, 1), max_new_tokens=12, budget=Budget(6, 3), warmup=False)
    prompts = [[1, 2], [3], [4, 5, 6]]
    runs = run_bench(models, config, prompts)
    units = bench_units(len(prompts), config.temperatures, config.seeds)
    assert len(runs) == len(units) * len(rows)
    assert [r.sequence for r in runs] == list(range(len(runs)))
    for u, (pi, t, seed) in enumerate(units):
        block = runs[u * len(rows):(u + 1) * len(rows)]  # every row of a unit runs back to back
        assert {(r.prompt_index, r.temperature, r.seed, r.unit) for r in block} == {(pi, t, seed, u)}
        assert [r.row for r in block] == [r.name for r in unit_order(rows, u)]  # the baseline included
        assert all(r.new_tokens == 12 and r.time_total > 0 for r in block)
    # lossless at T = 0: every method reproduces the baseline's tokens, unit by unit
    records = aggregate(runs, rows, config.temperatures, budget=config.budget)
    for rec in records:
        if rec["temperature"] == 0:
            assert rec["matches_autoregressive"] == 1.0, rec["method"]
    base = [r for r in records if r["method"] == AUTOREGRESSIVE]
    assert [r["tau"] for r in base] == [1.0, 1.0] and [r["speedup"] for r in base] == [1.0, 1.0]
    assert all(r["tau"] >= 1.0 for r in records)


def test_a_perfect_draft_accepts_whole_chains():
    target = _bigram(0)
    models = BenchModels(target=target, targets={"lm": target}, drafts={"lm": _bigram(0)},
                         tokenize=lambda s: [1], eos_token_id=None)
    rows = parse_rows("sd", ["lm"])
    config = BenchConfig(rows, (0.0,), (0,), max_new_tokens=15, budget=Budget(4, 4), warmup=True)
    records = aggregate(run_bench(models, config, [[1]]), rows, config.temperatures, budget=config.budget)
    sd = next(r for r in records if r["method"] == "sd")
    assert sd["tau"] == 5.0 and sd["target_forwards"] == 3 and sd["acceptance_by_depth"] == [1.0] * 4


def _rec(seq, unit, row, t, new, steps, emitted, seconds, tokens=()):
    return RunRecord(seq, unit, 0, t, 0, row, new, steps, emitted, (steps, steps // 2), (steps // 2, 1), seconds,
                     0.1, 0.2, 0.3, 0.05, tuple(tokens))


def test_aggregate_speedup_is_a_ratio_of_side_by_side_rates():
    rows = [RowSpec(AUTOREGRESSIVE, "autoregressive"), RowSpec("sd", "speculative", "sd", "lm"),
            RowSpec(PEER, "peer", draft="lm")]
    runs = [
        _rec(0, 0, AUTOREGRESSIVE, 0.0, 10, 10, 10, 2.0, range(10)),
        _rec(1, 0, "sd", 0.0, 10, 4, 11, 1.0, range(10)),
        _rec(2, 1, "sd", 0.0, 10, 5, 10, 1.5, [9] * 10),  # differs from unit 1's baseline
        _rec(3, 1, AUTOREGRESSIVE, 0.0, 10, 10, 10, 3.0, range(10)),
        RunRecord(4, 1, 0, 0.0, 0, PEER, 10, 5, 10, (), (), 1.0, *(float("nan"),) * 4, tuple(range(10))),
    ]
    recs = {r["method"]: r for r in aggregate(runs, rows, [0.0], budget=Budget(4, 2), options={("sd", 0.0): {"depth": 2}})}
    assert recs[AUTOREGRESSIVE]["tokens_per_s"] == pytest.approx(20 / 5.0)
    assert recs["sd"]["tokens_per_s"] == pytest.approx(20 / 2.5)
    assert recs["sd"]["speedup"] == pytest.approx(2.0)
    assert recs["sd"]["tau"] == pytest.approx(21 / 9)
    assert recs["sd"]["tau_stderr"] == pytest.approx(abs(11 / 4 - 2.0) / 2)  # stderr of (2.75, 2.0)
    assert recs["sd"]["matches_autoregressive"] == 0.5
    assert recs["sd"]["acceptance_by_depth"] == pytest.approx([4 / 9, 2 / 4])
    assert recs["sd"]["options"] == {"depth": 2} and recs["sd"]["budget_nodes"] == 4
    assert recs[PEER]["time_draft"] is None and recs[PEER]["speedup"] == pytest.approx(10.0 / 4.0)
    assert recs[PEER]["tau"] == 2.0 and recs[PEER]["matches_autoregressive"] == 1.0
    assert recs[AUTOREGRESSIVE]["tau_stderr"] == 0.0


def test_check_rows_fails_before_running():
    models = _models()
    config = BenchConfig(parse_rows("sd,hf-assisted", ["lm"]), (0.0,), (0,), 4, Budget(2, 2))
    with pytest.raises(InvalidConfigError, match="hf-assisted"):
        check_rows(models, config)
    with pytest.raises(InvalidConfigError, match="needs the eagle3 draft"):
        check_rows(models, BenchConfig([RowSpec("rheo", "speculative", "rheo", "eagle3")], (0.0,), (0,), 4, Budget(2, 2)))


def test_aggregate_does_not_depend_on_the_order_of_the_records():
    """Ray workers append records in the order they finish: the aggregates (the
    standard error's float sums included) are those of the records in unit order."""
    import random

    rows = [RowSpec(AUTOREGRESSIVE, "autoregressive"), RowSpec("sd", "speculative", "sd", "lm")]
    runs = []
    for u in range(12):
        runs.append(_rec(2 * u, u, AUTOREGRESSIVE, 1.0, 10, 10, 10, 1.0 + u / 7))
        runs.append(_rec(2 * u + 1, u, "sd", 1.0, 10, 3 + u % 5, 7 + (u * 5) % 11, 0.5 + u / 13))
    want = aggregate(runs, rows, [1.0], budget=Budget(4, 2))
    shuffled_differs = False
    rng = random.Random(0)
    for _ in range(20):
        order = runs[:]
        rng.shuffle(order)
        assert aggregate(order, rows, [1.0], budget=Budget(4, 2)) == want
        xs = [r.emitted / r.steps for r in order if r.row == "sd"]
        shuffled_differs |= sum(xs) != sum(r.emitted / r.steps for r in runs if r.row == "sd")
    assert shuffled_differs  # the float sums do depend on the order: sorting is what makes them equal


def test_a_row_may_name_another_verifier() -> None:
    """``method[verifier=NAME]``: the method's tree with another registered rule; unknown names and
    rules that cannot verify the tree fail before any model loads or any timing."""
    (row,) = parse_rows("sequoia[verifier=traversal]@lm", ["lm"], add_baseline=False)
    assert row.options == (("verifier", "traversal"),)
    with pytest.raises(UnknownNameError, match="traversl"):
        parse_rows("sequoia[verifier=traversl]@lm", ["lm"], add_baseline=False)
    target, draft = specdec.testing.markov_pair(5, seed=0, order=2)
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sequoia", verifier="traversal",
                                       num_nodes=6, max_depth=3, acceptance=(0.6, 0.2, 0.1))
    assert gen.verifier.registry_name == "traversal"
    with pytest.raises(specdec.UnsupportedTreeError, match="fit"):
        specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", verifier="traversal")
