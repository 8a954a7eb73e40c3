"""specdec.testing.counter.StepCounter counts what it says it counts."""

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
