"""Issue 57: plug-ins are part of a run's identity.

- overriding a name another module owns warns by name and is recorded (:func:`specdec.registry.overrides`), and
  the bench's run identity holds every plug-in module (its source's hash) and every override;
- a plug-in file is imported under a private name, never one that shadows a module of the standard library;
- a broken installed plug-in is skipped with a warning naming how to skip it (the commands), or an error naming
  the same (:func:`~specdec.plugins.load_entry_point_plugins`); ``SPECDEC_NO_ENTRY_POINTS`` and
  ``SPECDEC_SKIP_PLUGINS`` turn installed plug-ins off.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import sysconfig
import warnings
from pathlib import Path

import pytest

from specdec import cli, registry
from specdec.bench.hashes import file_sha256, plugin_identity
from specdec.bench.report import open_out_dir
from specdec.bench.runlog import write_header
from specdec.bench.settings import run_identity
from specdec.errors import InvalidConfigError, PluginError
from specdec.plugins import ENTRY_POINT_GROUP, PluginWarning, load_entry_point_plugins, load_plugin, load_plugins
from specdec.registry import ROLES, Override, RegistryOverrideWarning, get, list_registered, origin, register
from specdec.verify.rejection import RejectionIIDVerifier

_COUNTER = itertools.count()

RULE = '''\
from specdec.registry import register
from specdec.verify.rejection import RejectionIIDVerifier


@register("verifier", "{name}")
class Rule(RejectionIIDVerifier):
    """Rule 3, as a plug-in."""
'''

LOSSY = RULE + '''

@register("verifier", "rejection-iid", override=True)
class Lossy(RejectionIIDVerifier):
    """A plug-in's replacement of rule 3 (a lossy one, say)."""
'''


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder on sys.path for plug-in modules and installed distributions; afterwards, the registry and
    sys.modules as they were (a built-in a test replaced is put back)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("SPECDEC_NO_ENTRY_POINTS", "SPECDEC_SKIP_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    entries = {role: {n: (get(role, n), origin(role, n)) for n in list_registered(role)} for role in ROLES}
    modules = set(sys.modules)
    yield tmp_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # putting the original entries back warns about nothing
        for role in ROLES:
            for name in list_registered(role):
                if name not in entries[role]:
                    registry.unregister(role, name)
                elif get(role, name) is not entries[role][name][0]:
                    register(role, name, override=True)(entries[role][name][0])
    assert registry.overrides() == []
    for name in set(sys.modules) - modules:
        if name.startswith(("zzload", "specdec_plugin_")):
            del sys.modules[name]
    importlib.invalidate_caches()


def write(folder: Path, body: str, stem: str | None = None) -> tuple[str, str]:
    """A plug-in module in ``folder``: ``(module name, registered verifier name)``."""
    stem = stem or f"zzload{next(_COUNTER)}"
    name = f"{stem.replace('_', '-')}-{folder.name[-6:].replace('_', '-')}-rule"
    (folder / f"{stem}.py").write_text(body.format(name=name))
    importlib.invalidate_caches()
    return stem, name


def install_dist(site: Path, dist: str, entry_points: dict[str, str]) -> None:
    """A minimal installed distribution declaring ``entry_points`` in the plug-in group."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    importlib.invalidate_caches()


# ------------------------------------------------------------------ (6) overrides warn and are recorded
def test_overriding_a_builtin_warns_by_name_and_is_recorded(folder):
    module, _ = write(folder, LOSSY)
    builtin = get("verifier", "rejection-iid")
    with pytest.warns(RegistryOverrideWarning) as caught:
        plugin = load_plugin(module)
    message = str(caught[0].message)
    assert "verifier 'rejection-iid'" in message and "'specdec.verify.rejection'" in message
    assert f"module {module!r}" in message
    record = Override(role="verifier", name="rejection-iid", owner="specdec.verify.rejection", by=module)
    assert registry.overrides() == [record] and plugin.overrides == (record,)
    assert get("verifier", "rejection-iid").__module__ == module  # "sd" now runs it: hence the warning
    # putting the built-in back is no override: no warning, no record, its origin restored
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register("verifier", "rejection-iid", override=True)(builtin)
    assert registry.overrides() == [] and origin("verifier", "rejection-iid") == "specdec.verify.rejection"


def test_a_plugin_that_fails_after_an_override_leaves_no_record(folder):
    """Its import failed: the built-in it replaced is back, with its origin, and no override is recorded."""
    module, _ = write(folder, LOSSY + "\nraise RuntimeError('boom after the override')\n")
    builtin = get("verifier", "rejection-iid")
    with pytest.warns(RegistryOverrideWarning), pytest.raises(PluginError, match="boom after the override"):
        load_plugin(module)
    assert get("verifier", "rejection-iid") is builtin and origin("verifier", "rejection-iid") == builtin.__module__
    assert registry.overrides() == []


def test_a_module_replacing_its_own_entry_does_not_warn(folder):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register("verifier", "zz-own-rule")(type("A", (RejectionIIDVerifier,), {}))
        register("verifier", "zz-own-rule", override=True)(type("B", (RejectionIIDVerifier,), {}))
    assert registry.overrides() == []


def test_specdec_list_marks_an_override(folder, capsys):
    module, _ = write(folder, LOSSY)
    with pytest.warns(RegistryOverrideWarning):
        code = cli.main(["list", "verifier", "--pattern", "rejection-iid", "--plugin", module])
    assert code == 0
    assert f"[{module}, replaces specdec.verify.rejection's]" in capsys.readouterr().out


# ------------------------------------------------------------------ (6) the bench's run identity
class _Args:  # the parsed flags run_identity reads
    target = draft = eagle2_head = eagle3_head = "x"
    ignore_eos = False
    max_prompt_tokens = 8
    device = "cpu"


class _Settings:
    preset, temperatures, seeds, max_new_tokens, batch_size = "quick", (0.0,), (0,), 4, 1
    budget = "auto"
    optimum = False


def test_the_run_identity_holds_the_plugins_and_their_overrides(folder):
    module, name = write(folder, LOSSY)
    before = run_identity(_Args, _Settings, [], [])
    assert f"plugin:{module}" not in before and "override:verifier:rejection-iid" not in before
    with pytest.warns(RegistryOverrideWarning):
        load_plugin(module)
    identity = run_identity(_Args, _Settings, [], [])
    entry = identity[f"plugin:{module}"]
    assert entry["sha256"] == file_sha256(folder / f"{module}.py")
    assert entry["file"] == str((folder / f"{module}.py").resolve())
    assert entry["registered"] == {"verifier": sorted([name, "rejection-iid"])}
    assert identity["override:verifier:rejection-iid"] == {"owner": "specdec.verify.rejection", "by": module}
    assert plugin_identity() == {k: v for k, v in identity.items() if k.startswith(("plugin:", "override:"))}
    # the plug-in's source edited: another identity
    (folder / f"{module}.py").write_text(LOSSY.format(name=name) + "\n# edited\n")
    assert plugin_identity()[f"plugin:{module}"]["sha256"] != entry["sha256"]


def test_a_resume_with_another_plugin_set_is_refused_by_name(folder, tmp_path):
    module, name = write(folder, LOSSY)
    builtin = get("verifier", "rejection-iid")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.warns(RegistryOverrideWarning):
        load_plugin(module)
    write_header(out, run_identity(_Args, _Settings, [], []), {"expected_runs": 0, "budget": {"nodes": 4, "depth": 2}})
    assert open_out_dir(out, run_identity(_Args, _Settings, [], []))[1] is not None  # the same plug-ins: resumed
    register("verifier", "rejection-iid", override=True)(builtin)  # now without the plug-in
    registry.unregister("verifier", name)
    with pytest.raises(InvalidConfigError) as exc:
        open_out_dir(out, run_identity(_Args, _Settings, [], []))
    assert f"plugin:{module}" in str(exc.value) and "override:verifier:rejection-iid" in str(exc.value)


# ------------------------------------------------------------------ (8) a private module name for a file
def test_a_plugin_file_named_like_a_stdlib_module_does_not_shadow_it(folder, tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "wave", raising=False)  # not imported yet, as in a fresh process
    plugins_dir = tmp_path / "elsewhere"
    plugins_dir.mkdir()
    _, name = write(plugins_dir, RULE, stem="wave")
    plugin = load_plugin(str(plugins_dir / "wave.py"))
    assert plugin.module.startswith("specdec_plugin_wave_") and plugin.names("verifier") == (name,)
    assert origin("verifier", name) == plugin.module and plugin.file == str((plugins_dir / "wave.py").resolve())
    assert "wave" not in sys.modules
    import wave  # the standard library's, not the plug-in

    assert Path(wave.__file__).resolve().parent == Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert load_plugin(str(plugins_dir / "wave.py")) == plugin  # the same file again: the same module
    # another file of the same name, in another folder: another module
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    _, other_name = write(other_dir, RULE.replace("{name}", "{name}-2"), stem="wave")
    other = load_plugin(str(other_dir / "wave.py"))
    assert other.module != plugin.module and other.names("verifier") == (f"{other_name}-2",)


def test_a_private_name_is_found_again_from_its_folder(folder, tmp_path):
    """Another process (a bench worker) loads a file plug-in by its private name with its folder on sys.path."""
    plugins_dir = tmp_path / "files"
    plugins_dir.mkdir()
    _, name = write(plugins_dir, RULE, stem="zzload_private")
    plugin = load_plugin(str(plugins_dir / "zzload_private.py"))
    assert plugin.import_root == str(plugins_dir.resolve())
    registry.unregister("verifier", name)
    del sys.modules[plugin.module]  # as in a fresh process
    with pytest.raises(PluginError, match="private name of plug-in file zzload_private.py"):
        load_plugin(plugin.module)  # its folder is not on sys.path
    sys.path.append(plugin.import_root)
    try:
        again = load_plugin(plugin.module)
    finally:
        sys.path.remove(plugin.import_root)
    assert again.module == plugin.module and again.names("verifier") == (name,)


# ------------------------------------------------------------------ (14) installed plug-ins: skip, warn
def test_a_broken_entry_point_is_skipped_with_a_warning_naming_how(folder, capsys):
    good, good_name = write(folder, RULE)
    broken, _ = write(folder, "raise ImportError('a dependency of the plug-in is missing')\n")
    install_dist(folder, "zz_broken_dist", {"zzbroken": broken, "zzgood": good})
    with pytest.warns(PluginWarning) as caught:
        code = cli.main(["list", "verifier"])
    assert code == 0, capsys.readouterr().err
    message = str(caught[0].message)
    assert f"entry point 'zzbroken' = {broken!r} of zz_broken_dist" in message
    assert "a dependency of the plug-in is missing" in message
    assert "SPECDEC_SKIP_PLUGINS=zzbroken" in message and "SPECDEC_NO_ENTRY_POINTS=1" in message
    assert good_name in capsys.readouterr().out  # the good plug-in still loads
    # the library call stays strict: an error, naming the way to skip it
    with pytest.raises(PluginError, match="SPECDEC_SKIP_PLUGINS=zzbroken"):
        load_entry_point_plugins()


def test_skip_plugins_and_no_entry_points(folder, monkeypatch):
    good, good_name = write(folder, RULE)
    broken, _ = write(folder, "raise ImportError('missing')\n")
    install_dist(folder, "zz_skip_dist", {"zzbroken": broken, "zzgood": good})
    monkeypatch.setenv("SPECDEC_NO_ENTRY_POINTS", "1")  # the commands: no installed plug-in, not even a good one
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_plugins() == []
    assert good_name not in list_registered("verifier")
    monkeypatch.delenv("SPECDEC_NO_ENTRY_POINTS")
    monkeypatch.setenv("SPECDEC_SKIP_PLUGINS", f"zzbroken,{good}")  # an entry point's name, or its module
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not [p for p in load_entry_point_plugins() if p.module in (good, broken)]
    assert good_name not in list_registered("verifier")
    monkeypatch.setenv("SPECDEC_SKIP_PLUGINS", "zzbroken, nothing-such")
    with pytest.warns(PluginWarning, match=r"SPECDEC_SKIP_PLUGINS names 'nothing-such', which is no installed"):
        assert [p.module for p in load_entry_point_plugins() if p.module in (good, broken)] == [good]
    monkeypatch.setenv("SPECDEC_NO_ENTRY_POINTS", "maybe")
    with pytest.raises(InvalidConfigError, match="SPECDEC_NO_ENTRY_POINTS='maybe'"):
        load_plugins()


def test_an_explicit_plugin_file_that_fails_is_still_an_error(folder, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_NO_ENTRY_POINTS", "1")
    bad = folder / "zzload_bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    assert cli.main(["list", "--plugin", str(bad)]) == 2
    assert "failed to import: RuntimeError: boom" in capsys.readouterr().err
