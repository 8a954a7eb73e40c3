"""``runs.jsonl``: the resumable log of a ``specdec bench --out DIR`` sweep (docs/bench.md).

Layout: the first line is a *header* object (``"format": "specdec-bench-runs"``)
holding the run's *identity* (``config``: everything that decides what the
records mean: target, drafts, rows, temperatures, seeds, tokens, budget
request, prompts) and what the run resolved before measuring (``resolved``:
the tree budget (per temperature and draft kind with ``--budget auto``, rheo's sampled slots
``m`` included: :func:`budget_entry`), ``--budget auto``'s measurements,
Sequoia's acceptance profiles, the prompts used with their categories, the model descriptions).
Every further line is one finished generation (a
:class:`~specdec.bench.sweep.RunRecord` as a JSON object, with the tree
budget of its temperature and draft kind), appended and
flushed to disk as soon as it completes.

Resuming: rerunning the same command with the same ``--out`` reads the log,
checks that the identity is the same (a different one is refused: results of
two configurations are never mixed), reuses the resolved budget and profiles
(nothing is re-measured: the remaining records mean the same thing as the
finished ones) and skips the generations already in the log. A log written
before ``--budget auto`` chose per temperature holds one budget: resuming it
reuses that budget at every temperature and rheo's default ``m``, as its
logged generations ran (:func:`logged_budget`). A kill can only
lose the generations in flight: a last line cut by the kill is dropped (and the
log rewritten without it) on the next read; any other unreadable line, and any
record whose fields are of the wrong type, out of range or inconsistent
(:mod:`specdec.bench.runlog_checks`), is an error naming the file and line.
One process writes a log at a time (:mod:`specdec.bench.folder_lock`), and a
writer whose file was replaced or deleted under it stops with an error.

The header is written to a temporary file and moved into place, so
``runs.jsonl`` either does not exist or starts with a complete header.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from specdec.bench.budget import Budget, BudgetPlan
from specdec.bench.runlog_checks import check_record, sweep_shape
from specdec.bench.sweep import RunRecord
from specdec.errors import InvalidConfigError

__all__ = [
    "FORMAT",
    "VERSION",
    "RUNS_FILE",
    "RunLog",
    "RunLogWriter",
    "run_key",
    "prompts_digest",
    "read_runlog",
    "write_header",
    "identity_differences",
    "record_from_dict",
    "budget_entry",
    "logged_budget",
    "strict_json",
    "jsonable",
]

FORMAT = "specdec-bench-runs"
VERSION = 1
RUNS_FILE = "runs.jsonl"



def run_key(row: str, prompt_index: int, temperature: float, seed: int) -> tuple[str, int, float, int]:
    """What identifies one generation of a sweep: ``(row, prompt index, temperature, seed)``."""
    return (str(row), int(prompt_index), float(temperature), int(seed))


def prompts_digest(prompts: Iterable[Any]) -> str:
    """SHA-256 over the prompts' ids, categories and texts (a ``BenchPrompt`` sequence)."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([str(p.question_id), p.category, p.text], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _records_field(value: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(value)


@attrs.frozen
class RunLog:
    """A read ``runs.jsonl``.

    Attributes:
        path: the file.
        header: the header object (``config``, ``resolved``).
        records: the generations, as dicts (in file order).
        dropped_tail: a last line cut by a kill was dropped.
    """

    path: Path
    header: dict[str, Any]
    records: tuple[dict[str, Any], ...] = attrs.field(converter=_records_field)
    dropped_tail: bool = False

    @property
    def config(self) -> dict[str, Any]:
        return self.header["config"]

    @property
    def resolved(self) -> dict[str, Any]:
        return self.header["resolved"]

    def keys(self) -> set[tuple[str, int, float, int]]:
        return {run_key(r["row"], r["prompt_index"], r["temperature"], r["seed"]) for r in self.records}

    def expected(self) -> int:
        """Generations the whole sweep makes (from the header)."""
        return int(self.resolved["expected_runs"])

    @property
    def complete(self) -> bool:
        return len(self.records) >= self.expected()


def _foreign(path: Path, why: str) -> InvalidConfigError:
    return InvalidConfigError(
        f"{path} is not a specdec bench run log ({why}); `specdec bench --out` refuses that folder unless "
        "--overwrite is given (which replaces its results): choose another folder to keep them"
    )


def read_runlog(path: str | os.PathLike, *, repair: bool = False) -> RunLog:
    """Read and check ``runs.jsonl`` (``path`` is the file or its folder).

    Args:
        repair: rewrite the file without a last line cut by a kill (resuming
            does, so that appends start on a fresh line).

    Every record is checked field by field
    (:func:`~specdec.bench.runlog_checks.check_record`: types, ranges, the
    counts that must agree, its place in the sweep the header describes).

    Raises:
        InvalidConfigError: a missing or foreign header, a newer format, a
            header field of the sweep's shape out of range, a corrupt line
            other than a cut last line (not JSON, a number too long to read,
            a nesting too deep), a malformed record (a field of the wrong type,
            out of range, or counts that disagree), a record outside the sweep
            the header describes, or a generation logged twice (the message
            names the file and the line).
    """
    p = Path(path)
    if p.is_dir():
        p = p / RUNS_FILE
    if not p.is_file():
        raise InvalidConfigError(f"{p} does not exist (a specdec bench --out folder holds one)")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _foreign(p, "not UTF-8 text") from None
    lines = text.split("\n")
    ends_clean = text.endswith("\n")
    if ends_clean:
        lines = lines[:-1]
    if not lines or not lines[0].strip():
        raise _foreign(p, "empty, no header line")
    try:
        header = json.loads(lines[0])
    except (ValueError, RecursionError):  # JSONDecodeError, a 5,000-digit number, a deep nesting
        raise _foreign(p, "line 1 is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _foreign(p, f"line 1 is not a {FORMAT!r} header; logs of specdec before resumable runs cannot be resumed")
    if not isinstance(header.get("version"), int) or header["version"] > VERSION:
        raise InvalidConfigError(f"{p}: run log version {header.get('version')!r} is newer than this specdec's ({VERSION})")
    if not isinstance(header.get("config"), dict) or not isinstance(header.get("resolved"), dict):
        raise _foreign(p, "the header has no config or resolved object")
    shape = sweep_shape(header, f"{p}:1")
    records: list[dict[str, Any]] = []
    seen: dict[tuple[str, int, float, int], int] = {}
    dropped = False
    for n, line in enumerate(lines[1:], start=2):
        last = n == len(lines)
        if not line.strip():
            if last:
                continue
            raise InvalidConfigError(f"{p}:{n}: empty line inside the run log (corrupt file)")
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, a 5,000-digit number, a deep nesting
            if last and not ends_clean:  # the write a kill cut short: that generation was in flight
                dropped = True
                break
            why = ("nested too deeply" if isinstance(exc, RecursionError) else
                   f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)[:100])
            raise InvalidConfigError(f"{p}:{n}: not JSON ({why}; corrupt run log: only a cut last line is "
                                     "dropped)") from None
        where = f"{p}:{n}"
        check_record(rec, where, shape)  # every field: types, ranges, counts, the place in the sweep
        generation = run_key(rec["row"], rec["prompt_index"], rec["temperature"], rec["seed"])
        if generation in seen:
            raise InvalidConfigError(f"{where}: the generation of line {seen[generation]} is logged twice "
                                     "(corrupt run log)")
        seen[generation] = n
        records.append(rec)
    log = RunLog(p, header, records, dropped)
    if repair and (dropped or not ends_clean):
        _atomic_write(p, [lines[0], *(json.dumps(r, allow_nan=False) for r in records)])
    return log


def strict_json(value: Any) -> Any:
    """``value`` with NaN and infinities as None, recursively (strict JSON: ``allow_nan=False``);
    tuples become lists, keys strings.

    Example:
        >>> strict_json({"tau": float("nan"), 1: (2.0, float("inf"))})
        {'tau': None, '1': [2.0, None]}
    """
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def jsonable(value: Any) -> Any:
    """Builder options as JSON: mappings with string keys, lists, and JSON scalars; any other value
    as its ``str`` (the ``options`` of a header and of ``results.json``).

    Example:
        >>> jsonable({"expansion": (2, 1), 3: 1j})
        {'expansion': [2, 1], '3': '1j'}
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def _atomic_write(path: Path, lines: Sequence[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_header(out: str | os.PathLike, config: Mapping[str, Any], resolved: Mapping[str, Any]) -> Path:
    """Start a fresh ``runs.jsonl`` in ``out`` (replacing any earlier one) with its header."""
    path = Path(out) / RUNS_FILE
    header = {"format": FORMAT, "version": VERSION, "config": strict_json(dict(config)),
              "resolved": strict_json(dict(resolved))}
    _atomic_write(path, [json.dumps(header, allow_nan=False)])
    return path


class RunLogWriter:
    """Appends finished generations to ``runs.jsonl``, each flushed and synced to disk.

    ``sequence`` numbers continue from ``start_sequence`` in the order the
    records reach the writer (with Ray workers: the order they arrive).

    After each record the writer checks that ``path`` is still the file it
    appends to: a log replaced or deleted under it (by a process that does not
    take the folder's lock, :mod:`specdec.bench.folder_lock`) raises
    :class:`~specdec.errors.InvalidConfigError` instead of losing the records
    silently.
    """

    def __init__(self, path: str | os.PathLike, start_sequence: int = 0) -> None:
        self.path = Path(path)
        self.next_sequence = start_sequence
        self._fh = self.path.open("a", encoding="utf-8")
        st = os.fstat(self._fh.fileno())
        self._identity = (st.st_dev, st.st_ino)
        self._written = 0

    def write(self, record: Mapping[str, Any]) -> dict[str, Any]:
        rec = strict_json(dict(record))
        rec["sequence"] = self.next_sequence
        self.next_sequence += 1
        self._fh.write(json.dumps(rec, allow_nan=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._written += 1
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self._identity
        except FileNotFoundError:
            same = False
        if not same:
            raise InvalidConfigError(
                f"{self.path} was replaced or deleted by another process while this sweep appended to it (another "
                "program writing the same folder): the file no longer holds the "
                f"{self._written} generation{'' if self._written == 1 else 's'} this run logged; rerun the command "
                "to resume from what the file holds"
            )
        return rec

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def identity_differences(logged: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two run identities (empty when they match)."""
    out = []
    for key in sorted(set(logged) | set(current)):
        a, b = logged.get(key), current.get(key)
        if strict_json(a) != strict_json(b):
            out.append(f"{key}: {_short(a)} in the log, {_short(b)} now")
    return out


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def record_from_dict(rec: Mapping[str, Any]) -> RunRecord:
    """A :class:`~specdec.bench.sweep.RunRecord` from a logged line (null times -> NaN; a line logged
    before ``--optimum`` existed has no ``depth_optimum`` / ``optimum_bound``: empty and false; one logged
    before the per-position counts has no ``depth_drafted``: empty)."""
    nan = float("nan")
    return RunRecord(
        sequence=int(rec["sequence"]), unit=int(rec["unit"]), prompt_index=int(rec["prompt_index"]),
        temperature=float(rec["temperature"]), seed=int(rec["seed"]), row=str(rec["row"]),
        new_tokens=int(rec["new_tokens"]), steps=int(rec["steps"]), emitted=int(rec["emitted"]),
        depth_attempted=tuple(int(x) for x in rec["depth_attempted"]),
        depth_accepted=tuple(int(x) for x in rec["depth_accepted"]),
        time_total=nan if rec["time_total"] is None else float(rec["time_total"]),
        time_prefill=nan if rec["time_prefill"] is None else float(rec["time_prefill"]),
        time_draft=nan if rec["time_draft"] is None else float(rec["time_draft"]),
        time_target=nan if rec["time_target"] is None else float(rec["time_target"]),
        time_verify=nan if rec["time_verify"] is None else float(rec["time_verify"]),
        tokens=tuple(int(t) for t in rec["tokens"]),
        budget_nodes=None if rec.get("budget_nodes") is None else int(rec["budget_nodes"]),
        budget_depth=None if rec.get("budget_depth") is None else int(rec["budget_depth"]),
        depth_optimum=tuple(float(x) for x in rec.get("depth_optimum") or ()),
        optimum_bound=bool(rec.get("optimum_bound", False)),
        depth_drafted=tuple(int(x) for x in rec.get("depth_drafted") or ()),
    )


def budget_entry(budget: BudgetPlan, slots: Mapping[float, int] | None = None, *,
                 auto: bool) -> dict[str, Any]:
    """The header's ``resolved.budget``: ``{"nodes", "depth", "auto"}`` for one budget at every
    temperature; with a budget per temperature (``--budget auto``) also ``by_temperature``, a list of
    ``{"temperature", "nodes", "depth", "m"}`` (``m``: rheo's sampled slots, None without a choice),
    and ``nodes`` / ``depth`` None unless every temperature has the same budget. With a budget per
    temperature and draft kind (``--budget auto`` since issue 59) each temperature's entry also has
    ``by_kind`` (``{kind: {"nodes", "depth"}}``), and its ``nodes`` / ``depth`` are None unless every
    kind has the same budget there.

    Example:
        >>> budget_entry({0.0: {"lm": Budget(1, 1), "eagle3": Budget(4, 2)}}, auto=True)["by_temperature"]
        [{'temperature': 0.0, 'nodes': None, 'depth': None, 'm': None, 'by_kind': {'eagle3': {'nodes': 4, 'depth': 2}, \
'lm': {'nodes': 1, 'depth': 1}}}]
    """
    slots = dict(slots or {})
    if isinstance(budget, Budget) and not slots:
        return {"nodes": budget.nodes, "depth": budget.depth, "auto": bool(auto)}
    per = budget if not isinstance(budget, Budget) else {t: budget for t in slots}

    def pair(entry: Budget | Mapping[str, Budget]) -> tuple[int, int] | None:
        if isinstance(entry, Budget):
            return entry.nodes, entry.depth
        one = {(b.nodes, b.depth) for b in entry.values()}
        return next(iter(one)) if len(one) == 1 else None

    pairs = {t: pair(e) for t, e in per.items()}
    one = set(pairs.values())
    nodes: int | None = None
    depth: int | None = None
    only = next(iter(one)) if len(one) == 1 else None
    if only is not None:
        nodes, depth = only
    entries = []
    for t in sorted(per):
        e = per[t]
        both = pairs[t]
        item: dict[str, Any] = {"temperature": float(t), "nodes": both[0] if both else None,
                                "depth": both[1] if both else None, "m": slots.get(t)}
        if not isinstance(e, Budget):
            item["by_kind"] = {k: {"nodes": e[k].nodes, "depth": e[k].depth} for k in sorted(e)}
        entries.append(item)
    return {"nodes": nodes, "depth": depth, "auto": bool(auto), "by_temperature": entries}


def logged_budget(resolved: Mapping[str, Any]) -> tuple[Budget | dict[float, Budget | dict[str, Budget]],
                                                         dict[float, int]]:
    """The tree budget and rheo's sampled slots a header's ``resolved`` holds (:func:`budget_entry`).

    Returns ``(budget, slots)``: one :class:`~specdec.bench.budget.Budget` for
    every temperature (a fixed budget, and every log written before
    ``--budget auto`` chose per temperature: its one budget served all of
    them), ``{T: Budget}`` (logs written before it chose per draft kind) or
    ``{T: {kind: Budget}}``; ``slots`` is ``{T: m}`` (empty when none was chosen).

    Raises:
        InvalidConfigError: the header has no usable budget.
    """
    entry = resolved.get("budget")
    try:
        if isinstance(entry, Mapping) and entry.get("by_temperature"):
            per: dict[float, Budget | dict[str, Budget]] = {}
            for e in entry["by_temperature"]:
                kinds = e.get("by_kind")
                per[float(e["temperature"])] = (
                    {str(k): Budget(int(b["nodes"]), int(b["depth"])) for k, b in kinds.items()}
                    if isinstance(kinds, Mapping) and kinds else Budget(int(e["nodes"]), int(e["depth"])))
            slots = {float(e["temperature"]): int(e["m"]) for e in entry["by_temperature"] if e.get("m") is not None}
            return per, slots
        if isinstance(entry, Mapping):
            return Budget(int(entry["nodes"]), int(entry["depth"])), {}
    except (KeyError, TypeError, ValueError, AttributeError, InvalidConfigError):
        pass
    raise InvalidConfigError(f"the run log's header has no usable tree budget ({_short(entry)})")
