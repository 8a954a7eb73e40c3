"""Few-row linear layers on the CPU: the same product, the fastest layout for each row count.

Why: a draft tree is scored by a forward over a handful of tokens, and the
autoregressive baseline by a forward over one. On the CPU these are
matrix products with ``n`` = 1-16 rows, where the BLAS kernel behind
:func:`torch.nn.functional.linear` can be several times slower than reading
the weight once would allow. Measured on this project's 2-core AMD EPYC VM
(torch 2.13, MKL, SmolLM2-135M's 49,152 x 576 LM head): ``F.linear`` takes
10 / 21 / 33 / 16 ms for 1 / 2 / 3 / 4 rows, while ``(W @ x.T).T`` takes
3-5 ms for 2-5 rows, and a oneDNN-packed weight 5-7 ms for 1-8 rows. Which
layout wins depends on the machine, the weight's shape and ``n``, so it is
measured (:func:`tune_linear`), not guessed.

Words: ``x`` is ``[..., K]`` (``n`` rows once flattened), ``weight`` is
``[N, K]`` as in :class:`torch.nn.Linear`, ``bias`` is ``[N]`` or None; every
method returns ``x @ weight.T + bias`` of shape ``[..., N]``.

Methods (all exact rewrites of the same product; results differ from the
reference only by floating-point summation order):

- ``"rows"``: :func:`linear_reference`, ``F.linear`` (the reference).
- ``"columns"``: :func:`linear_columns`, ``(weight @ x.T).T``: the rows of
  ``x`` become columns of a product whose long side is the weight's; one row
  is padded to two, which stays on the matrix-matrix path.
- ``"onednn"``: :func:`linear_onednn`, oneDNN's linear on a weight packed
  once with :func:`pack_onednn` (extra memory: one copy of the weight).
- ``"fewrow"``: :func:`~specdec.kernels.fewrow.linear_fewrow`, specdec's own
  kernel for 1-16 rows reading each weight once for all rows, on a weight
  packed once in column blocks (:mod:`specdec.kernels.fewrow`; extra memory:
  one copy of the weight; compiled on first use; where it cannot be built it
  is left out of the candidates, with a warning naming why).

:func:`accelerate_linears` installs the tuned dispatch on every
:class:`torch.nn.Linear` of a model, in place and reversibly
(:func:`restore_linears`); :class:`~specdec.targets.hf.HFTarget`, the HF
drafts and the EAGLE heads do so on the CPU by default (``cpu_linear``).
Training, autograd and non-CPU tensors always take the reference path.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.nn as nn
import torch.nn.functional as F

from specdec._cache import cache_root
from specdec.kernels.fewrow import MAX_ROWS as FEWROW_MAX_ROWS
from specdec.kernels.fewrow import fewrow_available, fewrow_unavailable_reason, linear_fewrow, pack_fewrow
from specdec.kernels.tuning_scope import (
    BUCKET_ROWS,
    PROGRESS_S,
    check_rows,
    current_rows,
    describe_rows,
    expected_seconds,
    heartbeat,
    say,
)

__all__ = [
    "LINEAR_METHODS",
    "LinearPlan",
    "RowDispatchLinear",
    "accelerate_linears",
    "cached_plan",
    "dispatch_for",
    "linear_columns",
    "linear_onednn",
    "linear_reference",
    "onednn_available",
    "pack_onednn",
    "resolve_cpu_linear",
    "restore_linears",
    "tune_linear",
]

LINEAR_METHODS: tuple[str, ...] = ("rows", "columns", "onednn", "fewrow")


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by :func:`torch.nn.functional.linear` (method ``"rows"``).

    Args:
        x: ``[..., K]`` input.
        weight: ``[N, K]``.
        bias: ``[N]`` or None.

    Returns:
        ``[..., N]``.
    """
    return F.linear(x, weight, bias)


def linear_columns(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` computed as ``(weight @ x.T).T`` (method ``"columns"``).

    Args:
        x: ``[..., K]`` input (``n`` rows once flattened).
        weight: ``[N, K]``.
        bias: ``[N]`` or None.

    Returns:
        ``[..., N]``, contiguous.

    Example:
        >>> import torch
        >>> x, w = torch.randn(3, 8), torch.randn(5, 8)
        >>> torch.allclose(linear_columns(x, w), linear_reference(x, w), atol=1e-5)
        True
    """
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n == 1:  # a single column takes the matrix-vector path, slower on the machines measured
        rows = torch.cat([rows, rows])  # (an expanded, stride-0 copy would take a slow path again)
    out = torch.mm(weight, rows.t()).t()[:n]
    if bias is not None:
        out = out + bias
    # back to row-major: measured faster in a whole forward than passing the transposed view on
    return out.contiguous().reshape(*lead, weight.shape[0])


def onednn_available() -> bool:
    """Whether this torch build has oneDNN (MKL-DNN) for CPU tensors."""
    return bool(torch.backends.mkldnn.is_available())


def pack_onednn(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (``[N, K]`` float32, CPU) packed for :func:`linear_onednn`: a copy in oneDNN's layout."""
    if not onednn_available():
        raise RuntimeError("this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)")
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"oneDNN packing needs a float32 CPU weight, got {weight.dtype} on {weight.device}")
    return weight.detach().to_mkldnn()


def linear_onednn(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with a weight packed by :func:`pack_onednn` (method ``"onednn"``).

    Args:
        x: ``[..., K]`` float32 CPU input.
        packed: ``pack_onednn(weight)`` for a ``[N, K]`` weight.
        bias: ``[N]`` or None.

    Returns:
        ``[..., N]``.
    """
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch._C._nn.mkldnn_linear(rows.to_mkldnn(), packed, None).to_dense()
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, packed.shape[0])


@attrs.frozen
class LinearPlan:
    """Which method computes a ``[rows, K] x [N, K]^T`` product fastest, per row count.

    Attributes:
        shape: the weight's ``(N, K)``.
        methods: ``methods[n - 1]`` is the method for ``n`` rows, ``1 <= n <= max_rows``.
        seconds: the measured median seconds, ``seconds[n - 1][method]``.
        threads: torch CPU threads during the measurement.
        buckets: ``((rows, method), ...)`` measured beyond ``max_rows``
            (ascending): more rows take the method of the largest bucket at or
            below their count (batched tree forwards carry tens to hundreds of
            rows); without buckets, ``"rows"``.
        bucket_seconds: the measured seconds of each bucket (as ``seconds``); a
            bucket of at most 16 rows won by ``"fewrow"`` hands more rows, up to
            the next bucket, to the fastest other method measured there.
    """

    shape: tuple[int, int]
    methods: tuple[str, ...]
    seconds: tuple[dict[str, float], ...] = attrs.field(eq=False, repr=False)
    threads: int
    buckets: tuple[tuple[int, str], ...] = ()
    bucket_seconds: tuple[dict[str, float], ...] = attrs.field(default=(), eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        late = [n for n, m in enumerate(self.methods, 1) if m == "fewrow" and n > FEWROW_MAX_ROWS]
        late += [n for n, m in self.buckets if m == "fewrow" and n > FEWROW_MAX_ROWS]
        if late:
            raise ValueError(f"the 'fewrow' method takes at most {FEWROW_MAX_ROWS} rows; the plan gives it {late[0]}")

    @property
    def max_rows(self) -> int:
        return len(self.methods)

    @property
    def measured_rows(self) -> tuple[int, ...]:
        """The row counts measured: ``1..max_rows``, then the buckets'."""
        return tuple(range(1, len(self.methods) + 1)) + tuple(n for n, _ in self.buckets)

    def method_for(self, rows: int) -> str:
        """The method for ``rows`` rows: the tuned one up to :attr:`max_rows`,
        then the largest bucket's at or below ``rows`` (``"rows"`` without buckets or for 0 rows).
        Past the ``"fewrow"`` kernel's 16 rows, the fastest other method measured at the
        row count that chose it stands in for it until the next measured count."""
        if 1 <= rows <= len(self.methods):
            return self.methods[rows - 1]
        if rows < 1 or not self.buckets:
            return "rows"
        method = self.methods[-1] if self.methods else "rows"
        timing = self.seconds[-1] if self.seconds else {}
        for i, (size, chosen) in enumerate(self.buckets):
            if size > rows:
                break
            method = chosen
            timing = self.bucket_seconds[i] if i < len(self.bucket_seconds) else {}
        if method == "fewrow" and rows > FEWROW_MAX_ROWS:  # the kernel's limit: the next best measured there
            others = {m: t for m, t in timing.items() if m != "fewrow"}
            method = min(others, key=lambda m: others[m]) if others else "rows"
        return method


def _check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    if isinstance(methods, str) or not methods:
        raise ValueError(f"methods must be a non-empty sequence of {LINEAR_METHODS}, got {methods!r}")
    out = tuple(methods)
    for m in out:
        if m not in LINEAR_METHODS:
            raise ValueError(f"unknown linear method {m!r}; known: {', '.join(LINEAR_METHODS)}")
    if "rows" not in out:
        raise ValueError("methods must include 'rows' (the reference, used for training and large inputs)")
    if "onednn" in out and not onednn_available():
        out = tuple(m for m in out if m != "onednn")
    if "fewrow" in out and not fewrow_available():
        _warn_fewrow_once()
        out = tuple(m for m in out if m != "fewrow")
    return out


_fewrow_warned = False


def _warn_fewrow_once() -> None:
    """Say once per process that the few-row kernel is not among the candidates, and why."""
    global _fewrow_warned
    if not _fewrow_warned:
        _fewrow_warned = True
        warnings.warn(f"the 'fewrow' linear method is left out of the CPU linear tuning: {fewrow_unavailable_reason()}; "
                      "few-row target forwards take the torch layouts (slower: docs/bench.md)", stacklevel=4)


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The median of ``repeats`` consecutive timed calls of ``fn`` after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _interleaved_min_seconds(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """The fastest of ``repeats`` timed calls of each run, the runs interleaved (A, B, C, A, B, C, ...).

    Why not a median of consecutive calls: on a shared machine another process takes the
    cores for whole scheduler slices (milliseconds, longer than a small product), so a
    median of three consecutive calls could crown whichever method was not preempted
    (plans measured so picked ``rows`` for 2-16 rows of a 576 x 1536 weight, 5-50x slower).
    Interference only adds time, so each method's minimum is its cost on a quiet core, and
    interleaving exposes every method to the same spells of load.
    """
    # the first round: each run warmed up (allocator, oneDNN primitive cache) and timed once
    best = {m: _median_seconds(fn, 1) for m, fn in runs.items()}
    for _ in range(repeats - 1):
        for m, fn in runs.items():
            start = time.perf_counter()
            fn()
            best[m] = min(best[m], time.perf_counter() - start)
    return best


_PLANS: dict[tuple[Any, ...], LinearPlan] = {}

PLAN_FILE_ENV = "SPECDEC_LINEAR_PLANS"
"""Environment variable: the JSON file of tuned plans shared by processes on this
machine (default ``<specdec cache>/linear-plans.json``); ``0`` turns the file off."""


def plan_file() -> Path | None:
    """The on-disk plan cache (:data:`PLAN_FILE_ENV`), None when turned off."""
    value = os.environ.get(PLAN_FILE_ENV)
    if value == "0":
        return None
    if value:
        return Path(value).expanduser()
    return cache_root() / "linear-plans.json"


def _machine() -> str:
    """What a plan's timings depend on besides its key: CPU model, vector ISA, torch, oneDNN."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    isa = torch.backends.cpu.get_cpu_capability()
    return f"{model} | {isa} | torch {torch.__version__} | onednn {onednn_available()} | cpus {os.cpu_count()}"


PLAN_TIMING = "interleaved-min"
"""How plans are timed (:func:`_interleaved_min_seconds`); part of the plan file's keys, so plans
timed otherwise (medians of consecutive calls, before issue 48) are measured again, not reused."""


def _file_key(key: tuple[Any, ...], repeats: int) -> str:
    return json.dumps([_machine(), repr(key), repeats, PLAN_TIMING])


def _load_plan(key: tuple[Any, ...], repeats: int) -> LinearPlan | None:
    path = plan_file()
    if path is None or not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text()).get(_file_key(key, repeats))
        if entry is None:
            return None
        return LinearPlan(shape=tuple(entry["shape"]), methods=tuple(entry["methods"]), seconds=tuple(entry["seconds"]),
                          threads=int(entry["threads"]), buckets=tuple((int(n), str(m)) for n, m in entry["buckets"]),
                          bucket_seconds=tuple(entry.get("bucket_seconds", ())))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"ignoring the linear plan cache {path} ({exc}); plans are measured again", stacklevel=3)
        return None


def _store_plan(key: tuple[Any, ...], repeats: int, plan: LinearPlan) -> None:
    path = plan_file()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            table = {}
        table[_file_key(key, repeats)] = {"shape": list(plan.shape), "methods": list(plan.methods),
                                 "seconds": [dict(t) for t in plan.seconds], "threads": plan.threads,
                                 "buckets": [list(b) for b in plan.buckets],
                                 "bucket_seconds": [dict(t) for t in plan.bucket_seconds]}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table))
        os.replace(tmp, path)  # atomic: concurrent workers never read half a file
    except OSError as exc:
        warnings.warn(f"could not write the linear plan cache {path} ({exc})", stacklevel=3)


LARGE_ROWS: tuple[int, ...] = BUCKET_ROWS
"""Row counts beyond ``max_rows`` that :func:`tune_linear` measures when asked for them
(``large_rows=LARGE_ROWS``, :attr:`LinearPlan.buckets`); by default only those a one-row run
reaches are (:data:`~specdec.kernels.tuning_scope.DEFAULT_ROWS`)."""


def _plan_key(n_out: int, k_in: int, rows: Sequence[int], cands: tuple[str, ...]) -> tuple[Any, ...]:
    """The cache key of a plan measuring ``rows``: the contiguous counts ``1..m``, then the others."""
    prefix = 0
    while prefix + 1 in rows:
        prefix += 1
    big = tuple(r for r in rows if r > prefix)
    return ((n_out, k_in), prefix, cands, torch.get_num_threads(), big)


def _row_counts(max_rows: int | None, large_rows: Sequence[int] | None, rows: Sequence[int] | None) -> tuple[int, ...]:
    """The row counts :func:`tune_linear` measures for these arguments (its docstring)."""
    if rows is not None:
        return check_rows(rows)
    if max_rows is None and large_rows is None:
        return current_rows()
    top = 16 if max_rows is None else max_rows
    extra = [r for r in current_rows() if r > max(top, 16)] if large_rows is None else [int(r) for r in large_rows]
    return tuple(range(1, top + 1)) + tuple(sorted({r for r in extra if r > top}))


def cached_plan(shape: tuple[int, int], rows: Sequence[int], methods: Sequence[str] = LINEAR_METHODS,
                repeats: int = 5) -> LinearPlan | None:
    """The plan :func:`tune_linear` would return for these arguments without measuring, or None
    (it is in neither the process's plans nor the plan file)."""
    key = _plan_key(int(shape[0]), int(shape[1]), check_rows(rows), _check_methods(methods))
    return _PLANS.get(key) or _load_plan(key, repeats)


def _where_cached() -> str:
    path = plan_file()
    return f"cached in {path}" if path is not None else f"not cached: {PLAN_FILE_ENV}=0"


def tune_linear(
    shape: tuple[int, int],
    *,
    max_rows: int | None = None,
    methods: Sequence[str] = LINEAR_METHODS,
    repeats: int = 5,
    cold_bytes: int = 32 * 2**20,
    cache: bool = True,
    large_rows: Sequence[int] | None = None,
    rows: Sequence[int] | None = None,
) -> LinearPlan:
    """Measure each method at each row count the caller will use, on this machine, and keep the fastest.

    The row counts: ``rows`` when given; else the scope's
    (:func:`~specdec.kernels.tuning_scope.tuning_rows`), by default
    :data:`~specdec.kernels.tuning_scope.DEFAULT_ROWS` (1-16 and 24-64: a one-row
    run's trees, baseline and draft levels), with ``max_rows`` replacing the counts
    up to 16 by ``1..max_rows`` and ``large_rows`` replacing those above it. A count
    that was not measured takes the method of the largest measured count below it;
    ``"rows"`` below the smallest, and past ``1..m`` when nothing beyond a contiguous
    ``1..m`` was measured (``large_rows=()``).

    The weights are random float32 matrices of ``shape``; several copies
    (about ``cold_bytes`` in all, at most 64) are cycled so that a small
    weight is timed out of cache, as it is inside a model. Plans are cached
    per ``(shape, row counts, methods, threads)`` for the process and, with
    ``cache``, in a file shared by the processes of this machine
    (:func:`plan_file`, keyed also by CPU model, vector ISA, torch and oneDNN:
    a Ray worker or a second run does not measure again). A measurement
    expected to take a second or more says so on stderr (the weight, the row
    counts, about how long, the plan file), and again at least every 30 s
    (:func:`~specdec.kernels.tuning_scope.tuning_log` sends the lines elsewhere).

    Args:
        shape: the weight's ``(N, K)``.
        max_rows: largest row count tuned one by one.
        large_rows: further row counts measured (those above ``max_rows``);
            a larger input takes the method of the largest one at or below
            its count (``LARGE_ROWS``: up to 256 rows; ``()``: none, larger
            inputs take ``"rows"``).
        rows: the row counts to measure (ints >= 1; overrides ``max_rows`` and ``large_rows``).
        methods: candidates (must include ``"rows"``; ``"onednn"`` is dropped
            where oneDNN is missing).
        repeats: timed calls per (rows, method), the methods interleaved; the fastest counts
            (robust to other processes on the machine: :func:`_interleaved_min_seconds`).
        cold_bytes: total bytes of weight copies cycled through.
        cache: reuse and store the plan in the process-wide cache and the
            plan file (``SPECDEC_LINEAR_PLANS=0``: the process cache only).

    Returns:
        The :class:`LinearPlan`.
    """
    n_out, k_in = (int(s) for s in shape)
    if n_out < 1 or k_in < 1:
        raise ValueError(f"shape must be positive, got {shape}")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise ValueError(f"max_rows must be an int >= 1, got {max_rows!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    counts = _row_counts(max_rows, large_rows, rows)
    cands = _check_methods(methods)
    key = _plan_key(n_out, k_in, counts, cands)
    if cache and key in _PLANS:
        return _PLANS[key]
    if cache:
        stored = _load_plan(key, repeats)
        if stored is not None:
            _PLANS[key] = stored
            return stored
    prefix = key[1]
    expect = expected_seconds((n_out, k_in), counts, len(cands), repeats, cold_bytes)
    talk = expect >= 1.0
    if talk:
        say(f"tuning the CPU linear layout of a {n_out:,} x {k_in:,} weight for {describe_rows(counts)} rows "
            f"({', '.join(cands)}; about {expect:.0f} s on a quiet 2-core CPU; once per machine, "
            f"{_where_cached() if cache else 'not cached'})")
    copies = max(1, min(64, math.ceil(cold_bytes / (4 * n_out * k_in))))
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n_out, k_in, generator=gen) * 0.02 for _ in range(copies)]
    packed = [pack_onednn(w) for w in weights] if "onednn" in cands else []
    blocked = [pack_fewrow(w) for w in weights] if "fewrow" in cands else []
    measured: dict[int, tuple[str, dict[str, float]]] = {}

    def fastest(n: int) -> tuple[str, dict[str, float]]:
        x = torch.randn(n, k_in, generator=gen)
        runs: dict[str, Callable[[], Any]] = {
            "rows": lambda: [linear_reference(x, w) for w in weights],
            "columns": lambda: [linear_columns(x, w) for w in weights],
            "onednn": lambda: [linear_onednn(x, p) for p in packed],
            "fewrow": lambda: [linear_fewrow(x, b, n_out) for b in blocked],
        }
        here = tuple(m for m in cands if m != "fewrow" or n <= FEWROW_MAX_ROWS)
        timing = _interleaved_min_seconds({m: runs[m] for m in here}, repeats)
        timing = {m: t / copies for m, t in timing.items()}
        return min(here, key=lambda m: (timing[m], m != "rows")), timing

    started = time.perf_counter()
    weight_of = [1 + r / 8 for r in counts]  # a row count's share of the work (expected_seconds)

    def progress(elapsed: float) -> str:
        done = len(measured)
        left = f", about {elapsed * (sum(weight_of) / sum(weight_of[:done]) - 1):.0f} s left" if done else ""
        return f"  ... {n_out:,} x {k_in:,}: {done} of {len(counts)} row counts in {elapsed:.0f} s{left}"

    with torch.no_grad(), heartbeat(progress, PROGRESS_S) if talk else contextlib.nullcontext():
        for n in counts:
            measured[n] = fastest(n)
    small = [measured[n] for n in range(1, prefix + 1)]
    big = [(n, measured[n]) for n in key[4]]
    plan = LinearPlan(shape=(n_out, k_in), methods=tuple(m for m, _ in small), seconds=tuple(t for _, t in small),
                      threads=torch.get_num_threads(), buckets=tuple((n, m) for n, (m, _) in big),
                      bucket_seconds=tuple(t for _, (_, t) in big))
    if talk:
        say(f"  ... {n_out:,} x {k_in:,} tuned in {time.perf_counter() - started:.1f} s")
    if cache:
        _PLANS[key] = plan
        _store_plan(key, repeats, plan)
    return plan


def _version(t: torch.Tensor) -> int:
    """``t``'s in-place version counter (0 for inference tensors, which cannot change in place outside inference mode)."""
    try:
        return int(t._version)
    except RuntimeError:
        return 0


class RowDispatchLinear:
    """The ``forward`` that :func:`accelerate_linears` installs on a :class:`torch.nn.Linear`.

    Calls the plan's method for the input's row count when the input is a
    float32 CPU tensor and no gradient is needed; otherwise (training,
    autograd, other devices or dtypes) the reference
    ``F.linear``. The oneDNN copy of the weight is made on first use and
    remade whenever the weight changes in place (its version counter moves);
    so is the few-row kernel's blocked copy (packed when the plan is installed).
    """

    def __init__(self, module: Any, plan: LinearPlan) -> None:
        self.module = module
        self.plan = plan
        self._packed: torch.Tensor | None = None
        self._packed_version = -1
        self._blocked: torch.Tensor | None = None
        self._blocked_version = -1
        weight = module.weight
        if "fewrow" in plan.methods and weight.device.type == "cpu" and weight.dtype == torch.float32:
            with torch.no_grad():  # packed at install, like oneDNN's copy below
                self._fewrow_weight()
        if "onednn" in plan.methods or any(m == "onednn" for _, m in plan.buckets):
            # packed now, not at the first forward of a row count that takes oneDNN: packing an LM head
            # (113 MB for SmolLM2-135M) costs tens of milliseconds, and a model's layers about a second in
            # all, which used to land inside a timed generation (issue 48's step profile)
            weight = module.weight
            if weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_available():
                with torch.no_grad():
                    self._onednn_weight()

    def _onednn_weight(self) -> torch.Tensor:
        weight = self.module.weight
        version = _version(weight)
        if self._packed is None or self._packed_version != version:
            self._packed = pack_onednn(weight)
            self._packed_version = version
        return self._packed

    def _fewrow_weight(self) -> torch.Tensor:
        weight = self.module.weight
        version = _version(weight)
        if self._blocked is None or self._blocked_version != version:
            self._blocked = pack_fewrow(weight)
            self._blocked_version = version
        return self._blocked

    def __call__(self, input: torch.Tensor) -> torch.Tensor:  # nn.Linear.forward's name: it may be passed by keyword
        x = input
        weight, bias = self.module.weight, self.module.bias
        if (
            x.device.type != "cpu"
            or x.dtype != torch.float32
            or weight.dtype != torch.float32
            or weight.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        ):
            return F.linear(x, weight, bias)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        method = self.plan.method_for(rows) if rows else "rows"
        if method == "columns":
            return linear_columns(x, weight, bias)
        if method == "onednn":
            return linear_onednn(x, self._onednn_weight(), bias)
        if method == "fewrow":
            return linear_fewrow(x, self._fewrow_weight(), weight.shape[0], bias)
        return F.linear(x, weight, bias)


def resolve_cpu_linear(option: bool | str, device: torch.device) -> bool:
    """The ``cpu_linear`` option of the model wrappers: True / False, or
    ``"auto"`` = on for a model on the CPU."""
    if option == "auto":
        return torch.device(device).type == "cpu"
    if not isinstance(option, bool):
        raise ValueError(f"cpu_linear must be True, False or 'auto', got {option!r}")
    return option


def _linears(model: nn.Module) -> Iterable[nn.Linear]:
    return (m for m in model.modules() if isinstance(m, nn.Linear))


def accelerate_linears(
    model: nn.Module,
    *,
    max_rows: int | None = None,
    methods: Sequence[str] = LINEAR_METHODS,
    repeats: int = 5,
    min_numel: int = 1 << 16,
    large_numel: int = 1 << 25,
    rows: Sequence[int] | None = None,
) -> dict[tuple[int, int], LinearPlan]:
    """Install a tuned :class:`RowDispatchLinear` as the ``forward`` of every
    CPU float32 :class:`torch.nn.Linear` in ``model`` (in place; the module
    types, parameters and ``state_dict`` are unchanged).

    Each distinct weight shape is tuned once per machine (:func:`tune_linear`,
    cached in :func:`plan_file`), at the row counts the caller will use
    (``rows``; by default a one-row run's,
    :data:`~specdec.kernels.tuning_scope.DEFAULT_ROWS`): on a quiet 2-core CPU
    about 5 s for SmolLM2-135M's 49,152 x 576 LM head and 1-2 s for each other
    shape, about 13 s for the model (minutes under load). When shapes must be
    measured, a line on stderr says how many, about how long and where they are
    cached, then one line per shape. Calling it again re-installs.
    :func:`restore_linears` undoes it.

    Args:
        model: any module.
        max_rows, rows, methods, repeats: as in :func:`tune_linear`.
        min_numel: layers whose weight has fewer elements keep ``F.linear``
            (for tiny weights the choice does not matter and tuning is wasted).
        large_numel: weights with more elements (an LM head over a large
            vocabulary: Gemma-3's 262,144 x 640) measure row counts only up to
            64 (larger inputs take the 64-row count's method): such a head's
            tuning at 96-256 rows costs minutes on a 2-core CPU.

    Returns:
        ``{weight shape: plan}`` for the layers changed (empty when none qualifies).

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
        >>> x = torch.randn(3, 8)
        >>> with torch.no_grad():
        ...     before = net(x)
        ...     plans = accelerate_linears(net, rows=[1, 2, 3, 4], repeats=1, min_numel=0)
        ...     after = net(x)
        >>> list(plans), plans[(4, 8)].measured_rows, torch.allclose(before, after, atol=1e-6)
        ([(4, 8)], (1, 2, 3, 4), True)
        >>> restore_linears(net)
        1
    """
    counts = _row_counts(max_rows, None, rows)
    layers: list[tuple[nn.Linear, tuple[int, int]]] = []
    wanted: dict[tuple[int, int], tuple[int, ...]] = {}
    for lin in _linears(model):
        w = lin.weight
        if w.device.type != "cpu" or w.dtype != torch.float32 or w.numel() < min_numel:
            continue
        shape = (int(w.shape[0]), int(w.shape[1]))
        layers.append((lin, shape))
        if shape not in wanted:
            wanted[shape] = counts if w.numel() <= large_numel else tuple(r for r in counts if r <= 64) or counts[:1]
    plans: dict[tuple[int, int], LinearPlan] = {}
    todo = [shape for shape, r in wanted.items() if cached_plan(shape, r, methods, repeats) is None]
    cands = len(_check_methods(methods)) if todo else 0
    expect = sum(expected_seconds(shape, wanted[shape], cands, repeats, 32 * 2**20) for shape in todo)
    started = time.perf_counter()
    if expect >= 1.0:
        say(f"tuning the CPU linear layouts of {type(model).__name__}: {len(todo)} weight shape(s) at "
            f"{describe_rows(counts)} rows, about {expect:.0f} s on a quiet 2-core CPU (first use on this machine, "
            f"{_where_cached()})")
    for shape, r in wanted.items():
        plans[shape] = tune_linear(shape, rows=r, methods=methods, repeats=repeats)
    if expect >= 1.0:
        say(f"tuned the CPU linear layouts of {type(model).__name__} in {time.perf_counter() - started:.0f} s")
    for lin, shape in layers:
        lin.forward = RowDispatchLinear(lin, plans[shape])  # type: ignore[method-assign]  # installing a forward is the point (restore_linears undoes it)
    return plans


def restore_linears(model: nn.Module) -> int:
    """Remove what :func:`accelerate_linears` installed; returns how many layers were restored."""
    count = 0
    for lin in _linears(model):
        if isinstance(lin.__dict__.get("forward"), RowDispatchLinear):
            del lin.forward
            count += 1
    return count


def dispatch_for(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    max_rows: int | None = None,
    methods: Sequence[str] = LINEAR_METHODS,
    rows: Sequence[int] | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A ``x -> F.linear(x, weight, bias)`` function with the tuned dispatch, for a bare
    weight (a target's LM head used by a draft; the rows of an LM head that a draft's
    proposal vocabulary keeps). Same rules as :class:`RowDispatchLinear`; the row counts
    tuned as in :func:`tune_linear`."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (int(weight.shape[0]),):
        raise ValueError(f"bias must be [N] = [{int(weight.shape[0])}], got shape {tuple(bias.shape)}")
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return lambda x: F.linear(x, weight, bias)
    plan = tune_linear((int(weight.shape[0]), int(weight.shape[1])), max_rows=max_rows, methods=methods, rows=rows)
    return RowDispatchLinear(types.SimpleNamespace(weight=weight, bias=bias), plan)
