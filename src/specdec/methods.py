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

from specdec.errors import InvalidConfigError, UnknownNameError, UnsupportedTreeError
from specdec.registry import get, list_registered, register
from specdec.tree import NodeKind

if TYPE_CHECKING:  # the builder modules import this one to register their methods
    from specdec.trees.base import TreeBuilder
    from specdec.verify.base import Verifier

__all__ = [
    "DEFAULT_METHOD",
    "Method",
    "compose",
    "fitting_verifiers",
    "register_method",
    "resolve_composition",
    "resolve_method",
]

DEFAULT_METHOD = "rheo"
"""The method :class:`~specdec.generate.SpeculativeGenerator` uses when none is named."""


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


def fitting_verifiers(builder: TreeBuilder) -> list[str]:
    """The registered lossless verifiers that can verify every tree ``builder`` grows:
    they support each child kind it :attr:`~specdec.trees.base.TreeBuilder.produces`
    and each of its :attr:`~specdec.trees.base.TreeBuilder.sibling_modes` (when declared).

    A verifier that needs one-hot ``p`` (:attr:`~specdec.verify.base.Verifier.requires_greedy`)
    is listed as ``"name (temperature 0 only)"``: a composition is made before the
    sampling is known (a generator serves any sampling, one call at a time), so the
    list names every verifier that fits and labels those that fit at temperature 0 only.

    Example:
        >>> from specdec.trees import EagleTreeBuilder
        >>> fitting_verifiers(EagleTreeBuilder(K=2, B=1, depth=2, N=3))
        ['greedy (temperature 0 only)', 'match', 'mixed']
    """
    kinds = {int(k) for k in builder.produces}
    modes = set(builder.sibling_modes or ())
    fits = []
    for name in list_registered("verifier"):
        cls = get("verifier", name)
        if not cls.lossless or not kinds <= {int(k) for k in cls.supported_kinds} or not modes <= set(cls.supported_modes):
            continue
        fits.append(f"{name} (temperature 0 only)" if cls.requires_greedy else name)
    return fits


def compose(
    tree: str, verifier: str | None, options: Mapping[str, Any], context: str = ""
) -> tuple[TreeBuilder, Verifier]:
    """Build ``(builder, verifier)`` from registry names, checking that they fit.

    Args:
        tree: registry name of the tree builder.
        verifier: registry name of the verifier, or None for the builder's own
            :attr:`~specdec.trees.base.TreeBuilder.default_verifier` (never another
            method's verifier).
        options: the builder's constructor options.
        context: what is being composed, for the errors (``"method 'sd'"``).

    Raises:
        InvalidConfigError: an option the builder does not take, or ``verifier``
            None for a builder that declares no default verifier (the error lists
            the verifiers that fit).
        UnsupportedTreeError: the builder can emit children (kinds, or sibling
            modes) the verifier cannot verify losslessly; the error lists the
            verifiers that fit (:func:`fitting_verifiers`).

    Example:
        >>> builder, verifier = compose("static", None, {"expansion": (2, 1), "mode": "wor"})
        >>> verifier.registry_name
        'rejection-wor'
    """
    where = f" for {context}" if context else ""
    builder_cls = get("tree", tree)
    try:  # an unknown verifier fails first, naming what was being composed
        verifier_cls = None if verifier is None else get("verifier", verifier)
    except UnknownNameError as err:
        raise UnknownNameError(f"{err}" + (f" (composing {context})" if context else "")) from None
    allowed = builder_options(builder_cls)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InvalidConfigError(
            f"unknown option(s) {', '.join(unknown)}{where}; tree builder {tree!r} accepts: {', '.join(allowed)}"
        )
    builder: TreeBuilder = builder_cls(**options)
    named = "verifier"
    if verifier is None:  # the builder's own verifier (per instance: static's depends on its mode)
        verifier = builder.default_verifier
        if not verifier:
            raise InvalidConfigError(
                f"tree builder {tree!r}{where} declares no default_verifier, so give verifier= by name; "
                f"verifiers that fit: {', '.join(fitting_verifiers(builder)) or 'none'}"
            )
        named = "its default verifier"
    verifier_obj: Verifier = (verifier_cls or get("verifier", verifier))()
    missing = {int(k) for k in builder.produces} - {int(k) for k in verifier_obj.supported_kinds}
    if missing:
        kinds = ", ".join(NodeKind(k).name.lower() for k in sorted(missing))
        raise UnsupportedTreeError(
            f"tree builder {tree!r} emits {kinds} children that {named} {verifier!r} cannot verify losslessly{where}; "
            f"verifiers that fit: {', '.join(fitting_verifiers(builder)) or 'none'}"
        )
    modes = builder.sibling_modes  # None: undeclared, checked on every tree (Verifier.check_tree)
    bad_modes = set(modes or ()) - set(verifier_obj.supported_modes)
    if bad_modes:
        drawn = ", ".join(sorted(repr(m.value) for m in bad_modes))
        raise UnsupportedTreeError(
            f"tree builder {tree!r} draws several sampled children of one node {drawn}, "
            f"which {named} {verifier!r} cannot verify losslessly (it supports modes "
            f"{sorted(m.value for m in verifier_obj.supported_modes)}){where}; "
            f"verifiers that fit: {', '.join(fitting_verifiers(builder)) or 'none'}"
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


def resolve_composition(
    method: str | None, tree: str | None, verifier: str | None, options: Mapping[str, Any]
) -> tuple[str, TreeBuilder, Verifier]:
    """``(name, builder, verifier)`` for ``SpeculativeGenerator(method=, tree=, verifier=, **options)``.

    The rule (docs/generation.md):

    - ``method`` alone: the method (its tree, its verifier, its defaults
      overridden by ``options``).
    - ``method`` and ``verifier=``: the method's tree (with its defaults) and
      that verifier; errors say so (``for tree 'rheo' of the default method 'rheo'
      with verifier 'x', as tree= was not given``).
    - ``tree=`` (with or without a method): that tree builder (a method's
      defaults still apply), with ``verifier=`` when given, else the builder's
      own :attr:`~specdec.trees.base.TreeBuilder.default_verifier`, never the
      method's verifier; a builder without one fails listing the verifiers that fit.
    - ``method=None`` needs ``tree=``.

    ``name`` is the method's name when the composition is the method's own,
    else ``"tree+verifier"``.

    Raises:
        InvalidConfigError: ``method=None`` without ``tree=``, or bad options.
        UnsupportedTreeError: the builder and the verifier do not fit.

    Example:
        >>> name, builder, verifier = resolve_composition(DEFAULT_METHOD, "static", None, {})
        >>> name, verifier.registry_name
        ('static+rejection-iid', 'rejection-iid')
    """
    if method is None:
        if tree is None:
            raise InvalidConfigError(
                "give a method name, or tree= (with verifier=, or the builder's default verifier) to compose one"
            )
        builder, verifier_obj = compose(tree, verifier, options)
        return f"{tree}+{verifier_obj.registry_name}", builder, verifier_obj
    m = resolve_method(method)
    merged = {**m.defaults, **options}
    owner = f"the default method {m.name!r}" if m.name == DEFAULT_METHOD else f"method {m.name!r}"
    tree_name, verifier_name = tree or m.tree, verifier
    if tree is None and verifier is None:
        verifier_name, context = m.verifier, f"method {m.name!r}"
    elif tree is None:
        context = f"tree {m.tree!r} of {owner} with verifier {verifier!r}, as tree= was not given"
    else:
        context = f"tree {tree!r} with the defaults of {owner}" if m.defaults else ""
    builder, verifier_obj = compose(tree_name, verifier_name, merged, context=context)
    own = tree_name == m.tree and verifier_obj.registry_name == m.verifier
    return (m.name if own else f"{tree_name}+{verifier_obj.registry_name}"), builder, verifier_obj
