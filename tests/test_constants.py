"""``device_constant``: cached eagerly, traced (no Dynamo warning) under ``torch.compile``."""

from __future__ import annotations

import functools
import warnings

import torch

from specdec._constants import device_constant


def _compile_and_run(fn):
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(fn, backend="aot_eager", fullgraph=True)(torch.ones(5))
    return out, [str(w.message) for w in caught if "lru_cache" in str(w.message)]


def test_device_constant_is_cached_eagerly_and_traced_without_warning_when_compiled():
    @device_constant()
    def columns(n, device):
        return torch.arange(n, device=device)

    cpu = torch.device("cpu")
    assert columns(5, cpu) is columns(5, cpu) and columns.cache_info().hits == 1
    out, lru_warnings = _compile_and_run(lambda x: x * columns(5, x.device))
    assert torch.equal(out, torch.arange(5.0)) and lru_warnings == []

    # the power of the check: a plain lru_cache is what Dynamo warns about
    @functools.lru_cache(maxsize=8)
    def plain(n, device):
        return torch.arange(n, device=device)

    out, lru_warnings = _compile_and_run(lambda x: x * plain(5, x.device))
    assert torch.equal(out, torch.arange(5.0)) and lru_warnings
