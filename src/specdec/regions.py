"""Marks the model forwards inside a speculative step.

:func:`model_call` wraps every call into a draft's or target's network (the
``root_logits``/``tree_logits`` of a draft, the target's tree forward), so
that :class:`specdec.testing.counter.StepCounter` can tell the step's own
work (tree building, verification, bookkeeping) from the models' work. It
costs one integer increment per model call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["MODEL_CALL_EVENT", "model_call", "in_model_call"]

MODEL_CALL_EVENT = "specdec.model_call"
"""The profiler event :func:`model_call` records while a
:class:`specdec.testing.counter.KernelCounter` is active."""

_depth = 0
_profiled = 0


@contextmanager
def model_call() -> Iterator[None]:
    """The enclosed code is a model forward."""
    global _depth
    _depth += 1
    try:
        if _profiled and _depth == 1:
            with torch.profiler.record_function(MODEL_CALL_EVENT):
                yield
        else:
            yield
    finally:
        _depth -= 1


def in_model_call() -> bool:
    """True inside :func:`model_call`."""
    return _depth > 0
