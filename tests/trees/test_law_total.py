"""``law_total``: the float64 row sums of draft laws, computed a few rows at a time on a CPU,
have the bits of ``sum(dim=-1, dtype=float64)`` (the divisor the reference and fast builders share)."""

from __future__ import annotations

import pytest
import torch

from specdec.trees._common import _TOTAL_CHUNK, law_total


@pytest.mark.parametrize("shape", [(1, 128256), (10, 128256), (3, 7, 128256), (61, 49152), (200, 5), (1, 1), (0, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_law_total_has_the_bits_of_one_float64_sum(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    probs = torch.softmax(torch.randn(*shape, generator=g) * 4, dim=-1).to(dtype)
    got = law_total(probs)
    assert got.dtype == torch.float64 and got.shape == (*shape[:-1], 1)
    assert torch.equal(got, probs.sum(dim=-1, keepdim=True, dtype=torch.float64))


def test_law_total_chunks_many_rows():
    """More rows than one chunk holds: the rows are summed chunk by chunk, each row whole
    (a chunk split inside a row, or rows out of order, would change the bits or the order)."""
    V = 4099
    rows = 3 * (_TOTAL_CHUNK // V) + 5
    g = torch.Generator().manual_seed(1)
    probs = torch.rand(rows, V, generator=g)
    probs[::7] *= 1e-3  # rows of very different sizes: a mixed-up order is visible
    assert torch.equal(law_total(probs), probs.sum(dim=-1, keepdim=True, dtype=torch.float64))
