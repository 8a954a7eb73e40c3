"""``--budget auto`` per temperature (issue 19, item 4): a budget ``(N, d)`` and rheo's sampled slots ``m``
for every temperature, used by every unit of that temperature, logged, resumed and reported."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import cli
from specdec.bench import auto_budget
from specdec.bench.auto_budget import (
    BudgetChoice, SlotsChoice, choose_budget, choose_budgets, choose_sampled_slots, pilot_tau,
)
from specdec.bench.budget import Budget, dynamic_width, method_options
from specdec.bench.models import BenchModels
from specdec.bench.rows import AUTOREGRESSIVE, parse_rows
from specdec.bench.runlog import RunLogWriter, read_runlog
from specdec.bench.runner import _generators, aggregate, run_bench
from specdec.bench.sweep import BenchConfig, row_options
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.sampling import SamplingConfig

V = 7


def _bigram(seed: int, noise: float = 0.0) -> CallableLM:
    table = 2.0 * torch.randn(V, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    if noise:
        table = table + noise * torch.randn(V, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return CallableLM(lambda prefixes: table[[p[-1] for p in prefixes]], V)


def _models() -> BenchModels:
    target = _bigram(0)
    return BenchModels(target=target, targets={"lm": target}, drafts={"lm": _bigram(1, 0.7)},
                       tokenize=lambda text: [len(w) % V for w in text.split()], eos_token_id=None)


# ------------------------------------------------------------------ the choices
def test_each_temperature_gets_the_budget_of_its_own_profiles():
    """A peaked profile (T = 0: the draft's first choice or nothing) favours a deep, narrow tree; a flat one
    (T = 1: the target's token spread over the draft's ranks) a wide, shallow one. One choice per temperature,
    each the one its profiles alone give, and not the one budget of the mean over temperatures."""
    forward = lambda tokens: 1.0 + 0.02 * tokens  # noqa: E731 - a cost model
    level = {"lm": lambda w: 0.01 + 0.001 * w}
    peaked = {"lm@T=0": ("lm", (0.9, 0.02, 0.01))}
    flat = {"lm@T=1": ("lm", (0.25, 0.2, 0.15, 0.1, 0.08, 0.06))}
    by_t = choose_budgets(forward, level, {0.0: peaked, 1.0: flat})
    assert set(by_t) == {0.0, 1.0} and all(set(c) == {"lm"} for c in by_t.values())
    chosen = {t: c["lm"] for t, c in by_t.items()}
    assert chosen[0.0].budget == choose_budget(forward, level, peaked).budget
    assert chosen[1.0].budget == choose_budget(forward, level, flat).budget
    assert chosen[0.0].budget != chosen[1.0].budget
    assert chosen[0.0].budget.depth > chosen[1.0].budget.depth  # deep at T = 0
    assert dynamic_width(chosen[1.0].budget) > dynamic_width(chosen[0.0].budget)  # siblings at T = 1
    one = choose_budget(forward, level, {**peaked, **flat}).budget  # the single budget of the mean
    assert one != chosen[0.0].budget or one != chosen[1.0].budget
    with pytest.raises(InvalidConfigError, match="no acceptance profile at T=1"):
        choose_budgets(forward, level, {0.0: peaked, 1.0: {}})


def test_the_sampled_slots_are_the_pilots_best():
    calls = []

    def pilot(taus):
        def fn(m):
            calls.append(m)
            return taus[m]
        return fn

    assert choose_sampled_slots(pilot({1: 2.0, 2: 2.4, 3: 2.2}), 10).m == 2
    assert choose_sampled_slots(pilot({1: 2.0, 2: 2.1, 3: 2.6}), 4).m == 3
    tie = choose_sampled_slots(pilot({1: 2.0, 2: 2.5, 3: 2.5}), 10)
    assert tie.m == 2 and tie.tau == {1: 2.0, 2: 2.5, 3: 2.5}  # ties go to the smaller m
    calls.clear()
    assert choose_sampled_slots(pilot({1: 1.0, 2: 3.0, 3: 9.0}), 3).m == 2 and calls == [1, 2]  # m < K = 3
    calls.clear()
    # m = K (every slot sampled) is the sampled-dynamic method, never rheo's: with K = 2 only m = 1 is left
    assert choose_sampled_slots(pilot({1: 1.0, 2: 3.0}), 2) == SlotsChoice(1, (1,), {}) and calls == []
    every = choose_sampled_slots(pilot({1: 1.0, 2: 1.1, 3: 1.2, 10: 1.5}), 10)
    assert (every.m, every.candidates, calls) == (3, (1, 2, 3), [1, 2, 3])
    with pytest.raises(InvalidConfigError, match="K must be an int >= 2"):
        choose_sampled_slots(pilot({}), 1)


def test_pilot_tau_measures_tokens_per_step():
    models = _models()
    opts = {**method_options("rheo", Budget(8, 2)), "m": 2}
    args = (models.target, models.drafts["lm"], "rheo", opts, [[1, 2], [3]], SamplingConfig(temperature=1.0), 12)
    emitted, steps = pilot_tau(*args)
    assert emitted >= 2 * 12  # every token of both generations (a last step may emit past the limit)
    assert 1 <= steps <= emitted
    assert pilot_tau(*args) == (emitted, steps)  # seeded
    # a perfect draft accepts whole paths: depth 2 + the bonus per step
    perfect = pilot_tau(models.target, _bigram(0), "rheo", opts, [[1]], SamplingConfig(temperature=0), 9)
    assert perfect == (9, 3)


# ------------------------------------------------------------------ the runner
def test_the_runner_uses_each_temperatures_budget_and_m():
    rows = parse_rows("sd,rheo,rheo[m=1]@lm", ["lm"])
    budgets = {0.0: Budget(2, 2), 1.0: Budget(12, 3)}
    config = BenchConfig(rows, (0.0, 1.0), (0,), max_new_tokens=8, budget=budgets, warmup=False,
                         sampled_slots={0.0: 1, 1.0: 3})
    options = row_options(config)
    assert options[("sd", 0.0)] == {"depth": 2} and options[("sd", 1.0)] == {"depth": 3}
    assert options[("rheo", 0.0)] == {"N": 2, "depth": 2, "K": 2, "B": 2, "m": 1}
    assert options[("rheo", 1.0)] == {"N": 12, "depth": 3, "K": 4, "B": 4, "m": 3}
    assert options[("rheo[m=1]@lm", 1.0)]["m"] == 1  # the row's own m wins over auto's
    gens = _generators(_models(), config, options)
    assert (gens[("rheo", 1.0)].builder.m, gens[("rheo", 1.0)].builder.N) == (3, 12)
    assert gens[("rheo", 0.0)].builder.N == 2
    runs = run_bench(_models(), config, [[1, 2], [3]])
    for r in runs:
        want = (None, None) if r.row == AUTOREGRESSIVE else (budgets[r.temperature].nodes, budgets[r.temperature].depth)
        assert (r.budget_nodes, r.budget_depth) == want, r
        assert len(r.depth_attempted) <= budgets[r.temperature].depth
    for rec in aggregate(runs, rows, config.temperatures, budget=config.budget, options=options):
        if rec["kind"] == "speculative":
            assert rec["budget_nodes"] == budgets[rec["temperature"]].nodes
    # batched runs carry the budget of their temperature too
    batched = run_bench(_models(), attrs_evolve(config, batch_size=2), [[1, 2], [3], [4]], options=options)
    assert {(r.temperature, r.budget_nodes) for r in batched if r.row == "rheo"} == {(0.0, 2), (1.0, 12)}
    # a rheo row whose own K leaves no room for auto's m gets m = K - 1 (rheo keeps a deterministic slot)
    small = BenchConfig(parse_rows("rheo[K=2]@lm", ["lm"]), (1.0,), (0,), 4, {1.0: Budget(12, 3)}, sampled_slots={1.0: 3})
    assert row_options(small)[("rheo[K=2]@lm", 1.0)]["m"] == 1
    # a row's own m that the temperature's K has no room for widens K to m + 1 (N and d stay): no late error
    own = BenchConfig(parse_rows("rheo[m=3]@lm", ["lm"]), (0.0, 1.0), (0,), 4, budgets, sampled_slots={0.0: 1, 1.0: 2})
    assert row_options(own)[("rheo[m=3]@lm", 0.0)] == {"N": 2, "depth": 2, "K": 4, "B": 2, "m": 3}
    assert row_options(own)[("rheo[m=3]@lm", 1.0)] == {"N": 12, "depth": 3, "K": 4, "B": 4, "m": 3}
    _generators(_models(), own, row_options(own))  # every row builds
    with pytest.raises(InvalidConfigError, match="no tree budget for T=1"):
        BenchConfig(rows, (0.0, 1.0), (0,), 4, {0.0: Budget(2, 2)})


def attrs_evolve(config, **kw):
    import attrs

    return attrs.evolve(config, **kw)


# ------------------------------------------------------------------ the command
def _run(capsys, *args):
    code = cli.main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _args(tiny_dirs, out, *extra):
    """2 prompts x (T=0, T=1) x (baseline, sd, rheo, rheo[m=1]) = 16 generations."""
    return ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "sd,rheo,rheo[m=1]", "--budget", "auto", "--num-prompts", "2", "--max-new-tokens", "4",
            "--temperatures", "0,1", "--seeds", "0", "--ignore-eos", "--no-plots", "--threads", "1", "--out", out,
            *extra]


def _fake_choices(budgets, taus, calls):
    """choose_budgets and pilot_tau replaced: the given budgets per temperature, and pilot generations whose
    tau is ``taus[m]`` (the measurements still run; only the choice is fixed, so the test does not depend on
    this machine's timings)."""
    def choose(forward, level, acceptance, *a, **k):
        calls.append(("choose", sorted(acceptance)))
        out = {}
        for t, profiles in acceptance.items():
            out[t] = {}
            for key, (kind, _) in profiles.items():  # budgets[t]: one Budget for every kind, or {kind: Budget}
                b = budgets[t] if isinstance(budgets[t], Budget) else budgets[t][kind]
                out[t][kind] = BudgetChoice(b, 1.0, {(b.nodes, b.depth): 1.0}, {key: 1.5})
        return out

    def pilot(target, draft, method, options, prompts, sampling, max_new_tokens, *, seed=0):
        calls.append(("pilot", method, sampling.temperature, options["m"], options["N"]))
        return int(100 * taus[options["m"]]), 100

    return choose, pilot


def _patch(monkeypatch, budgets, taus, calls):
    choose, pilot = _fake_choices(budgets, taus, calls)
    monkeypatch.setattr(auto_budget, "choose_budgets", choose)
    monkeypatch.setattr(auto_budget, "pilot_tau", pilot)


BUDGETS = {0.0: Budget(2, 2), 1.0: Budget(12, 3)}
TAUS = {1: 2.0, 2: 2.5, 3: 2.5, 4: 2.4}  # m = 2 and m = 3 tie: the smaller wins (m = K = 4 is never piloted)


@pytest.fixture(scope="module")
def auto_run(tiny_dirs, tmp_path_factory):
    """A finished --budget auto sweep with per-temperature budgets and a pilot-chosen m at T = 1."""
    out = tmp_path_factory.mktemp("auto") / "out"
    calls: list = []
    mp = pytest.MonkeyPatch()
    try:
        _patch(mp, BUDGETS, TAUS, calls)
        torch.set_num_threads(1)
        assert cli.main(["bench", *map(str, _args(tiny_dirs, out))]) == 0
    finally:
        mp.undo()
    return out, calls


def test_auto_chooses_per_temperature_and_records_it(auto_run, capsys):
    out, calls = auto_run
    assert ("choose", [0.0, 1.0]) in calls
    pilots = [c for c in calls if c[0] == "pilot"]
    # only the rheo row without its own m is piloted, only at T = 1, at T = 1's budget, for every m < K = 4
    assert sorted(pilots) == [("pilot", "rheo", 1.0, m, 12) for m in (1, 2, 3)]
    log = read_runlog(out)
    entry = log.resolved["budget"]
    assert entry["auto"] and entry["nodes"] is None and entry["by_temperature"] == [
        {"temperature": 0.0, "nodes": 2, "depth": 2, "m": 1, "by_kind": {"lm": {"nodes": 2, "depth": 2}}},
        {"temperature": 1.0, "nodes": 12, "depth": 3, "m": 2, "by_kind": {"lm": {"nodes": 12, "depth": 3}}}]
    assert len(entry["sha256"]) == 64
    pilot = log.resolved["auto_budget"]["by_temperature"][1]["pilot"]
    assert pilot["tau"] == {"1": 2.0, "2": 2.5, "3": 2.5} and pilot["candidates"] == [1, 2, 3]
    assert log.resolved["auto_budget"]["by_temperature"][0]["pilot"] is None  # T = 0: m plays no part
    options = {(name, t): o for name, t, o in log.resolved["options"]}
    assert options[("rheo", 1.0)]["m"] == 2 and options[("rheo", 0.0)]["m"] == 1
    assert options[("rheo[m=1]", 1.0)]["m"] == 1  # the explicit row option wins
    assert options[("sd", 0.0)] == {"depth": 2} and options[("sd", 1.0)] == {"depth": 3}
    assert len(log.records) == 16
    for r in log.records:  # every generation carries the budget of its temperature
        want = None if r["row"] == AUTOREGRESSIVE else BUDGETS[r["temperature"]].nodes
        assert r["budget_nodes"] == want, r
    results = json.loads((out / "results.json").read_text())
    for rec in results:
        if rec["kind"] == "speculative":
            assert (rec["budget_nodes"], rec["budget_depth"]) == (BUDGETS[rec["temperature"]].nodes,
                                                                 BUDGETS[rec["temperature"]].depth)
    assert {(r["method"], r["temperature"]): r["options"].get("m") for r in results if r["base_method"] == "rheo"} == {
        ("rheo", 0.0): 1, ("rheo", 1.0): 2, ("rheo[m=1]", 0.0): 1, ("rheo[m=1]", 1.0): 1}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["budget"] == entry
    # the report says what auto chose per temperature, from runs.jsonl alone
    code, stdout, err = _run(capsys, "report", out, "--no-plots", "--no-write")
    assert code == 0, err
    assert "budget auto, per temperature and draft kind (below)" in stdout
    assert "auto budget at T=0: lm 2 nodes, depth 2; rheo m=1 (greedy: m plays no part)" in stdout
    assert "auto budget at T=1: lm 12 nodes, depth 3; rheo m=2 (pilot tau m=1 2.000, m=2 2.500, m=3 2.500)" in stdout


def _interrupt_after(monkeypatch, n):
    real = RunLogWriter.write
    count = [0]

    def write(self, record):
        count[0] += 1
        if count[0] > n:
            raise RuntimeError("killed")
        return real(self, record)

    monkeypatch.setattr(RunLogWriter, "write", write)


def test_a_resumed_auto_sweep_keeps_its_choices(capsys, tiny_dirs, tmp_path, monkeypatch, auto_run):
    out = tmp_path / "out"
    calls: list = []
    _patch(monkeypatch, BUDGETS, TAUS, calls)
    _interrupt_after(monkeypatch, 5)
    with pytest.raises(RuntimeError, match="killed"):
        _run(capsys, *_args(tiny_dirs, out))
    monkeypatch.undo()
    # were it re-resolved, another machine state would choose otherwise: here, other budgets and m = 3
    again: list = []
    _patch(monkeypatch, {0.0: Budget(4, 4), 1.0: Budget(6, 2)}, {1: 1.0, 2: 1.0, 3: 3.0}, again)
    code, _, err = _run(capsys, *_args(tiny_dirs, out))
    assert code == 0, err
    assert again == []  # nothing re-measured or re-chosen
    assert "5 of 16 generations done" in err
    assert "T=0: lm 2 nodes, depth 2 (rheo m=1); T=1: lm 12 nodes, depth 3 (rheo m=2) as logged" in err
    log = read_runlog(out)
    assert len(log.records) == 16
    for r in log.records:
        if r["row"] != AUTOREGRESSIVE:
            assert r["budget_nodes"] == BUDGETS[r["temperature"]].nodes
    strip = lambda f: sorted((r["row"], r["prompt_index"], r["temperature"], r["tokens"])  # noqa: E731
                             for r in read_runlog(f).records)
    assert strip(out) == strip(auto_run[0])  # the same generations as the uninterrupted sweep


def _as_old_log(src, dst, keep):
    """``src``'s runs.jsonl as specdec wrote it before per-temperature auto budgets: one budget in the
    header, the old auto_budget info, no per-record budget, no m in the options; ``keep`` records."""
    lines = (src / "runs.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    res = header["resolved"]
    res["budget"] = {"nodes": 3, "depth": 2, "auto": True}
    res["auto_budget"] = {"batch_size": 1, "table": {"3,2": 1.0}, "expected_tokens_per_s": 1.0}
    res["options"] = [[name, t, {k: v for k, v in o.items() if k != "m"}] for name, t, o in res["options"]]
    records = []
    for line in lines[1:1 + keep]:
        r = json.loads(line)
        r.pop("budget_nodes")
        r.pop("budget_depth")
        records.append(json.dumps(r))
    dst.mkdir()
    (dst / "runs.jsonl").write_text("\n".join([json.dumps(header), *records]) + "\n")
    return dst


def test_an_old_single_budget_log_reports_and_resumes(capsys, tiny_dirs, tmp_path, monkeypatch, auto_run):
    old = _as_old_log(auto_run[0], tmp_path / "old", keep=16)
    code, stdout, err = _run(capsys, "report", old, "--no-plots")
    assert code == 0, err
    assert "budget 3 nodes, depth 2 (auto)" in stdout and "auto budget at" not in stdout
    results = json.loads((old / "results.json").read_text())
    assert {r["budget_nodes"] for r in results if r["kind"] == "speculative"} == {3}
    # resuming an old auto sweep reuses its one budget at every temperature (and rheo's default m)
    partial = _as_old_log(auto_run[0], tmp_path / "partial", keep=4)
    calls: list = []
    _patch(monkeypatch, BUDGETS, TAUS, calls)
    code, _, err = _run(capsys, *_args(tiny_dirs, partial))
    assert code == 0, err
    assert calls == [] and "tree budget 3 nodes, depth 2 as logged (a log of one budget for every temperature)" in err
    log = read_runlog(partial)
    assert len(log.records) == 16
    assert {(r["temperature"], r["budget_nodes"]) for r in log.records[4:] if r["row"] != AUTOREGRESSIVE} == {
        (0.0, 3), (1.0, 3)}


def test_the_default_policy_is_written_into_the_rows_options():
    """sampled-dynamic at T = 0.6 runs the policy's M = 8192 (docs/trees.md, "Default policy"), and the log says so;
    a row's own M wins; rheo's policy keeps its standing defaults."""
    rows = parse_rows("sampled-dynamic,sampled-dynamic[M=64]@lm,rheo", ["lm", "eagle3"])
    config = BenchConfig(rows, (0.6, 1.0), (0,), 8, Budget(60, 6))
    options = row_options(config)
    assert options[("sampled-dynamic", 0.6)]["M"] == 8192 and "M" not in options[("sampled-dynamic", 1.0)]
    assert options[("sampled-dynamic[M=64]@lm", 0.6)]["M"] == 64
    assert options[("rheo", 0.6)] == options[("rheo", 1.0)] == {"N": 60, "depth": 6, "K": 10, "B": 10}
