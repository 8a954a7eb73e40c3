"""docs/serving.md, "Your own runner, end to end": the loop an engine writes around its own
draft and target runners, run as printed, reads the device at most twice per step (counted:
host reads of tensors outside the toy models), and is at most 40 lines of public API."""

from __future__ import annotations

import re
from pathlib import Path

from specdec.testing.counter import StepCounter

PAGE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


def own_runner_block() -> str:
    match = re.search(r"<!-- own-runner -->\n```python\n(.*?)^```", PAGE.read_text(), re.DOTALL | re.MULTILINE)
    assert match, "docs/serving.md lost its own-runner example"
    return match.group(1)


def test_the_loop_reads_the_device_at_most_twice_per_step():
    scope: dict = {}
    with StepCounter(ops=False) as counter:
        exec(compile(own_runner_block(), str(PAGE), "exec"), scope)
    reads = sum(k for (kind, _site), k in counter.sync_sites["step"].items() if kind == "read")
    assert reads / scope["steps"] <= 2, counter.report()
    assert all(len(seq) > 3 for seq in scope["sequences"])  # every row made progress


def test_the_loop_is_at_most_40_lines_of_public_api():
    lines = [line for line in own_runner_block().splitlines() if line.strip()]
    body = [line for line in lines if not line.startswith(("import ", "from "))]
    toy = [line for line in body if "table" in line.split("=")[0] or line.startswith(("V =", "g ="))]
    assert len(body) - len(toy) <= 40, len(body) - len(toy)
