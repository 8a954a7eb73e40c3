"""What a ``specdec bench`` command holds while it runs, and gives back however it stops
(docs/bench.md, "One writer, a checked log, Ctrl-C").

:class:`BenchSession` holds the ``--out`` folder's lock
(:mod:`specdec.bench.folder_lock`), the Ray worker pools, and what is logged
where, so that :func:`specdec.bench.cli.bench_main` can shut the pools down,
release the lock and, after Ctrl-C, print one line (how many generations are
logged where; rerunning the same command resumes) and return
:data:`INTERRUPTED`. :func:`report_lock` is the lock of a writing ``specdec
bench report``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from specdec.bench.folder_lock import FolderLock, lock_folder
from specdec.bench.runlog import read_runlog
from specdec.errors import SpecDecError

__all__ = ["INTERRUPTED", "BenchSession", "PlainProgress", "report_lock"]

INTERRUPTED = 130
"""``specdec bench``'s exit status after Ctrl-C (128 + SIGINT, as shells report it)."""

_BENCH_HINT = ("two writers would log the same generations twice; wait for it to finish (rerunning this command "
               "then resumes the sweep, or rebuilds the report of a finished one), or choose another folder")
_REPORT_HINT = ("pass --no-write to print the report of the generations logged so far without writing into the "
                "folder, or wait for it to finish")


@attrs.define
class BenchSession:
    """What one ``specdec bench`` command holds (mutable: filled in as the command goes).

    Attributes:
        pools: the Ray worker pools started.
        lock: the ``--out`` folder's lock.
        out_dir: the ``--out`` folder.
        log_path: the sweep's ``runs.jsonl``, once one exists (resumed, or its header written).
        logged: generations that file holds (updated as each one is written).
        expected: generations of the whole sweep.
    """

    pools: list[Any] = attrs.field(factory=list)
    lock: FolderLock | None = None
    out_dir: Path | None = None
    log_path: Path | None = None
    logged: int = 0
    expected: int | None = None

    def lock_out(self, out: str, log: Callable[[str], None]) -> None:
        """Take ``--out``'s lock (before its log is read: a second writer is refused here, naming
        the holder); a lock left by a run that no longer runs is taken over, and ``log`` says so."""
        self.lock = lock_folder(out, command="specdec bench", hint=_BENCH_HINT)
        if self.lock.previous is not None:
            log(f"took over the lock of a specdec bench that ended without releasing it "
                f"({self.lock.previous.describe()})")

    def interrupted(self) -> str:
        """The one line Ctrl-C prints: what is logged where (counted in the file: Ctrl-C may come
        between a record's write and :attr:`logged`), and what rerunning does."""
        if self.log_path is not None:
            try:
                logged = len(read_runlog(self.log_path).records)  # a line cut by Ctrl-C is not counted
            except SpecDecError:
                logged = self.logged
            return (f"specdec bench: interrupted: {logged} of {self.expected} generations logged in "
                    f"{self.log_path}; rerun the same command to resume the sweep")
        if self.out_dir is not None:
            return (f"specdec bench: interrupted before any generation was measured: nothing was logged in "
                    f"{self.out_dir}; rerun the same command to start the sweep")
        return "specdec bench: interrupted; nothing is logged without --out"

    def close(self) -> None:
        """Shut the Ray pools down (workers never outlive the command) and release the lock."""
        try:
            for pool in self.pools:
                pool.shutdown()
        finally:
            if self.lock is not None:
                self.lock.release()


def report_lock(out: str, *, write: bool) -> FolderLock | None:
    """The lock of ``specdec bench report DIR`` (``out``: the folder or its ``runs.jsonl``): taken
    when it writes (not while a sweep writes there), None when it only prints or there is no folder."""
    folder = Path(out).parent if Path(out).is_file() else Path(out)
    if not write or not folder.is_dir():
        return None
    return lock_folder(folder, command="specdec bench report", what="report folder", hint=_REPORT_HINT)


class PlainProgress:
    """Progress lines for a console that is not a terminal (a pipe, a CI log, ``nohup``): rich's bar
    only renders its final state there, so a sweep would print nothing for minutes. :meth:`tick`
    prints ``description done/total`` at most every ``every`` seconds; on a terminal it does nothing
    (the live bar shows it).

    Args:
        console: the bench's log console (rich).
        every: seconds between lines.
    """

    def __init__(self, console: Any, every: float = 10.0, clock: Callable[[], float] | None = None) -> None:
        self.console = console
        self.every = every
        self.clock = clock if clock is not None else time.monotonic
        self.last = self.clock()

    def tick(self, description: str, done: float, total: float | None) -> None:
        if self.console.is_terminal or self.clock() - self.last < self.every:
            return
        self.last = self.clock()
        self.console.print(f"{description.strip()} {int(done)}/{int(total or 0)} generations", markup=False,
                           highlight=False)
