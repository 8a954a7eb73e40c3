"""Issue 57, item 20: the README's quick examples each run on their own, and its first command
says where its output goes.

``tests/test_docs_examples.py`` runs a page's python blocks concatenated, which hid that the
verifier example used ``specdec``, ``torch`` and ``sampling`` from the first one: a reader
pasting it alone got a NameError.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_docs_examples import python_blocks

ROOT = Path(__file__).resolve().parents[1]


def test_the_verifier_example_runs_alone():
    blocks = python_blocks("README.md")
    verifier = [b for b in blocks if 'get("verifier"' in b]
    assert len(verifier) == 1
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", verifier[0]], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("(")  # the accepted tokens, then the bonus


def test_the_readme_says_the_first_command_writes_no_file_and_how_to_keep_results():
    notes = (ROOT / "README.md").read_text().split("Notes:", 1)[1].split("## The command line", 1)[0]
    assert "writes no file" in " ".join(notes.split())
    assert "specdec bench --out" in " ".join(notes.split())
