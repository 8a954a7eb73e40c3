"""logit_bias and the penalties exact through every registered method (issue 58, deliverable 3).

Exact enumeration (``specdec.testing.exact_law``), as tests/e2e/test_logits_processors.py does for
the transformers processors: every registered method's real generation loop
(:func:`specdec.engine.run_rows`, the builder's and the verifier's every draw enumerated, steps
chained inside one enumeration, the context growing by the emitted tokens) gives the law of the
first two tokens, which must equal the law of autoregressive decoding with the same processor
(called on the sequence so far) on the order-2 toy target over ``V = 4``:

- :class:`~specdec.logit_bias.LogitBias` at ``T = 1`` and at ``T = 0.7`` (the bias goes on the
  raw logits, before temperature);
- :class:`~specdec.penalties.OutputPenalties` (presence and frequency) after transformers'
  ``RepetitionPenaltyLogitsProcessor``, at ``T = 1``.

The enumeration is multi-token and history dependent (the second token's law reads the
processed row of an accepted depth-1 node, whose history holds its own token), so no per-step
shortcut is needed. Power: each processor moves the law, and two broken variants fail the same
check: the penalties computed from the committed history only (every node's path ignored), and
the bias added after temperature.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import specdec.processors as processors_module
from specdec.engine import run_rows
from specdec.logit_bias import LogitBias
from specdec.methods import compose, resolve_method
from specdec.registry import get, list_registered
from specdec.sampling import SamplingConfig
from specdec.penalties import OutputPenalties
from specdec.testing import exact_law
from tests.e2e.test_logits_processors import PROMPT, deviation, models, processed_law

EXACT = 1e-9
NUM_TOKENS = 2
T1 = SamplingConfig(temperature=1.0)
T07 = SamplingConfig(temperature=0.7)
BIAS = {2: 1.5, 0: -1.0}
METHODS = list_registered("method")
# Smaller trees than the first example options where those take tens of seconds to enumerate;
# still more than one child at the root and a depth-1 node whose row the bonus reads.
OPTIONS = {
    "specinfer": {"expansion": (2,), "mode": "iid"},
    "sampled-dynamic": {"K": 2, "B": 1, "depth": 2, "N": 2, "M": 2},
}


def method_parts(name: str):
    method = resolve_method(name)
    options = OPTIONS.get(name, dict(get("tree", method.tree).example_options[0]))
    return compose(method.tree, method.verifier, options)


def law_of(name: str, processor, sampling: SamplingConfig) -> dict:
    """The first ``NUM_TOKENS`` tokens' exact law through the method's generation loop (the draft
    proposes the target's two largest logits per row, so depth-1 nodes are accepted)."""
    target, draft = models(draft_is_target=True)
    builder, verifier = method_parts(name)

    def program(rng):
        reports = run_rows(target, draft, builder, verifier, [list(PROMPT)], sampling, [rng],
                           max_new_tokens=NUM_TOKENS, logits_processor=processor)
        return tuple(t for report in reports for t in report.kept[0])

    law = exact_law(program)
    assert abs(math.fsum(law.values()) - 1.0) < 1e-9
    return law


def reference(processor, sampling: SamplingConfig) -> dict:
    target, _ = models(draft_is_target=True)
    return processed_law(target, processor, sampling, NUM_TOKENS)


def penalties() -> LogitsProcessorList:
    return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5),
                                OutputPenalties(len(PROMPT), presence=0.8, frequency=0.6)])


class BiasAfterTemperature:
    """Broken variant: the bias added to ``logits / T`` instead of ``logits`` (``bias * T`` on the
    raw logits), at ``T = 0.7``."""

    def __init__(self, temperature: float) -> None:
        self.inner = LogitBias({t: b * temperature for t, b in BIAS.items()})

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids, scores)


def committed_only(context: torch.Tensor, paths: torch.Tensor, depth: int) -> torch.Tensor:
    """Broken variant: every node processed with the committed context alone (its path ignored)."""
    return context.view(1, -1).expand(paths.shape[0], -1)


def test_the_processors_move_the_law():
    plain = reference(lambda ids, s: s, T1)
    assert deviation(reference(LogitBias(BIAS), T1), plain) > 0.05
    assert deviation(reference(penalties(), T1), plain) > 0.05
    assert deviation(reference(BiasAfterTemperature(0.7), T07), reference(LogitBias(BIAS), T07)) > 0.01


@pytest.mark.parametrize("sampling", [T1, T07], ids=["T1", "T0.7"])
@pytest.mark.parametrize("method", METHODS)
def test_logit_bias_is_exact(method, sampling):
    got = law_of(method, LogitBias(BIAS), sampling)
    assert deviation(got, reference(LogitBias(BIAS), sampling)) < EXACT


@pytest.mark.parametrize("method", METHODS)
def test_penalties_are_exact(method):
    got = law_of(method, penalties(), T1)
    assert deviation(got, reference(penalties(), T1)) < EXACT


@pytest.mark.parametrize("method", ["sd", "rheo"])
def test_bias_after_temperature_is_caught(method):
    got = law_of(method, BiasAfterTemperature(0.7), T07)
    assert deviation(got, reference(LogitBias(BIAS), T07)) > 0.01


@pytest.mark.parametrize("method", METHODS)
def test_penalties_from_the_committed_history_only_are_caught(method, monkeypatch):
    want = reference(penalties(), T1)
    monkeypatch.setattr(processors_module, "node_contexts", committed_only)
    assert deviation(law_of(method, penalties(), T1), want) > 1e-3
