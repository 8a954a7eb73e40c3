"""``benchmarks/rheo_policy_table.py``: the default policy's rule (docs/trees.md, "Default policy"), on synthetic
tuning logs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module():
    spec = importlib.util.spec_from_file_location("rheo_policy_table", ROOT / "benchmarks" / "rheo_policy_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


M = module()


def write_log(folder: Path, taus: dict[str, list[float]], *, drop: int = 0) -> Path:
    """A tuning log at T = 1: per row, tau per prompt (2 seeds each, the same tau), 20 target forwards each."""
    folder.mkdir(parents=True)
    records = [{"row": row, "temperature": 1.0, "prompt_index": p, "seed": s, "emitted": int(round(t * 20)), "steps": 20}
               for row, ts in taus.items() for p, t in enumerate(ts) for s in (0, 1)]
    header = {"config": {"target": "smollm2", "prompts": {"count": 7}, "temperatures": [1.0], "seeds": [0, 1]},
              "resolved": {"expected_runs": len(records)}}
    lines = [header, *records[: len(records) - drop]]
    (folder / "runs.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    return folder


BASE = [2.0, 2.2, 1.8, 2.1, 1.9, 2.0, 2.3]


def decisions(folder):
    out = folder.parent / "out.json"
    assert M.main([str(folder), "--json", str(out)]) == 0
    return {(d["method"], d["table_free"]): d for d in json.loads(out.read_text())}


def test_a_candidate_replaces_the_standing_default_only_when_clearly_ahead(tmp_path):
    taus = {"rheo": BASE,
            "rheo[M=8192]": [t * 1.1 for t in BASE],  # ahead on every prompt: chosen
            "rheo[K=16,B=16]": [t * 1.3 for t in BASE],  # a shape ablation: never a candidate
            "sampled-dynamic": BASE,
            "sampled-dynamic[M=8192]": [t * (1.2 if i % 2 else 0.85) for i, t in enumerate(BASE)],  # best, unclear
            "sampled-dynamic[proxy=calibrated]": [t * 1.25 for t in BASE]}  # clearly ahead, needs a table
    got = decisions(write_log(tmp_path / "a", taus))
    rheo = got[("rheo", False)]
    assert rheo["best"] == rheo["chosen"] == "rheo[M=8192]" and "rheo[K=16,B=16]" not in rheo["candidates"]
    assert rheo["best_over_standing"][0] == pytest.approx(1.1, abs=0.01) and rheo["best_over_standing"][1] > 1
    sd = got[("sampled-dynamic", False)]
    assert sd["chosen"] == "sampled-dynamic[proxy=calibrated]"
    free = got[("sampled-dynamic", True)]  # no table: the calibrated row is out; the best left is not clearly ahead
    assert free["best"] == "sampled-dynamic[M=8192]" and free["best_over_standing"][1] <= 1
    assert free["chosen"] == "sampled-dynamic"


def test_the_rule_decides_on_a_complete_run_only(tmp_path, capsys):
    folder = write_log(tmp_path / "a", {"rheo": BASE, "rheo[M=8192]": BASE, "sampled-dynamic": BASE}, drop=3)
    with pytest.raises(SystemExit, match="the rule decides on the complete tuning run only"):
        M.main([str(folder)])
    assert M.main([str(folder), "--partial"]) == 0
    assert "no decision (partial run)" in capsys.readouterr().out
