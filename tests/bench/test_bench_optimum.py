"""`specdec bench --optimum`: the gap to the best lossless acceptance (issue 44, item 5)."""

from __future__ import annotations

import json

import attrs
import pytest
import torch

from specdec import cli
from specdec.bench.budget import Budget
from specdec.bench.models import BenchModels
from specdec.bench.report import gap_text
from specdec.bench.rows import AUTOREGRESSIVE, RowSpec, parse_rows
from specdec.bench.runlog import read_runlog, record_from_dict
from specdec.bench.runner import aggregate, run_bench
from specdec.bench.sweep import BenchConfig, RunRecord
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM

V = 7
GAP_KEYS = ("optimum_by_depth", "gap_by_depth", "gap", "optimum_bound")


def _bigram(seed: int, noise: float = 0.0) -> CallableLM:
    table = 2.0 * torch.randn(V, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    if noise:
        table = table + noise * torch.randn(V, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return CallableLM(lambda prefixes: table[[p[-1] for p in prefixes]], V)


def _models(noise: float) -> BenchModels:
    target = _bigram(0)
    return BenchModels(target=target, targets={"lm": target}, drafts={"lm": _bigram(1, noise)},
                       tokenize=lambda text: [1], eos_token_id=None)


def _run(capsys, *args):
    code = cli.main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _sweep(tiny_dirs, out, *extra):
    """2 prompts x (T=0 + T=1 with 2 seeds) x (baseline, sd, specinfer, rheo) = 24 generations."""
    return ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "sd,specinfer,rheo", "--budget", "4", "--depth", "2", "--num-prompts", "2",
            "--max-new-tokens", "6", "--temperatures", "0,1", "--seeds", "0,1", "--ignore-eos", "--no-plots",
            "--out", out, *extra]


def _header_cells(stdout: str) -> list[str]:
    line = next(ln for ln in stdout.splitlines() if "method" in ln and "speedup" in ln)
    return [c.strip() for c in line.strip("┃│ ").replace("┃", "│").split("│")]


def _tokens(folder):
    return {(r["row"], r["prompt_index"], r["temperature"], r["seed"]): r["tokens"] for r in read_runlog(folder).records}


@pytest.fixture(scope="module")
def plain(tiny_dirs, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("plain") / "out"
    assert cli.main(["bench", *map(str, _sweep(tiny_dirs, out))]) == 0
    return out


@pytest.fixture(scope="module")
def measured(tiny_dirs, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("measured") / "out"
    assert cli.main(["bench", *map(str, _sweep(tiny_dirs, out, "--optimum"))]) == 0
    return out


# ------------------------------------------------------------------ the runner and aggregate


def test_the_runner_measures_the_optimum_without_changing_the_tokens():
    rows = parse_rows("sd,specinfer,rheo", ["lm"])
    config = BenchConfig(rows, (0.0, 1.0), (0, 1), max_new_tokens=16, budget=Budget(6, 3), warmup=False)
    prompts = [[1, 2], [3]]
    plain = run_bench(_models(0.7), config, prompts)
    runs = run_bench(_models(0.7), attrs.evolve(config, optimum=True), prompts)
    assert [r.tokens for r in runs] == [r.tokens for r in plain]  # the measurement draws nothing
    assert all(r.depth_optimum == () and not r.optimum_bound for r in plain)
    for r in runs:
        if r.row == AUTOREGRESSIVE:
            assert r.depth_optimum == ()
        else:  # one value per tested depth, each at most one acceptance per tested node
            assert len(r.depth_optimum) == len(r.depth_attempted) > 0
            assert all(-1e-9 <= o <= n + 1e-9 for o, n in zip(r.depth_optimum, r.depth_attempted))
    records = aggregate(runs, rows, config.temperatures, budget=config.budget)
    for rec in records:
        if rec["kind"] != "speculative":
            assert all(rec[k] is None for k in GAP_KEYS)
            continue
        acc, opt = rec["acceptance_by_depth"], rec["optimum_by_depth"]
        assert len(opt) == len(acc) and isinstance(rec["optimum_bound"], bool)
        assert rec["gap_by_depth"] == [o - a for o, a in zip(opt, acc)]  # by construction, bit for bit
        rs = [r for r in runs if r.row == rec["method"] and r.temperature == rec["temperature"]]
        att = [sum(r.depth_attempted[d] for r in rs if d < len(r.depth_attempted)) for d in range(len(acc))]
        # the overall gap: the per-depth gaps weighted by the tested nodes
        assert rec["gap"] == pytest.approx(sum(g * n for g, n in zip(rec["gap_by_depth"], att)) / sum(att))
    assert all(rec[k] is None for rec in aggregate(plain, rows, config.temperatures) for k in GAP_KEYS)


def test_a_perfect_draft_leaves_nothing_on_the_table():
    """Draft = target at T=1: the chain accepts every draft, and the best lossless rule can do no better."""
    rows = parse_rows("sd", ["lm"])
    config = BenchConfig(rows, (1.0,), (0,), max_new_tokens=15, budget=Budget(4, 4), warmup=False, optimum=True)
    records = aggregate(run_bench(_models(0.0), config, [[1], [2]]), rows, config.temperatures, budget=config.budget)
    sd = next(r for r in records if r["method"] == "sd")
    assert sd["acceptance_by_depth"] == [1.0] * 4
    assert sd["optimum_by_depth"] == pytest.approx([1.0] * 4) and sd["gap"] == pytest.approx(0.0, abs=1e-9)
    assert sd["optimum_bound"] is False


def _rec(row, depth_optimum=(), bound=False):
    return RunRecord(0, 0, 0, 1.0, 0, row, 8, 4, 8, (4, 2), (2, 1), 1.0, 0.1, 0.2, 0.3, 0.05, tuple(range(8)),
                     depth_optimum=depth_optimum, optimum_bound=bound)


def test_aggregate_sums_the_optimum_and_marks_a_bound():
    rows = [RowSpec("sd", "speculative", "sd", "lm"), RowSpec("specinfer", "speculative", "specinfer", "lm")]
    runs = [_rec("sd", (3.0, 1.5)), _rec("sd", (2.5, 1.0)), _rec("specinfer", (3.0, 1.0), bound=True),
            _rec("specinfer", (3.0, 1.0))]
    recs = {r["method"]: r for r in aggregate(runs, rows, [1.0])}
    sd, si = recs["sd"], recs["specinfer"]
    assert sd["optimum_by_depth"] == pytest.approx([5.5 / 8, 2.5 / 4])
    assert sd["gap_by_depth"] == pytest.approx([5.5 / 8 - 4 / 8, 2.5 / 4 - 2 / 4])
    assert sd["gap"] == pytest.approx((8.0 - 6) / 12) and sd["optimum_bound"] is False
    assert si["optimum_bound"] is True and si["gap"] == pytest.approx((8.0 - 6) / 12)
    assert (gap_text(sd), gap_text(si)) == ("0.167", "<=0.167")


def test_the_config_refuses_the_optimum_of_batched_calls():
    with pytest.raises(InvalidConfigError, match="--optimum with --batch-size > 1"):
        BenchConfig(parse_rows("sd", ["lm"]), (0.0,), (0,), 4, Budget(2, 2), batch_size=2, optimum=True)


# ------------------------------------------------------------------ the command


def test_optimum_run_has_the_gap_column_and_fields(capsys, tiny_dirs, measured, plain):
    code, stdout, err = _run(capsys, "report", measured, "--no-plots", "--no-write")
    assert code == 0, err
    assert "gap" in _header_cells(stdout) and "--optimum (timings include its host work)" in stdout
    assert "not comparable with a run without --optimum" in stdout and "gap = the best lossless" in stdout
    results = json.loads((measured / "results.json").read_text())
    for rec in results:
        if rec["kind"] != "speculative":
            assert all(rec[k] is None for k in GAP_KEYS)
            continue
        assert len(rec["optimum_by_depth"]) == len(rec["acceptance_by_depth"]) > 0
        assert rec["gap_by_depth"] == [o - a for o, a in zip(rec["optimum_by_depth"], rec["acceptance_by_depth"])]
        assert isinstance(rec["gap"], float) and isinstance(rec["optimum_bound"], bool)
        cell = gap_text(rec)
        assert cell.startswith("<=") == rec["optimum_bound"] and cell in stdout
    log = read_runlog(measured)
    assert log.config["optimum"] is True
    assert all(len(r["depth_optimum"]) == len(r["depth_attempted"]) for r in log.records if r["row"] != "autoregressive")
    meta = json.loads((measured / "meta.json").read_text())
    assert meta["optimum"] is True and "not comparable" in meta["optimum_note"]
    assert _tokens(measured) == _tokens(plain)  # the measurement changes no draw


def test_a_run_without_it_has_no_gap(capsys, plain):
    code, stdout, err = _run(capsys, "report", plain, "--no-plots", "--no-write")
    assert code == 0, err
    assert "gap" not in _header_cells(stdout) and "--optimum" not in stdout
    assert all(rec[k] is None for rec in json.loads((plain / "results.json").read_text()) for k in GAP_KEYS)
    assert "optimum" not in read_runlog(plain).config  # logs of plain runs keep their identity
    meta = json.loads((plain / "meta.json").read_text())
    assert meta["optimum"] is False and meta["optimum_note"] is None


def _old_log(tmp_path, plain, keep):
    """``plain``'s log as a specdec before ``--optimum`` wrote it (no optimum keys), cut after ``keep`` records."""
    out = tmp_path / "old"
    out.mkdir()
    header, *lines = (plain / "runs.jsonl").read_text().splitlines()
    records = [{k: v for k, v in json.loads(ln).items() if k not in ("depth_optimum", "optimum_bound")}
               for ln in lines[:keep]]
    (out / "runs.jsonl").write_text("\n".join([header, *map(json.dumps, records)]) + "\n")
    return out


def test_an_old_runs_jsonl_without_the_fields_resumes(capsys, tiny_dirs, tmp_path, plain):
    out = _old_log(tmp_path, plain, 7)
    assert [record_from_dict(r).depth_optimum for r in read_runlog(out).records] == [()] * 7
    code, stdout, err = _run(capsys, *_sweep(tiny_dirs, out))
    assert code == 0, err
    assert "7 of 24 generations done" in err and "gap" not in _header_cells(stdout)
    assert _tokens(out) == _tokens(plain)
    assert all(rec[k] is None for rec in json.loads((out / "results.json").read_text()) for k in GAP_KEYS)


def test_resuming_a_plain_log_with_optimum_is_refused_before_any_work(capsys, no_work, tiny_dirs, tmp_path, plain):
    out = _old_log(tmp_path, plain, 5)
    code, _, err = _run(capsys, *_sweep(tiny_dirs, out, "--optimum"))
    assert code == 2 and "holds a sweep of another configuration" in err and "optimum: null in the log, true now" in err


def test_optimum_with_a_batch_size_is_refused_before_any_work(capsys, no_work, tiny_dirs, tmp_path):
    code, _, err = _run(capsys, *_sweep(tiny_dirs, tmp_path / "b", "--optimum", "--batch-size", "2"))
    assert code == 2 and "--optimum with --batch-size > 1" in err


def test_a_malformed_depth_optimum_is_refused(tmp_path, plain):
    out = tmp_path / "bad"
    out.mkdir()
    header, first, *_ = (plain / "runs.jsonl").read_text().splitlines()
    (out / "runs.jsonl").write_text("\n".join([header, json.dumps({**json.loads(first), "depth_optimum": 0.5})]) + "\n")
    with pytest.raises(InvalidConfigError, match="'depth_optimum' has the wrong type"):
        read_runlog(out)
