"""Issue 57: the CPU linear tuner measures the row counts a run uses, and says what it is doing.

A cold tuning used to time 4 layouts at 1-16 rows and 8 buckets up to 256 rows for every
weight shape, silently (a fresh clone's first bench looked hung for 25 minutes). Now the
default is a one-row run's counts (1-16, 24-64), callers can name exactly the counts they
need, and a tuning expected to take a second or more prints what, how long and where it is
cached.
"""

from __future__ import annotations

import doctest
import importlib
import json
import time

import pytest
import torch
import transformers

import specdec.kernels.linear as linear
from specdec.kernels.linear import (
    LARGE_ROWS,
    LinearPlan,
    accelerate_linears,
    cached_plan,
    dispatch_for,
    restore_linears,
    tune_linear,
)
from specdec.kernels.tuning_scope import (
    DEFAULT_ROWS,
    current_rows,
    describe_rows,
    expected_seconds,
    rows_up_to,
    tuning_log,
    tuning_rows,
)
from specdec.targets.hf import HFTarget


@pytest.fixture
def counted(monkeypatch):
    """How many row counts were timed (one interleaved round of methods per count)."""
    calls: list[int] = []
    real = linear._interleaved_min_seconds

    def spy(runs, repeats):
        calls.append(1)
        return real(runs, repeats)

    monkeypatch.setattr(linear, "_interleaved_min_seconds", spy)
    return calls


def _tiny_llama(vocab: int = 97) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_the_default_tunes_a_one_row_runs_counts_only(counted):
    plan = tune_linear((32, 16), repeats=1, cache=False)
    assert plan.measured_rows == DEFAULT_ROWS == tuple(range(1, 17)) + (24, 32, 48, 64)
    assert len(counted) == len(DEFAULT_ROWS)  # no 96-256 row buckets unless asked
    assert plan.method_for(300) == plan.buckets[-1][1]  # larger inputs: the largest measured count's method


def test_exactly_the_row_counts_asked_are_measured(counted):
    plan = tune_linear((32, 16), rows=[24, 1, 5], repeats=1, cache=False)
    assert len(counted) == 3 and plan.measured_rows == (1, 5, 24)
    assert plan.max_rows == 1 and [n for n, _ in plan.buckets] == [5, 24]
    assert plan.method_for(3) == plan.methods[0]  # between counts: the largest measured count below
    assert plan.method_for(7) == plan.buckets[0][1] and plan.method_for(40) == plan.buckets[1][1]
    without_one = tune_linear((32, 16), rows=[4], repeats=1, cache=False)
    assert without_one.method_for(2) == "rows"  # below the smallest measured count: the reference


def test_asked_rows_override_and_old_arguments_keep_their_meaning(counted):
    full = tune_linear((32, 16), max_rows=2, large_rows=LARGE_ROWS, repeats=1, cache=False)
    assert full.measured_rows == (1, 2, *LARGE_ROWS)
    short = tune_linear((32, 16), max_rows=3, repeats=1, cache=False)
    assert short.measured_rows == (1, 2, 3, 24, 32, 48, 64)


@pytest.mark.parametrize("rows", [[], [0], [2, -1], "16", [True]])
def test_bad_row_counts_are_refused(rows):
    with pytest.raises(ValueError, match="rows"):
        tune_linear((8, 8), rows=rows, cache=False)


def test_a_small_fewrow_bucket_hands_more_rows_to_the_next_best():
    plan = LinearPlan(shape=(8, 8), methods=("rows",), seconds=({"rows": 1.0},), threads=1,
                      buckets=((4, "fewrow"), (32, "rows")),
                      bucket_seconds=({"fewrow": 1.0, "columns": 2.0, "rows": 3.0}, {"rows": 1.0}))
    assert plan.method_for(10) == "fewrow" and plan.method_for(16) == "fewrow"
    assert plan.method_for(17) == "columns" and plan.method_for(31) == "columns"  # past the kernel's 16 rows
    assert plan.method_for(32) == "rows"
    with pytest.raises(ValueError, match="at most 16 rows"):
        LinearPlan(shape=(8, 8), methods=(), seconds=(), threads=1, buckets=((17, "fewrow"),))


def test_plans_of_asked_rows_are_shared_through_the_plan_file(tmp_path, monkeypatch):
    path = tmp_path / "plans.json"
    monkeypatch.setenv(linear.PLAN_FILE_ENV, str(path))
    monkeypatch.setattr(linear, "_PLANS", {})
    assert cached_plan((32, 16), [1, 5], repeats=1) is None
    first = tune_linear((32, 16), rows=[1, 5], repeats=1)
    (entry,) = json.loads(path.read_text()).values()
    assert [n for n, _ in entry["buckets"]] == [5] and len(entry["bucket_seconds"]) == 1
    monkeypatch.setattr(linear, "_PLANS", {})  # another process: read from the file
    again = cached_plan((32, 16), [1, 5], repeats=1)
    assert again == first and again.bucket_seconds == first.bucket_seconds


def test_tuning_rows_scopes_every_tuning_of_a_block(counted):
    net = torch.nn.Sequential(torch.nn.Linear(16, 24)).eval()
    with tuning_rows([1, 3]):
        assert current_rows() == (1, 3)
        plans = accelerate_linears(net, repeats=1, min_numel=0)
        head = dispatch_for(torch.randn(40, 16))
    assert current_rows() == DEFAULT_ROWS
    assert plans[(24, 16)].measured_rows == (1, 3) and head.plan.measured_rows == (1, 3)
    restore_linears(net)


def test_hf_target_tunes_the_rows_it_is_given(monkeypatch):
    monkeypatch.setattr(linear, "_PLANS", {})
    target = HFTarget(_tiny_llama(vocab=2100), linear_rows=[1, 2, 9])
    assert target.linear_plans and all(p.measured_rows == (1, 2, 9) for p in target.linear_plans.values())


def test_a_measured_tuning_says_what_how_long_and_where(monkeypatch, tmp_path):
    path = tmp_path / "plans.json"
    monkeypatch.setenv(linear.PLAN_FILE_ENV, str(path))
    monkeypatch.setattr(linear, "_PLANS", {})
    monkeypatch.setattr(linear, "expected_seconds", lambda *a: 5.0)  # as long as a real model's shapes
    monkeypatch.setattr(linear, "PROGRESS_S", 0.001)  # a heartbeat every millisecond
    net = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Linear(24, 16)).eval()
    lines: list[str] = []
    with tuning_log(lines.append):
        accelerate_linears(net, rows=[1, 2], repeats=1, min_numel=0)
    assert "Sequential: 2 weight shape(s) at 1-2 rows, about 10 s" in lines[0] and str(path) in lines[0]
    assert any("tuning the CPU linear layout of a 24 x 16 weight for 1-2 rows" in x and str(path) in x for x in lines)
    assert any(" row counts in " in x for x in lines)  # no silence longer than PROGRESS_S
    assert "tuned the CPU linear layouts of Sequential in" in lines[-1]
    lines.clear()
    with tuning_log(lines.append):
        accelerate_linears(net, rows=[1, 2], repeats=1, min_numel=0)  # cached: nothing measured, nothing said
    assert lines == []
    restore_linears(net)


def test_quick_tunings_are_silent(capsys):
    tune_linear((8, 8), rows=[1, 2], repeats=1, cache=False)
    assert capsys.readouterr().err == ""


def test_helpers():
    assert rows_up_to(1) == (1,) and rows_up_to(300)[-4:] == (96, 128, 192, 256)
    assert describe_rows(DEFAULT_ROWS) == "1-16, 24, 32, 48, 64"
    big, small = expected_seconds((49152, 576), DEFAULT_ROWS, 4, 5, 32 * 2**20), expected_seconds(
        (49152, 576), [1, 5], 4, 5, 32 * 2**20)
    assert big > 10 * small
    with pytest.raises(ValueError, match="int >= 1"):
        rows_up_to(0)


@pytest.mark.parametrize("module", ["specdec.kernels.tuning_scope", "specdec.kernels.linear"])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(importlib.import_module(module), verbose=False)
    assert tried > 0 and failures == 0


def test_one_long_row_count_is_not_silent(monkeypatch):
    # under load a single timed row count can outlast PROGRESS_S: the lines come from a thread
    real = linear._interleaved_min_seconds

    def slow(runs, repeats):
        time.sleep(0.2)
        return real(runs, repeats)

    monkeypatch.setattr(linear, "_interleaved_min_seconds", slow)
    monkeypatch.setattr(linear, "expected_seconds", lambda *a: 5.0)
    monkeypatch.setattr(linear, "PROGRESS_S", 0.05)
    lines: list[str] = []
    with tuning_log(lines.append):
        tune_linear((32, 16), rows=[3], repeats=1, cache=False)
    assert any("0 of 1 row counts in " in x for x in lines)
    assert "tuned in" in lines[-1]
