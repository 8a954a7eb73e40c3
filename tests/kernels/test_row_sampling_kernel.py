"""Per-row sampling through the fused Triton kernel (issue 56, deliverable 3), under Triton's
interpreter (``TRITON_INTERPRET=1``, tests/kernels/conftest.py): a batch of 4 rows with 4
sampling configurations (greedy, a temperature, temperature + top-k, temperature + top-p) runs
with ``kernel="triton"`` in one launch per step, each row equal to its batch-1 run."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingConfig
from specdec.kernels import verify_fused
from specdec.models.callable import CallableLM

pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")

V = 6
_g = torch.Generator().manual_seed(11)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # order 1: logits after token a = TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
PROMPTS = [[1, 2], [3], [4, 5, 0], [2]]
SEEDS = [31, 32, 33, 34]
CONFIGS = [
    SamplingConfig(temperature=0.0),  # greedy: p given (one-hot)
    SamplingConfig(temperature=0.7),  # logits mode
    SamplingConfig(temperature=1.3, top_k=3),  # logits mode with a top-k threshold
    SamplingConfig(temperature=0.9, top_p=0.8),  # p given (top-p)
]
NEW = 8


def _lm(table: torch.Tensor) -> CallableLM:
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=V)


def _generator(method: str) -> specdec.SpeculativeGenerator:
    options = {"rheo": {"K": 2, "m": 1, "depth": 2, "N": 4}, "specinfer": {"expansion": (2, 1)}}[method]
    return specdec.SpeculativeGenerator(target=_lm(TARGET), draft=_lm(DRAFT), method=method, kernel="triton",
                                        random="counter", **options)


@pytest.mark.parametrize("method", ["rheo", "specinfer"])
def test_mixed_rows_run_through_the_kernel_each_equal_to_its_batch_one_run(method, monkeypatch):
    launches: list[int] = []
    original = verify_fused._kernels().launch_decisions

    def counted(*args, **kwargs):
        launches.append(args[0].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(verify_fused._kernels(), "launch_decisions", counted)
    out = _generator(method).generate_batch(PROMPTS, NEW, CONFIGS, SEEDS)
    assert len(launches) == out.steps  # one launch per step for every row, whatever their configurations
    single = _generator(method)
    for b, prompt in enumerate(PROMPTS):
        ref = single.generate(prompt, NEW, CONFIGS[b], seed=SEEDS[b])
        assert list(out.tokens[b]) == ref.tokens, (method, b, CONFIGS[b])


def test_mixed_rows_differ_from_one_configuration():
    """Power: the rows' own configurations are what the kernel applies (not row 0's for all)."""
    mixed = _generator("rheo").generate_batch(PROMPTS, NEW, CONFIGS, SEEDS)
    shared = _generator("rheo").generate_batch(PROMPTS, NEW, [CONFIGS[1]] * 4, SEEDS)
    assert mixed.tokens[1] == shared.tokens[1]
    assert sum(mixed.tokens[b] != shared.tokens[b] for b in (0, 2, 3)) >= 1
