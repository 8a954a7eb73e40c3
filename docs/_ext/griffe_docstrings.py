"""Griffe extension for the docs build (loaded from ``mkdocs.yml``; not part of the package).

specdec's docstrings use two conventions that plain mkdocstrings does not render:

- reStructuredText roles such as ``:class:`~specdec.tree.DraftTree``` or
  ``:meth:`validate```. They become mkdocstrings cross-references to the
  resolved full path (``~`` shows only the last component), marked optional so
  a reference to an object that has no page renders as code instead of
  failing the strict build. A name that cannot be resolved renders as code.
- ``Example:`` sections. Google style's doctest section is ``Examples:``; an
  ``Example:`` header would otherwise render ``>>>`` lines as prose.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const|type):`(?P<tilde>~?)(?P<name>[A-Za-z_][\w.]*)(?P<call>\(\))?`"
)
_EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.MULTILINE)


def _resolve(obj: griffe.Object, name: str) -> str | None:
    """Full path of ``name`` as seen from ``obj``'s scope, or None."""
    if name.startswith("specdec."):
        return name
    head, _, rest = name.partition(".")
    try:
        full = obj.resolve(head)
    except Exception:  # noqa: BLE001 - any failure: not resolvable
        return None
    return f"{full}.{rest}" if rest else full


def _rewrite(obj: griffe.Object, text: str) -> str:
    def role(match: re.Match[str]) -> str:
        name = match["name"]
        shown = name.rsplit(".", 1)[-1] if match["tilde"] else name
        full = _resolve(obj, name)
        if full is None:
            return f"`{shown}`"
        return f'<autoref identifier="{full}" optional><code>{shown}</code></autoref>'

    text = _ROLE.sub(role, text)
    return _EXAMPLE.sub(lambda m: f"{m['indent']}Examples:", text)


class SpecdecDocstrings(griffe.Extension):
    """Rewrite the docstrings of every object of a loaded package (see module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = _rewrite(obj, obj.docstring.value)
            stack.extend(member for member in obj.members.values() if not member.is_alias)
