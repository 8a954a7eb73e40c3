"""``specdec bench --plugin MODULE``: a plug-in's method benched like a built-in one (issue 43)."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

from specdec import cli
from specdec.bench import workers
from specdec.bench.hashes import file_sha256
from specdec.bench.runlog import read_runlog
from specdec.plugins import private_name
from specdec.registry import list_registered, unregister

PLUGIN = '''\
"""A plug-in: rule 3 under another name, and a method using it on the chain builder."""
from specdec.methods import Method, register_method
from specdec.registry import register
from specdec.trees.chain import ChainTreeBuilder
from specdec.verify.rejection import RejectionIIDVerifier


@register("verifier", "zz-bench-rule")
class BenchRule(RejectionIIDVerifier):
    """Rule 3, from a plug-in (its own walk: a subclass declares no fused form)."""


register_method(Method("zz-bench-sd", "chain", "zz-bench-rule", {"depth": 2}, description="sd from a plug-in"))


@register("tree", "zz-bench-chain")
class BenchChain(ChainTreeBuilder):
    """The chain builder under a plug-in's name: a builder the bench has no budget mapping for."""


register_method(Method("zz-bench-own", "zz-bench-chain", "rejection-iid", {"depth": 3}))
'''


@pytest.fixture
def plugin(tmp_path):
    """A plug-in module ``zz_bench_plugin`` in a folder that is not on sys.path (yields the folder)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "zz_bench_plugin.py").write_text(PLUGIN)
    importlib.invalidate_caches()
    path = list(sys.path)
    yield folder
    sys.path[:] = path
    for role, name in (("method", "zz-bench-sd"), ("method", "zz-bench-own"), ("verifier", "zz-bench-rule"),
                       ("tree", "zz-bench-chain")):
        if name in list_registered(role):
            unregister(role, name)
    sys.modules.pop("zz_bench_plugin", None)


def _run(capsys, *args):
    code = cli.main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_plugin_method_is_benched(capsys, tiny_dirs, tmp_path, plugin):
    """A plug-in's method on a built-in builder gets the budget like any method; one on the plug-in's own
    builder (no budget mapping) runs with its method's options, and the log and the results say so."""
    out = tmp_path / "out"
    code, stdout, err = _run(
        capsys, "--plugin", plugin / "zz_bench_plugin.py", "--target", tiny_dirs["target"], "--draft",
        tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"], "--methods", "zz-bench-sd,zz-bench-own[depth=2]",
        "--budget", "3", "--depth", "3", "--num-prompts", "1", "--max-new-tokens", "5", "--seeds", "0",
        "--ignore-eos", "--out", out, "--no-plots",
    )
    assert code == 0, err
    assert "zz-bench-sd" in stdout
    unmapped = ("its tree builder 'zz-bench-chain' has no tree-budget mapping: runs with options {'depth': 2} "
                "(the method's own, and the row's), not the budget")
    assert f"zz-bench-own[depth=2]: {unmapped}" in err  # logged before anything runs
    records = {(r["method"], r["temperature"]): r for r in json.loads((out / "results.json").read_text())}
    rows = ("autoregressive", "zz-bench-sd", "zz-bench-own[depth=2]")
    assert set(records) == {(m, t) for m in rows for t in (0.0, 1.0)}
    for t in (0.0, 1.0):
        sd, own = records[("zz-bench-sd", t)], records[("zz-bench-own[depth=2]", t)]
        assert (sd["budget_nodes"], sd["budget_depth"], sd["options"]) == (3, 3, {"depth": 3})  # the budget's
        assert (own["budget_nodes"], own["budget_depth"], own["options"]) == (None, None, {"depth": 2})
        assert own["note"] == unmapped and own["new_tokens"] == 5
        assert len(own["acceptance_by_depth"]) <= 2
    for name in rows[1:]:
        assert records[(name, 0.0)]["matches_autoregressive"] == 1.0  # exact at T=0, as a lossless rule must be
    # a file is imported under its private name (issue 57), which the log records with its source's hash
    module = private_name(plugin / "zz_bench_plugin.py")
    assert json.loads((out / "meta.json").read_text())["plugins"] == [module]
    config = read_runlog(out).config
    assert config[f"plugin:{module}"]["sha256"] == file_sha256(plugin / "zz_bench_plugin.py")


def test_without_the_plugin_its_method_is_unknown(capsys, no_work):
    code, _, err = _run(capsys, "--methods", "zz-bench-sd")
    assert code == 2 and "unknown method 'zz-bench-sd' in --methods" in err


def test_a_bad_plugin_fails_before_any_work(capsys, no_work, tmp_path):
    bad = tmp_path / "zz_bench_broken.py"
    bad.write_text("raise ImportError('a missing dependency of the plug-in')\n")
    code, _, err = _run(capsys, "--plugin", bad, "--methods", "sd")
    assert code == 2
    assert err.startswith("specdec bench: error: plug-in module")
    assert "failed to import: ImportError: a missing dependency of the plug-in" in err


def test_a_ray_worker_imports_the_plugins_before_its_models(plugin, monkeypatch):
    """``--workers``: each worker process imports the command's plug-ins (from the folder they were imported
    from here) before it loads the models, so their methods resolve there; a plug-in that fails is the
    worker's error (``ready()`` reports it, and the command stops before the sweep)."""
    loaded = []
    monkeypatch.setattr(workers.bench_models, "load_bench_models", lambda *a, **k: loaded.append(True) or "models")
    assert str(plugin) not in sys.path and "zz_bench_plugin" not in sys.modules
    spec = {"target": "t", "draft": "d", "eagle_heads": {}, "need_kinds": frozenset(), "device": "cpu",
            "plugins": [("zz_bench_plugin", str(plugin))]}
    worker = workers._Worker(spec, None)
    assert worker.error is None and loaded and worker.models == "models"
    assert "zz-bench-sd" in list_registered("method") and str(plugin) in sys.path
    broken = workers._Worker({**spec, "plugins": [("zz_bench_missing", str(plugin))]}, None)
    assert broken.error is not None and broken.error.startswith("PluginError: plug-in module 'zz_bench_missing'")
