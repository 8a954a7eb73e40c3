"""specdec.plugins: loading a plug-in module, what it registered, and every bad input's clear error."""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specdec.errors import InvalidConfigError, PluginError, UnknownNameError
from specdec.plugins import (
    ENTRY_POINT_GROUP,
    Plugin,
    load_entry_point_plugins,
    load_plugin,
    load_plugins,
    private_name,
)
from specdec.registry import ROLES, get, list_registered, origin, unregister

_COUNTER = itertools.count()

HEADER = """\
from specdec.methods import Method, register_method
from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier
from specdec.verify.rejection import RejectionIIDVerifier
"""

MATCH = """
@register("verifier", "{name}-match")
class Match(Verifier):
    \"\"\"Sample-and-match, as a plug-in.\"\"\"

    supported_kinds = frozenset({{NodeKind.DETERMINISTIC}})
    supported_modes = frozenset({{SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT}})

    def verify_node(self, tree, node, p_node, rng):
        z = rng.categorical(p_node)
        for child in tree.children(node):
            if int(tree.tokens[child]) == z:
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token=z)
"""

GOOD = MATCH + """
@register("verifier", "{name}-rejection")
class Rejection(RejectionIIDVerifier):
    \"\"\"Rule 3, as a plug-in.\"\"\"


register_method(Method("{name}-sd", "chain", "{name}-rejection", {{"depth": 2}}, description="sd, as a plug-in"))
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Writes plug-in modules into a folder on sys.path; afterwards removes what they registered and imported."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {role: set(list_registered(role)) for role in ROLES}
    modules = set(sys.modules)

    def write(body: str, *, package: str | None = None, header: str = HEADER) -> str:
        name = f"zzplug{next(_COUNTER)}_{tmp_path.name.replace('-', '_')}"
        path = tmp_path / (f"{package}/{name}.py" if package else f"{name}.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + textwrap.dedent(body).format(name=name.replace("_", "-")))
        importlib.invalidate_caches()
        return f"{package}.{name}" if package else name

    write.root = tmp_path  # type: ignore[attr-defined]
    yield write
    for role in ROLES:
        for name in set(list_registered(role)) - before[role]:
            unregister(role, name)
    for name in set(sys.modules) - modules:
        if name.startswith(("zzplug", "zzpkg", "specdec_plugin_zzplug")):
            del sys.modules[name]


def dashed(module: str) -> str:
    return module.rsplit(".", 1)[-1].replace("_", "-")


# ------------------------------------------------------------------ loading
def test_load_plugin_finds_what_the_module_registered(plugins):
    module = plugins(GOOD)
    plugin = load_plugin(module)
    name = dashed(module)
    assert isinstance(plugin, Plugin) and plugin.module == module
    assert set(plugin.registered) == set(ROLES)  # every role, maybe empty
    assert plugin.names("verifier") == (f"{name}-match", f"{name}-rejection")  # sorted
    assert plugin.names("method") == (f"{name}-sd",)
    assert plugin.names("tree") == plugin.names("draft") == plugin.names("target") == ()
    assert plugin.file == str((plugins.root / f"{module}.py").resolve())
    assert plugin.import_root == str(plugins.root.resolve())
    assert origin("method", f"{name}-sd") == module  # register_method is attributed to its caller
    with pytest.raises(UnknownNameError, match="roles are"):
        plugin.names("verifiers")
    assert load_plugin(module) == plugin  # loading again imports nothing new and finds the same


def test_a_module_imported_before_is_found_by_origin(plugins):
    module = plugins(GOOD)
    importlib.import_module(module)  # e.g. by `pytest -p module`, or by the user
    assert load_plugin(module).names("verifier") == (f"{dashed(module)}-match", f"{dashed(module)}-rejection")


def test_a_package_counts_its_submodules_and_nothing_else(plugins):
    sub = plugins(MATCH, package="zzpkg")
    (plugins.root / "zzpkg" / "__init__.py").write_text(f"import {sub}  # noqa: F401\n")
    other = plugins(MATCH)  # another module, imported too: not the package's
    importlib.import_module(other)
    plugin = load_plugin("zzpkg")
    assert plugin.names("verifier") == (f"{dashed(sub)}-match",)
    assert plugin.import_root == str(plugins.root.resolve())
    assert load_plugin(sub).names("verifier") == plugin.names("verifier")


def test_a_py_file_is_loaded_under_its_private_name(plugins, tmp_path, monkeypatch):
    module = plugins(GOOD)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])  # not importable by name
    plugin = load_plugin(str(tmp_path / f"{module}.py"))
    assert plugin.module == private_name(tmp_path / f"{module}.py") and len(plugin.names("verifier")) == 2
    assert plugin.module.startswith(f"specdec_plugin_{module}_") and module not in sys.modules
    assert load_plugin(str(tmp_path / f"{module}.py")) == plugin  # the same file again: the same module
    with pytest.raises(PluginError, match="does not exist"):
        load_plugin(str(tmp_path / "nothere.py"))


def test_the_builtin_packages_pass_the_checks():
    """The checks are not stricter than specdec itself: every built-in entry passes them."""
    found = {role: set() for role in ROLES}
    for package in ("specdec.verify", "specdec.trees", "specdec.drafts", "specdec.targets", "specdec.models"):
        for role, names in load_plugin(package).registered.items():
            found[role] |= set(names)
    for role in ROLES:
        assert found[role] == set(list_registered(role)), role


# ------------------------------------------------------------------ bad input
def test_a_module_that_fails_to_import(plugins):
    module = plugins(MATCH + "\nraise RuntimeError('boom at import')\n")
    with pytest.raises(PluginError) as exc:
        load_plugin(module)
    assert str(exc.value).startswith(f"plug-in module {module!r} failed to import: RuntimeError: boom at import")
    assert isinstance(exc.value.__cause__, RuntimeError)  # chained
    assert isinstance(exc.value, InvalidConfigError)
    # what it registered before failing is gone with it, so fixing the module and retrying works
    assert f"{dashed(module)}-match" not in list_registered("verifier")
    path = plugins.root / f"{module}.py"
    path.write_text(path.read_text().replace("raise RuntimeError('boom at import')", ""))
    importlib.invalidate_caches()
    assert load_plugin(module).names("verifier") == (f"{dashed(module)}-match",)


def test_a_module_that_does_not_exist():
    with pytest.raises(PluginError, match=r"plug-in module 'zz_no_such_plugin' failed to import: "
                                          r"ModuleNotFoundError.*on sys.path"):
        load_plugin("zz_no_such_plugin")
    for bad in ("", "  "):
        with pytest.raises(PluginError, match="a plug-in is named by"):
            load_plugin(bad)


def test_a_module_that_registers_nothing(plugins):
    module = plugins("X = 1\n")
    with pytest.raises(PluginError, match=rf"plug-in module {module!r} registered nothing; a plug-in registers "
                                          r"with specdec.registry.register\("):
        load_plugin(module)


def test_a_module_that_takes_a_registered_name(plugins):
    module = plugins(MATCH + """
@register("verifier", "greedy")
class Mine(Match):
    pass
""")
    with pytest.raises(PluginError) as exc:
        load_plugin(module)
    message = str(exc.value)
    assert f"plug-in module {module!r} registers verifier 'greedy'" in message
    assert "module 'specdec.verify.greedy' owns" in message
    assert get("verifier", "greedy").__module__ == "specdec.verify.greedy"  # untouched
    assert f"{dashed(module)}-match" not in list_registered("verifier")  # its entries went with its import


BAD = {
    "abstract verifier": ("""
@register("verifier", "{name}")
class Half(Verifier):
    supported_kinds = frozenset({{NodeKind.SAMPLED}})
""", "is abstract (it cannot be instantiated): it does not implement verify_node"),
    "verifier of no kind": ("""
@register("verifier", "{name}")
class NoKind(RejectionIIDVerifier):
    supported_kinds = frozenset()
""", "declares no supported_kinds"),
    "verifier with arguments": ("""
@register("verifier", "{name}")
class Needs(RejectionIIDVerifier):
    def __init__(self, strength):
        self.strength = strength
""", "cannot be made with no arguments"),
    "not a verifier": ("""
register("verifier", "{name}")(lambda: None)
""", "is not a Verifier subclass"),
    "abstract builder": ("""
from specdec.trees.base import TreeBuilder

@register("tree", "{name}")
class Half(TreeBuilder):
    produces = frozenset({{NodeKind.SAMPLED}})
""", "is abstract (it cannot be instantiated): it does not implement feed_build, max_depth, max_nodes"),
    "builder of no kind": ("""
from specdec.trees.chain import ChainTreeBuilder

@register("tree", "{name}")
class NoKind(ChainTreeBuilder):
    produces = frozenset()
""", "declares no produces"),
    "batch form without build_batch": ("""
from specdec.trees.base import OneTreeBuilder

@register("tree", "{name}")
class Claims(OneTreeBuilder):
    produces = frozenset({{NodeKind.SAMPLED}})
    batch_form = True
    max_nodes = 2
    max_depth = 1

    def build(self, root_token, draft, sampling, rng):
        raise NotImplementedError
""", "declares batch_form = True but writes no feed_build of its own"),
    "unregistered default verifier": ("""
from specdec.trees.chain import ChainTreeBuilder

@register("tree", "{name}")
class Lost(ChainTreeBuilder):
    default_verifier = "no-such-rule"
""", "names default_verifier 'no-such-rule' (example_options {{'depth': 2}}), which is not registered"),
    "default verifier that does not fit": ("""
from specdec.trees.static import StaticTreeBuilder

@register("tree", "{name}")
class Misfit(StaticTreeBuilder):  # i.i.d. siblings, verified by rule 4 (siblings without replacement)
    example_options = ({{"expansion": (2, 1), "mode": "iid"}},)

    @property
    def default_verifier(self):
        return "rejection-wor"
""", "names default_verifier 'rejection-wor' (example_options {{'expansion': (2, 1), 'mode': 'iid'}}), which "
     "cannot verify its trees"),
    "example options the builder refuses": ("""
from specdec.trees.chain import ChainTreeBuilder

@register("tree", "{name}")
class Opts(ChainTreeBuilder):
    example_options = ({{"width": 3}},)
""", "is not built by its example_options {{'width': 3}}"),
    "draft rows mode without its methods": ("""
from specdec.drafts.base import OneRowDraft
from specdec.drafts.ngram import NgramDraft

@register("draft", "{name}")
class Rows(NgramDraft):  # declares the rows mode, but its begin_rows is the one-row default
    begin_rows = OneRowDraft.begin_rows
""", "declares supports_rows = True but does not override begin_rows"),
    "target batch mode without its methods": ("""
from specdec.targets.base import OneRowTarget

@register("target", "{name}")
class Batch(OneRowTarget):
    supports_batch = True
    vocab_size = 3

    def prefill(self, prompt_ids):
        pass

    def score_tree(self, tree):
        raise NotImplementedError

    def accept(self, accepted_nodes, bonus_token):
        pass
""", "declares supports_batch = True but does not override prefill_batch, score_batch, accept_rows, keep_rows"),
    "method that does not compose": ("""
register_method(Method("{name}", "static", "rejection-wor", {{"expansion": (2, 1), "mode": "iid"}}))
""", "does not compose: tree builder 'static' draws several sampled children of one node 'iid'"),
    "not a method": ("""
register("method", "{name}")(("chain", "greedy"))
""", "is not a specdec.methods.Method"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_module_that_declares_what_it_does_not_implement(plugins, case):
    body, expected = BAD[case]
    module = plugins(body)
    with pytest.raises(PluginError) as exc:
        load_plugin(module)
    message = str(exc.value)
    assert message.startswith(f"plug-in module {module!r} declares what it does not implement: ")
    assert f"{dashed(module)!r} " in message  # the entry is named
    assert expected.replace("{{", "{").replace("}}", "}") in message


def test_every_problem_of_a_module_is_named_at_once(plugins):
    module = plugins(BAD["verifier of no kind"][0].replace("{name}", "{name}-a")
                     + BAD["builder of no kind"][0].replace("{name}", "{name}-b"))
    with pytest.raises(PluginError) as exc:
        load_plugin(module)
    assert f"verifier '{dashed(module)}-a' declares no supported_kinds" in str(exc.value)
    assert f"tree '{dashed(module)}-b' declares no produces" in str(exc.value)


# ------------------------------------------------------------------ entry points
def install_dist(site: Path, dist: str, entry_points: dict[str, str]) -> None:
    """A minimal installed distribution (a .dist-info folder) declaring ``entry_points`` in the plug-in group."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    importlib.invalidate_caches()


def test_entry_point_plugins_are_found_and_loaded(plugins, tmp_path):
    first, second = plugins(GOOD), plugins(MATCH)
    install_dist(tmp_path, "zz_plug_dist", {"rules": first, "more": second, "again": first})
    found = {p.module: p for p in load_entry_point_plugins()}
    assert first in found and second in found
    assert found[first].names("method") == (f"{dashed(first)}-sd",)
    assert [p.module for p in load_entry_point_plugins()].count(first) == 1  # one Plugin per module
    # what the commands load: the installed plug-ins, then the named ones, one Plugin per module
    loaded = [p.module for p in load_plugins([second])]
    assert loaded.count(second) == 1 and first in loaded
    assert [p.module for p in load_plugins([second], entry_points=False)] == [second]


def test_a_broken_entry_point_names_itself_and_its_distribution(plugins, tmp_path):
    module = plugins("X = 1\n")
    install_dist(tmp_path, "zz_broken_dist", {"nothing": module})
    with pytest.raises(PluginError, match=rf"entry point 'nothing' = {module!r} of zz_broken_dist .*registered "
                                          "nothing"):
        load_entry_point_plugins()


def test_an_entry_point_names_a_module_not_an_attribute(plugins, tmp_path):
    module = plugins(MATCH)
    install_dist(tmp_path, "zz_attr_dist", {"rules": f"{module}:Match"})
    with pytest.raises(PluginError, match="the value of a specdec.plugins entry point is a module name"):
        load_entry_point_plugins()


def test_importing_specdec_loads_no_entry_point(plugins, tmp_path):
    """Installed plug-ins are loaded on request only (the commands do), never by a registry lookup."""
    module = plugins(MATCH)
    install_dist(tmp_path, "zz_lazy_dist", {"rules": module})
    code = (f"import sys; from specdec.registry import list_registered; names = list_registered('verifier'); "
            f"assert {module!r} not in sys.modules; from specdec.plugins import load_entry_point_plugins; "
            f"load_entry_point_plugins(); assert {module!r} in sys.modules; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
