"""Per-position acceptance in the bench (issue 59, deliverable 4): runs.jsonl records carry ``depth_drafted``
(checked field by field; old logs without it still read), the results give ``acceptance_by_position`` per
method (accepted at depth d / drafted at depth d), batched records carry each prompt's own counts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import attrs
import pytest
import torch
from rich.console import Console

from specdec.bench.budget import Budget
from specdec.bench.models import BenchModels
from specdec.bench.report import results_table
from specdec.bench.rows import parse_rows
from specdec.bench.runlog import read_runlog, record_from_dict
from specdec.bench.runner import aggregate, run_bench
from specdec.bench.sweep import BenchConfig
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM

from test_bench_runlog_checks import HEADER, RECORDS  # tests/bench is on sys.path (conftest)

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


def _log(folder: Path, records: list[dict]) -> Path:
    folder.mkdir()
    (folder / "runs.jsonl").write_text("\n".join(json.dumps(x) for x in [HEADER, *records]) + "\n")
    return folder


def _with_drafted(drafted) -> list[dict]:
    """The checks' valid log, its ``sd`` records (2 steps, attempted [2, 1], accepted [2, 1]) with ``drafted``."""
    return [{**r, "depth_drafted": drafted} if r["row"] == "sd" else {**r, "depth_drafted": []} for r in RECORDS]


def test_records_with_and_without_the_drafted_counts_read(tmp_path):
    log = read_runlog(_log(tmp_path / "new", _with_drafted([2, 2, 1])))
    read = [record_from_dict(r) for r in log.records]
    assert [r.depth_drafted for r in read if r.row == "sd"] == [(2, 2, 1), (2, 2, 1)]
    assert read[1].as_dict()["depth_drafted"] == [2, 2, 1]  # written back as a JSON list
    old = read_runlog(_log(tmp_path / "old", RECORDS))  # logged before the counts existed
    assert all(record_from_dict(r).depth_drafted == () for r in old.records)
    assert record_from_dict(RECORDS[1]).depth_drafted == ()


@pytest.mark.parametrize(("drafted", "message"), [
    ([2], "'depth_drafted' has 1 depths, fewer than depth_attempted's 2"),
    ([2, 0], r"'depth_drafted' at depth 2: 0 drafted, 1 attempted in 2 steps \(attempted <= drafted <= steps\)"),
    ([3, 2], r"'depth_drafted' at depth 1: 3 drafted, 2 attempted in 2 steps"),
    ([2, 1, 2], "'depth_drafted' at depth 3 exceeds depth 2 \\(1 -> 2\\)"),
    ([2, -1], "'depth_drafted' holds -1 at index 1"),
    ([2, True], "'depth_drafted' holds True at index 1"),
    ("2,1", "'depth_drafted' has the wrong type \\(str\\)"),
])
def test_a_bad_drafted_count_names_the_field_and_line(tmp_path, drafted, message):
    with pytest.raises(InvalidConfigError, match=f"runs.jsonl:3: {message}"):
        read_runlog(_log(tmp_path / "bad", _with_drafted(drafted)))


def test_acceptance_by_position_is_accepted_over_drafted_per_method():
    models = _models()
    rows = parse_rows("sd,eagle2", ["lm"])
    config = BenchConfig(rows, (1.0,), (0, 1), max_new_tokens=10, budget=Budget(5, 3), warmup=False)
    runs = run_bench(models, config, [[1, 2], [3]])
    records = {r["method"]: r for r in aggregate(runs, rows, config.temperatures, budget=config.budget)}
    for name in ("sd", "eagle2"):
        mine = [r for r in runs if r.row == name]
        assert all(r.depth_drafted and len(r.depth_drafted) >= len(r.depth_attempted) for r in mine)
        D = max(len(r.depth_drafted) for r in mine)
        drafted = [sum(r.depth_drafted[d] for r in mine if d < len(r.depth_drafted)) for d in range(D)]
        accepted = [sum(r.depth_accepted[d] for r in mine if d < len(r.depth_accepted)) for d in range(D)]
        assert records[name]["drafted_by_depth"] == drafted
        assert records[name]["acceptance_by_position"] == [a / n for a, n in zip(accepted, drafted)]
    assert records["autoregressive"]["acceptance_by_position"] is None  # no tree: nothing drafted
    table = io.StringIO()
    Console(file=table, width=250).print(results_table(list(records.values())))
    assert "by position" in table.getvalue()
    # records of an older log (no drafted counts): no per-position rates, no column
    old = [attrs.evolve(r, depth_drafted=()) for r in runs]
    older = aggregate(old, rows, config.temperatures, budget=config.budget)
    assert all(r["acceptance_by_position"] is None for r in older)
    table = io.StringIO()
    Console(file=table, width=250).print(results_table(older))
    assert "by position" not in table.getvalue()


def test_batched_records_carry_each_prompts_own_counts():
    """A batched call's records carry each prompt's per-depth counts, equal to its batch-1 run's (the rows
    draw from their own sources: at T = 0 and T = 1 alike, a prompt's run is its batch-1 run)."""
    models = _models()
    rows = parse_rows("sd", ["lm"])
    prompts = [[1, 2], [3], [4, 5, 6]]
    one = BenchConfig(rows, (0.0, 1.0), (0,), max_new_tokens=10, budget=Budget(4, 3), warmup=False)
    batched = BenchConfig(rows, (0.0, 1.0), (0,), max_new_tokens=10, budget=Budget(4, 3), warmup=False, batch_size=3)

    def counts(runs):
        return {(r.row, r.prompt_index, r.temperature): (r.depth_attempted, r.depth_accepted, r.depth_drafted)
                for r in runs}

    single, batch = counts(run_bench(models, one, prompts)), counts(run_bench(models, batched, prompts))
    assert batch == single
    assert any(v[2] for k, v in batch.items() if k[0] == "sd")
