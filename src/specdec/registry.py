"""One registry for every pluggable role, timm style.

Roles: ``"tree"`` (tree builders), ``"verifier"``, ``"draft"`` (draft models),
``"target"`` (target models) and ``"method"`` (named builder + verifier +
defaults). A plug-in registers itself with a decorator and is found by name::

    from specdec.registry import register

    @register("verifier", "my-rule")
    class MyRule(Verifier):
        ...

and the conformance tests, parametrised over :func:`list_registered`, test it
the moment it is imported.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from typing import Any, TypeVar

from specdec.errors import InvalidConfigError, RegistryConflictError, UnknownNameError

__all__ = ["ROLES", "register", "get", "list_registered", "unregister"]

ROLES: tuple[str, ...] = ("tree", "verifier", "draft", "target", "method")

_REGISTRY: dict[str, dict[str, Any]] = {role: {} for role in ROLES}

T = TypeVar("T")


def _check_role(role: str) -> dict[str, Any]:
    if not isinstance(role, str) or role not in _REGISTRY:
        raise UnknownNameError(f"unknown registry role {role!r}; roles are: {', '.join(ROLES)}")
    return _REGISTRY[role]


def register(role: str, name: str, *, override: bool = False) -> Callable[[T], T]:
    """Decorator registering ``obj`` under ``role``/``name``.

    Args:
        role: one of :data:`ROLES`.
        name: the public name (lower case, ``-`` separated by convention).
        override: allow replacing an existing entry; otherwise registering a
            taken name raises :class:`~specdec.errors.RegistryConflictError`.

    The object gets a ``registry_name`` attribute when it allows one.
    """
    table = _check_role(role)
    if not isinstance(name, str) or not name:
        raise ValueError(f"registry names must be non-empty strings, got {name!r}")

    def decorator(obj: T) -> T:
        if name in table and table[name] is not obj and not override:
            raise RegistryConflictError(
                f"{role} {name!r} is already registered ({table[name]!r}); pass override=True to replace it"
            )
        table[name] = obj
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
    """Import the built-in plug-in packages so their decorators run."""
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
