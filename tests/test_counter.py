"""specdec.testing.counter.StepCounter counts what it says it counts."""

import pytest
import torch

from specdec.regions import model_call
from specdec.testing.counter import StepCounter


def test_reads_copies_ops_and_views_are_counted_by_site_and_region():
    x = torch.arange(4.0)
    with StepCounter() as c:
        total = x.sum()  # 1 op
        _ = float(total)  # read
        _ = x.tolist()  # read
        _ = torch.tensor([1, 2])  # tensor from Python data
        _ = torch.as_tensor(x)  # from a tensor: no copy counted
        _ = x.unsqueeze(0)  # a view
        with model_call():
            _ = int(x[0])  # a read inside a model forward
            _ = x * 2
    assert c.syncs == 3 and c.model_syncs == 1
    kinds = {kind for (kind, _site) in c.sync_sites["step"]}
    assert kinds == {"read", "h2d"}
    assert all("test_counter.py" in site for (_kind, site) in c.sync_sites["step"])
    assert c.ops >= 2 and c.compute_ops <= c.ops - 1 and c.view_names["step"]["unsqueeze"] == 1
    assert c.op_names["step"]["sum"] == 1
    assert c.model_ops >= 1


def test_patches_are_undone():
    before = (torch.Tensor.item, torch.Tensor.tolist, torch.tensor)
    with StepCounter():
        pass
    assert (torch.Tensor.item, torch.Tensor.tolist, torch.tensor) == before


def test_kernel_counter_counts_the_ops_the_host_dispatches_outside_model_forwards():
    """Top-level ATen ops count once (softmax's inner _softmax does not count again),
    views are told apart, and a model forward's ops are left out."""
    from specdec.regions import model_call
    from specdec.testing.counter import KernelCounter

    x = torch.randn(4, 5)
    with KernelCounter() as k:
        y = torch.softmax(x, -1).reshape(20).sum()
        with model_call():
            _ = (x * 2).exp().sum()
    assert k.op_names == {"aten::softmax": 1, "aten::reshape": 1, "aten::sum": 1}
    assert (k.ops, k.compute_ops, k.kernels) == (3, 2, 0)
    assert float(y) == pytest.approx(4.0)


def test_kernel_counter_counts_a_compiled_graph_s_ops():
    """StepCounter's dispatch mode cannot watch a compiled function; KernelCounter can:
    with the aot_eager backend the graph's ATen ops are dispatched one by one, and counted."""
    from specdec.testing.counter import KernelCounter

    def f(x):
        return (x * 2 + 1).amax(dim=-1)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 4)
    compiled(x)
    with KernelCounter() as k:
        out = compiled(x)
    assert torch.equal(out, f(x))
    assert k.op_names["aten::amax"] == 1 and k.op_names["aten::mul"] == 1 and k.op_names["aten::add"] == 1
