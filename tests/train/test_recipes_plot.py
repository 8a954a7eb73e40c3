"""Training-curve plots of chained phases (``python -m specdec.train.recipes --plot --plot-before``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.train.recipes import chained_metrics, main


def _write_run(run: Path, name: str, steps: list[int], acc: float) -> None:
    run.mkdir(parents=True)
    rows = [{"step": s, "loss": 1.0 / s, "acc": acc, "acc2": acc / 2} for s in steps]
    (run / f"{name}.metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_chained_metrics_offsets_each_phase(tmp_path):
    _write_run(tmp_path / "a", "eagle3", [1, 2, 3], 0.1)
    (tmp_path / "a" / "eagle2.metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 1.0, "acc": 0.2}) + "\n")
    _write_run(tmp_path / "b", "eagle3", [1, 2], 0.3)
    # a resumed phase re-logs steps after its last checkpoint: the latest row of a step wins
    with (tmp_path / "b" / "eagle3.metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "loss": 9.0, "acc": 0.9}) + "\n")
    curves, boundaries = chained_metrics([tmp_path / "a", tmp_path / "b"])
    assert boundaries == [5]  # phase a ends at its last logged step (eagle2's step 5)
    assert [r["step"] for r in curves["eagle3"]] == [1, 2, 3, 6, 7]
    assert [r["acc"] for r in curves["eagle3"]] == [0.1, 0.1, 0.1, 0.3, 0.9]
    assert [r["step"] for r in curves["eagle2"]] == [5]
    one, none = chained_metrics([tmp_path / "b"])
    assert [r["step"] for r in one["eagle3"]] == [1, 2] and none == []


def test_chained_metrics_rejects_a_folder_without_metrics(tmp_path):
    _write_run(tmp_path / "a", "eagle3", [1], 0.1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a training run folder"):
        chained_metrics([tmp_path / "empty", tmp_path / "a"])


def test_plot_cli_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _write_run(tmp_path / "a", "eagle3", list(range(1, 60)), 0.1)
    _write_run(tmp_path / "b", "eagle3", list(range(1, 40)), 0.3)
    png = tmp_path / "curves.png"
    assert main(["--out", str(tmp_path / "b"), "--plot", str(png), "--plot-before", str(tmp_path / "a")]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(png) in capsys.readouterr().out
