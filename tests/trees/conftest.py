"""Fixtures for the tree-builder tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors: intra-op threads only add overhead (on a busy 2-core box a
    [2, 3] softmax takes ~10 ms with 2 threads, ~1 us with 1), so the exact
    enumerations run single-threaded; the previous setting is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
