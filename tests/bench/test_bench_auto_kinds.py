"""``--budget auto`` per draft kind (issue 59, item 1): each (temperature, draft kind) gets the budget of that
kind's own profile, and the choice is carried through the rows' options, every record, the header's digest,
resume (refused when the choices do not match), the report and ``meta.json``."""

from __future__ import annotations

import json
import re

import pytest
import torch

from specdec import cli
from specdec.bench import auto_budget
from specdec.bench import runner as bench_runner
from specdec.bench.auto_budget import AUTO_CANDIDATES, AUTO_DEPTHS, BudgetChoice, choose_budget, choose_budgets
from specdec.bench.budget import Budget, budget_at, budget_text, dynamic_width
from specdec.bench.hashes import budget_sha256, check_budget_choices
from specdec.bench.models import BenchModels
from specdec.bench.report import budget_lines
from specdec.bench.rows import AUTOREGRESSIVE, parse_rows
from specdec.bench.runlog import budget_entry, logged_budget, read_runlog
from specdec.bench.runner import aggregate, run_bench
from specdec.bench.sweep import BenchConfig, row_options
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.trees.sequoia import sequoia_tree

# ------------------------------------------------------------------ the chooser
# the case: a draft LM (slow levels, a weak first choice) whose optimum is 1 node, and an EAGLE-3 head
# (cheap levels, a strong first choice) whose optimum is a deeper tree
FORWARD = lambda tokens: 1.0 + 0.1 * tokens  # noqa: E731 - the target's cost model t(n)
LEVEL = {"lm": lambda w: 0.3 + 0.01 * w, "eagle3": lambda w: 0.01 + 0.001 * w}
PROFILES = {
    0.0: {"lm@T=0": ("lm", (0.45, 0.05, 0.02)), "eagle3@T=0": ("eagle3", (0.9, 0.04, 0.02))},
    1.0: {"lm@T=1": ("lm", (0.3, 0.1, 0.05)), "eagle3@T=1": ("eagle3", (0.5, 0.2, 0.1, 0.05))},
}


def _own_optimum(kind, a):
    """The kind's own best (N, d) by enumeration: its G / (d t_level(K) + t(N + 1)), ties to the smaller N, d."""
    best = None
    for n in AUTO_CANDIDATES:
        for d in AUTO_DEPTHS:
            if d > n:
                continue
            _, g = sequoia_tree(list(a), n, d)
            rate = g / (d * LEVEL[kind](dynamic_width(Budget(n, d))) + FORWARD(n + 1))
            if best is None or rate > best[0] * (1 + 1e-12):
                best = (rate, Budget(n, d))
    return best[1]


def _check_each_kind_gets_its_own_optimum(chooser):
    chosen = chooser(FORWARD, LEVEL, PROFILES)
    assert set(chosen) == set(PROFILES)
    for t, profiles in PROFILES.items():
        assert set(chosen[t]) == {kind for kind, _ in profiles.values()}
        for kind, a in profiles.values():
            assert chosen[t][kind].budget == _own_optimum(kind, a), (t, kind)


def test_each_draft_kind_gets_its_own_optimum():
    optima = {(t, kind): _own_optimum(kind, a) for t, p in PROFILES.items() for kind, a in p.values()}
    assert optima[(0.0, "lm")] == Budget(1, 1)  # the test has power: the kinds' optima differ at each temperature
    assert optima[(0.0, "lm")] != optima[(0.0, "eagle3")] and optima[(1.0, "lm")] != optima[(1.0, "eagle3")]
    _check_each_kind_gets_its_own_optimum(choose_budgets)


def test_a_chooser_that_averages_the_kinds_fails_the_check():
    """The chooser before issue 59: one budget per temperature, the mean over the kinds, given to every kind."""
    def averaged(forward, level, acceptance):
        return {t: {kind: choose_budget(forward, level, profiles) for kind, _ in profiles.values()}
                for t, profiles in acceptance.items()}

    with pytest.raises(AssertionError):
        _check_each_kind_gets_its_own_optimum(averaged)


def test_choose_budgets_bad_input():
    with pytest.raises(InvalidConfigError, match=r"no draft level time for draft kind\(s\) \['eagle3'\]"):
        choose_budgets(FORWARD, {"lm": LEVEL["lm"]}, PROFILES)
    with pytest.raises(InvalidConfigError, match="no acceptance profile at T=1"):
        choose_budgets(FORWARD, LEVEL, {0.0: PROFILES[0.0], 1.0: {}})


# ------------------------------------------------------------------ identity, header, report
PLAN = {0.0: {"lm": Budget(1, 1), "eagle3": Budget(4, 2)}, 1.0: {"lm": Budget(2, 2), "eagle3": Budget(6, 2)}}


def test_the_digest_changes_when_one_kinds_choice_changes():
    base = budget_sha256(PLAN, {1.0: 2})
    assert base == budget_sha256({1.0: dict(reversed(PLAN[1.0].items())), 0.0: PLAN[0.0]}, {1.0: 2})  # order-free
    other = {**PLAN, 1.0: {**PLAN[1.0], "eagle3": Budget(6, 3)}}  # one kind, one temperature, the depth only
    assert budget_sha256(other, {1.0: 2}) != base
    assert budget_sha256(PLAN, {1.0: 1}) != base  # rheo's m is part of the choices
    swapped = {t: {"lm": b["eagle3"], "eagle3": b["lm"]} for t, b in PLAN.items()}  # the same budgets, other kinds
    assert budget_sha256(swapped, {1.0: 2}) != base
    assert budget_sha256({0.0: Budget(1, 1), 1.0: Budget(2, 2)}) != budget_sha256({0.0: {"lm": Budget(1, 1)},
                                                                                 1.0: {"lm": Budget(2, 2)}})


def test_the_header_round_trips_and_the_report_shows_each_kind():
    entry = budget_entry(PLAN, {0.0: 1, 1.0: 2}, auto=True)
    assert entry["nodes"] is None and entry["by_temperature"][0]["by_kind"] == {
        "eagle3": {"nodes": 4, "depth": 2}, "lm": {"nodes": 1, "depth": 1}}
    same = budget_entry({0.0: {"lm": Budget(3, 2), "eagle3": Budget(3, 2)}}, auto=True)
    assert (same["nodes"], same["depth"], same["by_temperature"][0]["nodes"]) == (3, 2, 3)  # kinds agree
    budget, slots = logged_budget({"budget": entry})
    assert budget == PLAN and slots == {0.0: 1, 1.0: 2}
    assert budget_at(budget, 1.0, "eagle3") == Budget(6, 2)
    with pytest.raises(InvalidConfigError, match="no tree budget for draft kind 'ngram' at T=1"):
        budget_at(budget, 1.0, "ngram")
    assert budget_text(budget, slots) == ("T=0: eagle3 4 nodes, depth 2, lm 1 node, depth 1 (rheo m=1); "
                                          "T=1: eagle3 6 nodes, depth 2, lm 2 nodes, depth 2 (rheo m=2)")
    pilot = {"candidates": [1, 2], "tau": {"1": 2.0, "2": 2.25}}
    lines = budget_lines({"resolved": {"budget": entry, "auto_budget": {"by_temperature": [
        {"temperature": 0.0, "pilot": None}, {"temperature": 1.0, "pilot": pilot}]}}})
    assert lines == ["auto budget at T=0: eagle3 4 nodes, depth 2; lm 1 node, depth 1; rheo m=1 (greedy: m plays no part)",
                     "auto budget at T=1: eagle3 6 nodes, depth 2; lm 2 nodes, depth 2; rheo m=2 "
                     "(pilot tau m=1 2.000, m=2 2.250)"]


# ------------------------------------------------------------------ the sweep
V = 7


def _bigram(seed: int, noise: float = 0.0) -> CallableLM:
    table = 2.0 * torch.randn(V, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    if noise:
        table = table + noise * torch.randn(V, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return CallableLM(lambda prefixes: table[[p[-1] for p in prefixes]], V)


def test_every_row_and_record_gets_its_kinds_budget():
    target = _bigram(0)
    models = BenchModels(target=target, targets={"lm": target, "lm-full": target},
                         drafts={"lm": _bigram(1, 0.7), "lm-full": _bigram(2, 0.3)},
                         tokenize=lambda text: [len(w) % V for w in text.split()], eos_token_id=None)
    rows = parse_rows("sd,sd@lm-full,rheo@lm-full", ["lm", "lm-full"])
    plan = {0.0: {"lm": Budget(1, 1), "lm-full": Budget(4, 2)}, 1.0: {"lm": Budget(2, 2), "lm-full": Budget(6, 3)}}
    config = BenchConfig(rows, (0.0, 1.0), (0,), max_new_tokens=6, budget=plan, warmup=False,
                         sampled_slots={0.0: 1, 1.0: 1})
    options = row_options(config)
    assert options[("sd", 0.0)] == {"depth": 1} and options[("sd@lm-full", 0.0)] == {"depth": 2}
    assert options[("sd", 1.0)] == {"depth": 2} and options[("sd@lm-full", 1.0)] == {"depth": 3}
    assert options[("rheo@lm-full", 1.0)]["N"] == 6
    runs = run_bench(models, config, [[1, 2], [3]], options=options)
    kind = {r.name: r.draft for r in rows}
    for r in runs:
        want = (None, None) if r.row == AUTOREGRESSIVE else (plan[r.temperature][kind[r.row]].nodes,
                                                             plan[r.temperature][kind[r.row]].depth)
        assert (r.budget_nodes, r.budget_depth) == want, r
    for rec in aggregate(runs, rows, config.temperatures, budget=plan, options=options):
        if rec["kind"] == "speculative":
            assert rec["budget_nodes"] == plan[rec["temperature"]][rec["draft"]].nodes
    with pytest.raises(InvalidConfigError, match="no tree budget for draft kind 'lm-full' at T=0"):
        BenchConfig(rows, (0.0,), (0,), 4, {0.0: {"lm": Budget(1, 1)}})


# ------------------------------------------------------------------ the command
KIND_PLAN = {0.0: {"lm": Budget(1, 1), "ngram": Budget(4, 2)}, 1.0: {"lm": Budget(3, 3), "ngram": Budget(2, 1)}}


def _args(tiny_dirs, out):
    """2 prompts x (T=0, T=1) x (baseline, sd on the draft LM, sd on prompt lookup) = 12 generations."""
    return ["bench", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]), "--prompts",
            str(tiny_dirs["prompts"]), "--methods", "sd,sd@ngram", "--budget", "auto", "--num-prompts", "2",
            "--max-new-tokens", "4", "--temperatures", "0,1", "--seeds", "0", "--ignore-eos", "--no-plots",
            "--threads", "1", "--out", str(out)]


def _fake_chooser(calls):
    """choose_budgets replaced by KIND_PLAN (the measurements still run on the tuning prompts)."""
    def choose(forward, level, acceptance, *a, **k):
        calls.append(sorted((t, kind) for t, p in acceptance.items() for kind, _ in p.values()))
        return {t: {kind: BudgetChoice(KIND_PLAN[t][kind], 1.0, {(1, 1): 1.0}, {key: 1.5})
                    for key, (kind, _) in p.items()} for t, p in acceptance.items()}
    return choose


@pytest.fixture(scope="module")
def kinds_run(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("kinds") / "out"
    calls: list = []
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(auto_budget, "choose_budgets", _fake_chooser(calls))
        torch.set_num_threads(1)
        assert cli.main(_args(tiny_dirs, out)) == 0
    finally:
        mp.undo()
    return out, calls


def test_the_sweep_records_and_reports_each_kinds_choice(kinds_run, capsys):
    out, calls = kinds_run
    assert calls == [[(0.0, "lm"), (0.0, "ngram"), (1.0, "lm"), (1.0, "ngram")]]  # one profile per (T, kind)
    log = read_runlog(out)
    entry = log.resolved["budget"]
    assert logged_budget(log.resolved)[0] == KIND_PLAN and entry["sha256"] == budget_sha256(KIND_PLAN)
    assert log.resolved["auto_budget"]["per_draft_kind"] is True
    assert {k for e in log.resolved["auto_budget"]["by_temperature"] for k in e["by_kind"]} == {"lm", "ngram"}
    kind = {"sd": "lm", "sd@ngram": "ngram"}
    assert len(log.records) == 12
    for r in log.records:
        if r["row"] != AUTOREGRESSIVE:
            b = KIND_PLAN[r["temperature"]][kind[r["row"]]]
            assert (r["budget_nodes"], r["budget_depth"]) == (b.nodes, b.depth), r
    options = {(name, t): o for name, t, o in log.resolved["options"]}
    assert options[("sd", 0.0)] == {"depth": 1} and options[("sd@ngram", 0.0)] == {"depth": 2}
    assert options[("sd", 1.0)] == {"depth": 3} and options[("sd@ngram", 1.0)] == {"depth": 1}
    results = json.loads((out / "results.json").read_text())
    assert {(r["method"], r["temperature"]): r["budget_nodes"] for r in results if r["kind"] == "speculative"} == {
        ("sd", 0.0): 1, ("sd@ngram", 0.0): 4, ("sd", 1.0): 3, ("sd@ngram", 1.0): 2}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["budget"] == entry and meta["auto_budget"]["by_temperature"][0]["by_kind"]["ngram"]["nodes"] == 4
    code = cli.main(["bench", "report", str(out), "--no-plots", "--no-write"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "budget auto, per temperature and draft kind (below)" in stdout
    assert "auto budget at T=0: lm 1 node, depth 1; ngram 4 nodes, depth 2" in stdout
    assert "auto budget at T=1: lm 3 nodes, depth 3; ngram 2 nodes, depth 1" in stdout


def _partial(src, dst, keep, edit=None):
    """``src``'s log with its first ``keep`` records; ``edit`` changes the header's resolved object."""
    lines = (src / "runs.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    if edit is not None:
        edit(header["resolved"])
    dst.mkdir()
    (dst / "runs.jsonl").write_text("\n".join([json.dumps(header), *lines[1:1 + keep]]) + "\n")
    return dst


def _ngram_at_t0(res, nodes):
    for e in res["budget"]["by_temperature"]:
        if e["temperature"] == 0.0:
            e["by_kind"]["ngram"]["nodes"] = nodes


def test_resume_keeps_the_logged_choices(kinds_run, tiny_dirs, tmp_path, monkeypatch, capsys):
    partial = _partial(kinds_run[0], tmp_path / "partial", keep=5)
    calls: list = []
    monkeypatch.setattr(auto_budget, "choose_budgets", _fake_chooser(calls))
    assert cli.main(_args(tiny_dirs, partial)) == 0, capsys.readouterr().err
    assert calls == []  # nothing re-chosen: the remaining generations run at the logged choices
    assert "T=0: lm 1 node, depth 1, ngram 4 nodes, depth 2; T=1: lm 3 nodes, depth 3, ngram 2 nodes, depth 1 " \
           "as logged" in capsys.readouterr().err
    strip = lambda f: sorted((r["row"], r["prompt_index"], r["temperature"], r["budget_nodes"], r["tokens"])  # noqa: E731
                             for r in read_runlog(f).records)
    assert strip(partial) == strip(kinds_run[0])


def test_resume_refuses_choices_that_do_not_match(kinds_run, tiny_dirs, tmp_path, monkeypatch, capsys):
    def boom(*a, **k):
        raise AssertionError("models loaded before the choices were checked")

    monkeypatch.setattr("specdec.bench.models.load_bench_models", boom)
    # a choice edited in the header: its digest no longer matches
    edited = _partial(kinds_run[0], tmp_path / "edited", keep=5, edit=lambda res: _ngram_at_t0(res, 6))
    assert cli.main(_args(tiny_dirs, edited)) == 2
    assert "do not match their digest (resolved.budget.sha256)" in capsys.readouterr().err

    # a consistent header (digest recomputed) whose generations ran at other choices: a mixed log
    def rechosen(res):
        _ngram_at_t0(res, 6)
        budget, slots = logged_budget(res)
        res["budget"]["sha256"] = budget_sha256(budget, slots)

    mixed = _partial(kinds_run[0], tmp_path / "mixed", keep=11, edit=rechosen)
    assert cli.main(_args(tiny_dirs, mixed)) == 2
    assert re.search(r"'sd@ngram' T=0 .* ran at 4 nodes, depth 2, but the header's budget for draft ngram at T=0 is "
                     r"6 nodes, depth 2", capsys.readouterr().err)
    # the check itself, on the header and records alone
    log = read_runlog(mixed)
    with pytest.raises(InvalidConfigError, match="generations and its choices disagree"):
        check_budget_choices(log.header, log.records, "runs.jsonl")
    check_budget_choices(read_runlog(kinds_run[0]).header, read_runlog(kinds_run[0]).records, "runs.jsonl")


def test_the_choice_uses_tuning_prompts_and_says_when_there_are_none(tiny_dirs, tmp_path, monkeypatch, capsys):
    """The profiles behind the choice use prompts the run does not report on; a set with no other prompt (all 4
    reported) falls back to reported ones, and the log says so (never silently)."""
    profiled: list = []
    reported: list = []
    real_profile, real_run = auto_budget.profile_positional_acceptance, bench_runner.run_bench

    def profile(target, draft, prompts, *a, **k):
        profiled.extend(tuple(p) for p in prompts)
        return real_profile(target, draft, prompts, *a, **k)

    def run(models, config, prompts, *a, **k):
        reported.extend(tuple(p) for p in prompts)
        return real_run(models, config, prompts, *a, **k)

    monkeypatch.setattr(auto_budget, "profile_positional_acceptance", profile)
    monkeypatch.setattr(bench_runner, "run_bench", run)
    monkeypatch.setattr(auto_budget, "choose_budgets", _fake_chooser([]))
    args = _args(tiny_dirs, tmp_path / "held")
    args[args.index("--methods") + 1], args[args.index("--temperatures") + 1] = "sd", "0"
    assert cli.main(args) == 0
    assert "of the reported prompts" not in capsys.readouterr().err
    assert len(set(profiled)) == 2 and len(set(reported)) == 2 and not set(profiled) & set(reported)  # tuning only
    profiled.clear()
    reported.clear()
    args[args.index("--num-prompts") + 1], args[-1] = "0", str(tmp_path / "all")  # all 4 reported: none left
    assert cli.main(args) == 0
    assert "the profiles and --budget auto use 4 of the reported prompts" in capsys.readouterr().err
    assert set(profiled) <= set(reported)
