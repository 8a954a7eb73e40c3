"""The Triton KV compaction equals compact_kv_reference, in place (Triton interpreter).

The SmolLM2 cache layout (3 KV heads, head dim 64) with a few layers; every
dtype is moved as raw bits; chunks smaller than the moved range exercise the
in-place ordering argument (a chunk's sources are never rows written by an
earlier chunk). The default selector uses the torch path on CPU.
"""

from __future__ import annotations

import pytest
import torch

from specdec.kernels.kv_compact import compact_kv_inplace, compact_kv_reference, kv_keep_index
from specdec.kernels.select import compact_kv_auto, kv_compaction_path


def smollm2_like_cache(dtype: torch.dtype, layers: int = 3, past: int = 40, tree: int = 24, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, past + tree, 64, generator=gen).to(dtype) for _ in range(2 * layers)]


def test_auto_uses_torch_on_cpu_and_matches_reference() -> None:
    cache = smollm2_like_cache(torch.float32)
    keep = kv_keep_index(40, [0, 3, 9, 20])
    expected = compact_kv_reference(cache, keep)
    assert kv_compaction_path(cache) == "torch"
    out = compact_kv_auto(cache, keep)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert out[0].data_ptr() == cache[0].data_ptr()


@pytest.fixture
def compact_kv_triton():
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    from specdec.kernels.kv_compact_triton import compact_kv_triton

    return compact_kv_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("chunk", [2, 16])
def test_matches_reference_in_place(compact_kv_triton, dtype: torch.dtype, chunk: int) -> None:
    cache = smollm2_like_cache(dtype)
    keep = kv_keep_index(40, [0, 1, 5, 12, 23])  # root at 40, then a path of ascending node ids
    expected = compact_kv_reference(cache, keep)
    out = compact_kv_triton(cache, keep, chunk=chunk)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert all(o.data_ptr() == c.data_ptr() for o, c in zip(out, cache))  # in place, views


def test_strided_views_and_several_groups(compact_kv_triton) -> None:
    """Views left by an earlier compaction (non-contiguous) and layers of two shapes."""
    big = [t[..., :50, :] for t in smollm2_like_cache(torch.float32, layers=2, past=60, tree=4)]
    other = smollm2_like_cache(torch.float32, layers=1, past=30, tree=20, seed=1)
    cache = big + other
    keep = torch.cat([torch.arange(30), torch.tensor([30, 33, 41, 49])])
    expected = compact_kv_reference(cache, keep)
    out = compact_kv_triton(cache, keep)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


def test_nothing_to_move_and_bad_index(compact_kv_triton) -> None:
    cache = smollm2_like_cache(torch.float32, layers=1)
    before = [t.clone() for t in cache]
    out = compact_kv_triton(cache, kv_keep_index(40, [0, 1, 2]))
    assert all(torch.equal(o, b[..., :43, :]) for o, b in zip(out, before))
    with pytest.raises(ValueError, match="strictly increasing"):
        compact_kv_triton(cache, torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match="outside"):
        compact_kv_triton(cache, torch.tensor([0, 64]))
    with pytest.raises(ValueError, match="int64"):
        compact_kv_triton(cache, torch.tensor([0, 1], dtype=torch.int32))


def test_same_result_as_the_torch_in_place_version(compact_kv_triton) -> None:
    a = smollm2_like_cache(torch.bfloat16, seed=3)
    b = [t.clone() for t in a]
    keep = kv_keep_index(40, [0, 2, 6, 7, 19])
    assert all(torch.equal(x, y) for x, y in zip(compact_kv_triton(a, keep), compact_kv_inplace(b, keep)))
