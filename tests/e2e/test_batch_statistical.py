"""Batched speculative generation is lossless per row (issue 15): rows of
different prompts and seeds decoded together, each row's first tokens
compared with the target's exact law by a seeded chi-square test; a broken
variant (a row scored with another row's context) is caught."""

from __future__ import annotations

import pytest

from specdec import SamplingConfig, SpeculativeGenerator
from specdec.testing import MarkovLM, chi_square_test

from .test_statistical import ALPHA, NUM_TOKENS, SAMPLINGS, SMALL_OPTIONS, make_models

ROWS = [[0, 1], [2, 3], [3, 0, 2]]  # ragged prompts (order-2 models: at least 2 tokens), one row each
CALLS = 1200  # batched generations; each gives one sample per row


def sample_rows(gen: SpeculativeGenerator, sampling: SamplingConfig) -> list[list[tuple[int, ...]]]:
    samples: list[list[tuple[int, ...]]] = [[] for _ in ROWS]
    for call in range(CALLS):
        out = gen.generate_batch(ROWS, NUM_TOKENS, sampling, seeds=[call * len(ROWS) + b for b in range(len(ROWS))])
        for b, tokens in enumerate(out.tokens):
            samples[b].append(tuple(tokens))
    return samples


@pytest.mark.parametrize("method", ["eagle2", "rheo", "sd", "specinfer", "sequoia"])  # level-wise and shaped builders
def test_every_row_of_a_batch_is_lossless(method: str) -> None:
    sampling = SAMPLINGS["T0.6-topk3-topp0.9"]
    target, draft = make_models()
    gen = SpeculativeGenerator(target=target, draft=draft, method=method, **SMALL_OPTIONS[method])
    for b, samples in enumerate(sample_rows(gen, sampling)):
        law = target.joint_law(ROWS[b], NUM_TOKENS, sampling)
        result = chi_square_test(samples, law)
        assert result.unexpected == 0, f"{method} row {b} emitted a sequence of probability 0"
        assert result.p_value > ALPHA, f"{method} row {b}: chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"


class _RowLeak(MarkovLM):
    """BROKEN: scores row b's tree with the context of row b - 1 (rows leaking into each other)."""

    def _rows_contexts(self, b: int) -> list[int]:
        assert self.target_rows is not None
        return self.target_rows[b - 1]


def test_the_harness_catches_a_row_that_sees_another_rows_context() -> None:
    sampling = SAMPLINGS["T0.6-topk3-topp0.9"]
    target, draft = make_models()
    leaky = _RowLeak(target.table)
    gen = SpeculativeGenerator(target=leaky, draft=draft, method="eagle2", **SMALL_OPTIONS["eagle2"])
    samples = sample_rows(gen, sampling)
    p_values = [chi_square_test(samples[b], target.joint_law(ROWS[b], NUM_TOKENS, sampling)).p_value for b in range(len(ROWS))]
    assert min(p_values) < 1e-6, p_values
