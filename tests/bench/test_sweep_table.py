"""``benchmarks/rheo_sweep_table.py`` on the committed SmolLM2 sweep logs (issue 19): merging folders,
``--same-at`` and the comparison of a rheo row with the eagle3 row of the same options; and, on small
logs written here, which folders of other seeds merge."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def table_module():
    spec = importlib.util.spec_from_file_location("rheo_sweep_table", ROOT / "benchmarks" / "rheo_sweep_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DIRS = [RESULTS / "rheo_sweep_smollm2_b60_t03", RESULTS / "rheo_sweep_smollm2_b60_t03_untempered",
        RESULTS / "rheo_sweep_smollm2_b60_t1"]


@pytest.fixture(scope="module")
def logs_present():
    if not all((d / "runs.jsonl").exists() for d in DIRS):
        pytest.skip("the committed sweep logs are not in this checkout")


def run(tmp_path, *extra):
    out = tmp_path / "out.json"
    assert table_module().main([*map(str, DIRS), "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_a_rheo_row_with_options_is_compared_with_the_eagle3_row_of_the_same_options(tmp_path, logs_present):
    ratios = {(r["temperature"], r["row"]): r for r in run(tmp_path)["ratios"]}
    assert ratios[(0.3, "rheo")]["eagle_row"] == "eagle3"
    assert ratios[(0.3, "rheo[rank_law=untempered]")]["eagle_row"] == "eagle3[rank_law=untempered]"
    assert (1.0, "rheo[rank_law=untempered]") not in ratios  # no such row at T = 1 without --same-at


def test_same_at_moves_the_cells(tmp_path, logs_present):
    plain = {(c["row"], c["temperature"]): c["tau"] for c in run(tmp_path)["cells"]}
    moved = run(tmp_path, "--same-at", "rheo[rank_law=untempered]=rheo@1",
                "--same-at", "eagle3[rank_law=untempered]=eagle3@1")
    cells = {(c["row"], c["temperature"]): c["tau"] for c in moved["cells"]}
    assert cells[("rheo[rank_law=untempered]", 1.0)] == plain[("rheo", 1.0)]
    assert ("rheo", 1.0) not in cells and cells[("rheo", 0.3)] == plain[("rheo", 0.3)]
    ratio = {(r["temperature"], r["row"]): r for r in moved["ratios"]}[(1.0, "rheo[rank_law=untempered]")]
    assert ratio["eagle_row"] == "eagle3[rank_law=untempered]" and 1.1 < ratio["rheo_over_eagle3"][0] < 1.3


@pytest.mark.parametrize("spec,message", [
    ("rheo[rank_law=untempered]=rheo@0.3", "has its own cell"),
    ("rheo[rank_law=untempered]=rheo@0.8", "has no cell"),
    ("rheo", "expected ROW=OTHER"),
])
def test_same_at_refuses_what_it_cannot_do(tmp_path, logs_present, capsys, spec, message):
    with pytest.raises(SystemExit):
        table_module().main([*map(str, DIRS), "--same-at", spec])
    assert message in capsys.readouterr().err


def test_eagle_row_names_the_comparison(tmp_path, logs_present):
    plain = {(r["temperature"], r["row"]): r for r in run(tmp_path)["ratios"]}
    assert plain[(0.3, "rheo")]["eagle_row"] == "eagle3"
    chosen = {(r["temperature"], r["row"]): r
              for r in run(tmp_path, "--eagle-row", "rheo=eagle3[rank_law=untempered]")["ratios"]}
    assert chosen[(0.3, "rheo")]["eagle_row"] == "eagle3[rank_law=untempered]"
    # the untempered eagle3 row (2.36) is ahead of the tempered one (2.13): the ratio moves
    assert chosen[(0.3, "rheo")]["rheo_over_eagle3"][0] < plain[(0.3, "rheo")]["rheo_over_eagle3"][0]
    assert (1.0, "rheo") not in chosen  # no eagle3[rank_law=untempered] cell at T = 1 in these logs


@pytest.mark.parametrize("spec,message", [("rheo", "expected ROW=EAGLE_ROW"), ("rheo=eagle9", "no row 'eagle9'")])
def test_eagle_row_refuses_what_it_cannot_do(tmp_path, logs_present, capsys, spec, message):
    with pytest.raises(SystemExit):
        table_module().main([*map(str, DIRS), "--eagle-row", spec])
    assert message in capsys.readouterr().err


def write_log(folder: Path, temperature: float, seeds: list[int], run_seeds: list[int]) -> Path:
    """A two-prompt run log of eagle3 and rheo at one temperature, as ``specdec bench`` writes it."""
    folder.mkdir()
    config = {"target": "smollm2", "max_new_tokens": 8, "budget": {"nodes": 4, "depth": 2},
              "prompts": {"count": 2}, "temperatures": [temperature], "seeds": seeds}
    records = [{"row": row, "temperature": temperature, "prompt_index": p, "seed": s, "emitted": 8, "steps": steps}
               for row, steps in (("eagle3", 4), ("rheo", 4 if temperature == 0 else 2))
               for p in (0, 1) for s in run_seeds]
    lines = [{"config": config, "resolved": {"expected_runs": len(records)}}, *records]
    (folder / "runs.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    return folder


def test_a_greedy_run_of_the_first_seed_joins_a_sweep_of_three_seeds(tmp_path):
    # at T = 0 the bench runs only the first seed, so `--seeds 0` and `--seeds 0,1,2` log the same generations
    greedy = write_log(tmp_path / "t0", 0.0, [0], [0])
    sampled = write_log(tmp_path / "t1", 1.0, [0, 1, 2], [0, 1, 2])
    for dirs in ([greedy, sampled], [sampled, greedy]):
        out = tmp_path / "out.json"
        assert table_module().main([*map(str, dirs), "--json", str(out)]) == 0
        cells = {(c["row"], c["temperature"]): c["tau"] for c in json.loads(out.read_text())["cells"]}
        assert cells[("rheo", 0.0)] == 2.0 and cells[("rheo", 1.0)] == 4.0


@pytest.mark.parametrize("first,second", [
    ((0.0, [1], [1]), (1.0, [0, 1, 2], [0, 1, 2])),  # the greedy run used another seed
    ((1.0, [0], [0]), (1.0, [0, 1, 2], [0, 1, 2])),  # two sampled runs of different seeds
])
def test_runs_of_other_seeds_are_refused(tmp_path, first, second):
    dirs = [write_log(tmp_path / "a", *first), write_log(tmp_path / "b", *second)]
    with pytest.raises(SystemExit, match="not part of the same sweep .*: seeds differ"):
        table_module().main(list(map(str, dirs)))


def test_sampled_runs_of_other_seeds_are_refused_behind_a_greedy_run(tmp_path):
    # the greedy run's first seed matches both, but the two sampled runs differ
    dirs = [write_log(tmp_path / "t0", 0.0, [0], [0]), write_log(tmp_path / "t03", 0.3, [0, 1], [0, 1]),
            write_log(tmp_path / "t1", 1.0, [0, 1, 2], [0, 1, 2])]
    with pytest.raises(SystemExit, match="t1 is not part of the same sweep as .*t03: seeds differ"):
        table_module().main(list(map(str, dirs)))
