"""The bench's speedup bound (issue 48): Sequoia's hardware-aware model from the measured costs."""

from __future__ import annotations

import math

import pytest

from specdec.bench.bound import bound_lines, forward_curve, speedup_bound, tree_forward_time
from specdec.errors import InvalidConfigError


def test_the_bound_is_taus_share_of_the_step_cost():
    # a free draft and a tree forward as cheap as one token: the bound is tau
    assert speedup_bound(1.7, 0.03, 0.0, 0.03) == pytest.approx(1.7)
    # the CPU: tau 1.40, draft 2 x 6 ms, a 3-token forward 57.8 ms against 35.7 ms for one
    assert speedup_bound(1.40, 0.0357, 0.012, 0.0578) == pytest.approx(1.40 * 35.7 / 69.8)


@pytest.mark.parametrize("args, match", [
    ((1.4, 0.0, 0.01, 0.03), "t_one must be a positive finite time"),
    ((1.4, 0.03, -0.01, 0.03), "t_draft_step must be a finite time >= 0"),
    ((1.4, 0.03, 0.01, math.nan), "t_tree must be a positive finite time"),
    ((0.5, 0.03, 0.01, 0.03), "tau must be a finite number >= 1"),
])
def test_bad_costs_are_refused(args, match):
    with pytest.raises(InvalidConfigError, match=match):
        speedup_bound(*args)


def test_a_curve_that_was_not_measured_is_refused_not_guessed():
    assert forward_curve({"1": 0.03, "5": 0.04}) == {1: 0.03, 5: 0.04}
    with pytest.raises(InvalidConfigError, match="the forward of 5 tokens has no valid time"):
        forward_curve({"1": 0.03, "5": None})
    with pytest.raises(InvalidConfigError, match="the forward of 3 tokens has no valid time"):
        forward_curve({1: 0.03, 3: math.inf})
    with pytest.raises(InvalidConfigError, match="no one-token forward"):
        forward_curve({2: 0.03})
    with pytest.raises(InvalidConfigError, match="outside the measured forward sizes"):
        tree_forward_time({1: 0.03, 5: 0.04}, 9)
    assert tree_forward_time({1: 0.03, 5: 0.05}, 3) == pytest.approx(0.04)


def _rec(method, kind, t, **kw):
    base = {"method": method, "kind": kind, "temperature": t, "tau": 1.0, "speedup": 1.0, "new_tokens": 100,
            "target_forwards": 100, "time_total": 4.0, "time_draft": 0.0, "time_target": 3.6}
    return base | kw


def test_the_summary_lines_name_each_row_and_the_curve():
    records = [
        _rec("autoregressive", "autoregressive", 0.0),  # 40 ms per token
        _rec("sd", "speculative", 0.0, tau=1.5, speedup=0.9, target_forwards=50, time_draft=0.5, time_target=2.5),
        _rec("hf-assisted", "peer", 0.0, tau=1.4, speedup=1.0, time_draft=math.nan, time_target=math.nan),
    ]
    lines = bound_lines(records, {"1": 0.036, "3": 0.05})
    # sd: 10 ms draft + 50 ms target per step against 40 ms per baseline token: 1.5 * 40 / 60 = 1.00
    assert any("T=0 sd: tau 1.50, draft 0.25 + target 1.25 of t(1) per step -> bound 1.00x (measured 0.90x)" in x
               for x in lines), lines
    assert any("hf-assisted: transformers' loop has no time split" in x for x in lines)
    assert any("n=1: 1.00, n=3: 1.39" in x for x in lines)
    assert any("measured with --budget auto" in x for x in bound_lines(records, None))
    batched = records[:1] + [_rec("sd", "speculative", 0.0, tau=1.5, time_draft=None, time_target=None)]
    assert any("T=0 sd: no time split recorded" in x for x in bound_lines(batched, None))
    with pytest.raises(InvalidConfigError, match="no valid time"):
        bound_lines(records, {"1": 0.036, "3": -1.0})
