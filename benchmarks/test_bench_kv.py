"""Benchmark: KV-cache compaction after one verified tree, SmolLM2-135M sized.

The cache of SmolLM2-135M-Instruct: 30 layers, 3 KV heads, head dim 64; 512
committed positions plus a 64-node draft tree (576 cached positions) compacted
to the committed context + root + an accepted path of 5 nodes. Measured for
:func:`~specdec.kernels.kv_compact.compact_kv_reference` (the torch gather a
fused kernel may replace) in float32 and bfloat16, next to
:func:`~specdec.kernels.kv_compact.compact_kv_inplace` (the wrappers' default,
which moves only the root and accepted positions). Run with::

    pytest benchmarks/test_bench_kv.py --benchmark-only
"""

from __future__ import annotations

import pytest
import torch

from specdec.kernels.kv_compact import compact_kv_inplace, compact_kv_reference, kv_keep_index

LAYERS = 30
KV_HEADS = 3
HEAD_DIM = 64
PAST = 512
TREE_NODES = 64
ACCEPTED = [3, 9, 20, 41, 63]  # an accepted path below the root (node ids ascend along a path)


def smollm2_cache(dtype: torch.dtype) -> list[torch.Tensor]:
    """``2 * 30`` tensors ``[1, 3, 576, 64]``: keys and values of every layer."""
    g = torch.Generator().manual_seed(0)
    shape = (1, KV_HEADS, PAST + TREE_NODES, HEAD_DIM)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(2 * LAYERS)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_bench_compact_kv_reference(benchmark, dtype):
    cache = smollm2_cache(dtype)
    keep = kv_keep_index(PAST, [0, *ACCEPTED])
    out = benchmark(compact_kv_reference, cache, keep)
    assert len(out) == 2 * LAYERS
    assert out[0].shape == (1, KV_HEADS, PAST + 1 + len(ACCEPTED), HEAD_DIM)
    assert torch.equal(out[7][..., PAST + 1 :, :], cache[7][..., [PAST + a for a in ACCEPTED], :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_bench_compact_kv_inplace(benchmark, dtype):
    cache = smollm2_cache(dtype)
    keep = kv_keep_index(PAST, [0, *ACCEPTED])
    expected = compact_kv_reference(cache, keep)
    results = []

    def fresh_cache():  # in place: every round needs an uncompacted cache (not timed)
        return ([t.clone() for t in cache], keep), {}

    def run(tensors, index):
        results.append(compact_kv_inplace(tensors, index))

    benchmark.pedantic(run, setup=fresh_cache, rounds=50, warmup_rounds=2)
    assert all(torch.equal(a, b) for a, b in zip(results[-1], expected))
