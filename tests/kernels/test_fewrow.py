"""The few-row CPU linear kernel (specdec.kernels.fewrow) against its plain-torch reference.

The kernel must return the reference product (the same packed weight, unpacked, through
``F.linear``) up to float32 summation order for every row count, shape, leading dims and
bias; a row's result must not depend on how many rows are computed with it (bit for bit);
bad input is refused by name; the linear dispatch runs it, repacks it after an in-place
update, never hands it more than 16 rows, and says so when it cannot be built.
"""

from __future__ import annotations

import pytest
import torch

from specdec.kernels import fewrow
from specdec.kernels.fewrow import (
    MAX_ROWS,
    fewrow_available,
    fewrow_unavailable_reason,
    linear_fewrow,
    linear_fewrow_reference,
    pack_fewrow,
)
from specdec.kernels.linear import LinearPlan, RowDispatchLinear, _check_methods, accelerate_linears

pytestmark = pytest.mark.skipif(not fewrow_available(), reason=f"few-row kernel not built: {fewrow_unavailable_reason()}")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def _within_rounding(out: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Equal up to the summation order's float32 error: at most ``K * eps * sum_k |x_k w_k|`` per output."""
    bound = x.shape[-1] * torch.finfo(torch.float32).eps * (x.abs() @ weight.abs().T) + 1e-30
    return out.shape == ref.shape and bool(((out - ref).abs() <= bound).all())


@pytest.mark.parametrize("shape", [(1, 1), (15, 7), (16, 64), (17, 33), (100, 129), (200, 576)])
@pytest.mark.parametrize("rows", list(range(1, MAX_ROWS + 1)))
def test_kernel_equals_reference(shape, rows):
    gen = torch.Generator().manual_seed(rows * 1000 + shape[0])
    weight = torch.randn(*shape, generator=gen)
    x = torch.randn(rows, shape[1], generator=gen)
    packed = pack_fewrow(weight)
    out = linear_fewrow(x, packed, shape[0])
    assert _within_rounding(out, linear_fewrow_reference(x, packed, shape[0]), x, weight)
    assert _within_rounding(out, torch.nn.functional.linear(x, weight), x, weight)


def test_bias_and_leading_dims():
    weight, bias = torch.randn(40, 24), torch.randn(40)
    x = torch.randn(2, 3, 24)
    out = linear_fewrow(x, pack_fewrow(weight), 40, bias)
    assert out.shape == (2, 3, 40) and _close(out, torch.nn.functional.linear(x, weight, bias))
    # a non-contiguous input (a transposed view) is read correctly
    xt = torch.randn(24, 5).t()
    assert _close(linear_fewrow(xt, pack_fewrow(weight), 40), xt @ weight.T)


@pytest.mark.parametrize("shape", [(49, 576), (576, 1536)])
def test_a_rows_result_does_not_depend_on_the_other_rows(shape):
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(*shape, generator=gen)
    x = torch.randn(MAX_ROWS, shape[1], generator=gen)
    packed = pack_fewrow(weight)
    full = linear_fewrow(x, packed, shape[0])
    for m in range(1, MAX_ROWS + 1):
        assert torch.equal(linear_fewrow(x[:m], packed, shape[0]), full[:m]), m
        assert torch.equal(linear_fewrow(x[m - 1 : m], packed, shape[0])[0], full[m - 1]), m
    other = x.clone()
    other[1:] = torch.randn(MAX_ROWS - 1, shape[1], generator=gen)
    assert torch.equal(linear_fewrow(other, packed, shape[0])[0], full[0])


def test_a_wrong_product_is_caught():
    """The comparison above has power: a kernel fed a wrongly packed weight (one block's
    columns shifted) fails it."""
    weight, x = torch.randn(40, 24), torch.randn(5, 24)
    packed = pack_fewrow(weight)
    broken = packed.clone()
    broken[1] = packed[1].roll(1, dims=1)
    assert not _close(linear_fewrow(x, broken, 40), torch.nn.functional.linear(x, weight))


def test_pack_layout():
    weight = torch.arange(20 * 3, dtype=torch.float32).reshape(20, 3)
    packed = pack_fewrow(weight)
    assert packed.shape == (2, 3, 16) and packed.is_contiguous()
    for n in range(20):
        assert torch.equal(packed[n // 16, :, n % 16], weight[n])
    assert not packed[1, :, 4:].any()


def test_bad_input_is_refused():
    weight = torch.randn(20, 8)
    packed = pack_fewrow(weight)
    with pytest.raises(ValueError, match="1-16 rows, got 17"):
        linear_fewrow(torch.randn(17, 8), packed, 20)
    with pytest.raises(ValueError, match="1-16 rows, got 0"):
        linear_fewrow(torch.randn(0, 8), packed, 20)
    with pytest.raises(RuntimeError, match="K = 9"):
        linear_fewrow(torch.randn(2, 9), packed, 20)
    with pytest.raises(RuntimeError, match="n_out 40"):
        linear_fewrow(torch.randn(2, 8), packed, 40)
    with pytest.raises(RuntimeError, match="float32"):
        linear_fewrow(torch.randn(2, 8, dtype=torch.float64), packed, 20)
    with pytest.raises(ValueError, match="float32 CPU weight"):
        pack_fewrow(weight.double())
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        pack_fewrow(torch.randn(3))


def _forced(shape: tuple[int, int], methods: tuple[str, ...]) -> LinearPlan:
    return LinearPlan(shape=shape, methods=methods, seconds=(), threads=torch.get_num_threads())


def test_dispatch_runs_the_kernel_and_repacks_after_an_update():
    lin = torch.nn.Linear(24, 40).eval()
    ref = torch.nn.Linear(24, 40).eval()
    ref.load_state_dict(lin.state_dict())
    dispatch = RowDispatchLinear(lin, _forced((40, 24), ("fewrow",) * 16))
    lin.forward = dispatch
    with torch.no_grad():
        for rows in range(1, 21):  # 17+ rows: past the plan, F.linear
            x = torch.randn(1, rows, 24)
            assert _close(lin(x), ref(x)), rows
        assert dispatch._blocked is not None
        lin.weight.mul_(2.0)
        ref.weight.mul_(2.0)
        x = torch.randn(3, 24)
        assert _close(lin(x), ref(x))


def test_a_plan_never_gives_the_kernel_more_than_16_rows():
    with pytest.raises(ValueError, match="at most 16 rows; the plan gives it 17"):
        _forced((8, 8), ("fewrow",) * 17)
    with pytest.raises(ValueError, match="gives it 24"):
        LinearPlan(shape=(8, 8), methods=("rows",), seconds=(), threads=1, buckets=((24, "fewrow"),))
    # between max_rows = 16 and the first bucket: the fastest other method measured at 16 rows
    seconds = tuple({"rows": 3.0, "columns": 2.0, "fewrow": 1.0} for _ in range(16))
    plan = LinearPlan(shape=(8, 8), methods=("fewrow",) * 16, seconds=seconds, threads=1, buckets=((24, "rows"),))
    assert plan.method_for(16) == "fewrow" and plan.method_for(20) == "columns" and plan.method_for(30) == "rows"


def test_an_unbuildable_kernel_is_left_out_with_a_warning(monkeypatch):
    monkeypatch.setenv("SPECDEC_FEWROW", "0")
    monkeypatch.setattr("specdec.kernels.linear._fewrow_warned", False)
    assert not fewrow_available() and fewrow_unavailable_reason() == "turned off by SPECDEC_FEWROW=0"
    with pytest.warns(UserWarning, match="'fewrow' linear method is left out.*SPECDEC_FEWROW=0"):
        assert "fewrow" not in _check_methods(("rows", "columns", "fewrow"))


def test_a_failed_build_names_its_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))  # an empty cache: a published build would be loaded
    monkeypatch.setattr(fewrow, "_module", None)
    monkeypatch.setattr(fewrow, "_reason", None)

    def broken(*args, **kwargs):
        raise OSError("no compiler here")

    monkeypatch.setattr("torch.utils.cpp_extension.load_inline", broken)
    assert not fewrow_available()
    assert "OSError: no compiler here" in (fewrow_unavailable_reason() or "")
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler and ninja"):
        linear_fewrow(torch.randn(2, 8), pack_fewrow(torch.randn(4, 8)), 4)


def test_a_model_with_the_kernel_matches_its_reference():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 300)).eval()
    x = torch.randn(5, 256)
    with torch.no_grad():
        before = net(x)
        plans = accelerate_linears(net, max_rows=8, methods=("rows", "fewrow"), repeats=1, min_numel=0)
        assert all(set(p.methods) <= {"rows", "fewrow"} for p in plans.values())
        assert _close(net(x), before)
