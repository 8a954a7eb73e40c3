"""min_p through the fused Triton kernel (issue 58, deliverable 3), under Triton's interpreter
(tests/kernels/conftest.py): a min_p row is not fused from the logits (its processed p is given,
as a top-p row's), in the same one launch as the other rows, and equals its batch-1 run."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingConfig
from specdec.kernels import verify_fused
from specdec.models.callable import CallableLM
from specdec.sampling import RowSampling, process_logits

pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")

V = 6
_g = torch.Generator().manual_seed(11)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # order 1: logits after token a = TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
PROMPTS = [[1, 2], [3], [4, 5, 0]]
SEEDS = [31, 32, 33]
CONFIGS = [SamplingConfig(temperature=0.7), SamplingConfig(temperature=1.0, min_p=0.4),
           SamplingConfig(temperature=1.3, top_k=4, min_p=0.2)]


def _lm(table: torch.Tensor) -> CallableLM:
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=V)


def test_min_p_rows_are_not_fused_from_the_logits():
    assert RowSampling.of(CONFIGS, 3).fused().tolist() == [True, False, False]


def test_min_p_rows_through_the_kernel_equal_their_batch_one_runs(monkeypatch):
    launches: list[int] = []
    original = verify_fused._kernels().launch_decisions

    def counted(*args, **kwargs):
        launches.append(args[0].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(verify_fused._kernels(), "launch_decisions", counted)

    def gen() -> specdec.SpeculativeGenerator:
        return specdec.SpeculativeGenerator(target=_lm(TARGET), draft=_lm(DRAFT), method="specinfer", kernel="triton",
                                            random="counter", expansion=(2, 1))

    out = gen().generate_batch(PROMPTS, 8, CONFIGS, SEEDS)
    assert len(launches) == out.steps  # one launch per step for every row
    for b, prompt in enumerate(PROMPTS):
        ref = gen().generate(prompt, 8, CONFIGS[b], seed=SEEDS[b])
        assert list(out.tokens[b]) == ref.tokens, (b, CONFIGS[b])
        context = prompt[-1:] + list(ref.tokens)
        for prev, tok in zip(context[:-1], context[1:]):
            assert process_logits(TARGET[prev], CONFIGS[b])[tok] > 0, (b, prev, tok)  # min_p's kept set only
