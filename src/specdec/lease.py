"""One generation per model at a time.

A target's and a draft's caches (KV slabs, the committed context, an EAGLE
head's features) hold one sequence. Two generations on the same model object,
interleaved (a second call while a stream is open) or from two threads, would
overwrite each other's caches and emit wrong tokens without any error. Every
loop that prefills a model therefore *holds* it for the generation's lifetime
(:func:`hold`), and a second holder gets a :class:`~specdec.errors.ModelBusyError`
at once, before any model state is touched. A stream releases its models when it
is exhausted, closed (``close()``), garbage-collected, or raises.

Concurrent requests are decoded together with ``generate_batch`` (one state per
row), or with one model object per concurrent generation.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import attrs

from specdec.errors import ModelBusyError

__all__ = ["hold", "holder_of"]


@attrs.frozen
class _Holder:
    what: str  # e.g. "SpeculativeGenerator.stream"
    thread: str  # the thread that took the model


_LOCK = threading.Lock()
_HOLDERS: dict[int, _Holder] = {}  # id(model) -> its holder; entries live exactly as long as a hold


def holder_of(model: Any) -> str | None:
    """Who holds ``model`` now (``"<call> in thread <name>"``), or None."""
    with _LOCK:
        h = _HOLDERS.get(id(model))
    return None if h is None else f"{h.what} in thread {h.thread!r}"


@contextlib.contextmanager
def hold(what: str, **models: Any) -> Iterator[None]:
    """Hold every model given by role (``target=..., draft=...``; None skipped)
    for the body, or raise :class:`~specdec.errors.ModelBusyError` naming the
    role, the model's class and its current holder. The same object under two
    roles (one model as its own draft) is held once."""
    me = _Holder(what, threading.current_thread().name)
    unique: dict[int, tuple[str, Any]] = {}
    for role, model in models.items():
        if model is not None:
            unique.setdefault(id(model), (role, model))
    with _LOCK:
        for key, (role, model) in unique.items():
            other = _HOLDERS.get(key)
            if other is not None:
                where = "this thread" if other.thread == me.thread else f"thread {other.thread!r}"
                raise ModelBusyError(
                    f"the {role} ({type(model).__name__}) is in use by {other.what} in {where}: a model's caches hold "
                    f"one sequence at a time, so {what} cannot start until that generation ends "
                    "(exhaust or close() the open stream, or decode the prompts together with generate_batch)"
                )
        for key in unique:
            _HOLDERS[key] = me
    try:
        yield
    finally:
        with _LOCK:
            for key in unique:
                if _HOLDERS.get(key) is me:
                    del _HOLDERS[key]
