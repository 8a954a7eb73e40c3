"""A build lock that never hangs for ever, a progress heartbeat, and publishing a folder whole (issue 57).

Why: a compiled kernel (:mod:`specdec.kernels.fewrow`) is built on first use,
minutes on a small CPU, in a cache folder shared by every process of the
machine. torch's own file baton waits on its ``lock`` file with no timeout and no
message, so a first build killed mid-compile (SIGKILL, the OOM killer, a CI
timeout) left a lock that made every later process wait for ever, silently; and
building in place let a process load a library another one was relinking.

What:

- :func:`build_lock` creates ``<name>.lock`` exclusively and records the
  holder's pid, host and a random token in it; while held, a heartbeat thread
  refreshes its modification time. A waiter breaks the lock when its holder is
  gone (same host and ``os.kill(pid, 0)`` says no such process, or a zombie) or
  has not refreshed it for :data:`STALE_S` seconds (a holder on another host, or
  a pid reused); otherwise it waits, saying on stderr who holds the lock and
  repeating it every :data:`HEARTBEAT_S` seconds, and raises
  :class:`BuildLockTimeout` after ``timeout`` seconds.
- :class:`Heartbeat` prints a line to stderr every :data:`HEARTBEAT_S` seconds
  while a long step runs, and keeps the held lock fresh.
- :func:`publish` renames a finished build folder into place (one ``rename``):
  a reader sees no folder or the whole one, never a half-written library.

The lock only spares duplicate work: correctness never rests on it, since every
build writes its own temporary folder and the rename is atomic (if two
processes build, the second one's rename finds the folder there and keeps it).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["HEARTBEAT_S", "STALE_S", "BuildLockTimeout", "Heartbeat", "build_lock", "lock_holder", "publish", "say"]

HEARTBEAT_S = 30.0
"""Seconds between progress lines on stderr (no phase of a first build is silent for longer)."""

TOUCH_S = 10.0
"""Seconds between refreshes of a held lock's modification time."""

STALE_S = 120.0
"""A lock not refreshed for this long is stale, whoever holds it (another host, a reused pid)."""

POLL_S = 0.5
"""Seconds between a waiter's looks at the lock."""


class BuildLockTimeout(RuntimeError):
    """Another live process held the build lock for longer than the waiter's timeout."""


def say(line: str) -> None:
    """One line on stderr, flushed (progress of a first build: never a warning, never silent)."""
    try:
        sys.stderr.write(f"specdec: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr must not fail a build
        pass


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process of this host (a zombie, killed but not yet reaped, is not)."""
    if pid <= 0:
        return False
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate it there: the lock's age decides
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # no /proc (macOS): os.kill's answer stands
        return True


def lock_holder(lock: Path) -> dict[str, Any] | None:
    """What the lock file records (pid, host, token, started, what), None when there is no lock;
    ``{}`` for a lock whose content is not (yet) readable."""
    try:
        text = lock.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        info = json.loads(text)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _age(lock: Path) -> float | None:
    try:
        return time.time() - lock.stat().st_mtime
    except OSError:
        return None


def _stale_reason(lock: Path, info: dict[str, Any]) -> str | None:
    """Why the lock described by ``info`` is stale, or None while its holder may be working."""
    age = _age(lock)
    if age is None:
        return None  # gone: the next attempt creates it
    pid, host = info.get("pid"), info.get("host")
    if isinstance(pid, int) and host == socket.gethostname() and not _pid_alive(pid):
        return f"its holder, pid {pid}, is gone"
    if age > STALE_S:
        return f"not refreshed for {age:.0f} s"
    return None


def _break(lock: Path) -> bool:
    """Remove ``lock`` if it is still stale once moved aside (an atomic rename: another waiter may have
    replaced the stale lock with its own live one since it was read; that one is put back)."""
    aside = lock.with_name(f"{lock.name}.stale-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return False
    except OSError:
        return False
    moved = lock_holder(aside)
    if moved is None or _stale_reason(aside, moved) is not None:
        aside.unlink(missing_ok=True)
        return True
    # a live lock taken meanwhile: put it back unless a newer one is there (then both build: harmless)
    with contextlib.suppress(OSError):
        os.link(aside, lock)
    aside.unlink(missing_ok=True)
    return False


def _describe(info: dict[str, Any]) -> str:
    if not info:
        return "another process"
    return f"pid {info.get('pid')} on {info.get('host')}"


class Heartbeat:
    """While the ``with`` block runs: ``message(elapsed_seconds)`` on stderr every ``interval`` seconds,
    and the modification time of ``touch`` (a held lock) refreshed every :data:`TOUCH_S` seconds."""

    def __init__(self, message: Callable[[float], str], *, touch: Path | None = None,
                 interval: float | None = None) -> None:
        self.message = message
        self.touch = touch
        self.interval = HEARTBEAT_S if interval is None else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specdec-build-heartbeat", daemon=True)
        self._start = 0.0

    def _run(self) -> None:
        next_line = self._start + self.interval
        while True:
            now = time.monotonic()
            wait = min(TOUCH_S, max(0.0, next_line - now))
            if self._stop.wait(wait):
                return
            if self.touch is not None:
                with contextlib.suppress(OSError):
                    os.utime(self.touch)
            if time.monotonic() >= next_line:
                say(self.message(time.monotonic() - self._start))
                next_line += self.interval

    def __enter__(self) -> Heartbeat:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def build_lock(lock: Path, *, what: str, timeout: float) -> Iterator[dict[str, Any]]:
    """Hold ``lock`` (created exclusively, holder recorded inside) for the ``with`` block.

    Args:
        lock: the lock file (its folder must exist).
        what: what the holder builds, for the waiting messages (``"the few-row CPU linear kernel"``).
        timeout: the most seconds to wait for a live holder (0: do not wait).

    Yields:
        The record written into the lock (pid, host, token, started, what).

    Raises:
        BuildLockTimeout: a live holder kept it for ``timeout`` seconds; the message names the
            holder, the lock file and how to remove it.
    """
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "token": secrets.token_hex(8),
            "started": time.time(), "what": what}
    start = time.monotonic()
    announced = False
    next_line = start + HEARTBEAT_S
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            info = lock_holder(lock)
            if info is None:
                continue  # released between the two calls
            stale = _stale_reason(lock, info)
            if stale is not None:
                if _break(lock):
                    say(f"removed a stale build lock {lock} ({stale})")
                continue
            waited = time.monotonic() - start
            if waited >= timeout:
                raise BuildLockTimeout(
                    f"{_describe(info)} has held the build lock {lock} for longer than this process waits "
                    f"({timeout:g} s); if no build is running there, delete that file"
                ) from None
            if not announced:
                announced = True
                say(f"waiting for {_describe(info)}, which is building {what} (lock {lock}; "
                    f"giving up after {timeout:g} s)")
            elif time.monotonic() >= next_line:
                next_line += HEARTBEAT_S
                say(f"still waiting for {_describe(info)} to build {what} ({_duration(waited)} so far)")
            time.sleep(min(POLL_S, max(0.0, timeout - waited)))
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(mine, f)
        break
    try:
        yield mine
    finally:
        if lock_holder(lock) == mine:
            lock.unlink(missing_ok=True)


def publish(built: Path, final: Path, complete: Callable[[Path], bool]) -> bool:
    """Rename the finished folder ``built`` to ``final`` (atomic: readers see none or all of it).

    Returns:
        True when ``built`` is now ``final``; False when a ``final`` that ``complete`` accepts was
        already there (another process published first): ``built`` is removed and ``final`` kept.
        An incomplete ``final`` (a leftover of an older layout) is moved aside and removed.
    """
    for _ in range(3):
        try:
            os.rename(built, final)
            return True
        except OSError:
            if not final.exists():
                raise
        if complete(final):
            shutil.rmtree(built, ignore_errors=True)
            return False
        aside = final.with_name(f"{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(final, aside)
        shutil.rmtree(aside, ignore_errors=True)
    raise OSError(f"could not rename {built} to {final}: something keeps recreating it")
