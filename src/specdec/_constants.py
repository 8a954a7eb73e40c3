"""Small constant tensors made once per shape and device (``arange`` columns, masks, index tables).

:func:`device_constant` is ``functools.lru_cache`` for the step's constant
tensors, minus its cost under ``torch.compile``: Dynamo does not trace
through a cache (it calls the wrapped function and warns, once per call
site), so while a graph is being compiled the function is called directly
and its tensors become constants of the graph, with no warning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def device_constant(maxsize: int = 64) -> Callable[[F], F]:
    """Cache a function of hashable arguments (sizes, devices) that returns tensors nobody
    writes to: eagerly each result is made once; compiled, it is traced into the graph.

    Example:
        >>> @device_constant()
        ... def ones(n, device):
        ...     return torch.ones(n, device=device)
        >>> ones(3, torch.device("cpu")) is ones(3, torch.device("cpu"))
        True
    """

    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def get(*args: Any) -> Any:
            if torch.compiler.is_compiling():
                return fn(*args)
            return cached(*args)

        get.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        get.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return get  # type: ignore[return-value]

    return wrap
