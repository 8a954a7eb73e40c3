"""Compatibility of the HF wrappers with the installed transformers.

specdec supports ``transformers`` in :data:`specdec.models.hf_common.SUPPORTED_TRANSFORMERS`
(tested on 4.46.3, 4.57.1 and 5.24.0). This test checks that the installed
version is admitted both by that range and by the pyproject's dependency, and
exercises every piece of the cache / forward API the wrappers use, so a
transformers release that changes them fails here first.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
import transformers
from hf_model_helpers import make_tiny_llama, plain_logits
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from specdec.models import hf_forward
from specdec.models.hf_common import SUPPORTED_TRANSFORMERS, KVCache, check_transformers_version, forward_tokens

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def declared_transformers() -> SpecifierSet:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["hf"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "transformers"]
    return req.specifier


def test_installed_version_is_supported_and_declared():
    installed = Version(transformers.__version__)
    assert installed in SpecifierSet(SUPPORTED_TRANSFORMERS)
    assert installed in declared_transformers(), f"pyproject admits transformers{declared_transformers()}"
    check_transformers_version()
    with pytest.raises(ImportError, match="pip install"):
        check_transformers_version("4.40.0")
    with pytest.raises(ImportError):
        check_transformers_version("6.0.0")


def test_declared_range_is_within_the_supported_range():
    """Every bound the pyproject declares lies in the supported range: its
    lower bound is supported (versions below 4.46 are not)."""
    declared = declared_transformers()
    lower = [Version(s.version) for s in declared if s.operator in (">=", "==", "~=")]
    assert lower and all(v in SpecifierSet(SUPPORTED_TRANSFORMERS) for v in lower)


def test_cache_and_forward_api_used_by_the_wrappers():
    model = make_tiny_llama("sdpa", torch.float64)
    cache = KVCache(model)
    obj = cache.obj
    # the cache class, its length and the per-layer tensors
    assert type(obj).__name__ == "DynamicCache"
    assert obj.get_seq_length() == 0
    if hasattr(obj, "layers"):  # >= 4.56: our slab layers stand in for DynamicLayer
        from transformers.cache_utils import DynamicLayer

        assert cache.preallocated and obj.layers
        assert all(isinstance(layer, DynamicLayer) for layer in obj.layers)
    else:
        assert isinstance(obj.key_cache, list) and isinstance(obj.value_cache, list)
    # the forward keywords: cache kwarg, logits restriction, hidden states
    cache_kw, logits_kw = hf_forward._forward_kwargs(type(model).forward)
    params = inspect.signature(type(model).forward).parameters
    assert cache_kw in params and logits_kw in params
    assert hf_forward._forward_kwargs(type(model.base_model).forward)[0] in inspect.signature(type(model.base_model).forward).parameters
    logits, hidden = forward_tokens(model, cache, [4, 5, 6], [0, 1, 2], logits="last", hidden_layers=(0, 2))
    assert logits.shape == (97,) and hidden.shape == (3, 2, 64)
    assert float((logits - plain_logits(model, [4, 5, 6])).abs().max()) < 1e-9
    assert len(cache) == 3 == obj.get_seq_length()
    # replaced tensors are what the next forward attends over (model reads our writes)
    cache.compact(torch.tensor([0, 2]))  # context is now [4, 6] at positions 0, 2
    assert obj.get_seq_length() == 2
    allowed = torch.ones(1, 3, dtype=torch.bool)
    logits, _ = forward_tokens(model, cache, [7], [3], allowed, logits="all")
    fresh = KVCache(model)
    forward_tokens(model, fresh, [4, 5, 6], [0, 1, 2], logits="none")
    fresh.compact(torch.tensor([0, 2]))
    again, _ = forward_tokens(model, fresh, [7], [3], None, logits="all")
    assert torch.allclose(logits, again, atol=1e-9)
    assert not torch.allclose(logits[0], plain_logits(model, [4, 5, 6, 7]), atol=1e-3)
