"""Named methods: a tree builder + a verifier + default parameters.

A method is what users pick by name (``SpeculativeGenerator(method="rheo")``).
Every method is registered under role ``"method"``, so the end-to-end
losslessness tests cover it the moment it is registered. Defaults and their
sources are listed in ``docs/methods.md``. Each method is registered beside
its builder (:func:`register_method` at the end of the builder's module).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from specdec.errors import InvalidConfigError, UnsupportedTreeError
from specdec.registry import get, list_registered, register

if TYPE_CHECKING:  # the builder modules import this one to register their methods
    from specdec.trees.base import TreeBuilder
    from specdec.verify.base import Verifier

__all__ = ["Method", "compose", "register_method", "resolve_method"]


@attrs.frozen
class Method:
    """A named composition of a tree builder and a verifier.

    Attributes:
        name: registry name of the method.
        tree: registry name of the tree builder (role ``"tree"``).
        verifier: registry name of the verifier (role ``"verifier"``).
        defaults: builder parameters used unless the caller overrides them.
        description: one line for ``specdec list``.
    """

    name: str
    tree: str
    verifier: str
    defaults: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    description: str = ""

    def build(self, **options: Any) -> tuple[TreeBuilder, Verifier]:
        """Instantiate the builder (defaults overridden by ``options``) and the verifier.

        Raises:
            InvalidConfigError: an option the builder does not take.
            UnsupportedTreeError: the builder can emit children the verifier cannot verify.
        """
        return compose(self.tree, self.verifier, {**self.defaults, **options}, context=f"method {self.name!r}")


def builder_options(builder_cls: type) -> list[str]:
    """Names of the constructor options a builder class accepts."""
    if attrs.has(builder_cls):
        return [a.alias or a.name for a in attrs.fields(builder_cls) if a.init]
    import inspect

    params = inspect.signature(builder_cls).parameters
    return [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def compose(tree: str, verifier: str, options: Mapping[str, Any], context: str = "") -> tuple[TreeBuilder, Verifier]:
    """Build ``(builder, verifier)`` from registry names, checking that they fit."""
    builder_cls = get("tree", tree)
    verifier_obj: Verifier = get("verifier", verifier)()
    allowed = builder_options(builder_cls)
    unknown = sorted(set(options) - set(allowed))
    where = f" for {context}" if context else ""
    if unknown:
        raise InvalidConfigError(
            f"unknown option(s) {', '.join(unknown)}{where}; tree builder {tree!r} accepts: {', '.join(allowed)}"
        )
    builder: TreeBuilder = builder_cls(**options)
    missing = {int(k) for k in builder.produces} - {int(k) for k in verifier_obj.supported_kinds}
    if missing:
        raise UnsupportedTreeError(
            f"tree builder {tree!r} emits children that verifier {verifier!r} cannot verify losslessly{where}"
        )
    modes = builder.sibling_modes  # None: undeclared, checked on every tree (Verifier.check_tree)
    bad_modes = set(modes or ()) - set(verifier_obj.supported_modes)
    if bad_modes:
        drawn = ", ".join(sorted(repr(m.value) for m in bad_modes))
        fits = sorted(name for name in list_registered("verifier")
                      if set(modes or ()) <= set(get("verifier", name).supported_modes)
                      and {int(k) for k in builder.produces} <= {int(k) for k in get("verifier", name).supported_kinds})
        raise UnsupportedTreeError(
            f"tree builder {tree!r}{where} draws several sampled children of one node {drawn}, "
            f"which verifier {verifier!r} cannot verify losslessly (it supports modes "
            f"{sorted(m.value for m in verifier_obj.supported_modes)}); verifiers that fit: {', '.join(fits) or 'none'}"
        )
    return builder, verifier_obj


def register_method(method: Method) -> Method:
    """Register ``method`` under role ``"method"`` by its name; builder modules call it
    beside their builder class, so a method lives next to the tree it grows."""
    register("method", method.name)(method)
    return method


def resolve_method(name: str) -> Method:
    """The registered :class:`Method` called ``name`` (clear error otherwise)."""
    method = get("method", name)
    if not isinstance(method, Method):
        raise InvalidConfigError(f"method {name!r} is registered but is not a Method")
    return method
