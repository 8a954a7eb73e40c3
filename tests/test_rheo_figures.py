"""``benchmarks/rheo_figures.py`` (issue 47), on small run logs written here: the every-slot cells (logged as
``rheo`` with ``m = K`` before issue 47) are drawn as the ``sampled-dynamic`` method, never as rheo, and each
point's tau and standard error are the cell's; the SVGs are the same bytes from run to run."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def figures_module():
    spec = importlib.util.spec_from_file_location("rheo_figures", ROOT / "benchmarks" / "rheo_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# (emitted, steps) per (prompt, seed) unit: prompts 0 and 1, seeds 0 and 1
UNITS = [(0, 0), (0, 1), (1, 0), (1, 1)]
EVERY_SLOT = [(10, 5), (12, 4), (9, 6), (8, 4)]  # per-unit tau 2, 3, 1.5, 2
RHEO = [(8, 4), (8, 4), (9, 3), (6, 3)]  # per-unit tau 2, 2, 3, 2
EAGLE = [(8, 8)] * 4


def write_log(folder: Path, temperature: float, rows: dict[str, tuple[dict, list[tuple[int, int]]]]) -> Path:
    """A run log as ``specdec bench`` writes it: ``rows`` maps a logged row to its resolved options and units."""
    folder.mkdir()
    config = {"target": "smollm2", "max_new_tokens": 8, "budget": {"nodes": 60, "depth": 6},
              "prompts": {"count": 2, "sha256": "p" * 64}, "temperatures": [temperature], "seeds": [0, 1]}
    records = [{"row": "autoregressive", "temperature": temperature, "prompt_index": p, "seed": s,
                "emitted": 8, "steps": 8} for p, s in UNITS]
    for row, (_, units) in rows.items():
        records += [{"row": row, "temperature": temperature, "prompt_index": p, "seed": s, "emitted": e, "steps": n}
                    for (p, s), (e, n) in zip(UNITS, units, strict=True)]
    header = {"config": config, "resolved": {"expected_runs": len(records),
                                             "options": [[row, temperature, opts] for row, (opts, _) in rows.items()]}}
    (folder / "runs.jsonl").write_text("\n".join(map(json.dumps, [header, *records])) + "\n")
    return folder


def by_label(data, method_label_prefix):
    (label,) = [k for k in data if k.startswith(method_label_prefix)]
    return {p.temperature: p for p in data[label]}


def sweep(tmp_path):
    """Two folders as the SmolLM2 sweep's: T = 1 (plain rows, where both ranking laws coincide) and T = 1.2,
    each with an every-slot row logged as ``rheo[m=10,proxy=displaced]``."""
    k10 = {"N": 60, "depth": 6, "K": 10, "B": 10}
    every = {**k10, "m": 10, "proxy": "displaced"}
    t1 = write_log(tmp_path / "t1", 1.0, {"eagle3": (k10, EAGLE), "rheo": (k10, RHEO),
                                         "rheo[m=10,proxy=displaced]": (every, EVERY_SLOT)})
    t12 = write_log(tmp_path / "t12", 1.2, {"eagle3[rank_law=untempered]": ({**k10, "rank_law": "untempered"}, EAGLE),
                                           "rheo[rank_law=untempered]": ({**k10, "rank_law": "untempered"}, RHEO),
                                           "rheo[m=10,proxy=displaced]": (every, EVERY_SLOT)})
    return [t1, t12], {("rheo[m=10,proxy=displaced]", 1.0), ("rheo[m=10,proxy=displaced]", 1.2)}


def every_slot_under_rheo(data, every_slot_logged):
    """The points of a rheo line whose cell was logged with every slot sampled."""
    rheo = by_label(data, "rheo ")
    return [p for p in rheo.values() if (p.logged, p.temperature) in every_slot_logged]


def test_every_slot_rows_are_drawn_as_sampled_dynamic_never_as_rheo(tmp_path):
    fig = figures_module()
    dirs, every_slot_logged = sweep(tmp_path)
    data = fig.series(dirs, fig.SMOLLM2.lines)
    sampled = by_label(data, "sampled-dynamic[proxy=displaced,M=1024]")
    rheo = by_label(data, "rheo ")
    assert sorted(sampled) == [1.0, 1.2] and sorted(rheo) == [1.0, 1.2]
    for t in (1.0, 1.2):
        assert sampled[t].row == "sampled-dynamic[proxy=displaced,M=1024]"
        assert sampled[t].logged == "rheo[m=10,proxy=displaced]"
        # by hand: pooled 39 / 19; per-unit tau 2, 3, 1.5, 2 (mean 2.125), standard error of their mean
        assert sampled[t].tau == pytest.approx(39 / 19)
        assert sampled[t].stderr == pytest.approx(math.sqrt((0.125**2 + 0.875**2 + 0.625**2 + 0.125**2) / 3 / 4))
        assert (sampled[t].prompts, sampled[t].generations) == (2, 4)
        # rheo's points are the rheo rows' (pooled 31 / 14; per-unit 2, 2, 3, 2: standard error 0.25)
        assert rheo[t].tau == pytest.approx(31 / 14) and rheo[t].stderr == pytest.approx(0.25)
        assert by_label(data, "eagle3")[t].tau == 1.0
    assert rheo[1.0].logged == "rheo" and rheo[1.2].logged == "rheo[rank_law=untempered]"
    assert not every_slot_under_rheo(data, every_slot_logged)
    assert all(not v for k, v in data.items() if k.startswith(("sequoia", "specinfer", "sd ")))


def test_without_the_mapping_the_every_slot_cells_would_be_missing_or_rheos(tmp_path, monkeypatch):
    # what the test above guards against: with the renaming gone, the sampled-dynamic line is empty and an
    # auto-budget row logged as plain `rheo` with m = K lands on rheo's line
    fig = figures_module()
    dirs, _ = sweep(tmp_path)
    monkeypatch.setattr(fig, "every_slot_names", lambda headers: {})
    data = fig.series(dirs, fig.SMOLLM2.lines)
    assert not by_label(data, "sampled-dynamic")
    auto = write_log(tmp_path / "auto", 1.0, {"eagle3": ({"K": 2}, EAGLE), "rheo": ({"K": 2, "m": 2}, EVERY_SLOT)})
    data = fig.series([auto], fig.SMOLLM2.lines)
    assert every_slot_under_rheo(data, {("rheo", 1.0)})


def test_an_auto_budget_row_with_every_slot_sampled_is_not_rheos(tmp_path):
    # a `--budget auto` rheo row whose pilot chose m = K was logged as plain `rheo`
    fig = figures_module()
    auto = write_log(tmp_path / "auto", 1.0, {"eagle3": ({"K": 2}, EAGLE), "rheo": ({"K": 2, "m": 2}, EVERY_SLOT)})
    data = fig.series([auto], fig.SMOLLM2.lines)
    assert not by_label(data, "rheo ")
    scaled = fig.Line("sampled-dynamic", "scaled", (("sampled-dynamic[proxy=scaled,M=1024]", fig.ALL),), "k")
    (point,) = fig.series([auto], (scaled,))["scaled"]
    assert point.logged == "rheo" and point.tau == pytest.approx(39 / 19)
    # a rheo line asking for the every-slot cell by its logged name finds nothing: the cell has moved
    asks = fig.Line("rheo", "rheo asks", (("rheo", fig.ALL),), "k")
    assert fig.series([auto], (asks,)) == {"rheo asks": []}


def test_a_line_refuses_rows_of_another_method_and_two_rows_at_one_temperature(tmp_path):
    fig = figures_module()
    dirs, _ = sweep(tmp_path)
    wrong = fig.Line("rheo", "wrong", (("sampled-dynamic[proxy=displaced,M=1024]", fig.ALL),), "k")
    with pytest.raises(ValueError, match="another method"):
        fig.series(dirs, (wrong,))
    both = fig.Line("rheo", "both", (("rheo", fig.ALL), ("rheo[rank_law=untempered]", fig.ALL)), "k")
    fig.series(dirs, (both,))  # rheo at T = 1, the untempered row at 1.2: one row each
    twice = write_log(tmp_path / "twice", 0.6, {"rheo": ({"K": 10}, RHEO),
                                                "rheo[rank_law=untempered]": ({"K": 10}, RHEO)})
    with pytest.raises(ValueError, match="two rows at T=0.6"):
        fig.series([twice], (both,))


def test_the_svgs_are_the_same_bytes_every_time(tmp_path):
    pytest.importorskip("matplotlib")
    fig = figures_module()
    dirs, _ = sweep(tmp_path)
    data = fig.series(dirs, fig.SMOLLM2.lines)
    out = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        fig.plot_tau([(fig.SMOLLM2, data)], tmp_path / name / "tau.svg")
        fig.plot_tree(tmp_path / name / "tree.svg")
        out.append([(tmp_path / name / f).read_bytes() for f in ("tau.svg", "tree.svg")])
    assert out[0] == out[1]
    tau_svg = out[0][0].decode()
    assert "sampled-dynamic[proxy=displaced,M=1024]" in tau_svg and "rheo[m=10" not in tau_svg
    assert "<dc:date>" not in tau_svg  # no date in the metadata
