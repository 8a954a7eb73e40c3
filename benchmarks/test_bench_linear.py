"""Benchmark: few-row linear layers at SmolLM2-135M's shapes, each method.

A target forward over a draft tree of ``n`` nodes, or over one token in
autoregressive decoding, multiplies ``n`` rows by every weight of the model.
Timed here for 1, 2, 4 and 8 rows: the reference ``F.linear`` ("rows"), the
``(W @ x.T).T`` layout ("columns") and oneDNN on a packed weight ("onednn"),
for the LM head (49,152 x 576) and the MLP's up projection (1,536 x 576).
:func:`~specdec.kernels.linear.tune_linear` makes the same measurement with
the small weights out of cache, and the model wrappers use its choice. Run with::

    pytest benchmarks/test_bench_linear.py --benchmark-only

Results of this VM: ``benchmarks/results/linear_cpu.md``.
"""

from __future__ import annotations

import pytest
import torch

from specdec.kernels.linear import linear_columns, linear_onednn, linear_reference, onednn_available, pack_onednn

SHAPES = {"lm_head": (49152, 576), "up_proj": (1536, 576)}


@pytest.mark.parametrize("rows", [1, 2, 4, 8])
@pytest.mark.parametrize("layer", sorted(SHAPES))
@pytest.mark.parametrize("method", ["rows", "columns", "onednn"])
def test_bench_linear(benchmark, method, layer, rows):
    if method == "onednn" and not onednn_available():
        pytest.skip("torch built without oneDNN")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(*SHAPES[layer], generator=g) * 0.02
    x = torch.randn(rows, weight.shape[1], generator=g)
    if method == "rows":
        fn, arg = linear_reference, weight
    elif method == "columns":
        fn, arg = linear_columns, weight
    else:
        fn, arg = linear_onednn, pack_onednn(weight)
    with torch.no_grad():
        out = benchmark(fn, x, arg)
    assert torch.allclose(out, linear_reference(x, weight), rtol=1e-4, atol=1e-5)
