"""The deprecation policy's helper (internal): a renamed public name keeps its old name for one
minor release, as an alias that warns.

The policy (docs/api/public.md, "Deprecation policy"): a name of the stable API is never removed
or renamed in a patch release; to rename it, the new name ships and the old one stays an alias
that raises a ``DeprecationWarning`` naming the new name, for at least one minor release, then
goes. A module declares its renamed names once:

    if not TYPE_CHECKING:  # type checkers see the new names only
        __getattr__ = deprecated_aliases(__name__, globals(), [Renamed("old", "new", "0.1.0", "0.2.0")])

and ``module.old`` / ``from module import old`` return ``module.new`` with the warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

__all__ = ["Renamed", "deprecated_aliases", "deprecation_message", "serve_as_form"]


@attrs.frozen
class Renamed:
    """A public name renamed in the same module.

    Args:
        old: the name kept as a deprecated alias.
        new: the name it now has.
        since: the release that deprecated ``old``.
        removed_in: the release that removes it (at least one minor release after ``since``).
    """

    old: str
    new: str
    since: str
    removed_in: str


def deprecation_message(module: str, renamed: Renamed) -> str:
    """The warning's text: what is deprecated, since when, until when, and what to use."""
    return (f"{module}.{renamed.old} is deprecated since {renamed.since} and will be removed in "
            f"{renamed.removed_in}: use {module}.{renamed.new}")


def deprecated_aliases(module: str, namespace: Mapping[str, Any], renames: Iterable[Renamed]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) serving each old name as its new name's object, with a
    ``DeprecationWarning`` pointing at the caller's line; any other missing name is the usual
    ``AttributeError``.

    Args:
        module: the module's ``__name__``.
        namespace: the module's ``globals()`` (read when an old name is looked up).
        renames: the module's renamed names.
    """
    table = {r.old: r for r in renames}

    def __getattr__(name: str) -> Any:
        renamed = table.get(name)
        if renamed is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(deprecation_message(module, renamed), DeprecationWarning, stacklevel=2)
        return namespace[renamed.new]

    return __getattr__


def serve_as_form(cls: type, form: type, contract: type, methods: Iterable[str], replacement: str) -> None:
    """0.1.0's contracts, deprecated (docs/api/public.md, "Deprecation policy"): ``cls`` subclasses
    ``contract`` directly and writes the one-row ``methods`` of 0.1.0, so it is served as ``form``
    (the one-row form): it gets ``form``'s attributes it and its own bases lack, and a
    ``DeprecationWarning`` names ``replacement``. Called from ``contract.__init_subclass__``, before
    ``ABCMeta`` computes the class's abstract methods."""
    warnings.warn(
        f"{cls.__qualname__} subclasses {contract.__name__} and writes the one-row methods ({', '.join(methods)}): "
        f"{contract.__name__} is the batch contract since 0.1.1; subclass {replacement} instead (served as one "
        "since 0.1.1; this alias goes in 0.2.0)", DeprecationWarning, stacklevel=4)
    own_bases = [base for base in cls.__mro__[1:] if base not in (contract, object) and base.__module__ != "abc"]
    for name, value in vars(form).items():
        if name.startswith("__") or name == "_abc_impl" or name in cls.__dict__:
            continue
        if any(name in vars(base) for base in own_bases):
            continue  # a base of the class defines it already
        setattr(cls, name, value)
