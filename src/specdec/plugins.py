"""Loading plug-ins: modules outside specdec that register strategies.

A plug-in is a Python module that registers verifiers, tree builders, draft
or target models, or methods with :func:`specdec.registry.register` (or
:func:`specdec.methods.register_method`) when it is imported.
:func:`load_plugin` imports one by name and returns what it registered
(:class:`Plugin`), checked: a module that fails to import, registers nothing,
registers a name that is taken, or declares a capability it does not
implement is a :class:`~specdec.errors.PluginError` naming the module and the
name:

    from specdec.plugins import load_plugin

    plugin = load_plugin("my_pkg.rules")      # or a file: load_plugin("./my_rules.py")
    plugin.names("verifier")                  # ('my-rule',)

A ``.py`` file is imported under a private module name,
``specdec_plugin_<stem>_<12 hex digits>`` (:func:`private_name`), never under its
bare stem: a plug-in file named ``wave.py`` does not become the standard
library's ``wave`` for the rest of the process. A plug-in that replaces a name
another module registered (``register(..., override=True)``) warns
(:class:`~specdec.registry.RegistryOverrideWarning`) and its
:attr:`Plugin.overrides` say so; ``specdec bench`` records every plug-in module
(with the SHA-256 of its source) and every override in a run's identity
(:func:`specdec.bench.hashes.plugin_identity`), so a sweep is resumed only with
the same plug-ins.

A plug-in's entries are those registered by code in the module or in its
submodules (:func:`specdec.registry.origin`), so a module imported before
(by ``pytest -p``, or by the user) is found the same way.

An installed package makes its plug-ins known through the entry-point group
:data:`ENTRY_POINT_GROUP`, each entry's value a module name:

    [project.entry-points."specdec.plugins"]
    my_rules = "my_pkg.rules"

:func:`load_entry_point_plugins` loads them all. Importing specdec never does:
the ``specdec list``, ``demo`` and ``bench`` commands load every installed
plug-in (and the modules given with ``--plugin``), and so does the conformance
command with ``--entry-points``. Two environment variables leave installed
plug-ins out:

- ``SPECDEC_SKIP_PLUGINS=name1,name2``: these entry points (an entry point's
  name, or the module it names) are not loaded, by the commands nor by
  :func:`load_entry_point_plugins`; a name that matches no installed entry
  point warns (:class:`PluginWarning`).
- ``SPECDEC_NO_ENTRY_POINTS=1``: the ``specdec list``, ``demo`` and ``bench``
  commands load no installed plug-in (:func:`load_plugins`); only ``--plugin``
  modules.

An installed plug-in that fails to load (its import fails, it registers
nothing, ...) does not stop the commands: it is left out with a
:class:`PluginWarning` naming the entry point, its distribution, the error and
the variable that skips it. :func:`load_entry_point_plugins` itself (and so the
conformance command's ``--entry-points``, which asks for them) raises a
:class:`~specdec.errors.PluginError` naming the same. A module named with
``--plugin`` that fails is always an error.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from specdec import registry
from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.errors import InvalidConfigError, PluginError, RegistryConflictError, SpecDecError, UnknownNameError
from specdec.methods import Method, compose
from specdec.registry import ROLES, Override
from specdec.targets.base import OneRowTarget, TargetModel
from specdec.trees.base import OneTreeBuilder, TreeBuilder
from specdec.verify.base import Verifier

__all__ = [
    "ENTRY_POINT_GROUP",
    "NO_ENTRY_POINTS_ENV",
    "Plugin",
    "PluginWarning",
    "SKIP_PLUGINS_ENV",
    "add_plugin_argument",
    "load_entry_point_plugins",
    "load_plugin",
    "load_plugins",
    "private_name",
    "shown_name",
]

ENTRY_POINT_GROUP = "specdec.plugins"
"""The entry-point group of installed plug-ins; each entry's value is a module name."""
NO_ENTRY_POINTS_ENV = "SPECDEC_NO_ENTRY_POINTS"
"""Set to ``1`` (or ``true``, ``yes``, ``on``), the commands load no installed plug-in (:func:`load_plugins`)."""
SKIP_PLUGINS_ENV = "SPECDEC_SKIP_PLUGINS"
"""Comma-separated entry-point names (or the modules they name) that are never loaded (:func:`load_entry_point_plugins`)."""


class PluginWarning(UserWarning):
    """An installed plug-in left out (it failed to load: the message names it, the error and how to
    skip it), or a :data:`SKIP_PLUGINS_ENV` name that matches no installed plug-in."""


@attrs.frozen
class Plugin:
    """A loaded plug-in module and what it registered.

    Attributes:
        module: the module's name (a file loaded by path: its private name,
            :func:`private_name`).
        registered: per role of :data:`specdec.registry.ROLES` (every role is
            present, maybe empty), the sorted names registered by the module
            or its submodules.
        file: the module's source file, None for a module without one.
        overrides: the names it replaced that another module had registered
            (:func:`specdec.registry.overrides`; each one warned).
    """

    module: str
    registered: Mapping[str, tuple[str, ...]] = attrs.field(eq=True, hash=False)
    file: str | None = None
    overrides: tuple[Override, ...] = ()

    def names(self, role: str) -> tuple[str, ...]:
        """The names the plug-in registered under ``role`` (sorted; empty if none).

        Raises:
            UnknownNameError: ``role`` is not a registry role.
        """
        if role not in self.registered:
            raise UnknownNameError(f"unknown registry role {role!r}; roles are: {', '.join(ROLES)}")
        return self.registered[role]

    @property
    def import_root(self) -> str | None:
        """The folder from which ``import <module>`` finds this module (its file's
        folder above its top-level package), for another process that must import
        it too (``specdec bench --workers``); None for a module without a file."""
        if self.file is None:
            return None
        path = Path(self.file)
        here = path.parent if path.stem == "__init__" else path
        return str(here.parents[len(self.module.split(".")) - 1])


def load_plugin(module: str) -> Plugin:
    """Import the plug-in ``module`` and return what it registered, checked.

    Args:
        module: a dotted module name (``my_pkg.rules``), or the path of a
            ``.py`` file, imported under its private name (:func:`private_name`;
            that name loads it again, from a folder of ``sys.path``). A module
            imported before is not imported again: its entries are found by
            :func:`specdec.registry.origin`.

    Raises:
        PluginError: the module fails to import (the original exception
            chained), registers a name that is taken (naming the role, the name
            and the module that owns it), registers nothing, or registers an
            entry that does not implement what it declares (each such entry
            named with what is missing): a verifier class that is abstract or
            declares no ``supported_kinds``; a tree builder class that is
            abstract, declares no ``produces``, declares ``batch_form`` without
            its own ``feed_build`` (a per-tree builder's runs its host ``build`` row by row), or names a ``default_verifier`` that is not
            registered or cannot verify its trees; a draft class declaring
            ``supports_rows`` or a target class declaring ``supports_batch``
            without the methods of that mode; a method whose tree and verifier
            do not compose. Entries registered by a module whose import failed
            are removed again (a retry starts clean); entries of a module that
            imported are kept, whatever the checks say.
    """
    if not isinstance(module, str) or not module.strip():
        raise PluginError(f"a plug-in is named by a module name or a .py file path, got {module!r}")
    registry._ensure_builtins_loaded()  # first: the built-ins a plug-in imports are not its entries
    before = registry._snapshot()
    try:
        loaded = _import(module)
    except RegistryConflictError as exc:
        registry._discard_since(before, lambda origin: origin not in sys.modules)
        raise PluginError(
            f"plug-in module {module!r} registers {exc.role} {exc.name!r} (in module {exc.claimant!r}), a name "
            f"module {exc.owner!r} owns: choose another name (register(..., override=True) replaces the other "
            "entry, on purpose only: it warns, and the bench records it)"
        ) from exc
    except PluginError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the plug-in's own code is reported, chained
        registry._discard_since(before, lambda origin: origin not in sys.modules)
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name is not None and _within(module, exc.name):
            hint = (" (is it installed, or its folder on sys.path, e.g. PYTHONPATH=folder? "
                    "the path of a .py file works too)")
        raise PluginError(f"plug-in module {module!r} failed to import: {type(exc).__name__}: {exc}{hint}") from exc
    name = loaded.__name__
    shown = module if module.endswith(".py") else name  # a file: as the caller named it, not its private name
    registered = {role: tuple(n for n in registry.list_registered(role) if _within(registry.origin(role, n), name))
                  for role in ROLES}
    if not any(registered.values()):
        raise PluginError(
            f"plug-in module {shown!r} registered nothing; a plug-in registers with "
            "specdec.registry.register(role, name) (or specdec.methods.register_method) when it is imported"
        )
    problems = [f"{role} {n!r} {why}" for role in ROLES for n in registered[role] for why in _problems(role, n)]
    if problems:
        raise PluginError(f"plug-in module {shown!r} declares what it does not implement: " + "; ".join(problems))
    file = getattr(loaded, "__file__", None)  # a namespace package has none
    return Plugin(module=name, registered=registered, file=str(Path(file).resolve()) if file else None,
                  overrides=tuple(o for o in registry.overrides() if _within(o.by, name)))


def load_entry_point_plugins(*, strict: bool = True) -> list[Plugin]:
    """Load every installed plug-in: the modules named by the entry points of
    group :data:`ENTRY_POINT_GROUP` (:mod:`importlib.metadata`), each with
    :func:`load_plugin`; one :class:`Plugin` per module, in the order found. The
    entry points :data:`SKIP_PLUGINS_ENV` names are left out.

    Args:
        strict: a plug-in that cannot be loaded raises (the default); False: it is
            left out with a :class:`PluginWarning` saying the same (the commands).

    Raises:
        PluginError: ``strict``, an entry point whose value is not a module name
            (``module:attr``), or a module :func:`load_plugin` refuses; the
            message names the entry point, its distribution and how to skip it
            (:data:`SKIP_PLUGINS_ENV`, :data:`NO_ENTRY_POINTS_ENV`).
    """
    skip = _skipped()
    matched: set[str] = set()
    plugins: dict[str, Plugin] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if {ep.name, ep.module} & skip:
            matched |= {ep.name, ep.module} & skip
            continue
        dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
        where = f"entry point {ep.name!r} = {ep.value!r} of {dist} (group {ENTRY_POINT_GROUP!r})"
        how = (f"skip it with {SKIP_PLUGINS_ENV}={ep.name} (names separated by commas), or every installed "
               f"plug-in with {NO_ENTRY_POINTS_ENV}=1")
        try:
            if ep.attr:
                raise PluginError(f"the value of a {ENTRY_POINT_GROUP} entry point is a module name, not "
                                  f"module:attribute (write {ep.module!r})")
            if ep.module not in plugins:
                plugins[ep.module] = load_plugin(ep.module)
        except PluginError as exc:
            if strict:
                raise PluginError(f"{where}: {exc}; {how}") from exc.__cause__
            warnings.warn(PluginWarning(f"{where} is left out: {exc}; {how}"), stacklevel=2)
    for name in sorted(skip - matched):
        installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        warnings.warn(PluginWarning(f"{SKIP_PLUGINS_ENV} names {name!r}, which is no installed plug-in (installed "
                                    f"entry points of group {ENTRY_POINT_GROUP!r}: {', '.join(installed) or 'none'})"),
                      stacklevel=2)
    return list(plugins.values())


def load_plugins(modules: Iterable[str] = (), *, entry_points: bool = True) -> list[Plugin]:
    """What the ``specdec`` commands load before they run: every installed plug-in
    (:func:`load_entry_point_plugins`, not strict: one that fails is left out with a
    :class:`PluginWarning`; none with ``entry_points=False`` or :data:`NO_ENTRY_POINTS_ENV`
    set), then each of ``modules`` (``--plugin``, :func:`load_plugin`); one :class:`Plugin`
    per module.

    Raises:
        PluginError: a module of ``modules`` :func:`load_plugin` refuses.
        InvalidConfigError: :data:`NO_ENTRY_POINTS_ENV` is neither true nor false.
    """
    installed = entry_points and not _env_flag(NO_ENTRY_POINTS_ENV)
    found = {p.module: p for p in (load_entry_point_plugins(strict=False) if installed else [])}
    for module in modules:
        plugin = load_plugin(module)
        found.setdefault(plugin.module, plugin)
    return list(found.values())


def private_name(path: str | os.PathLike[str]) -> str:
    """The module name a plug-in ``.py`` file is imported under: ``specdec_plugin_<stem>_<key>``,
    ``key`` the first 12 hex digits of the SHA-256 of its resolved path (one module per file).

    Example:
        >>> private_name("/plugins/wave.py").startswith("specdec_plugin_wave_")
        True
    """
    resolved = Path(path).expanduser().resolve()
    return f"specdec_plugin_{resolved.stem}_{hashlib.sha256(str(resolved).encode('utf-8')).hexdigest()[:12]}"


def add_plugin_argument(parser: argparse.ArgumentParser) -> None:
    """The commands' ``--plugin MODULE`` option (repeatable, into ``args.plugins``):
    modules to load with :func:`load_plugins` before the command runs."""
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                        help="load this plug-in module first (a dotted module name, or a .py file) to use what it "
                             f"registers; repeatable. Installed plug-ins (entry-point group {ENTRY_POINT_GROUP}) are "
                             f"loaded too, but for those {SKIP_PLUGINS_ENV}=NAME,... names, and none with "
                             f"{NO_ENTRY_POINTS_ENV}=1; one that fails is left out with a warning")


_PRIVATE_NAME = re.compile(r"specdec_plugin_(?P<stem>[A-Za-z_]\w*)_[0-9a-f]{12}")
"""A name of :func:`private_name`'s form."""


def shown_name(module: str) -> str:
    """How messages name ``module``, the module that registered an entry: the file's name
    (``my_rules.py``) for a plug-in file's private name (:func:`private_name`), else ``module``."""
    if _PRIVATE_NAME.fullmatch(module):
        file = getattr(sys.modules.get(module), "__file__", None)
        if file:
            return Path(file).name
    return module


# ------------------------------------------------------------------ loading
def _within(origin: str, module: str) -> bool:
    return origin == module or origin.startswith(module + ".")


def _import(module: str) -> ModuleType:
    """``module`` imported by name, or the ``.py`` file it names imported under its private name
    (a private name not imported yet: the file of that name found in a folder of ``sys.path``)."""
    if module.endswith(".py"):
        path = Path(module).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"plug-in file {module!r} does not exist ({path})")
        return _import_file(path, module)
    private = _PRIVATE_NAME.fullmatch(module)
    if private is not None and module not in sys.modules:
        stem = private["stem"]
        for entry in sys.path:
            candidate = (Path(entry) if entry else Path.cwd()) / f"{stem}.py"
            if candidate.is_file() and private_name(candidate) == module:
                return _import_file(candidate.resolve(), module)
        raise PluginError(f"plug-in module {module!r} is the private name of plug-in file {stem}.py, which no "
                          "folder of sys.path holds at the path it was loaded from: add its folder to sys.path, or "
                          "load the file by its path")
    return importlib.import_module(module)


def _import_file(path: Path, given: str) -> ModuleType:
    """The plug-in file ``path`` (resolved; named ``given`` by the caller) imported as :func:`private_name`."""
    if not path.stem.isidentifier():
        raise PluginError(f"plug-in file {given!r}: {path.stem!r} is not a module name (rename the file)")
    name = private_name(path)
    existing = sys.modules.get(name)
    if existing is not None:
        there = getattr(existing, "__file__", None)
        if there is not None and Path(there).resolve() == path:
            return existing
        raise PluginError(f"plug-in file {given!r} would be imported as module {name!r}, which is already "
                          f"imported from {there or 'elsewhere'}; rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plug-in file {given!r} cannot be imported as a Python module")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # as `import` does: the module's own code may import it back
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del sys.modules[name]  # as `import` does: a failed module is not kept
        raise
    return loaded


def _env_flag(var: str) -> bool:
    """The boolean environment variable ``var`` (unset or empty: False)."""
    value = os.environ.get(var, "")
    text = value.strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise InvalidConfigError(f"{var}={value!r}: expected 1 (or true, yes, on) to leave out every installed "
                             "plug-in, or 0 (false, no, off, empty)")


def _skipped() -> set[str]:
    """The names :data:`SKIP_PLUGINS_ENV` lists."""
    return {n.strip() for n in os.environ.get(SKIP_PLUGINS_ENV, "").split(",") if n.strip()}


# ------------------------------------------------------------------ checks
_ROW_METHODS = ("begin_rows", "commit_rows", "keep_rows", "rows_mode", "root_rows_logits", "tree_rows_logits")
"""What a draft declaring :attr:`~specdec.drafts.base.DraftModel.supports_rows` must implement itself."""
_BATCH_METHODS = ("prefill_batch", "score_batch", "accept_rows", "keep_rows")
"""What a target declaring :attr:`~specdec.targets.base.TargetModel.supports_batch` must implement itself."""
_BASES: Mapping[str, type] = {"verifier": Verifier, "tree": TreeBuilder, "draft": DraftModel, "target": TargetModel}


def _problems(role: str, name: str) -> list[str]:
    """What ``role``/``name`` declares and does not implement (empty when nothing)."""
    obj = registry.get(role, name)
    if role == "method":
        return _method_problems(obj)
    base = _BASES[role]
    if not (isinstance(obj, type) and issubclass(obj, base)):
        return [f"is not a {base.__name__} subclass (got {obj!r})"]
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        return [f"is abstract (it cannot be instantiated): it does not implement {missing}"]
    if role == "verifier" and issubclass(obj, Verifier):
        return _verifier_problems(obj)
    if role == "tree" and issubclass(obj, TreeBuilder):
        return _tree_problems(obj)
    if role == "draft" and issubclass(obj, DraftModel):  # a batch draft's methods are abstract (checked above)
        return _missing_mode(obj, "supports_rows", obj._one_row_form and obj.supports_rows, OneRowDraft, _ROW_METHODS)
    if role == "target" and issubclass(obj, TargetModel):
        return _missing_mode(obj, "supports_batch", obj._one_row_target and obj.supports_batch, OneRowTarget,
                             _BATCH_METHODS)
    raise AssertionError(f"unreachable: {role} {name!r} subclasses {base.__name__}")


def _missing_mode(cls: type, flag: str, declared: bool, base: type, methods: Sequence[str]) -> list[str]:
    missing = [m for m in methods if getattr(cls, m) is getattr(base, m)] if declared else []
    if not missing:
        return []
    return [f"declares {flag} = True but does not override {', '.join(missing)} (the one-row form's defaults, "
            f"{base.__name__}, serve one row)"]


def _verifier_problems(cls: type[Verifier]) -> list[str]:
    out = []
    if not cls.supported_kinds:
        out.append("declares no supported_kinds (the child kinds it verifies: NodeKind.SAMPLED, "
                   "NodeKind.DETERMINISTIC)")
    try:
        cls()
    except Exception as exc:  # noqa: BLE001 - reported, with the reason
        out.append(f"cannot be made with no arguments, as every composition makes it: {type(exc).__name__}: {exc}")
    return out


def _tree_problems(cls: type[TreeBuilder]) -> list[str]:
    out = []
    if not cls.produces:
        out.append("declares no produces (the child kinds it emits: NodeKind.SAMPLED, NodeKind.DETERMINISTIC)")
    if cls.batch_form and cls.feed_build is OneTreeBuilder.feed_build:
        out.append("declares batch_form = True but writes no feed_build of its own (a per-tree builder's "
                   "feed_build runs the host build row by row: specdec.adapters.host_feed)")
    builders: list[tuple[str, Any]] = []
    for options in cls.example_options:
        try:
            builders.append((f" (example_options {dict(options)!r})", cls(**options)))
        except Exception as exc:  # noqa: BLE001 - reported, with the reason
            out.append(f"is not built by its example_options {dict(options)!r}: {type(exc).__name__}: {exc}")
    if not cls.example_options and isinstance(cls.default_verifier, str):  # a class-level declaration
        builders.append(("", None))
    for where, builder in builders:
        declared = builder.default_verifier if builder is not None else cls.default_verifier
        if not declared:
            continue
        if declared not in registry.list_registered("verifier"):
            out.append(f"names default_verifier {declared!r}{where}, which is not registered "
                       f"(registered verifiers: {', '.join(registry.list_registered('verifier'))})")
            continue
        verifier = registry.get("verifier", declared)
        produces = builder.produces if builder is not None else cls.produces
        kinds = {int(k) for k in produces} - {int(k) for k in verifier.supported_kinds}
        modes = set((builder.sibling_modes or ()) if builder is not None else ()) - set(verifier.supported_modes)
        if kinds or modes:
            out.append(f"names default_verifier {declared!r}{where}, which cannot verify its trees (it supports "
                       f"kinds {sorted(k.name.lower() for k in verifier.supported_kinds)} and modes "
                       f"{sorted(m.value for m in verifier.supported_modes)})")
    return out


def _method_problems(method: Any) -> list[str]:
    if not isinstance(method, Method):
        return [f"is not a specdec.methods.Method (got {method!r})"]
    try:
        compose(method.tree, method.verifier, method.defaults, context=f"method {method.name!r}")
    except SpecDecError as exc:
        return [f"does not compose: {exc}"]
    except Exception as exc:  # noqa: BLE001 - the builder's own constructor failing on the defaults
        return [f"does not compose: {type(exc).__name__}: {exc}"]
    return []
