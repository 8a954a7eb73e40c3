"""The few-row linear kernels (specdec.kernels.linear) against their reference, F.linear.

Every method must return the reference product up to float32 summation order,
for every row count, input rank and bias; the dispatch must take the
reference path whenever autograd, another dtype or device is involved, and
must repack oneDNN weights after an in-place update.
"""

from __future__ import annotations

import json

import attrs
import pytest
import torch
import transformers

from specdec.kernels.linear import (
    LARGE_ROWS,
    LINEAR_METHODS,
    LinearPlan,
    RowDispatchLinear,
    accelerate_linears,
    dispatch_for,
    linear_columns,
    linear_onednn,
    linear_reference,
    onednn_available,
    pack_onednn,
    resolve_cpu_linear,
    restore_linears,
    tune_linear,
)
from specdec.targets.hf import HFTarget

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def _forced(shape: tuple[int, int], method: str, max_rows: int = 32) -> LinearPlan:
    return LinearPlan(shape=shape, methods=(method,) * max_rows, seconds=(), threads=torch.get_num_threads())


@pytest.mark.parametrize("shape", [(5, 8), (64, 48), (300, 96)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_columns_equals_reference(shape, rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(*shape, generator=g)
    b = torch.randn(shape[0], generator=g) if bias else None
    x = torch.randn(rows, shape[1], generator=g)
    assert _close(linear_columns(x, w, b), linear_reference(x, w, b))


@needs_onednn
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_equals_reference(rows, bias):
    g = torch.Generator().manual_seed(10 + rows)
    w = torch.randn(70, 40, generator=g)
    b = torch.randn(70, generator=g) if bias else None
    x = torch.randn(rows, 40, generator=g)
    assert _close(linear_onednn(x, pack_onednn(w), b), linear_reference(x, w, b))


@pytest.mark.parametrize("lead", [(3,), (1, 4), (2, 3), (1, 1, 2)])
def test_methods_keep_leading_dims(lead):
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(9, 6, generator=g), torch.randn(*lead, 6, generator=g)
    ref = linear_reference(x, w)
    assert _close(linear_columns(x, w), ref)
    assert _close(linear_columns(x.transpose(0, -2) if len(lead) > 1 else x, w), linear_reference(x.transpose(0, -2) if len(lead) > 1 else x, w))
    if onednn_available():
        assert _close(linear_onednn(x, pack_onednn(w)), ref)


def test_a_wrong_product_is_caught():
    """The comparison has power: a transposed-weight mistake or a dropped row fails it."""
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(6, 6, generator=g), torch.randn(3, 6, generator=g)
    ref = linear_reference(x, w)
    assert not _close(x @ w, ref)  # weight used untransposed
    assert not _close(torch.cat([ref[:2], ref[:1]]), ref)  # the n == 1 padding leaking a row


def test_tune_linear_plan():
    plan = tune_linear((32, 16), max_rows=6, repeats=1, cache=False, large_rows=LARGE_ROWS)
    assert plan.shape == (32, 16) and plan.max_rows == 6 and len(plan.seconds) == 6
    assert set(plan.methods) <= set(LINEAR_METHODS)
    for timing, chosen in zip(plan.seconds, plan.methods):
        assert timing[chosen] == min(timing.values())
    assert plan.method_for(0) == "rows"
    # beyond max_rows: the measured buckets (the 6-row choice until the first bucket)
    assert [size for size, _ in plan.buckets] == [24, 32, 48, 64, 96, 128, 192, 256]
    assert plan.method_for(7) == plan.methods[-1]
    assert plan.method_for(30) == plan.buckets[0][1] and plan.method_for(1000) == plan.buckets[-1][1]
    no_buckets = tune_linear((32, 16), max_rows=6, repeats=1, cache=False, large_rows=())
    assert no_buckets.buckets == () and no_buckets.method_for(7) == "rows"
    only_rows = tune_linear((32, 16), max_rows=3, methods=("rows",), repeats=1, cache=False)
    assert only_rows.methods == ("rows",) * 3
    cached = tune_linear((32, 16), max_rows=4, methods=("rows", "columns"), repeats=1)
    assert tune_linear((32, 16), max_rows=4, methods=("rows", "columns"), repeats=1) is cached


def test_plans_are_shared_through_the_plan_file(tmp_path, monkeypatch):
    """A tuned plan is written to the plan file and a new process (an empty
    process cache) reads it instead of measuring; another machine's entry, a
    different repeat count, the file turned off and a corrupt file measure again."""
    import specdec.kernels.linear as linear

    path = tmp_path / "plans.json"
    monkeypatch.setenv(linear.PLAN_FILE_ENV, str(path))
    monkeypatch.setattr(linear, "_PLANS", {})
    first = tune_linear((32, 16), max_rows=3, repeats=1)
    assert path.is_file() and len(json.loads(path.read_text())) == 1
    measured = []
    real = linear._median_seconds
    monkeypatch.setattr(linear, "_median_seconds", lambda fn, r: measured.append(1) or real(fn, r))
    monkeypatch.setattr(linear, "_PLANS", {})  # a new process
    again = tune_linear((32, 16), max_rows=3, repeats=1)
    assert again == first and again.seconds == first.seconds and not measured
    monkeypatch.setattr(linear, "_PLANS", {})
    tune_linear((32, 16), max_rows=3, repeats=2)  # another repeat count: measured, stored beside
    assert measured and len(json.loads(path.read_text())) == 2
    measured.clear()
    monkeypatch.setattr(linear, "_PLANS", {})
    monkeypatch.setattr(linear, "_machine", lambda: "another CPU")
    tune_linear((32, 16), max_rows=3, repeats=1)
    assert measured
    measured.clear()
    monkeypatch.setattr(linear, "_PLANS", {})
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="ignoring the linear plan cache"):
        tune_linear((32, 16), max_rows=3, repeats=1)
    assert measured and json.loads(path.read_text())  # measured, and the file rewritten whole
    measured.clear()
    monkeypatch.setenv(linear.PLAN_FILE_ENV, "0")
    monkeypatch.setattr(linear, "_PLANS", {})
    assert linear.plan_file() is None
    tune_linear((32, 16), max_rows=3, repeats=1)
    assert measured


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(methods=("columns",)), "must include 'rows'"),
        (dict(methods=("rows", "blas")), "unknown linear method"),
        (dict(methods="rows"), "non-empty sequence"),
        (dict(methods=()), "non-empty sequence"),
        (dict(max_rows=0), "max_rows"),
        (dict(max_rows=True), "max_rows"),
        (dict(repeats=0), "repeats"),
    ],
)
def test_tune_linear_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tune_linear((8, 8), **kwargs)


@pytest.mark.parametrize("method", ["columns", pytest.param("onednn", marks=needs_onednn)])
def test_dispatch_matches_reference_for_every_row_count(method):
    torch.manual_seed(3)
    lin = torch.nn.Linear(24, 40).eval()
    ref_lin = torch.nn.Linear(24, 40).eval()
    ref_lin.load_state_dict(lin.state_dict())
    lin.forward = RowDispatchLinear(lin, _forced((40, 24), method, max_rows=8))
    with torch.no_grad():
        for rows in range(1, 12):  # 9+ rows exceed the plan: reference path
            x = torch.randn(1, rows, 24)
            assert _close(lin(x), ref_lin(x)), rows
    # a plan with buckets runs the method for many rows too (batched tree forwards)
    plan = attrs.evolve(_forced((40, 24), "rows", max_rows=8), buckets=((24, method), (64, "rows")))
    lin.forward = RowDispatchLinear(lin, plan)
    with torch.no_grad():
        for rows in (9, 24, 40, 64, 100):
            x = torch.randn(2, rows, 24)
            assert _close(lin(x), ref_lin(x)), rows
    assert plan.method_for(40) == method and plan.method_for(100) == "rows" and plan.method_for(12) == "rows"


@needs_onednn
def test_dispatch_repacks_after_an_in_place_update():
    lin = torch.nn.Linear(16, 16, bias=False).eval()
    lin.forward = RowDispatchLinear(lin, _forced((16, 16), "onednn"))
    x = torch.randn(3, 16)
    with torch.no_grad():
        lin(x)
        lin.weight.mul_(2.0)
        assert _close(lin(x), x @ lin.weight.T)


@pytest.mark.parametrize("method", ["columns", pytest.param("onednn", marks=needs_onednn)])
def test_dispatch_keeps_autograd_on_the_reference_path(method):
    lin = torch.nn.Linear(8, 5)
    lin.forward = RowDispatchLinear(lin, _forced((5, 8), method))
    x = torch.randn(2, 8, requires_grad=True)
    lin(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    assert _close(x.grad, lin.weight.sum(0).expand(2, 8).detach())


def test_dispatch_leaves_other_dtypes_alone():
    lin = torch.nn.Linear(8, 5).double().eval()
    lin.forward = RowDispatchLinear(lin, _forced((5, 8), "onednn" if onednn_available() else "columns"))
    x = torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad():
        out = lin(x)
    assert out.dtype == torch.float64 and torch.allclose(out, torch.nn.functional.linear(x, lin.weight, lin.bias))


def test_dispatch_for_a_bare_weight():
    w = torch.randn(50, 12)
    fn = dispatch_for(w, max_rows=4)
    with torch.no_grad():
        for rows in (1, 3, 6):
            x = torch.randn(rows, 12)
            assert _close(fn(x), x @ w.T)
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        dispatch_for(torch.randn(3))


def _tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_accelerate_and_restore_a_model():
    model = _tiny_llama()
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    with torch.no_grad():
        before = model(ids).logits
        assert accelerate_linears(model) == {}  # every weight is under min_numel
        plans = accelerate_linears(model, max_rows=8, repeats=1, min_numel=0)
        assert set(plans) == {(32, 32), (16, 32), (64, 32), (32, 64), (97, 32)}
        assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
        after = model(ids).logits
        state = model.state_dict()
    assert _close(after, before)
    assert set(state) == set(_tiny_llama().state_dict())
    assert restore_linears(model) == 7 * 2 + 1
    assert restore_linears(model) == 0


def test_large_weights_tune_fewer_row_buckets():
    # a weight above large_numel (an LM head over a large vocabulary) measures the buckets up to 64 rows only
    model = _tiny_llama()
    with torch.no_grad():
        plans = accelerate_linears(model, rows=(1, 2, *LARGE_ROWS), repeats=1, min_numel=0, large_numel=97 * 32 - 1)
    assert [n for n, _ in plans[(97, 32)].buckets] == [n for n in LARGE_ROWS if n <= 64]
    assert [n for n, _ in plans[(64, 32)].buckets] == list(LARGE_ROWS)
    restore_linears(model)


def test_hf_target_option():
    model = _tiny_llama()
    assert resolve_cpu_linear("auto", torch.device("cpu")) is True
    assert resolve_cpu_linear(False, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="cpu_linear"):
        HFTarget(model, cpu_linear="yes")
    plain = HFTarget(model, cpu_linear=False)
    assert plain.linear_plans == {} and plain.min_tree_tokens == 4
    tiny = HFTarget(model)  # auto on the CPU, but every weight of this model is under min_numel
    assert tiny.linear_plans == {} and tiny.min_tree_tokens == 4
