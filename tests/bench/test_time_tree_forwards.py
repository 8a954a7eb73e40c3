"""Issue 57: ``--budget auto``'s forward timing prefills once and says how far it is.

It used to prefill the profile prompt before each of its 78 timed forwards (13 tree sizes x 6
rounds), silently: minutes on a loaded 2-core CPU with no line between "timing target
forwards" and the next phase.
"""

from __future__ import annotations

import doctest

import pytest
import torch
import transformers

from specdec.bench import auto_budget, forward_timing
from specdec.bench.auto_budget import time_tree_forwards
from specdec.errors import ContextOverflowError, InvalidConfigError, MeasurementError
from specdec.models import CallableLM
from specdec.targets.hf import HFTarget


def _target() -> HFTarget:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return HFTarget(transformers.LlamaForCausalLM(cfg).eval(), cpu_linear=False)


class _Clock:
    """A clock that moves only during a forward: the n-th forward scored lasts ``durations[n]``."""

    def __init__(self, durations):
        self.durations, self.now = list(durations), 0.0

    def __call__(self) -> float:
        return self.now

    def forward(self, prefixes):
        self.now += self.durations.pop(0)
        return torch.zeros(len(prefixes), 6)


def _count_prefills(target, monkeypatch) -> list[int]:
    calls: list[int] = []
    real = target.prefill

    def spy(prompt):
        calls.append(len(prompt))
        real(prompt)

    monkeypatch.setattr(target, "prefill", spy)
    return calls


def test_an_hf_target_is_prefilled_once(monkeypatch):
    target = _target()
    prefills = _count_prefills(target, monkeypatch)
    times = time_tree_forwards(target, [3, 4, 5, 6], [1, 2, 5], repeats=2, warmup=1)
    assert sorted(times) == [1, 2, 5] and all(t > 0 for t in times.values())
    assert prefills == [4]  # not 9 (one per forward)


def test_a_target_that_does_not_rescore_is_prefilled_before_every_forward(monkeypatch):
    lm = CallableLM(lambda p: torch.zeros(len(p), 6), vocab_size=6)
    prefills = _count_prefills(lm, monkeypatch)
    time_tree_forwards(lm, [1, 2], [1, 3], repeats=2, warmup=1)
    assert len(prefills) == 6


def test_a_rescored_tree_gives_the_logits_of_a_fresh_prefill():
    # what makes one prefill enough: scoring again before accept discards the previous tree
    target = _target()
    chain = forward_timing._chain([3, 4, 5, 6], 4, 50)
    short = forward_timing._chain([3, 4, 5, 6], 2, 50)
    target.prefill([3, 4, 5, 6])
    fresh = target.score_tree(chain)
    target.score_tree(short)
    again = target.score_tree(chain)
    assert torch.equal(fresh, again)


def test_the_fastest_round_counts_and_every_round_is_reported():
    clock = _Clock([9, 9, 3, 7, 2, 8])
    lm = CallableLM(clock.forward, vocab_size=6)
    lines: list[str] = []
    # rounds: warm-up (9, 9), then (3, 7), (2, 8): size 1 -> 2, size 3 -> 7
    got = time_tree_forwards(lm, [1, 2], [3, 1], repeats=2, warmup=1, log=lines.append, clock=clock)
    assert got == {1: 2.0, 3: 7.0}
    assert len(lines) == 3 and "2 tree sizes (1-3 tokens): round 1 of 3 in 18 s, about 36 s left" in lines[0]
    assert lines[-1].endswith("round 3 of 3 in 38 s")


def test_bad_input_and_a_failing_forward_are_clear_errors():
    lm = CallableLM(lambda p: torch.zeros(len(p), 6), vocab_size=6)
    with pytest.raises(InvalidConfigError, match="repeats"):
        time_tree_forwards(lm, [1], [1], repeats=0)
    with pytest.raises(InvalidConfigError, match="non-empty prompt"):
        time_tree_forwards(lm, [], [1])
    with pytest.raises(InvalidConfigError, match="tree sizes"):
        time_tree_forwards(lm, [1], [0, 2])
    with pytest.raises(ContextOverflowError, match="max_length 64"):
        time_tree_forwards(_target(), [1] * 60, [1, 9])

    def broken(prefixes):
        if len(prefixes) > 2:
            raise RuntimeError("out of memory")
        return torch.zeros(len(prefixes), 6)

    with pytest.raises(MeasurementError, match="3-token tree"):
        time_tree_forwards(CallableLM(broken, vocab_size=6), [1, 2], [1, 3], repeats=1)


def test_auto_budget_exports_it():
    assert "time_tree_forwards" in auto_budget.__all__


def test_docstring_examples():
    failures, tried = doctest.testmod(forward_timing, verbose=False)
    assert tried > 0 and failures == 0
