"""``specdec bench`` end to end on tiny random models, and its bad-input errors."""

from __future__ import annotations

import json

import pytest

from specdec import cli
from specdec.bench import cli as bench_cli
from specdec.bench import runner as bench_runner

REQUIRED = {
    "method": str, "temperature": float, "tau": float, "tokens_per_s": float, "speedup": float,
    "target_forwards": int, "new_tokens": int, "acceptance_by_depth": list, "kind": str, "runs": int,
}


def _run(capsys, *args):
    code = cli.main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "sd,nosuch"], "unknown method 'nosuch'"),
        (["--methods", "rheo@eagle7"], "unknown draft kind"),
        (["--prompts", "/nonexistent/q.jsonl"], "does not exist"),
        (["--temperatures", "0,hot"], "not a number"),
        (["--temperatures", "-1"], ">= 0"),
        (["--seeds", "1,x"], "not an integer"),
        (["--budget", "lots"], "--budget"),
        (["--budget", "0"], "--budget"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--eagle3-head", "/nonexistent/head"], "does not exist"),
        (["--batch-size", "0"], "--batch-size must be"),
        (["--batch-size", "2", "--budget", "4", "--methods", "hf-assisted"], "one sequence at a time"),
        # issue 16, defect 4b/4c: an empty list or a glob is an error, never the preset's methods
        (["--methods", ""], "--methods is empty"),
        (["--methods", " , ,"], "--methods is empty"),
        (["--methods", "zzz*"], "unknown method 'zzz*' in --methods"),
        (["--methods", "sd,eagle*"], "--methods takes method names, not glob patterns"),
        (["--out", ""], "--out is empty"),
    ],
)
def test_bad_input_fails_before_any_work(capsys, no_work, args, message):
    code, out, err = _run(capsys, *args)
    assert code == 2 and message in err and err.startswith("specdec bench: error:")


def test_unknown_preset_and_malformed_prompt_file(capsys, no_work, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--preset", "huge"])
    assert exc.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "category": "x"}\n')
    code, _, err = _run(capsys, "--prompts", bad)
    assert code == 2 and "q.jsonl:1: missing turns" in err


def test_unwritable_out_fails_before_any_work(capsys, no_work, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = _run(capsys, "--out", blocker)
    assert code == 2 and "not a directory" in err
    code, _, err = _run(capsys, "--out", blocker / "sub")
    assert code == 2 and "cannot be written" in err


def test_draft_vocabulary_mismatch(capsys, tiny_dirs, monkeypatch):
    monkeypatch.setattr(bench_runner, "run_bench", lambda *a, **k: pytest.fail("ran despite a bad draft"))
    code, _, err = _run(capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs["bad_vocab"],
                        "--prompts", tiny_dirs["prompts"], "--methods", "sd", "--budget", "2")
    assert code == 2 and "vocabulary of 50 tokens but the target has 64" in err


def test_unknown_target_is_a_clear_error(capsys, tmp_path):
    code, _, err = _run(capsys, "--target", tmp_path / "no-model", "--methods", "sd", "--budget", "2")
    assert code == 2 and "cannot load the target" in err


def test_end_to_end_results_and_plots(capsys, tiny_dirs, tmp_path):
    out = tmp_path / "out"
    code, stdout, err = _run(
        capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
        "--methods", "sd,specinfer,sequoia,eagle2,rheo,hf-assisted", "--budget", "6", "--depth", "3",
        "--num-prompts", "2", "--max-new-tokens", "6", "--seeds", "0,1", "--ignore-eos", "--out", out,
    )
    assert code == 0, err
    assert "speedup" in stdout and "hf-assisted" in stdout
    records = json.loads((out / "results.json").read_text())
    rows = ["autoregressive", "sd", "specinfer", "sequoia", "eagle2", "rheo", "hf-assisted"]
    assert sorted((r["method"], r["temperature"]) for r in records) == sorted((m, t) for m in rows for t in (0.0, 1.0))
    for r in records:
        for key, typ in REQUIRED.items():
            assert isinstance(r[key], typ), (key, r)
        assert r["new_tokens"] == 6 * 2 * (1 if r["temperature"] == 0 else 2)  # 2 prompts, 2 seeds at T > 0
        if r["kind"] == "speculative":
            assert r["budget_nodes"] == 6 and r["budget_depth"] == 3 and r["options"]
            assert len(r["acceptance_by_depth"]) <= 3
            if r["temperature"] == 0:
                assert r["matches_autoregressive"] == 1.0
    header, *runs = (out / "runs.jsonl").read_text().splitlines()
    assert json.loads(header)["format"] == "specdec-bench-runs"  # the resumable log's header (issue 18)
    assert len(runs) == len(rows) * 2 * 3  # rows x prompts x (1 unit at T=0 + 2 seeds at T=1)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["budget"] == {"nodes": 6, "depth": 3, "auto": False} and meta["prompts"]["count"] == 2
    for name in ("tau.png", "acceptance.png", "speedup.png", "temperature.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_auto_budget_and_eagle_head(capsys, tiny_dirs, tmp_path):
    from bench_helpers import make_model
    from specdec.drafts.eagle.checkpoints import save_head
    from specdec.train.models import new_head

    target = make_model(0, layers=2)
    head = new_head(target, 3, seed=3)
    save_head(head, tmp_path / "head3")
    out = tmp_path / "auto"
    code, stdout, err = _run(
        capsys, "--target", tiny_dirs["target"], "--eagle3-head", tmp_path / "head3",  # default draft: truncated copy
        "--prompts", tiny_dirs["prompts"], "--methods", "eagle3,rheo,rheo@lm", "--temperatures", "1",
        "--num-prompts", "1", "--max-new-tokens", "5", "--budget", "auto", "--out", out, "--no-plots",
    )
    assert code == 0, err
    records = {r["method"]: r for r in json.loads((out / "results.json").read_text())}
    assert records["rheo"]["draft"] == "eagle3" and records["rheo@lm"]["draft"] == "lm"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["models"]["lm"].startswith("truncated copy of the target (1 of 2 layers")
    assert "truncated copy" in stdout  # the output says which draft LM ran
    auto = meta["auto_budget"]
    assert meta["budget"]["auto"] and set(auto["acceptance"]) == {"eagle3@T=1", "lm@T=1"}
    (chosen,) = auto["by_temperature"]  # one temperature: one choice per draft kind, each its own table's best
    (entry,) = meta["budget"]["by_temperature"]
    assert set(chosen["by_kind"]) == set(entry["by_kind"]) == {"eagle3", "lm"}
    t1 = auto["forward_time_s"]["1"]
    for kind, mine in chosen["by_kind"].items():
        best = max(mine["table"], key=mine["table"].get)
        assert best == f"{mine['nodes']},{mine['depth']}" == "{nodes},{depth}".format(**entry["by_kind"][kind])
        assert mine["predicted_speedup"] == pytest.approx(mine["table"][best] * t1)
    # rheo's m: the pilot's best among m in {1, 2, 3} (those < K of every piloted kind: m = K is the
    # sampled-dynamic method); which one wins depends on the pilot generations, so the test checks the rule
    from specdec.bench.budget import Budget, dynamic_width
    K = min(dynamic_width(Budget(b["nodes"], b["depth"])) for b in entry["by_kind"].values())
    pilot = chosen["pilot"]
    assert set(pilot["candidates"]) == {m for m in (1, 2, 3) if m < K}
    assert entry["temperature"] == 1.0 and entry["m"] == chosen["m"] in pilot["candidates"]
    assert pilot["tau"][str(entry["m"])] == max(pilot["tau"].values()) if len(pilot["candidates"]) > 1 else not pilot["tau"]
    assert auto["autoregressive_tokens_per_s"] == pytest.approx(1 / t1)
    # one unbroken log line per kind, whatever the measured numbers' widths (rich once wrapped it mid-phrase)
    for kind in ("eagle3", "lm"):
        assert any(f"auto budget: T=1, draft {kind}: " in line and "predicts" in line
                   and "for autoregressive decoding (x" in line for line in err.splitlines())
    goal = [line for line in stdout.splitlines() if line.startswith("T=1: rheo tau")]
    assert len(goal) == 1 and "(goal >= 1.10: " in goal[0] and goal[0].endswith(")")  # one unbroken line
    for row in ("rheo", "rheo@lm", "eagle3"):  # each row runs at its draft kind's budget
        assert records[row]["budget_nodes"] == entry["by_kind"][records[row]["draft"]]["nodes"]
    assert records["rheo"]["options"]["m"] == entry["m"]  # the rows without their own m get the chosen one
    text = "; ".join(f"{k} {Budget(b['nodes'], b['depth'])}" for k, b in sorted(entry["by_kind"].items()))
    assert f"auto budget at T=1: {text}; rheo m={entry['m']}" in stdout
    assert not (out / "tau.png").exists()


def test_batch_size_runs_batched_rows_and_says_what_it_left_out(capsys, tiny_dirs, tmp_path):
    """--batch-size 2: the preset's rows that cannot batch are left out (the log
    names them), every method runs batched against the batched baseline, each
    prompt's T=0 tokens equal the baseline's where the method is exact, and
    result rows carry batch_size."""
    from bench_helpers import make_model
    from specdec.drafts.eagle.checkpoints import save_head
    from specdec.train.models import new_head

    target = make_model(0, layers=2)
    save_head(new_head(target, 3, seed=3), tmp_path / "head3")
    out = tmp_path / "batched"
    code, stdout, err = _run(
        capsys, "--target", tiny_dirs["target"], "--eagle3-head", tmp_path / "head3", "--prompts", tiny_dirs["prompts"],
        "--temperatures", "0,1", "--num-prompts", "3", "--max-new-tokens", "6", "--budget", "4", "--depth", "2",
        "--batch-size", "2", "--ignore-eos", "--out", out, "--no-plots",
    )
    assert code == 0, err
    assert "left out with --batch-size 2: hf-assisted: transformers' assisted generation" in err
    records = json.loads((out / "results.json").read_text())
    names = {r["method"] for r in records}
    # every method batches (level-wise and shaped builders, EAGLE heads and the draft LM); the peer does not
    assert {"autoregressive", "sd", "specinfer", "sequoia", "eagle2", "eagle3", "rheo"} <= names
    assert "hf-assisted" not in names
    assert all(r["batch_size"] == 2 for r in records)
    for r in records:
        assert r["new_tokens"] == 3 * 6 * (1 if r["temperature"] == 0 else r["runs"] // 3)
        if r["temperature"] == 0:
            assert r["matches_autoregressive"] == 1.0  # greedy rows equal the batched greedy baseline
    meta = json.loads((out / "meta.json").read_text())
    assert meta["batch_size"] == 2
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()[1:]]  # after the header
    assert {r["prompt_index"] for r in runs} == {0, 1, 2}


def test_auto_budget_per_batch_size(capsys, tiny_dirs, tmp_path):
    """--budget auto with --batch-size 2 times B-row forwards and B-row draft
    levels (issue 15), and the run uses the budget it chose."""
    from bench_helpers import make_model
    from specdec.drafts.eagle.checkpoints import save_head
    from specdec.train.models import new_head

    target = make_model(0, layers=2)
    save_head(new_head(target, 3, seed=3), tmp_path / "head3")
    out = tmp_path / "auto2"
    code, _, err = _run(
        capsys, "--target", tiny_dirs["target"], "--eagle3-head", tmp_path / "head3", "--prompts", tiny_dirs["prompts"],
        "--methods", "eagle3,rheo", "--temperatures", "0", "--num-prompts", "2", "--max-new-tokens", "4",
        "--budget", "auto", "--batch-size", "2", "--ignore-eos", "--out", out, "--no-plots",
    )
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    auto = meta["auto_budget"]
    assert auto["batch_size"] == 2 and meta["budget"]["auto"]
    (chosen,) = auto["by_temperature"]
    mine = chosen["by_kind"]["eagle3"]  # eagle3 and rheo: one draft kind, one budget
    best = max(mine["table"], key=mine["table"].get)
    assert best == f"{meta['budget']['nodes']},{meta['budget']['depth']}"  # one temperature, one kind: one budget
    assert chosen["m"] == 1 and chosen["pilot"] is None  # T = 0: rheo is EAGLE-2, no pilot
    assert auto["autoregressive_tokens_per_s"] == pytest.approx(2 / auto["forward_time_s"]["1"])  # rows summed
    assert any("auto budget for 2 rows:" in line for line in err.splitlines())
    records = json.loads((out / "results.json").read_text())
    assert all(r["batch_size"] == 2 for r in records)
    assert {r["budget_nodes"] for r in records if r["kind"] == "speculative"} == {meta["budget"]["nodes"]}
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()[1:]]
    assert {r["budget_nodes"] for r in runs if r["row"] != "autoregressive"} == {meta["budget"]["nodes"]}


# ------------------------------------------------ issue 16: --out with earlier results, bad --prompts JSON
def _earlier_results(folder):
    folder.mkdir()
    for name in ("results.json", "meta.json", "tau.png"):
        (folder / name).write_text("earlier run")
    return folder


def test_out_with_earlier_results_is_refused_before_any_work(capsys, no_work, tmp_path):
    out = _earlier_results(tmp_path / "out")
    code, _, err = _run(capsys, "--out", out)
    assert code == 2 and err.startswith("specdec bench: error:")
    assert str(out) in err and "meta.json, results.json, tau.png" in err and "--overwrite" in err
    assert all((out / n).read_text() == "earlier run" for n in ("results.json", "meta.json", "tau.png"))


def test_out_with_only_other_files_and_overwrite_pass_validation(capsys, no_work, tmp_path):
    """An empty folder, one holding other files, and --overwrite reach model loading (the `no_work` stub)."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for argv in (["--out", tmp_path / "new"], ["--out", other], ["--out", _earlier_results(tmp_path / "old"), "--overwrite"]):
        with pytest.raises(AssertionError, match="long work started"):
            _run(capsys, *argv)


def test_overwrite_replaces_earlier_results_and_removes_stale_files(capsys, tiny_dirs, tmp_path):
    out = _earlier_results(tmp_path / "out")
    code, stdout, err = _run(
        capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
        "--methods", "sd", "--budget", "2", "--num-prompts", "1", "--max-new-tokens", "3", "--temperatures", "0",
        "--out", out, "--no-plots", "--overwrite",
    )
    assert code == 0, err
    assert {r["method"] for r in json.loads((out / "results.json").read_text())} == {"autoregressive", "sd"}
    assert json.loads((out / "meta.json").read_text())["methods"] == ["autoregressive", "sd"]
    assert not (out / "tau.png").exists()  # a plot of the earlier run would not match the new results
    assert "removed tau.png" in stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('["a prompt",\n "another" "x"]', "p.json:2:12: invalid JSON"),
        ('{"turns": ["a"]}', "expected a JSON list"),
    ],
)
def test_broken_json_prompt_file_fails_before_any_work(capsys, no_work, tmp_path, content, message):
    bad = tmp_path / "p.json"
    bad.write_text(content)
    code, _, err = _run(capsys, "--prompts", bad)
    assert code == 2 and err.startswith("specdec bench: error:") and message in err
