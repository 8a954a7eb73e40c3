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


def write_log(folder: Path, temperature: float, seeds: list[int], run_seeds: list[int], **config_changes) -> Path:
    """A two-prompt run log of eagle3 and rheo at one temperature, as ``specdec bench`` writes it
    (``config_changes`` replace or, when None, remove keys of its header's ``config``)."""
    folder.mkdir()
    config = {"target": "smollm2", "max_new_tokens": 8, "budget": {"nodes": 4, "depth": 2},
              "prompts": {"count": 2, "sha256": "p" * 64}, "temperatures": [temperature], "seeds": seeds,
              "draft_sha256": {"eagle3": {"source": "/heads/eagle3", "sha256": "a" * 64},
                               "lm": {"source": "/lm", "sha256": "b" * 64}}}
    for key, value in config_changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
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


HEAD = {"source": "/heads/eagle3", "sha256": "a" * 64}


@pytest.mark.parametrize("change,message", [
    # another head: the hash of the one draft kind both logs use differs, named with both values
    (dict(draft_sha256={"eagle3": dict(HEAD, sha256="c" * 64)}),
     "draft_sha256.eagle3: " + "a" * 64 + " in .*a, " + "c" * 64 + " in .*b"),
    # other prompts (the same count)
    (dict(prompts={"count": 2, "sha256": "q" * 64}), 'prompts: .*"p{10}.* in .*a, .*"q{10}.* in .*b'),
    # other settings
    (dict(max_new_tokens=16), "max_new_tokens: 8 in .*a, 16 in .*b"),
    (dict(budget={"nodes": 60, "depth": 6}), "budget: "),
    # a log written before the hashes were recorded cannot be checked against one with them
    (dict(draft_sha256=None), "draft_sha256: recorded in one log only"),
])
def test_runs_of_other_heads_prompts_or_settings_are_refused_naming_the_field(tmp_path, change, message):
    dirs = [write_log(tmp_path / "a", 1.0, [0], [0]), write_log(tmp_path / "b", 1.0, [0], [0], **change)]
    with pytest.raises(SystemExit, match="not part of the same sweep as .*: " + message):
        table_module().main(list(map(str, dirs)))


def test_the_hashes_of_a_draft_only_one_log_uses_do_not_matter(tmp_path):
    # a folder whose rows use only the EAGLE-3 head merges with one that also used the draft LM: same head
    dirs = [write_log(tmp_path / "a", 0.0, [0], [0]),
            write_log(tmp_path / "b", 1.0, [0], [0], draft_sha256={"eagle3": HEAD})]
    assert table_module().main(list(map(str, dirs))) == 0
    # two logs that both predate the hashes still merge (nothing to check)
    old = [write_log(tmp_path / "c", 0.0, [0], [0], draft_sha256=None),
           write_log(tmp_path / "d", 1.0, [0], [0], draft_sha256=None)]
    assert table_module().main(list(map(str, old))) == 0


def test_rename_shows_an_old_row_under_its_method_and_gives_it_ratios(tmp_path):
    folder = write_log(tmp_path / "a", 1.0, [0], [0])
    out = tmp_path / "out.json"
    assert table_module().main([str(folder), "--rename", "rheo=sampled-dynamic[proxy=displaced]",
                                "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert {c["row"] for c in got["cells"]} == {"eagle3", "sampled-dynamic[proxy=displaced]"}
    (ratio,) = got["ratios"]
    assert ratio["row"] == "sampled-dynamic[proxy=displaced]" and ratio["eagle_row"] == "eagle3"
    assert ratio["rheo_over_eagle3"][0] == 2.0
    with pytest.raises(SystemExit):
        table_module().main([str(folder), "--rename", "rheo=eagle3"])  # a row of that name exists


def test_cells_of_rheo_with_every_slot_sampled_are_shown_as_sampled_dynamic(tmp_path, capsys):
    """A row logged as rheo with m = K (before issue 47) is the sampled-dynamic method: never shown as rheo's."""
    folder = write_log(tmp_path / "a", 1.0, [0], [0])
    lines = (folder / "runs.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["resolved"]["options"] = [["eagle3", 1.0, {"K": 10}], ["rheo", 1.0, {"K": 10, "m": 10}]]
    (folder / "runs.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    out = tmp_path / "out.json"
    assert table_module().main([str(folder), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert {c["row"] for c in got["cells"]} == {"eagle3", "sampled-dynamic[proxy=scaled,M=1024]"}
    assert [r["row"] for r in got["ratios"]] == ["sampled-dynamic[proxy=scaled,M=1024]"]
    assert "rheo at T=1 shown as sampled-dynamic[proxy=scaled,M=1024]" in capsys.readouterr().out
