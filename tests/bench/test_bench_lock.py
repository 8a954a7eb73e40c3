"""One writer per --out folder, and Ctrl-C (issue 57, items 5 and 13): a second `specdec bench` on a folder is
refused naming the holder's pid, the surviving folder resumes and reports; a lock left by a killed run is taken
over; Ctrl-C prints one line and exits with 130."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from specdec import cli
from specdec.bench.folder_lock import LOCK_FILE, lock_folder, read_holder
from specdec.bench.runlog import RunLogWriter, read_runlog, write_header
from specdec.errors import InvalidConfigError

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="fcntl and SIGKILL")


def _run(capsys, *args):
    try:
        code = cli.main(["bench", *map(str, args)])
    except KeyboardInterrupt:  # pragma: no cover - what happened before issue 57
        pytest.fail("KeyboardInterrupt escaped specdec bench (a traceback, not one line)")
    out = capsys.readouterr()
    return code, out.out, out.err


def _small(tiny_dirs, out, *extra):
    """1 prompt x T=0 x (baseline, sd) = 2 generations."""
    return ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "sd", "--budget", "3", "--depth", "2", "--num-prompts", "1", "--max-new-tokens", "4",
            "--temperatures", "0", "--ignore-eos", "--no-plots", "--out", out, *extra]


def test_a_second_writer_is_refused_naming_the_holder_and_the_folder_resumes_and_reports(capsys, tiny_dirs, tmp_path,
                                                                                        monkeypatch):
    """While a real sweep writes the folder (2 of its 6 generations logged), a second `specdec bench` on it (the
    same command) is refused with the holder's pid before it reads the log or loads a model, and so is `bench
    report` (which writes); the first finishes with every generation once, and the folder resumes and reports.
    Before the lock, the second resumed from the first one's partial log and appended the same generations."""
    from specdec.bench import runner as bench_runner

    out = tmp_path / "out"
    args = _small(tiny_dirs, out, "--temperatures", "0,1", "--seeds", "0,1")  # 3 units x 2 rows = 6 generations
    runs = out / "runs.jsonl"
    real = RunLogWriter.write
    second: list = []

    def boom(*a, **k):
        raise AssertionError("the second writer started work")

    def write(self, record):
        rec = real(self, record)
        if self.next_sequence == 2:  # the first writer has logged 2 generations: a second writer starts
            before = runs.read_bytes()
            with monkeypatch.context() as m:
                m.setattr("specdec.bench.models.load_bench_models", boom)
                m.setattr(bench_runner, "run_bench", boom)
                second.append(cli.main(["bench", *map(str, args)]))
                second.append(cli.main(["bench", "report", str(out), "--no-plots"]))
                second.append(cli.main(["bench", "report", str(out), "--no-plots", "--no-write"]))  # reading is fine
            second.append(runs.read_bytes() == before)
        return rec

    monkeypatch.setattr(RunLogWriter, "write", write)
    code, stdout, err = _run(capsys, *args)
    monkeypatch.undo()
    assert code == 0, err
    assert second == [2, 2, 0, True]
    pid = os.getpid()
    assert f"--out {out} is being written by another specdec bench (pid {pid} on " in err
    assert "wait for it to finish (rerunning this command then resumes the sweep" in err
    assert f"report folder {out} is being written by another specdec bench (pid {pid} on " in err
    assert "pass --no-write to print the report" in err
    assert "partial sweep: 2 of 6 generations" in stdout
    assert not (out / LOCK_FILE).exists()  # released (and deleted) at exit
    log = read_runlog(out)
    assert log.complete and len(log.records) == log.expected() == 6
    assert [r["sequence"] for r in log.records] == list(range(6))
    code, stdout, err = _run(capsys, *args)  # resumable: the finished sweep rebuilds its report
    assert code == 0 and "holds all 6 generations of this sweep" in err, err
    code, stdout, err = _run(capsys, "report", out, "--no-plots")
    assert code == 0 and "partial" not in stdout, err
    assert not (out / LOCK_FILE).exists()


def test_two_locks_on_one_folder(tmp_path):
    """The lock API: one holder at a time (even in one process), refused with its pid, released and retaken."""
    folder = tmp_path / "new" / "out"  # created by the lock
    with lock_folder(folder, command="specdec bench") as lock:
        assert lock.held and lock.previous is None and (folder / LOCK_FILE).exists()
        record = json.loads((folder / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["command"] == "specdec bench"
        with pytest.raises(InvalidConfigError, match=rf"--out {re.escape(str(folder))} is being written by another specdec bench "
                                                     rf"\(pid {os.getpid()} on .*, since 20.*Z; lock file .*\): wait"):
            lock_folder(folder)
    assert not lock.held and not (folder / LOCK_FILE).exists()
    lock.release()  # a second release does nothing
    with lock_folder(folder) as again:
        assert again.previous is None
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidConfigError, match="exists and is not a directory"):
        lock_folder(tmp_path / "file")


@posix_only
def test_a_lock_left_by_a_killed_run_is_taken_over(capsys, tiny_dirs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # a holder as lock_folder writes it (fcntl.flock and its JSON record), without importing torch (fast)
    code = ("import fcntl, json, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, json.dumps({'pid': os.getpid(), 'host': 'h', "
            "'started': 'then', 'command': 'specdec bench'}).encode()); print('locked', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-S", "-c", code, str(out / LOCK_FILE)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(InvalidConfigError, match=f"another specdec bench .pid {holder.pid} on h, since then"):
            lock_folder(out)
    finally:
        holder.kill()  # SIGKILL: no release, its record stays in the file
        holder.wait(timeout=60)
        holder.stdout.close()
    assert read_holder(out).pid == holder.pid  # a dead pid: the OS released its lock
    code, _, err = _run(capsys, *_small(tiny_dirs, out))
    assert code == 0, err
    assert f"took over the lock of a specdec bench that ended without releasing it (pid {holder.pid} on h" in err
    assert len(read_runlog(out).records) == 2 and not (out / LOCK_FILE).exists()


def test_a_lock_file_without_a_holder_is_taken(tmp_path):
    (tmp_path / LOCK_FILE).write_text("not json")
    with lock_folder(tmp_path) as lock:
        assert lock.previous is None and read_holder(tmp_path).pid == os.getpid()


def test_the_writer_stops_when_its_log_is_replaced_under_it(tmp_path):
    """Without the lock (another program), a second header replacing runs.jsonl orphaned the first writer's
    file: its records vanished and it exited 0. Now its next write raises."""
    header = ({"rows": ["autoregressive"]}, {"expected_runs": 2})
    path = write_header(tmp_path, *header)
    with RunLogWriter(path) as writer:
        writer.write({"row": "autoregressive"})
        write_header(tmp_path, *header)  # os.replace: a new file at the path
        with pytest.raises(InvalidConfigError, match="was replaced or deleted by another process .* the 2 generations"):
            writer.write({"row": "autoregressive"})
    with RunLogWriter(path) as writer:
        path.unlink()
        with pytest.raises(InvalidConfigError, match="replaced or deleted"):
            writer.write({"row": "autoregressive"})


def _interrupt_after(monkeypatch, n):
    """Ctrl-C while the n+1-th generation is written (after n were logged)."""
    real = RunLogWriter.write
    calls = [0]

    def write(self, record):
        calls[0] += 1
        if calls[0] > n:
            raise KeyboardInterrupt
        return real(self, record)

    monkeypatch.setattr(RunLogWriter, "write", write)


def test_ctrl_c_prints_one_line_and_exits_130_and_the_sweep_resumes(capsys, tiny_dirs, tmp_path, monkeypatch):
    out = tmp_path / "out"
    args = _small(tiny_dirs, out, "--temperatures", "0,1", "--seeds", "0")  # 2 units x 2 rows = 4 generations
    _interrupt_after(monkeypatch, 1)
    code, _, err = _run(capsys, *args)
    assert code == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == (f"specdec bench: interrupted: 1 of 4 generations logged in "
                                           f"{out / 'runs.jsonl'}; rerun the same command to resume the sweep")
    assert not (out / LOCK_FILE).exists()  # released
    monkeypatch.undo()
    _interrupt_after(monkeypatch, 1)  # interrupted again, resumed: it counts the logged ones
    code, _, err = _run(capsys, *args)
    assert code == 130 and "1 of 4 generations done" in err
    assert err.strip().splitlines()[-1].startswith("specdec bench: interrupted: 2 of 4 generations logged in ")
    monkeypatch.undo()
    code, _, err = _run(capsys, *args)
    assert code == 0 and "2 of 4 generations done" in err, err
    assert len(read_runlog(out).records) == 4


def test_ctrl_c_before_measuring(capsys, tiny_dirs, tmp_path, monkeypatch):
    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("specdec.bench.models.load_bench_models", interrupt)
    out = tmp_path / "out"
    code, _, err = _run(capsys, *_small(tiny_dirs, out))
    assert code == 130 and err.strip().splitlines()[-1] == (
        f"specdec bench: interrupted before any generation was measured: nothing was logged in {out}; rerun the "
        "same command to start the sweep")
    assert not (out / "runs.jsonl").exists() and not (out / LOCK_FILE).exists()
    code, _, err = _run(capsys, *_small(tiny_dirs, out)[:-2])  # no --out
    assert code == 130 and err.strip().splitlines()[-1] == "specdec bench: interrupted; nothing is logged without --out"
