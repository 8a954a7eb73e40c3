"""What the CPU linear tuner measures, and what it says while it measures (issue 57).

Why: :func:`~specdec.kernels.linear.tune_linear` times every candidate layout at
every row count it is given, for every weight shape of a model. Timing row counts
a run never uses (256-row buckets for a one-row run whose largest forward is a
65-token tree) cost about a quarter of a cold tuning, and a first run on a fresh
machine used to tune for minutes without a word (it looked hung).

What:

- :data:`DEFAULT_ROWS`: the row counts tuned when nobody says otherwise: 1-16
  one by one and the buckets of :data:`BUCKET_ROWS` up to 64, i.e. what a
  one-row run uses: its draft trees (``specdec bench --budget auto`` times trees
  of up to 64 nodes + the root), the autoregressive baseline's one-token forwards
  and the draft's levels. A larger input takes the largest measured count's method.
- :func:`rows_up_to`: the row counts of a run whose forwards carry at most
  ``n`` rows (a batched run: ``B x (nodes + 1)``); :func:`tuning_rows` makes
  them the default for every tuning in a ``with`` block (the model wrappers'
  :func:`~specdec.kernels.linear.accelerate_linears` and
  :func:`~specdec.kernels.linear.dispatch_for` included).
- :func:`say` / :func:`tuning_log`: progress lines of a tuning (one per weight
  shape, with its expected duration, and the plan file it is cached in) on stderr,
  prefixed ``specdec:``; :func:`tuning_log` sends them elsewhere (a bench log) or
  nowhere within a ``with`` block. :func:`expected_seconds` is the duration quoted.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

__all__ = [
    "BUCKET_ROWS",
    "DEFAULT_ROWS",
    "PROGRESS_S",
    "check_rows",
    "current_rows",
    "describe_rows",
    "expected_seconds",
    "heartbeat",
    "rows_up_to",
    "say",
    "tuning_log",
    "tuning_rows",
]

BUCKET_ROWS: tuple[int, ...] = (24, 32, 48, 64, 96, 128, 192, 256)
"""Row counts above 16 that a tuning measures when its run reaches them (:func:`rows_up_to`)."""

PROGRESS_S = 30.0
"""A tuning says how far it is at least this often (seconds): no silence longer than this."""

SECONDS_PER_BYTE = 4e-11
"""The tuner's cost per weight byte per timed call and row-count weight (:func:`expected_seconds`):
fitted on this project's 2-core AMD EPYC VM (torch 2.13), where SmolLM2-135M's 49,152 x 576
LM head takes 5-8 s over :data:`DEFAULT_ROWS` with 4 methods and 5 repeats, and its other
shapes 1.4-2 s each (issue 57)."""


def rows_up_to(n: int) -> tuple[int, ...]:
    """The row counts a run whose forwards carry at most ``n`` rows needs tuned:
    ``1..min(n, 16)`` one by one, then the :data:`BUCKET_ROWS` up to ``n``.

    Example:
        >>> rows_up_to(5)
        (1, 2, 3, 4, 5)
        >>> rows_up_to(65)[-5:]
        (16, 24, 32, 48, 64)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the largest row count must be an int >= 1, got {n!r}")
    return tuple(range(1, min(n, 16) + 1)) + tuple(r for r in BUCKET_ROWS if r <= n)


DEFAULT_ROWS: tuple[int, ...] = rows_up_to(65)
"""What a tuning measures by default: a one-row run's row counts (module docstring)."""


def check_rows(rows: Sequence[int], what: str = "rows") -> tuple[int, ...]:
    """``rows`` as a sorted tuple of distinct ints ``>= 1``; ValueError naming ``what`` otherwise."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or len(rows) == 0:
        raise ValueError(f"{what} must be a non-empty sequence of row counts, got {rows!r}")
    for r in rows:
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"{what} must hold ints >= 1, got {r!r}")
    return tuple(sorted(set(rows)))


_ROWS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar("specdec_tuning_rows", default=None)
_LOG: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("specdec_tuning_log", default=None)


def current_rows() -> tuple[int, ...]:
    """The row counts a tuning measures when its caller names none: :func:`tuning_rows`'s, else :data:`DEFAULT_ROWS`."""
    rows = _ROWS.get()
    return DEFAULT_ROWS if rows is None else rows


@contextlib.contextmanager
def tuning_rows(rows: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Within the block, tunings that name no row counts measure ``rows`` (e.g. ``rows_up_to(B * 65)``
    for a batched run of ``B`` rows, or exactly the tree sizes a run uses).

    Example:
        >>> with tuning_rows([1, 5]):
        ...     current_rows()
        (1, 5)
        >>> current_rows() == DEFAULT_ROWS
        True
    """
    token = _ROWS.set(check_rows(rows))
    try:
        yield current_rows()
    finally:
        _ROWS.reset(token)


def say(line: str) -> None:
    """One progress line of a tuning: to :func:`tuning_log`'s sink, else on stderr prefixed ``specdec:``."""
    sink = _LOG.get()
    if sink is not None:
        sink(line)
        return
    try:
        sys.stderr.write(f"specdec: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr must not fail a tuning
        pass


@contextlib.contextmanager
def tuning_log(sink: Callable[[str], None]) -> Iterator[None]:
    """Within the block, the tuner's progress lines go to ``sink`` (``lambda line: None``: nowhere)."""
    token = _LOG.set(sink)
    try:
        yield
    finally:
        _LOG.reset(token)


@contextlib.contextmanager
def heartbeat(message: Callable[[float], str], interval: float = PROGRESS_S) -> Iterator[None]:
    """Within the block, :func:`say` ``message(seconds so far)`` every ``interval`` seconds, from a
    thread (so that one long timed call cannot silence a tuning on a loaded machine), to the sink of
    the block's caller (:func:`tuning_log`)."""
    stop = threading.Event()
    context = contextvars.copy_context()  # the caller's sink: a thread starts with an empty context
    start = time.monotonic()

    def run() -> None:
        while not stop.wait(interval):
            context.run(say, message(time.monotonic() - start))

    thread = threading.Thread(target=run, name="specdec-tuning-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def expected_seconds(shape: tuple[int, int], rows: Sequence[int], methods: int, repeats: int,
                     cold_bytes: int) -> float:
    """About how long :func:`~specdec.kernels.linear.tune_linear` takes for a ``shape`` weight on a quiet
    2-core CPU: every timed call reads about ``max(cold_bytes, weight bytes)`` (the cycled copies), once
    per method, repeat and row count, a row count ``n`` weighing ``1 + n / 8``.

    Example:
        >>> 5 < expected_seconds((49152, 576), DEFAULT_ROWS, 4, 5, 32 * 2**20) < 12
        True
    """
    weight = 4 * shape[0] * shape[1]
    read = max(weight, min(64 * weight, cold_bytes))
    return SECONDS_PER_BYTE * read * methods * (repeats + 1) * sum(1 + r / 8 for r in rows)


def describe_rows(rows: Sequence[int]) -> str:
    """``"1-16, 24, 32, 48, 64"``: consecutive counts as ranges.

    Example:
        >>> describe_rows((1, 2, 3, 5, 24, 32))
        '1-3, 5, 24, 32'
    """
    parts: list[str] = []
    run: list[int] = []
    for r in sorted(rows):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)
