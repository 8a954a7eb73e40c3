"""Issue 57: ``specdec bench`` tunes the CPU linear layouts for the row counts the run uses,
and the tuner's progress lines go into the bench's own log.

A one-row run tunes the default counts (1-16, 24-64); a batched run (``--batch-size B``)
tunes up to ``B x 65`` rows, as its batched tree forwards reach them.
"""

from __future__ import annotations

import pytest

from specdec import cli
from specdec.bench import auto_budget
from specdec.bench import models as bench_models
from specdec.bench.budget import Budget
from specdec.kernels.tuning_scope import DEFAULT_ROWS, current_rows, rows_up_to, say


class _Stop(Exception):
    pass


@pytest.fixture
def seen(monkeypatch):
    """What the tuning scope was while the bench loaded its models (the load stops the run there)."""
    rows: list[tuple[int, ...]] = []

    def fake_load(*args, **kwargs):
        rows.append(current_rows())
        say("tuning the CPU linear layouts of FakeModel")  # as accelerate_linears would
        raise _Stop

    monkeypatch.setattr(bench_models, "load_bench_models", fake_load)
    return rows


@pytest.mark.parametrize(("flags", "want"), [
    ([], DEFAULT_ROWS),
    (["--budget", "4"], DEFAULT_ROWS),
    (["--batch-size", "4"], rows_up_to(4 * 65)),
])
def test_the_bench_tunes_the_rows_its_forwards_carry(seen, capsys, flags, want):
    with pytest.raises(_Stop):
        cli.main(["bench", "--methods", "sd", "--temperatures", "0", *flags])
    assert seen == [want]
    err = capsys.readouterr().err
    assert "specdec bench [" in err and "tuning the CPU linear layouts of FakeModel" in err
    assert "specdec: tuning" not in err  # in the bench's log, not as a bare stderr line


def test_linear_rows():
    assert auto_budget.linear_rows("auto") == DEFAULT_ROWS
    assert auto_budget.linear_rows(Budget(100, 6)) == rows_up_to(101)
    assert auto_budget.linear_rows(Budget(4, 2), 2) == DEFAULT_ROWS
