"""The build lock, heartbeat and atomic publish behind the few-row kernel's first build (issue 57).

A lock whose holder is dead (a reaped pid, a zombie) or silent for too long is taken over at
once; a live holder is waited for with a message and given up on after the timeout; only the
holder's own lock is removed on release; the heartbeat prints and refreshes the lock; a
published folder replaces an incomplete leftover and never an existing complete one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.kernels import build_lock as bl
from specdec.kernels.build_lock import BuildLockTimeout, Heartbeat, build_lock, lock_holder, publish


def _write_lock(lock: Path, pid: int, host: str | None = None, age: float = 0.0) -> dict:
    info = {"pid": pid, "host": host or socket.gethostname(), "token": "t", "started": 0.0, "what": "x"}
    lock.write_text(json.dumps(info))
    if age:
        past = time.time() - age
        os.utime(lock, (past, past))
    return info


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid names no process any more
    return proc.pid


def test_a_lock_of_a_dead_pid_is_taken_over_at_once(tmp_path, capfd):
    lock = tmp_path / "k.lock"
    _write_lock(lock, _dead_pid())
    start = time.monotonic()
    with build_lock(lock, what="the thing", timeout=30) as mine:
        assert lock_holder(lock) == mine and mine["pid"] == os.getpid()
    assert time.monotonic() - start < 5
    assert not lock.exists()
    err = capfd.readouterr().err
    assert "removed a stale build lock" in err and "is gone" in err


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="zombies are told apart through /proc")
def test_a_killed_but_unreaped_holder_counts_as_dead(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert bl._pid_alive(proc.pid)
        proc.kill()
        deadline = time.monotonic() + 10
        while bl._pid_alive(proc.pid) and time.monotonic() < deadline:  # a zombie until waited for
            time.sleep(0.05)
        assert not bl._pid_alive(proc.pid)
    finally:
        proc.wait()


def test_a_live_holder_is_waited_for_then_given_up_with_its_name(tmp_path, capfd):
    lock = tmp_path / "k.lock"
    _write_lock(lock, os.getpid())  # a live pid of this host
    start = time.monotonic()
    with pytest.raises(BuildLockTimeout, match=rf"pid {os.getpid()} on .* has held the build lock .*k\.lock"):
        with build_lock(lock, what="the thing", timeout=0.3):
            pass
    assert 0.3 <= time.monotonic() - start < 5
    assert lock.exists()  # not ours: left alone
    assert "waiting for pid" in capfd.readouterr().err


def test_another_hosts_lock_is_broken_only_when_not_refreshed(tmp_path):
    lock = tmp_path / "k.lock"
    _write_lock(lock, 1, host="elsewhere.invalid")  # its pid cannot be checked from here
    with pytest.raises(BuildLockTimeout):
        with build_lock(lock, what="x", timeout=0.2):
            pass
    _write_lock(lock, 1, host="elsewhere.invalid", age=bl.STALE_S + 5)
    with build_lock(lock, what="x", timeout=5) as mine:
        assert lock_holder(lock) == mine


def test_an_unreadable_lock_is_stale_only_when_old(tmp_path):
    lock = tmp_path / "k.lock"
    lock.write_text("")  # created, holder not yet written
    with pytest.raises(BuildLockTimeout, match="another process"):
        with build_lock(lock, what="x", timeout=0.2):
            pass
    past = time.time() - bl.STALE_S - 5
    os.utime(lock, (past, past))
    with build_lock(lock, what="x", timeout=5):
        pass


def test_release_removes_only_the_holders_own_lock(tmp_path):
    lock = tmp_path / "k.lock"
    with build_lock(lock, what="x", timeout=1):
        other = _write_lock(lock, os.getpid() + 1)  # taken over by someone else meanwhile
    assert lock_holder(lock) == other


def test_the_heartbeat_prints_and_refreshes_the_lock(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(bl, "TOUCH_S", 0.02)
    lock = tmp_path / "k.lock"
    _write_lock(lock, os.getpid(), age=1000)
    with Heartbeat(lambda s: f"busy {s:.2f}", touch=lock, interval=0.05):
        time.sleep(0.3)
    assert time.time() - lock.stat().st_mtime < 5
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("specdec: busy")]
    assert len(lines) >= 2


def test_publish_is_one_rename_and_keeps_a_complete_folder(tmp_path):
    def complete(p: Path) -> bool:
        return (p / "done").is_file()

    final = tmp_path / "final"
    first = tmp_path / "b1"
    first.mkdir()
    (first / "done").write_text("1")
    assert publish(first, final, complete) and (final / "done").read_text() == "1" and not first.exists()
    second = tmp_path / "b2"
    second.mkdir()
    (second / "done").write_text("2")
    assert not publish(second, final, complete)  # the one already published stays
    assert (final / "done").read_text() == "1" and not second.exists()
    (final / "done").unlink()
    (final / "junk").write_text("half")  # an incomplete leftover is replaced
    third = tmp_path / "b3"
    third.mkdir()
    (third / "done").write_text("3")
    assert publish(third, final, complete) and sorted(p.name for p in final.iterdir()) == ["done"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]
