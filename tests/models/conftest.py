"""Shared setup of the Hugging Face model tests (helpers live in ``hf_model_helpers``)."""

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the test modules import ``hf_model_helpers`` whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny models run ~50x faster on one thread than on two contended ones."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
