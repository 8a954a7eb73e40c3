"""Resumable sweeps (issue 18): runs.jsonl, resuming, refusals, `specdec bench report`, Spec-Bench's report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from specdec import cli
from specdec.bench.runlog import RunLogWriter, read_runlog
from specdec.errors import InvalidConfigError

TIMING = {"time_total", "time_prefill", "time_draft", "time_target", "time_verify", "sequence"}
RESULT_TIMING = {"tokens_per_s", "speedup", "time_total", "time_prefill", "time_draft", "time_target", "time_verify"}


def _run(capsys, *args):
    code = cli.main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _sweep(tiny_dirs, out, *extra):
    """A small sweep: 2 prompts x (T=0 + T=1 with 2 seeds) x (baseline, sd, rheo) = 18 generations."""
    return ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "sd,rheo", "--budget", "3", "--depth", "2", "--num-prompts", "2", "--max-new-tokens", "6",
            "--temperatures", "0,1", "--seeds", "0,1", "--ignore-eos", "--no-plots", "--out", out, *extra]


def _by_key(folder):
    """The logged generations without their timings, by (row, prompt, T, seed)."""
    log = read_runlog(folder)
    return {(r["row"], r["prompt_index"], r["temperature"], r["seed"]): {k: v for k, v in r.items() if k not in TIMING}
            for r in log.records}


def _results(folder):
    return sorted(({k: v for k, v in r.items() if k not in RESULT_TIMING}
                   for r in json.loads((folder / "results.json").read_text())),
                  key=lambda r: (r["method"], r["temperature"]))


@pytest.fixture(scope="module")
def full_run(tiny_dirs, tmp_path_factory):
    """An uninterrupted sweep (the reference of the resume tests)."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("full") / "out"
    assert cli.main(["bench", *map(str, _sweep(tiny_dirs, out))]) == 0
    return out


def test_runs_jsonl_has_a_header_and_every_generation(full_run):
    log = read_runlog(full_run)
    assert log.header["format"] == "specdec-bench-runs" and log.complete and not log.dropped_tail
    assert log.config["rows"] == ["autoregressive", "sd", "rheo"] and log.config["max_new_tokens"] == 6
    assert log.resolved["budget"] == {"nodes": 3, "depth": 2, "auto": False}
    assert len(log.records) == log.expected() == 18
    assert [r["sequence"] for r in log.records] == list(range(18))


_REAL_WRITE = RunLogWriter.write


def _interrupt_after(monkeypatch, n):
    """The n+1-th logged generation raises (as a kill would stop the sweep)."""
    real = RunLogWriter.write
    calls = [0]

    def write(self, record):
        calls[0] += 1
        if calls[0] > n:
            raise RuntimeError("killed")
        return real(self, record)

    monkeypatch.setattr(RunLogWriter, "write", write)


def test_an_interrupted_sweep_resumes_to_the_same_report(capsys, tiny_dirs, tmp_path, monkeypatch, full_run):
    out = tmp_path / "out"
    _interrupt_after(monkeypatch, 7)
    with pytest.raises(RuntimeError, match="killed"):
        _run(capsys, *_sweep(tiny_dirs, out))
    monkeypatch.undo()
    assert len(read_runlog(out).records) == 7 and not (out / "results.json").exists()
    with (out / "runs.jsonl").open("a") as fh:  # a kill in the middle of a write leaves a cut last line
        fh.write('{"sequence": 7, "unit": 2, "row": "s')
    code, stdout, err = _run(capsys, *_sweep(tiny_dirs, out))  # the same command
    assert code == 0, err
    assert "resuming" in err and "7 of 18 generations done" in err
    assert "resumed with 7 generations already done" in stdout
    log = read_runlog(out)
    assert len(log.records) == 18 and [r["sequence"] for r in log.records] == list(range(18))
    assert _by_key(out) == _by_key(full_run)  # the same generations, token for token
    assert _results(out) == _results(full_run)  # the same report, timings aside


def test_a_killed_process_resumes(tiny_dirs, tmp_path, full_run):
    """SIGKILL a `specdec bench` process mid-sweep; rerunning it loses at most the generation in flight."""
    out = tmp_path / "out"
    argv = [sys.executable, "-c", "import sys; from specdec.cli import main; sys.exit(main())", "bench",
            *map(str, _sweep(tiny_dirs, out, "--threads", "1"))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = out / "runs.jsonl"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if runs.exists() and runs.read_text().count("\n") >= 4:  # the header and 3 generations
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the sweep ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    done = len(read_runlog(out).records)
    assert 3 <= done < 18
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert f"{done} of 18 generations done" in proc.stderr
    assert _by_key(out) == _by_key(full_run)
    assert _results(out) == _results(full_run)


def test_batched_sweep_resumes(capsys, tiny_dirs, tmp_path, monkeypatch):
    """--batch-size 2: a batch whose records were partly written runs again, and only its missing records are kept."""
    out, ref = tmp_path / "out", tmp_path / "ref"
    args = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "sd", "--budget", "3", "--num-prompts", "3", "--max-new-tokens", "5", "--temperatures", "0,1",
            "--seeds", "0", "--batch-size", "2", "--ignore-eos", "--no-plots"]
    assert _run(capsys, *args, "--out", ref)[0] == 0
    _interrupt_after(monkeypatch, 5)  # inside the third batched call's records
    with pytest.raises(RuntimeError, match="killed"):
        _run(capsys, *args, "--out", out)
    monkeypatch.undo()
    code, _, err = _run(capsys, *args, "--out", out)
    assert code == 0, err
    assert _by_key(out) == _by_key(ref) and len(read_runlog(out).records) == 12


def _partial(tmp_path, full_run, keep):
    out = tmp_path / "partial"
    out.mkdir()
    lines = (full_run / "runs.jsonl").read_text().splitlines(keepends=True)
    (out / "runs.jsonl").write_text("".join(lines[: 1 + keep]))
    return out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--max-new-tokens", "5"], "max_new_tokens: 6 in the log, 5 now"),
        (["--methods", "sd"], 'rows: ["autoregressive", "sd", "rheo"] in the log, ["autoregressive", "sd"] now'),
        (["--budget", "4"], 'budget: {"nodes": 3, "depth": 2} in the log'),
        (["--num-prompts", "3"], "prompts: "),
        (["--preset", "full"], 'preset: "quick" in the log, "full" now'),
        (["--draft", "truncated:1"], "draft: "),
    ],
)
def test_a_different_configuration_is_refused_before_any_work(capsys, no_work, tiny_dirs, tmp_path, full_run,
                                                              change, message):
    out = _partial(tmp_path, full_run, 5)
    before = (out / "runs.jsonl").read_bytes()
    args = _sweep(tiny_dirs, out)
    for flag, value in zip(change[::2], change[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    code, _, err = _run(capsys, *args)
    assert code == 2 and "holds a sweep of another configuration" in err and message in err, err
    assert "--overwrite to start over" in err
    assert (out / "runs.jsonl").read_bytes() == before  # a partial folder is never touched


def test_overwrite_starts_over(capsys, tiny_dirs, tmp_path, full_run):
    out = _partial(tmp_path, full_run, 5)
    code, _, err = _run(capsys, *_sweep(tiny_dirs, out, "--max-new-tokens", "4", "--overwrite"))
    assert code == 0, err
    log = read_runlog(out)
    assert log.config["max_new_tokens"] == 4 and len(log.records) == 18 and "resuming" not in err


def test_a_finished_sweep_rebuilds_its_report_without_loading_models(capsys, no_work, tiny_dirs, full_run):
    before = (full_run / "runs.jsonl").read_bytes()
    code, stdout, err = _run(capsys, *_sweep(tiny_dirs, full_run))
    assert code == 0, err
    assert "holds all 18 generations of this sweep" in err and "rheo" in stdout
    assert (full_run / "runs.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"sequence": 0, "unit": 0, "row": "sd"}\n', "not a specdec bench run log (line 1 is not a"),
        ("", "not a specdec bench run log (empty"),
        ("not json\n", "line 1 is not JSON"),
    ],
)
def test_a_foreign_runs_jsonl_is_refused(capsys, no_work, tiny_dirs, tmp_path, content, message):
    out = tmp_path / "foreign"
    out.mkdir()
    (out / "runs.jsonl").write_text(content)
    code, _, err = _run(capsys, *_sweep(tiny_dirs, out))
    assert code == 2 and message in err and "--overwrite" in err, err
    assert (out / "runs.jsonl").read_text() == content


def test_a_corrupt_runs_jsonl_is_refused(capsys, no_work, tiny_dirs, tmp_path, full_run):
    out = _partial(tmp_path, full_run, 4)
    lines = (out / "runs.jsonl").read_text().splitlines(keepends=True)
    bad = lines[:2] + ['{"broken\n'] + lines[3:]
    (out / "runs.jsonl").write_text("".join(bad))
    code, _, err = _run(capsys, *_sweep(tiny_dirs, out))
    assert code == 2 and "runs.jsonl:3: not JSON" in err, err
    # a generation the header's sweep does not have
    rec = json.loads(lines[1])
    rec["row"] = "specinfer"
    (out / "runs.jsonl").write_text("".join([lines[0], json.dumps(rec) + "\n"]))
    code, _, err = _run(capsys, *_sweep(tiny_dirs, out))
    assert code == 2 and "outside the sweep the header describes" in err
    (out / "runs.jsonl").write_text("".join([lines[0], lines[1], lines[1]]))
    code, _, err = _run(capsys, *_sweep(tiny_dirs, out))
    assert code == 2 and "logged twice" in err


def test_report_rebuilds_results_from_runs_jsonl_alone(capsys, tmp_path, full_run):
    import shutil

    out = tmp_path / "copy"
    out.mkdir()
    shutil.copy(full_run / "runs.jsonl", out / "runs.jsonl")  # nothing else
    code, stdout, err = _run(capsys, "report", out)
    assert code == 0, err
    assert json.loads((out / "results.json").read_text()) == json.loads((full_run / "results.json").read_text())
    assert "tau = tokens per target forward" in stdout and "partial" not in stdout
    for name in ("tau.png", "acceptance.png", "speedup.png", "temperature.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    partial = _partial(tmp_path, full_run, 6)
    code, stdout, _ = _run(capsys, "report", partial, "--no-plots")
    assert code == 0 and "partial sweep: 6 of 18 generations" in stdout
    code, _, err = _run(capsys, "report", tmp_path / "nothing")
    assert code == 2 and "does not exist" in err


def test_spec_bench_report(capsys, tiny_dirs, tmp_path):
    from bench_helpers import WORDS

    q = tmp_path / "question.jsonl"
    cats = ["writing", "coding", "translation", "rag"]
    q.write_text("".join(json.dumps({"question_id": i + 1, "category": c,
                                     "turns": [" ".join(WORDS[(5 * i + j) % len(WORDS)] for j in range(4 + i))]}) + "\n"
                         for i, c in enumerate(cats)))
    out = tmp_path / "sb"
    code, _, err = _run(capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", q,
                        "--methods", "sd", "--budget", "3", "--num-prompts", "0", "--max-new-tokens", "5",
                        "--temperatures", "0", "--no-plots", "--out", out)
    assert code == 0, err
    code, stdout, err = _run(capsys, "report", out, "--format", "spec-bench")
    assert code == 0, err
    assert "Spec-Bench report, T=0" in stdout and "greedy equality: sd: 100% of 4 outputs" in stdout
    summary = json.loads((out / "spec_bench.json").read_text())["T=0"]
    sd = summary["sd"]
    assert {k for k in sd if k.startswith("task:")} == {"task:mt_bench", "task:translation", "task:rag"}
    assert {k for k in sd if k.startswith("category:")} == {f"category:{c}" for c in cats}
    assert sd["task:mt_bench"]["runs"] == 2 and sd["overall"]["runs"] == 4
    results = {r["method"]: r for r in json.loads((out / "results.json").read_text())}
    assert sd["overall"]["mean_accepted_tokens"] == pytest.approx(results["sd"]["tau"])  # the same tau
    assert summary["autoregressive"]["overall"]["speedup"] == 1.0
    code, stdout, _ = _run(capsys, "report", out, "--format", "spec-bench", "--by", "category", "--no-write")
    assert code == 0 and "per category" in stdout and "translation" in stdout


def test_spec_bench_report_refuses_other_categories(capsys, full_run):
    code, _, err = _run(capsys, "report", full_run, "--format", "spec-bench", "--no-write")
    assert code == 2 and "needs Spec-Bench's question.jsonl categories" in err and "'text'" in err


def test_workers_without_ray_is_a_clear_error(capsys, no_work, tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    code, _, err = _run(capsys, *_sweep(tiny_dirs, tmp_path / "w", "--workers", "2"))
    assert code == 2 and "pip install 'specdec-trees[ray]'" in err
    code, _, err = _run(capsys, *_sweep(tiny_dirs, tmp_path / "w", "--workers", "0"))
    assert code == 2 and "--workers must be" in err


def test_read_runlog_errors(tmp_path):
    with pytest.raises(InvalidConfigError, match="does not exist"):
        read_runlog(tmp_path)
    (tmp_path / "runs.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(InvalidConfigError, match="not UTF-8"):
        read_runlog(tmp_path)
    (tmp_path / "runs.jsonl").write_text('{"format": "specdec-bench-runs", "version": 99, "config": {}, "resolved": {}}\n')
    with pytest.raises(InvalidConfigError, match="newer"):
        read_runlog(tmp_path)


def test_spec_bench_speedup_is_the_ratio_of_mean_per_answer_speeds():
    """Spec-Bench's speed.py averages per-answer tokens/s; the table pools tokens and seconds: they differ here."""
    from specdec.bench.spec_bench import spec_bench_summary
    from specdec.bench.sweep import RunRecord

    header = {"config": {"temperatures": [0.0]},
              "resolved": {"rows": [{"name": "autoregressive", "kind": "autoregressive"}, {"name": "sd", "kind": "speculative"}],
                           "prompts": {"categories": ["writing", "rag"]}}}

    def rec(row, pi, n, steps, emitted, seconds, tokens):
        return RunRecord(0, pi, pi, 0.0, 0, row, n, steps, emitted, (), (), seconds, 0.0, 0.0, 0.0, 0.0, tokens)

    runs = [rec("autoregressive", 0, 10, 10, 10, 1.0, (1,) * 10), rec("autoregressive", 1, 10, 10, 10, 4.0, (2,) * 10),
            rec("sd", 0, 10, 4, 10, 0.5, (1,) * 10), rec("sd", 1, 10, 6, 10, 4.0, (3,) * 10)]
    s = spec_bench_summary(header, runs)["T=0"]
    sd = s["sd"]["overall"]
    assert sd["speedup"] == pytest.approx(((20 + 2.5) / 2) / ((10 + 2.5) / 2))  # 1.8; pooled would be 1.11
    assert sd["mean_accepted_tokens"] == pytest.approx(20 / 10) and sd["walltime"] == pytest.approx(2.25)
    assert sd["greedy_equal"] == 0.5
    assert s["sd"]["task:mt_bench"]["speedup"] == pytest.approx(2.0) and s["sd"]["task:rag"]["speedup"] == 1.0
    assert s["sd"]["category:rag"]["greedy_equal"] == 0.0


def test_a_calibrated_rheo_row_is_profiled_once_and_its_table_is_reused_on_resume(capsys, tiny_dirs, tmp_path,
                                                                                   monkeypatch):
    """``rheo[proxy=calibrated]``: the bench measures the table per T > 0 (none at T = 0), logs it in the
    header and meta.json, gives it to the row's builder, and a resumed sweep reuses the logged table."""
    import specdec.tune as rheo_module

    args = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "rheo[m=2,proxy=calibrated]", "--budget", "3", "--depth", "2", "--num-prompts", "2",
            "--max-new-tokens", "6", "--temperatures", "0,1", "--seeds", "0", "--ignore-eos", "--no-plots",
            "--out", tmp_path / "out"]
    profiles = []
    real = rheo_module.profile_calibration

    def counted(*a, **k):
        profiles.append(k)
        return real(*a, **k)

    monkeypatch.setattr(rheo_module, "profile_calibration", counted)
    _interrupt_after(monkeypatch, 5)
    with pytest.raises(RuntimeError, match="killed"):
        _run(capsys, *args)
    assert len(profiles) == 1 and profiles[0]["draws"] == 2  # T = 1 only
    header = read_runlog(tmp_path / "out").header
    ((name, t, table),) = header["resolved"]["rheo_calibration"]
    assert name == "rheo[m=2,proxy=calibrated]" and t == 1.0 and len(table) == 2
    options = {(n, tt): o for n, tt, o in header["resolved"]["options"]}
    assert options[(name, 1.0)]["calibration"] == table and "calibration" not in options[(name, 0.0)]
    monkeypatch.setattr(RunLogWriter, "write", _REAL_WRITE)
    code, stdout, err = _run(capsys, *args)
    assert code == 0, err
    assert "resuming" in err and len(profiles) == 1  # the logged table, not a new profile
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["rheo_calibration"] == {f"{name}@T=1": table}
    records = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["method"] for r in records} == {"autoregressive", name}


# ------------------------------------------------------------ the drafts' content hashes (issue 47)
def test_the_header_records_the_content_hash_of_every_draft_used(full_run, tiny_dirs):
    from specdec.bench.hashes import folder_sha256

    hashes = read_runlog(full_run).config["draft_sha256"]
    assert set(hashes) == {"lm"}  # sd and rheo (no EAGLE head for this target) run on the draft LM
    digest, files = folder_sha256(tiny_dirs["draft"])
    assert hashes["lm"]["sha256"] == digest and hashes["lm"]["files"] == files
    assert hashes["lm"]["source"] == str(tiny_dirs["draft"].resolve()) and "model.safetensors" in files


def test_another_draft_file_is_refused_on_resume(capsys, no_work, tiny_dirs, tmp_path, full_run):
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(tiny_dirs["draft"], draft)
    args = [*_sweep(tiny_dirs, tmp_path / "out")]
    args[args.index("--draft") + 1] = str(draft)
    out = tmp_path / "out"
    out.mkdir()
    lines = (full_run / "runs.jsonl").read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["config"]["draft"] = str(draft)  # the same command on a copy of the draft folder ...
    header["config"]["draft_sha256"]["lm"]["source"] = str(draft.resolve())
    (out / "runs.jsonl").write_text(json.dumps(header) + "\n" + "".join(lines[1:6]))
    before = (out / "runs.jsonl").read_bytes()
    cfg = json.loads((draft / "config.json").read_text())
    cfg["rms_norm_eps"] = cfg.get("rms_norm_eps", 1e-6) * 2  # ... whose weights' config was changed since
    (draft / "config.json").write_text(json.dumps(cfg))
    code, _, err = _run(capsys, *args)
    assert code == 2 and "holds a sweep of another configuration" in err and "draft_sha256" in err, err
    assert (out / "runs.jsonl").read_bytes() == before


def test_a_log_written_before_the_hashes_resumes(capsys, tiny_dirs, tmp_path, full_run):
    out = _partial(tmp_path, full_run, 5)
    lines = (out / "runs.jsonl").read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["config"]["draft_sha256"]  # as specdec wrote it before issue 47
    (out / "runs.jsonl").write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    code, _, err = _run(capsys, *_sweep(tiny_dirs, out))
    assert code == 0, err
    assert "written before run logs recorded the drafts' content hashes" in err and "5 of 18 generations done" in err
    log = read_runlog(out)
    assert len(log.records) == 18 and "draft_sha256" not in log.config  # the header stays as it was logged
    assert _by_key(out) == _by_key(full_run)
