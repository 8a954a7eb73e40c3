"""``specdec bench --plugin MODULE``: a plug-in's method benched like a built-in one (issue 43)."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
from pathlib import Path

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


BIGRAM = Path(__file__).resolve().parents[1] / "conformance" / "outside" / "good_bigram.py"
"""The outside bigram draft the conformance tests prove (tests/conformance/test_outside_plugins.py)."""


@pytest.fixture
def bigram():
    """The outside bigram draft plug-in, by file (``outside-bigram``, with a factory); removed afterwards."""
    yield BIGRAM
    if "outside-bigram" in list_registered("draft"):
        unregister("draft", "outside-bigram")
    for name, module in list(sys.modules.items()):  # imported from its file (under the name load_plugin gives it)
        if getattr(module, "__file__", None) == str(BIGRAM):
            del sys.modules[name]


def test_a_plugin_draft_is_benched_by_name(capsys, tiny_dirs, tmp_path, bigram):
    """``--plugin FILE --methods sd@NAME``: a registered draft with a factory is a draft kind; the bench builds
    it for its target with the factory, runs it (lossless: equal to the baseline at T=0), describes it, and
    the run log records its module's file hash."""
    out = tmp_path / "out"
    code, stdout, err = _run(
        capsys, "--plugin", bigram, "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"],
        "--prompts", tiny_dirs["prompts"], "--methods", "sd@outside-bigram", "--budget", "3", "--depth", "2",
        "--num-prompts", "1", "--max-new-tokens", "5", "--seeds", "0", "--ignore-eos", "--out", out, "--no-plots",
    )
    assert code == 0, err
    assert "draft outside-bigram: registered draft 'outside-bigram' (OutsideBigram, module '" in err
    assert "draft outside-bigram: registered draft 'outside-bigram'" in stdout  # the report names it too
    records = {(r["method"], r["temperature"]): r for r in json.loads((out / "results.json").read_text())}
    assert set(records) == {(m, t) for m in ("autoregressive", "sd@outside-bigram") for t in (0.0, 1.0)}
    for t in (0.0, 1.0):
        row = records[("sd@outside-bigram", t)]
        assert row["draft"] == "outside-bigram" and row["new_tokens"] == 5
    assert records[("sd@outside-bigram", 0.0)]["matches_autoregressive"] == 1.0
    header = json.loads((out / "runs.jsonl").read_text().splitlines()[0])
    entry = header["config"]["draft_sha256"]["outside-bigram"]
    assert entry == {"source": str(BIGRAM), "sha256": hashlib.sha256(BIGRAM.read_bytes()).hexdigest()}, entry


def test_a_draft_without_a_factory_is_refused_by_name(capsys, no_work, tmp_path):
    """A registered draft that declares no factory cannot be built for the bench's target: refused before any
    work, naming the draft, its module and how to declare a factory; an unknown kind lists the kinds."""
    plugin = tmp_path / "zz_bench_nofactory.py"
    plugin.write_text("from specdec.drafts.ngram import NgramDraft\nfrom specdec.registry import register\n\n\n"
                      "@register('draft', 'zz-no-factory')\nclass NoFactory(NgramDraft):\n    pass\n")
    try:
        code, _, err = _run(capsys, "--plugin", plugin, "--methods", "sd@zz-no-factory")
        assert code == 2
        assert "the bench cannot build the draft 'zz-no-factory'" in err
        assert "declares no factory" in err and "register('draft', 'zz-no-factory', factory=" in err
        code, _, err = _run(capsys, "--plugin", plugin, "--methods", "sd@zz-nope")
        assert code == 2 and "unknown draft kind 'zz-nope'" in err and "lm, lm-full, eagle2, eagle3, ngram" in err
    finally:
        unregister("draft", "zz-no-factory")
        for name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) == str(plugin):
                del sys.modules[name]


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


def test_the_draft_kinds_come_from_the_registry(tmp_path):
    """One function gives the bench's draft kinds: the built-in ones, then every registered draft with a
    factory (read at the call); the rows, the batch refusal and the run log's draft source follow it."""
    from specdec.bench.hashes import draft_source
    from specdec.bench.kinds import BUILTIN_DRAFT_KINDS, draft_has_rows, draft_kinds
    from specdec.bench.rows import batch_refusal, parse_rows
    from specdec.drafts.ngram import NgramDraft
    from specdec.errors import InvalidConfigError, PluginError
    from specdec.registry import register

    assert draft_kinds() == BUILTIN_DRAFT_KINDS == ("lm", "lm-full", "eagle2", "eagle3", "ngram")
    one_row = type("ZZOneRow", (NgramDraft,), {"supports_rows": False})
    register("draft", "zz-kind", factory=lambda s: one_row(s.vocab_size))(one_row)
    try:
        assert draft_kinds() == (*BUILTIN_DRAFT_KINDS, "zz-kind")
        assert draft_has_rows("ngram") and not draft_has_rows("zz-kind")
        (row,) = parse_rows("sd@zz-kind", ["lm", "zz-kind"], add_baseline=False)
        assert (row.name, row.draft) == ("sd@zz-kind", "zz-kind")
        assert "the zz-kind draft has no rows mode" in (batch_refusal(row) or "")
        with pytest.raises(InvalidConfigError, match="asks for the zz-kind draft, which is not available"):
            parse_rows("sd@zz-kind", ["lm"])
        source = draft_source("smollm2", "auto", {}, "zz-kind")  # the module that registered it
        assert source == Path(__file__)
        register("draft", "lm", factory=lambda s: NgramDraft(s.vocab_size))(type("ZZLm", (NgramDraft,), {}))
        with pytest.raises(PluginError, match=r"draft 'lm' \(module '.*'\) declares a factory but 'lm' is a "
                                              "built-in bench draft kind"):
            draft_kinds()
    finally:
        for name in ("zz-kind", "lm"):
            if name in list_registered("draft"):
                unregister("draft", name)
    assert draft_kinds() == BUILTIN_DRAFT_KINDS


def test_a_draft_factory_that_fails_is_named():
    """The bench builds a registered draft with its factory and checks what comes back, naming the draft."""
    from specdec.bench.kinds import plugin_draft
    from specdec.drafts.ngram import NgramDraft
    from specdec.drafts.setting import DraftSetting
    from specdec.errors import PluginError, VocabMismatchError
    from specdec.registry import register

    def broken(setting):
        raise KeyError("a missing table")

    cases = {"zz-raises": (broken, PluginError, r"the factory of draft 'zz-raises' \(module '.*'\) failed: "
                                                r"KeyError: 'a missing table'"),
             "zz-not-a-draft": (lambda s: "a string", PluginError, "returned str, not a DraftModel"),
             "zz-other-vocab": (lambda s: NgramDraft(s.vocab_size + 1), VocabMismatchError,
                                "built a draft over 8 tokens; the target has 7")}
    try:
        for name, (factory, error, message) in cases.items():
            register("draft", name, factory=factory)(type(f"ZZ{len(name)}", (NgramDraft,), {}))
            with pytest.raises(error, match=message):
                plugin_draft(name, DraftSetting(vocab_size=7))
    finally:
        for name in cases:
            if name in list_registered("draft"):
                unregister("draft", name)
