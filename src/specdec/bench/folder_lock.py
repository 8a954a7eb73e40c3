"""One writer per ``specdec bench --out`` folder (docs/bench.md, "One writer per folder").

``specdec bench --out DIR`` (and ``specdec bench report DIR`` when it writes)
holds an exclusive lock on ``DIR/.specdec-bench.lock`` from before it reads
``DIR/runs.jsonl`` until it exits. A second writer is refused at once, with a
message naming the holder's command, pid, host and start time (the lock file
holds them as one JSON object): two writers would read the same partial log
and append the same generations, or replace the log under each other.

The lock is an OS advisory lock on the open file (``fcntl.flock`` on POSIX,
``msvcrt.locking`` on Windows), so the operating system releases it when the
process ends, however it ends: a lock file left by a killed run (its pid no
longer running) is taken over, never refused; :attr:`FolderLock.previous`
describes the run that left it. Releasing deletes the file.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from specdec.errors import InvalidConfigError

__all__ = ["LOCK_FILE", "LockHolder", "FolderLock", "lock_folder", "read_holder"]

LOCK_FILE = ".specdec-bench.lock"
_WINDOWS_LOCK_OFFSET = 1 << 20
"""Windows locks a byte range: one byte far past the holder's JSON, which others can still read."""


@attrs.frozen
class LockHolder:
    """Who holds (or held) a folder's lock, as its lock file records it.

    Attributes:
        pid: the process id.
        host: the machine's name.
        started: when it took the lock (UTC, ISO 8601).
        command: what it runs (``"specdec bench"``, ``"specdec bench report"``).
        argv: its command line.
    """

    pid: int | None
    host: str | None = None
    started: str | None = None
    command: str | None = None
    argv: tuple[str, ...] = ()

    def describe(self) -> str:
        """``"pid 123 on host, since 2026-01-01T10:00:00Z"`` (the parts the file holds)."""
        parts = [f"pid {self.pid}" if self.pid is not None else "pid unknown"]
        if self.host:
            parts[0] += f" on {self.host}"
        if self.started:
            parts.append(f"since {self.started}")
        return ", ".join(parts)


def _parse_holder(text: str) -> LockHolder | None:
    """The holder a lock file's text describes, None when it describes none (empty or foreign)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or isinstance(data.get("pid"), bool) or not isinstance(data.get("pid"), int):
        return None

    def text_of(key: str) -> str | None:
        v = data.get(key)
        return v if isinstance(v, str) else None

    argv = data.get("argv")
    return LockHolder(data["pid"], text_of("host"), text_of("started"), text_of("command"),
                      tuple(a for a in argv if isinstance(a, str)) if isinstance(argv, list) else ())


def read_holder(folder: str | os.PathLike, wait: float = 1.0) -> LockHolder | None:
    """The holder recorded in ``folder``'s lock file (None: no lock file, or none recorded).

    A holder writes its record right after it takes the lock: an empty file is
    read again for up to ``wait`` seconds.
    """
    path = Path(folder).expanduser() / LOCK_FILE
    deadline = time.monotonic() + wait
    while True:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        holder = _parse_holder(text)
        if holder is not None or time.monotonic() >= deadline:
            return holder
        time.sleep(0.02)


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except OSError:
            pass

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _same_file(fd: int, path: Path) -> bool:
    """The open ``fd`` is still the file at ``path`` (a releasing holder deletes its file: an opener
    that locked the deleted file must open the path again)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


class FolderLock:
    """A held lock on a folder (:func:`lock_folder`); :meth:`release` (or leaving a ``with``
    block) gives it back and deletes the lock file.

    Attributes:
        path: the lock file.
        holder: this process's record in it.
        previous: the record a run that ended without releasing left in the file (a killed
            run; its lock was taken over), None when there was none.
    """

    def __init__(self, path: Path, fd: int, holder: LockHolder, previous: LockHolder | None) -> None:
        self.path = path
        self.holder = holder
        self.previous = previous
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the lock back (deleting the file first, so that no later run sees a stale
        record); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            if _same_file(fd, self.path):
                self.path.unlink()
        except OSError:  # a read-only or vanished folder (or Windows, which keeps open files): the OS lock still goes
            pass
        finally:
            _unlock(fd)
            os.close(fd)

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"FolderLock({str(self.path)!r}, held={self.held})"


def lock_folder(folder: str | os.PathLike, *, command: str = "specdec bench", what: str = "--out",
                hint: str = "wait for it to finish, or choose another folder") -> FolderLock:
    """Take ``folder``'s write lock (creating the folder if needed) or refuse.

    Args:
        folder: the folder.
        command: what this process runs (recorded for a refused second writer's message).
        what: how messages name the folder (``"--out"``).
        hint: what a refused writer is told to do.

    Returns:
        the held :class:`FolderLock` (a lock file left by a run that no longer runs is
        taken over: :attr:`FolderLock.previous`).

    Raises:
        InvalidConfigError: another process holds the lock (the message names its
            command, pid, host and start time), or the folder cannot be created or written.
    """
    p = Path(folder).expanduser()
    if p.exists() and not p.is_dir():
        raise InvalidConfigError(f"{what} {p} exists and is not a directory")
    path = p / LOCK_FILE
    for _ in range(100):  # another try only when a releasing holder deleted the file we opened
        try:
            p.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InvalidConfigError(f"{what} {p} cannot be written: {exc.strerror or exc}") from None
        try:
            try:
                locked = _try_lock(fd)
            except OSError as exc:  # a file system without locks (some network mounts)
                raise InvalidConfigError(
                    f"{what} {p} cannot be locked for writing ({exc.strerror or exc}): its file system has no file "
                    "locks; choose a folder on a local disk"
                ) from None
            if not locked:
                holder = read_holder(p)
                who = holder.command if holder is not None and holder.command else "process"
                raise InvalidConfigError(
                    f"{what} {p} is being written by another {who} "
                    f"({holder.describe() if holder is not None else 'pid unknown'}; lock file {path}): {hint}"
                )
            if not _same_file(fd, path):
                _unlock(fd)
                os.close(fd)
                continue
            os.lseek(fd, 0, os.SEEK_SET)
            previous = _parse_holder(os.read(fd, 1 << 16).decode("utf-8", errors="replace"))
            me = LockHolder(os.getpid(), socket.gethostname(),
                            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command, tuple(sys.argv))
            record = json.dumps({"pid": me.pid, "host": me.host, "started": me.started, "command": me.command,
                                 "argv": list(me.argv)}) + "\n"
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, record.encode("utf-8"))
            return FolderLock(path, fd, me, previous)
        except BaseException:
            os.close(fd)  # closing the descriptor releases a lock taken on it
            raise
    raise InvalidConfigError(f"{what} {p}: could not take the lock {path} (it was replaced 100 times in a row)")
