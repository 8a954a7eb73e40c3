"""Every field of every runs.jsonl record is checked, with the file and line in the error (issue 57, item 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec import cli
from specdec.bench.runlog import read_runlog
from specdec.errors import InvalidConfigError

ROWS = [{"name": "autoregressive", "kind": "autoregressive", "method": None, "draft": None, "note": "", "options": []},
        {"name": "sd", "kind": "speculative", "method": "sd", "draft": "lm", "note": "", "options": []}]
HEADER = {
    "format": "specdec-bench-runs", "version": 1,
    "config": {"preset": "quick", "rows": ["autoregressive", "sd"], "temperatures": [0.0, 1.0], "seeds": [0, 1],
               "max_new_tokens": 4, "ignore_eos": True, "batch_size": 1},
    "resolved": {"rows": ROWS, "budget": {"nodes": 3, "depth": 2, "auto": False}, "auto_budget": None,
                 "sequoia_acceptance": [], "options": [], "profile_prompts": 0, "profile_steps_per_prompt": 0,
                 "prompts": {"source": "test", "count": 2, "ids": ["a", "b"], "categories": ["text", "text"],
                             "tokens": [3, 3]},
                 "models": {}, "expected_runs": 12},
}
# units (prompt, T, seed): 0 (0, 0, 0), 1 (0, 1, 0), 2 (0, 1, 1), 3 (1, 0, 0), 4 (1, 1, 0), 5 (1, 1, 1)


def _record(sequence: int, unit: int, prompt: int, t: float, seed: int, row: str) -> dict:
    spec = row == "sd"  # 2 steps: 2 + 1 drafts accepted + 2 bonus tokens = 5 emitted, 4 kept
    return {"sequence": sequence, "unit": unit, "prompt_index": prompt, "temperature": t, "seed": seed, "row": row,
            "new_tokens": 4, "steps": 2 if spec else 4, "emitted": 5 if spec else 4,
            "depth_attempted": [2, 1] if spec else [], "depth_accepted": [2, 1] if spec else [],
            "time_total": 0.5 if spec else 1.0, "time_prefill": 0.1, "time_draft": 0.1 if spec else 0.0,
            "time_target": 0.2, "time_verify": 0.1, "tokens": [5, 6, 7, 8], "budget_nodes": 3 if spec else None,
            "budget_depth": 2 if spec else None, "depth_optimum": [], "optimum_bound": False}


RECORDS = [_record(0, 0, 0, 0.0, 0, "autoregressive"), _record(1, 0, 0, 0.0, 0, "sd"),
           _record(2, 1, 0, 1.0, 0, "sd"), _record(3, 1, 0, 1.0, 0, "autoregressive")]


def _write(folder: Path, lines: list[str], end: str = "\n") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "runs.jsonl").write_text("\n".join(lines) + end)
    return folder


def _log(folder: Path, line3: str | None = None, header: dict | None = None) -> Path:
    """The header and RECORDS; ``line3`` replaces the second record (line 3 of the file)."""
    lines = [json.dumps(header or HEADER), *map(json.dumps, RECORDS)]
    if line3 is not None:
        lines[2] = line3
    return _write(folder, lines)


def _with(**changes) -> str:
    return json.dumps({**RECORDS[1], **changes})


def test_the_valid_log_reads_and_reports(capsys, tmp_path):
    log = read_runlog(_log(tmp_path / "ok"))
    assert len(log.records) == 4 and not log.complete
    code = cli.main(["bench", "report", str(tmp_path / "ok"), "--no-plots", "--no-write"])
    out = capsys.readouterr()
    assert code == 0 and "partial sweep: 4 of 12 generations" in out.out, out.err


@pytest.mark.parametrize(("line3", "message"), [
    # unreadable lines: a raw traceback before (ValueError, RecursionError)
    (_with(tokens=["a"]), "'tokens' holds 'a' at index 0: an integer >= 0 was expected"),
    (_with(tokens=[5, 6, True, 8]), "'tokens' holds True at index 2"),
    (_with(tokens=[5, 6, -1, 8]), "'tokens' holds -1 at index 2"),
    (_with().replace('"steps": 2', '"steps": 1' + "0" * 5000), "not JSON (Exceeds the limit"),
    ('{"sequence": ' + "[" * 100_000 + "]" * 100_000 + "}", "not JSON (nested too deeply"),
    (_with(temperature=10 ** 400), "'temperature' is 1000000000000"),
    (_with().replace('"time_total": 0.5', '"time_total": ' + "9" * 400), "'time_total' is 99999"),
    (_with().replace('"time_total": 0.5', '"time_total": NaN'), "'time_total' is nan"),
    # out of range: averaged in silently before
    (_with(steps=0), "'steps' is 0: a generation makes at least one target forward"),
    (_with(steps=-3), "'steps' is -3"),
    (_with(time_total=-1), "'time_total' is -1: seconds are a finite number >= 0"),
    (_with(time_draft=-0.5), "'time_draft' is -0.5"),
    (_with(emitted=3), "'emitted' is 3, less than new_tokens (4)"),
    (_with(new_tokens=5, tokens=[5, 6, 7, 8, 9]), "'new_tokens' is 5: must be between 0 and max_new_tokens (4)"),
    (_with(new_tokens=-1), "'new_tokens' is -1"),
    (_with(sequence=-1), "'sequence' is -1"),
    # counts that must agree
    (_with(tokens=[5, 6, 7]), "'tokens' holds 3 tokens, but new_tokens is 4"),
    (_with(depth_accepted=[2]), "'depth_accepted' has 1 depths, depth_attempted 2"),
    (_with(depth_accepted=[3, 1]), "at depth 1: 3 accepted of 2 attempted in 2 steps"),
    (_with(depth_attempted=[3, 1], emitted=5), "at depth 1: 2 accepted of 3 attempted in 2 steps"),
    (_with(depth_attempted=[1, 2], depth_accepted=[1, 1], emitted=4), "at depth 2 exceeds depth 1"),
    (_with(emitted=7), "'emitted' is 7, not steps + accepted drafts (2 + 3)"),
    (_with(depth_optimum=[0.5, 0.2, 0.1]), "'depth_optimum' has 3 depths, depth_attempted 2"),
    (_with(depth_optimum=[-0.5, 0.0]), "'depth_optimum' holds -0.5 at index 0"),
    (_with(budget_nodes=0), "'budget_nodes' is 0: an integer >= 1"),
    (_with(unit=3), "'unit' is 3, but prompt 0 at T=0 with seed 0 is unit 0 of the sweep"),
    # types
    (_with(steps=2.0), "'steps' has the wrong type (float)"),
    (_with(steps=True), "'steps' has the wrong type (bool)"),
    (_with(row=5), "'row' has the wrong type (int)"),
    (_with(temperature="0"), "'temperature' has the wrong type (str)"),
    (_with(optimum_bound="yes"), "'optimum_bound' has the wrong type (str)"),
    (_with(time_verify="fast"), "'time_verify' has the wrong type (str)"),
    # the generation's place in the sweep
    (_with(seed=1), "generation 'sd' T=0.0 seed 1 prompt 0 is outside the sweep"),  # T = 0 runs the first seed only
    (_with(prompt_index=2), "prompt 2 is outside the sweep"),
    (json.dumps({k: v for k, v in RECORDS[1].items() if k != "emitted"}), "record without 'emitted'"),
])
def test_a_corrupt_record_is_refused_naming_the_file_line_and_field(capsys, tmp_path, line3, message):
    folder = _log(tmp_path / "bad", line3)
    with pytest.raises(InvalidConfigError) as info:
        read_runlog(folder)
    assert str(info.value).startswith(f"{folder / 'runs.jsonl'}:3: ") and message in str(info.value), info.value
    for argv in (["report", folder, "--no-plots", "--no-write"], ["report", folder, "--no-plots"]):
        code = cli.main(["bench", *map(str, argv)])  # one line and exit status 2, never a traceback
        err = capsys.readouterr().err
        assert code == 2 and f"runs.jsonl:3: " in err and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("config", "message"), [
    ({"seeds": ["x"]}, "the header's config.seeds is not a list of integers"),
    ({"temperatures": "ab"}, "the header's config.temperatures is not a list of temperatures >= 0"),
    ({"temperatures": [0.0, -1.0]}, "the header.s config.temperatures is not a list of temperatures >= 0"),
    ({"rows": "sd"}, "the header's config.rows is not a list of row names"),
    ({"max_new_tokens": 0}, "the header's config.max_new_tokens is not an integer >= 1"),
])
def test_a_corrupt_header_is_refused_naming_the_field(tmp_path, config, message):
    header = json.loads(json.dumps(HEADER))
    header["config"].update(config)
    folder = _log(tmp_path / "h", header=header)
    with pytest.raises(InvalidConfigError, match=f"runs.jsonl:1: {message}"):
        read_runlog(folder)


def test_a_corrupt_header_rows_or_count_is_refused(tmp_path):
    header = json.loads(json.dumps(HEADER))
    header["resolved"]["rows"] = [ROWS[0], {**ROWS[1], "colour": "red"}]
    with pytest.raises(InvalidConfigError, match="runs.jsonl:1: the header's resolved.rows is not a list of rows"):
        read_runlog(_log(tmp_path / "r", header=header))
    header["resolved"]["rows"] = ROWS[:1]
    with pytest.raises(InvalidConfigError, match="resolved.rows names .'autoregressive'. are not config.rows"):
        read_runlog(_log(tmp_path / "n", header=header))
    header = json.loads(json.dumps(HEADER))
    header["resolved"]["expected_runs"] = "many"
    with pytest.raises(InvalidConfigError, match="runs.jsonl:1: the header's resolved.expected_runs is not an integer"):
        read_runlog(_log(tmp_path / "e", header=header))


def test_a_deeply_nested_header_is_not_a_run_log(tmp_path):
    folder = _write(tmp_path / "deep", ['{"format": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    with pytest.raises(InvalidConfigError, match="is not a specdec bench run log .line 1 is not JSON"):
        read_runlog(folder)


def test_a_cut_last_line_is_still_dropped(tmp_path):
    """The documented behaviour that held: a kill cuts at most the last line; it is dropped (and the file repaired
    on resume), however it was cut (in a number, in a string, in a nesting)."""
    whole = json.dumps(RECORDS[3])
    for cut in (whole[:40], whole[:-1], whole[: whole.index('"tokens"') + 12]):
        folder = _write(tmp_path / "cut", [json.dumps(HEADER), *map(json.dumps, RECORDS[:3]), cut], end="")
        log = read_runlog(folder)
        assert log.dropped_tail and len(log.records) == 3
        log = read_runlog(folder, repair=True)
        assert (folder / "runs.jsonl").read_text().endswith(json.dumps(RECORDS[2]) + "\n")
    # the same cut line followed by a newline is not a kill's cut: an error naming it
    folder = _write(tmp_path / "cut", [json.dumps(HEADER), *map(json.dumps, RECORDS[:3]), whole[:40]])
    with pytest.raises(InvalidConfigError, match=r"runs.jsonl:5: not JSON"):
        read_runlog(folder)


def test_every_committed_run_log_passes_the_checks():
    """The checks are what specdec's writer does: every run log committed under benchmarks/results reads."""
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    logs = [p for p in results.glob("**/runs.jsonl") if '"specdec-bench-runs"' in p.open().readline()]
    if not logs:
        pytest.skip("no committed run logs (an sdist without benchmarks/)")
    assert sum(len(read_runlog(p).records) for p in logs) > 1000
