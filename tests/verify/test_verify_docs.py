"""Every Python example in docs/verifiers.md runs (so the page stays correct)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "verifiers.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S) if DOC.exists() else []


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 7


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, capsys) -> None:
    exec(compile(BLOCKS[index], f"{DOC.name}[example {index}]", "exec"), {"__name__": "__doc_example__"})


@pytest.mark.parametrize("module", ["greedy", "match", "rejection", "mixed", "kseq", "residual", "traversal"])
def test_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    mod = importlib.import_module(f"specdec.verify.{module}")
    failures, tried = doctest.testmod(mod, verbose=False)
    assert tried > 0 and failures == 0
