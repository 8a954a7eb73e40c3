"""The linear plans' timing (issue 48): interleaved, fastest call counts, robust to other processes."""

from __future__ import annotations

import itertools

import specdec.kernels.linear as linear


def test_methods_are_timed_interleaved_and_the_fastest_call_counts(monkeypatch):
    calls = []
    # a fake clock: each timed call of "a" takes 5 s except the third (1 s); "b" always 2 s (as if "a" were
    # preempted twice by another process: a median would crown "b", the minimum sees "a"'s own cost)
    durations = {"a": itertools.chain([5.0, 5.0, 1.0], itertools.repeat(5.0)), "b": itertools.repeat(2.0)}
    now = [0.0]
    monkeypatch.setattr(linear.time, "perf_counter", lambda: now[0])

    def run(name):
        def fn():
            calls.append(name)
            now[0] += next(durations[name])
        return fn

    best = linear._interleaved_min_seconds({"a": run("a"), "b": run("b")}, repeats=3)
    # round 1: each warmed up and timed (a, a, b, b), then the rounds alternate
    assert calls == ["a", "a", "b", "b", "a", "b", "a", "b"]
    assert best == {"a": 1.0, "b": 2.0}


def test_plans_timed_otherwise_are_not_reused():
    assert linear.PLAN_TIMING in linear._file_key(((8, 4), 2, ("rows",), 1, ()), 3)
