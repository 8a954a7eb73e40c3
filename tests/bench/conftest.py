"""Fixtures of the ``specdec bench`` tests (helpers live in ``bench_helpers``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
# the test modules import ``bench_helpers`` whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_helpers import WORDS, save_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """Folders: ``target`` (2 layers), ``draft`` (1 layer, other weights),
    ``bad_vocab`` (a draft over 50 tokens), ``prompts`` (a text prompt file)."""
    root = tmp_path_factory.mktemp("bench_models")
    dirs = {
        "target": save_model(root / "target", seed=0, layers=2),
        "draft": save_model(root / "draft", seed=1, layers=1),
        "bad_vocab": save_model(root / "bad_vocab", seed=2, layers=1, vocab=50, tokenizer=False),
    }
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(5 + i)) for i in range(4)) + "\n")
    dirs["prompts"] = prompts
    return dirs


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if any model is loaded or any benchmark runs."""
    from specdec.bench import runner as bench_runner

    def boom(*a, **k):
        raise AssertionError("long work started before the input was validated")

    monkeypatch.setattr("specdec.bench.models.load_bench_models", boom)
    monkeypatch.setattr(bench_runner, "run_bench", boom)
