"""Issue 57 (item 19): a bench whose output is not a terminal (a pipe, a CI log) still prints a progress
line at least every 10 s during the sweep; rich's bar renders only its final state there."""

from __future__ import annotations

import io

from rich.console import Console

from specdec.bench.session import PlainProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_pipe_gets_a_line_every_ten_seconds():
    out, clock = io.StringIO(), Clock()
    plain = PlainProgress(Console(file=out, force_terminal=False), every=10.0, clock=clock)
    for second in range(1, 36):
        clock.now = float(second)
        plain.tick("rheo T=1 prompt 3/6", second, 96)
    lines = out.getvalue().splitlines()
    assert lines == ["rheo T=1 prompt 3/6 10/96 generations", "rheo T=1 prompt 3/6 20/96 generations",
                     "rheo T=1 prompt 3/6 30/96 generations"]


def test_a_terminal_gets_no_extra_lines():
    out, clock = io.StringIO(), Clock()
    plain = PlainProgress(Console(file=out, force_terminal=True), every=10.0, clock=clock)
    clock.now = 100.0
    plain.tick("warm-up", 1, 2)
    assert out.getvalue() == ""
