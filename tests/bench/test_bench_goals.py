"""What `specdec bench` prints: the goal lines (specdec.bench.report.goal_summary / goal_lines) and the results table."""

from __future__ import annotations

from specdec.bench.report import goal_lines, goal_summary


def _rec(method: str, t: float, tau: float, speedup: float, nodes: int, draft: str = "eagle3") -> dict:
    return {"method": method, "base_method": method, "kind": "speculative", "draft": draft, "temperature": t,
            "tau": tau, "tau_stderr": 0.02, "speedup": speedup, "budget_nodes": nodes}


def test_goals_met_and_not_met():
    recs = [_rec("eagle3", 1.0, 1.40, 0.9, 4), _rec("rheo", 1.0, 1.60, 0.95, 4),
            _rec("eagle3", 0.0, 1.50, 1.05, 4), _rec("rheo", 0.0, 1.50, 1.04, 4)]
    lines = goal_lines(goal_summary(recs))
    assert any("ratio 1.143 (goal >= 1.10: met)" in line for line in lines)
    assert any("z = 0.00 (within noise)" in line for line in lines)
    assert any("best speedup 1.05x (eagle3) (goal > 1.0: met)" in line for line in lines)
    recs[1] = _rec("rheo", 1.0, 1.45, 0.95, 4)
    recs[2] = _rec("eagle3", 0.0, 1.50, 0.97, 4)
    recs[3] = _rec("rheo", 0.0, 1.30, 0.96, 4)
    lines = goal_lines(goal_summary(recs))
    assert any("(goal >= 1.10: NOT met)" in line for line in lines)
    assert any("NOT within noise" in line for line in lines)
    assert any("(goal > 1.0: NOT met)" in line for line in lines)


def test_one_node_budget_does_not_test_the_rheo_goal():
    recs = [_rec("eagle3", 1.0, 1.29, 1.0, 1), _rec("rheo", 1.0, 1.25, 1.0, 1)]
    (line,) = [x for x in goal_lines(goal_summary(recs)) if x.startswith("T=1: rheo")]
    assert "not tested at a 1-node budget" in line and "NOT met" not in line


def test_the_results_table_prints_row_names_with_options_whole():
    # "[m=10,proxy=calibrated]" looks like rich markup; printed as markup it vanished and two
    # rows read "rheo".
    from rich.console import Console

    from specdec.bench.report import results_table

    recs = [dict(_rec(name, 1.0, 1.8, 0.2, 60), tokens_per_s=2.0, target_forwards=10, new_tokens=18,
                 acceptance_by_depth=[0.5], matches_autoregressive=None)
            for name in ("rheo", "rheo[m=10,proxy=calibrated]", "[bold]x")]
    console = Console(record=True, width=400)
    console.print(results_table(recs))
    text = console.export_text()
    assert "rheo[m=10,proxy=calibrated]" in text and "[bold]x" in text
