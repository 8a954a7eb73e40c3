"""One registry for every pluggable role, timm style.

Roles: ``"tree"`` (tree builders), ``"verifier"``, ``"draft"`` (draft models),
``"target"`` (target models) and ``"method"`` (named builder + verifier +
defaults). A plug-in registers itself with a decorator and is found by name:

    from specdec.registry import register

    @register("verifier", "my-rule")
    class MyRule(Verifier):
        ...

and the conformance tests, parametrised over :func:`list_registered`, test it
the moment it is imported.

Each entry remembers the module that registered it (:func:`origin`): the
module of the code that called :func:`register` (or
:func:`specdec.methods.register_method`, which calls it). That is how
:func:`specdec.plugins.load_plugin` finds what a plug-in module registered,
even when the module was imported before.

Replacing a name another module registered (``override=True``) warns
(:class:`RegistryOverrideWarning`, naming the name, its owner and the module
that replaces it) and is recorded (:func:`overrides`): every use of the name,
the methods that compose it included, runs the replacement, and the bench
counts it in a run's identity. Registering the original entry again puts it
back (no warning, no record).

Lookups load the built-in strategies (``specdec.verify``, ``specdec.trees``,
``specdec.drafts``, ``specdec.targets``, ``specdec.methods``) on first use,
and nothing else: installed plug-ins (the entry-point group
``specdec.plugins``) are loaded only on request, by
:func:`specdec.plugins.load_entry_point_plugins` (the ``specdec`` commands and
the conformance command call it), so importing specdec never runs a third
party's code.
"""

from __future__ import annotations

import difflib
import fnmatch
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import attrs

from specdec.errors import InvalidConfigError, RegistryConflictError, UnknownNameError

__all__ = ["ROLES", "draft_factory", "list_draft_factories", "register", "get", "list_registered", "origin",
           "unregister", "Override", "RegistryOverrideWarning", "overrides"]

ROLES: tuple[str, ...] = ("tree", "verifier", "draft", "target", "method")

_REGISTRY: dict[str, dict[str, Any]] = {role: {} for role in ROLES}
_ORIGINS: dict[str, dict[str, str]] = {role: {} for role in ROLES}
"""Per role, the module that registered each name (:func:`origin`)."""
_REPLACED: dict[str, dict[str, tuple[Any, str]]] = {role: {} for role in ROLES}
"""Per role, for each name another module replaced (:func:`overrides`), the replaced
entry and its owner (the first ones, through a chain of replacements)."""
_DRAFT_FACTORIES: dict[str, tuple[Any, Callable[[Any], Any]]] = {}
"""Per draft name, the entry and the ``factory`` it declared when it registered (:func:`draft_factory`)."""

_FORWARDING_MODULES = frozenset({__name__, "specdec.methods"})
"""Modules whose frames :func:`_registering_module` steps over: this one, and
:func:`specdec.methods.register_method`'s, which registers on its caller's behalf."""

T = TypeVar("T")


class RegistryOverrideWarning(UserWarning):
    """A module replaced (``register(..., override=True)``) a name another module registered
    (:func:`overrides` lists them); the message names the name, its owner and the replacing module."""


@attrs.frozen
class Override:
    """A registered name that a module replaced (:func:`overrides`).

    Attributes:
        role: the registry role.
        name: the name replaced.
        owner: the module that registered the replaced entry (``specdec.verify.rejection``
            for the built-in ``rejection-iid``).
        by: the module whose entry holds the name now.
    """

    role: str
    name: str
    owner: str
    by: str


def _check_role(role: str) -> dict[str, Any]:
    if not isinstance(role, str) or role not in _REGISTRY:
        raise UnknownNameError(f"unknown registry role {role!r}; roles are: {', '.join(ROLES)}")
    return _REGISTRY[role]


def register(role: str, name: str, *, override: bool = False,
             factory: Callable[[Any], Any] | None = None) -> Callable[[T], T]:
    """Decorator registering ``obj`` under ``role``/``name``.

    Args:
        role: one of :data:`ROLES`.
        name: the public name (lower case, ``-`` separated by convention).
        override: allow replacing an existing entry; otherwise registering a
            taken name raises :class:`~specdec.errors.RegistryConflictError`.
        factory: drafts only: how a draft is built for a given target, a callable
            taking a :class:`specdec.drafts.setting.DraftSetting` and returning the
            draft. ``specdec bench`` (``method@NAME`` rows) and the conformance
            command build the draft with it (:func:`draft_factory`); a draft
            registered without one is refused by name there.

    The object gets a ``registry_name`` attribute when it allows one.
    """
    table = _check_role(role)
    if not isinstance(name, str) or not name:
        raise ValueError(f"registry names must be non-empty strings, got {name!r}")
    if factory is not None and (role != "draft" or not callable(factory)):
        raise InvalidConfigError(f"register({role!r}, {name!r}, factory={factory!r}): a factory is declared by a "
                                 "draft only, and is a callable taking a DraftSetting")

    def decorator(obj: T) -> T:
        module = _registering_module()
        if name in table and table[name] is obj:
            return obj  # registered again as it is: the first registration stands
        if name in table and not override:
            owner = _ORIGINS[role][name]
            raise RegistryConflictError(
                f"{role} {name!r} is already registered by module {owner!r} ({table[name]!r}); module {module!r} "
                "cannot register it again (pass override=True to replace it)",
                role=role, name=name, owner=owner, claimant=module,
            )
        if name in table:  # override=True
            module = _replace(role, name, obj, module)
        table[name] = obj
        _ORIGINS[role][name] = module
        if role == "draft":
            _set_factory(name, obj, factory)
        try:
            obj.registry_name = name  # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass
        return obj

    return decorator


def unregister(role: str, name: str) -> None:
    """Remove ``role``/``name`` (mainly for tests of plug-ins)."""
    table = _check_role(role)
    if name not in table:
        raise UnknownNameError(_unknown_message(role, name, table))
    del table[name]
    del _ORIGINS[role][name]
    _REPLACED[role].pop(name, None)
    if role == "draft":
        _set_factory(name, None, None)


def _replace(role: str, name: str, obj: Any, module: str) -> str:
    """Note that ``module`` replaces ``role``/``name`` by ``obj`` (warned and recorded when another
    module owns it; the record dropped when ``obj`` is the replaced original); returns its origin."""
    owner = _ORIGINS[role][name]
    replaced = _REPLACED[role].get(name)
    if replaced is not None and obj is replaced[0]:  # the original entry put back
        del _REPLACED[role][name]
        return replaced[1]
    if owner != module:
        _REPLACED[role].setdefault(name, (_REGISTRY[role][name], owner))
        warnings.warn(RegistryOverrideWarning(
            f"module {module!r} replaces {role} {name!r}, registered by module {owner!r} (register(..., "
            f"override=True)): every use of {name!r}, the methods composed of it included, now runs {obj!r}"
        ), stacklevel=3)
    return module


def overrides() -> list[Override]:
    """The registered names a module replaced that another module had registered
    (``register(..., override=True)``, :class:`RegistryOverrideWarning`), sorted by role and name.

    Example:
        >>> overrides()  # the built-ins replace nothing
        []
    """
    _ensure_builtins_loaded()
    return [Override(role, name, owner=_REPLACED[role][name][1], by=_ORIGINS[role][name])
            for role in ROLES for name in sorted(_REPLACED[role])]


def _set_factory(name: str, obj: Any, factory: Callable[[Any], Any] | None) -> None:
    if factory is None:
        _DRAFT_FACTORIES.pop(name, None)
    else:
        _DRAFT_FACTORIES[name] = (obj, factory)


def _factory_of(name: str) -> Callable[[Any], Any] | None:
    """The factory the current entry ``name`` declared (None: none, or one of an entry since replaced)."""
    entry = _DRAFT_FACTORIES.get(name)
    return entry[1] if entry is not None and entry[0] is _REGISTRY["draft"].get(name) else None


def draft_factory(name: str) -> Callable[[Any], Any]:
    """The ``factory`` the registered draft ``name`` declared (:func:`register`): it takes a
    :class:`specdec.drafts.setting.DraftSetting` and returns the draft.

    Raises:
        UnknownNameError: no draft ``name`` is registered.
        InvalidConfigError: the draft declared no factory (naming it, its module, and how to declare one).
    """
    _ensure_builtins_loaded()
    table = _check_role("draft")
    if name not in table:
        raise UnknownNameError(_unknown_message("draft", name, table))
    factory = _factory_of(name)
    if factory is None:
        raise InvalidConfigError(
            f"draft {name!r} (module {_ORIGINS['draft'][name]!r}) declares no factory, so it cannot be built for "
            f"a given target: register it with register('draft', {name!r}, factory=FACTORY), FACTORY(setting: "
            "specdec.drafts.setting.DraftSetting) -> DraftModel"
        )
    return factory


def list_draft_factories() -> list[str]:
    """Sorted names of the registered drafts that declared a ``factory`` (:func:`draft_factory`)."""
    _ensure_builtins_loaded()
    return sorted(n for n in _REGISTRY["draft"] if _factory_of(n) is not None)


def origin(role: str, name: str) -> str:
    """The module that registered ``role``/``name``: ``__name__`` of the code
    that called :func:`register` (or :func:`specdec.methods.register_method`).

    Example:
        >>> origin("verifier", "greedy")
        'specdec.verify.greedy'
        >>> origin("method", "sd")  # registered with register_method by the chain builder's module
        'specdec.trees.chain'

    Raises:
        UnknownNameError: naming the registered choices.
    """
    _ensure_builtins_loaded()
    table = _check_role(role)
    if name not in table:
        raise UnknownNameError(_unknown_message(role, name, table))
    return _ORIGINS[role][name]


def _registering_module() -> str:
    """``__name__`` of the first frame outside this module and ``specdec.methods``
    (the code that registers), or ``"?"`` for code run without a module name."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _FORWARDING_MODULES:
        frame = frame.f_back
    name = frame.f_globals.get("__name__") if frame is not None else None
    return name if isinstance(name, str) else "?"


_Snapshot = dict[str, dict[str, tuple[Any, str, tuple[Any, str] | None]]]


def _snapshot() -> _Snapshot:
    """Every entry, its origin and what it replaced, per role (:func:`_discard_since`)."""
    return {role: {n: (obj, _ORIGINS[role][n], _REPLACED[role].get(n)) for n, obj in table.items()}
            for role, table in _REGISTRY.items()}


def _discard_since(snapshot: _Snapshot, discard: Callable[[str], bool]) -> None:
    """Undo every entry added or replaced since ``snapshot`` by a module ``m`` with
    ``discard(m)`` (a plug-in module whose import failed: Python dropped it, so its
    classes are garbage and a retry would otherwise conflict with them)."""
    for role, table in _REGISTRY.items():
        for name in list(table):
            before = snapshot[role].get(name)
            if (before is None or before[0] is not table[name]) and discard(_ORIGINS[role][name]):
                if before is None:
                    del table[name]
                    del _ORIGINS[role][name]
                    _REPLACED[role].pop(name, None)
                    if role == "draft":
                        _set_factory(name, None, None)
                else:
                    table[name], _ORIGINS[role][name], replaced = before
                    if replaced is None:
                        _REPLACED[role].pop(name, None)
                    else:
                        _REPLACED[role][name] = replaced



def _unknown_message(role: str, name: str, table: dict[str, Any]) -> str:
    choices = sorted(table)
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"unknown {role} {name!r}.{hint} Registered {role}s: {', '.join(choices) or '(none)'}"


def get(role: str, name: str) -> Any:
    """The object registered as ``role``/``name``.

    Raises:
        UnknownNameError: naming the registered choices.
    """
    _ensure_builtins_loaded()
    table = _check_role(role)
    if not isinstance(name, str):
        raise InvalidConfigError(
            f"a {role} is named by a str (one of: {', '.join(sorted(table))}), got {type(name).__name__} {name!r}"
        )
    try:
        return table[name]
    except KeyError:
        raise UnknownNameError(_unknown_message(role, name, table)) from None


def list_registered(role: str, pattern: str = "*") -> list[str]:
    """Sorted names registered under ``role`` matching the glob ``pattern``.

    Example:
        >>> "rejection-iid" in list_registered("verifier", "rejection-*")
        True
    """
    _ensure_builtins_loaded()
    table = _check_role(role)
    if not isinstance(pattern, str):
        raise InvalidConfigError(f"pattern must be a glob str, got {type(pattern).__name__} {pattern!r}")
    return sorted(n for n in table if fnmatch.fnmatchcase(n, pattern))


_LOADED = False


def _ensure_builtins_loaded() -> None:
    """Import the built-in plug-in packages so their decorators run (never the
    installed entry-point plug-ins: :func:`specdec.plugins.load_entry_point_plugins`)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import importlib

    try:
        for module in ("specdec.verify", "specdec.trees", "specdec.drafts", "specdec.targets", "specdec.methods"):
            importlib.import_module(module)  # a failing import is a bug: never hide a role's plug-ins
    except BaseException:
        _LOADED = False  # the next lookup retries (and raises again) instead of seeing a partial registry
        raise
