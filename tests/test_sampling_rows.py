"""Per-row sampling as tensors (specdec.sampling.process_logits_rows): every row equals
process_logits of its own configuration bit for bit, ties included."""

from __future__ import annotations

import pytest
import torch

from specdec.sampling import (
    RowSampling,
    SamplingConfig,
    process_logits,
    process_logits_rows,
    top_k_logit_threshold,
    top_k_logit_threshold_rows,
)
from tests.engine._per_row import CONFIGS


def _logits(vocab: int, nodes: int, dtype: torch.dtype, ties: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(CONFIGS), nodes, vocab, generator=g, dtype=torch.float64) * 3
    if ties:  # few distinct values: ties at the top-k and top-p cuts and at the argmax
        x = x.round()
    x[0, 0, : vocab // 2] = float("-inf")  # banned tokens
    return x.to(dtype)


@pytest.mark.parametrize("vocab", [7, 40, 1500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("ties", [False, True])
def test_rows_equal_their_own_config(vocab: int, dtype: torch.dtype, ties: bool) -> None:
    logits = _logits(vocab, 3, dtype, ties, seed=vocab)
    rows = RowSampling.of(CONFIGS, len(CONFIGS))
    p = process_logits_rows(logits, rows)
    for b, config in enumerate(CONFIGS):
        alone = process_logits(logits[b], config, check=False)
        assert p.dtype == alone.dtype
        assert torch.equal(p[b], alone), (b, config)


@pytest.mark.parametrize("order", [[3, 0, 5, 3], [1, 1, 2, 2], [6, 4, 0, 7]])
def test_any_mix_of_rows(order: list[int]) -> None:
    configs = [CONFIGS[i] for i in order]
    logits = _logits(300, 2, torch.float32, True, seed=sum(order))[: len(order)]
    p = process_logits_rows(logits, RowSampling.of(configs, len(configs)))
    for b, config in enumerate(configs):
        assert torch.equal(p[b], process_logits(logits[b], config, check=False))


@pytest.mark.parametrize("ties", [False, True])
def test_top_k_thresholds_per_row(ties: bool) -> None:
    logits = _logits(50, 3, torch.float32, ties, seed=3)
    rows = RowSampling.of(CONFIGS, len(CONFIGS))
    got = top_k_logit_threshold_rows(logits.reshape(-1, 50), rows, 3).view(len(CONFIGS), 3)
    for b, config in enumerate(CONFIGS):
        want = (top_k_logit_threshold(logits[b], config) if not config.greedy
                else torch.full((3,), float("-inf")))
        assert torch.equal(got[b], want), (b, config)


def test_uniform_rows_are_process_logits() -> None:
    logits = _logits(20, 2, torch.float32, False, seed=1)
    config = SamplingConfig(temperature=0.7, top_p=0.9)
    assert torch.equal(process_logits_rows(logits, RowSampling.of(config, len(CONFIGS))),
                       process_logits(logits, config, check=False))
