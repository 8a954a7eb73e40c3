"""benchmarks/paired_speed.py: the paired throughput ratio of two bench rows and its interval."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def paired():
    spec = importlib.util.spec_from_file_location("paired_speed", ROOT / "benchmarks" / "paired_speed.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _records(speed_a: list[float], speed_b: list[float], temperature: float = 0.0) -> list[dict]:
    out = []
    for prompt, (sa, sb) in enumerate(zip(speed_a, speed_b)):
        for row, speed in (("a", sa), ("b", sb), ("autoregressive", 1.0)):
            out.append({"row": row, "temperature": temperature, "prompt_index": prompt, "seed": 0,
                        "new_tokens": 40, "time_total": 40 / speed})
    return out


def test_ratio_and_interval(paired, tmp_path):
    recs = _records([20.0] * 8, [25.0] * 8) + _records([30.0, 10.0] * 4, [20.0, 20.0] * 4, temperature=1.0)
    (tmp_path / "runs.jsonl").write_text("\n".join([json.dumps({"format": "specdec-bench-runs"})] + [json.dumps(r) for r in recs]))
    table = paired.paired_ratio(paired.load_units(tmp_path), "a", "b")
    assert table[0.0]["ratio"] == pytest.approx(0.8) and table[0.0]["low"] == pytest.approx(0.8) == table[0.0]["high"]
    # T = 1: throughput is tokens over summed seconds (80 tokens in 40/30 + 40/10 s), not a mean of speeds
    assert table[1.0]["tok_s_a"] == pytest.approx(80 / (40 / 30 + 4))
    assert table[1.0]["low"] < table[1.0]["ratio"] < table[1.0]["high"]
    assert "| 0 | 8 | 20.0 | 25.0 | 0.800 | [0.800, 0.800] |" in paired.render(table, "a", "b", tmp_path)


def test_unpaired_or_missing_rows_are_refused(paired):
    recs = _records([20.0] * 3, [25.0] * 3)
    with pytest.raises(ValueError, match="different units"):
        paired.paired_ratio([r for r in recs if not (r["row"] == "b" and r["prompt_index"] == 2)], "a", "b")
    with pytest.raises(ValueError, match="no records"):
        paired.paired_ratio(recs, "x", "y")
