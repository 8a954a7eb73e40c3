"""The layer table of docs/architecture.md is enforced: every module of ``src/specdec`` is in one
layer, and no import (module-level or inside a function) reaches a layer above its own.

The table is read from the page itself (its ``| layer | modules | ... |`` rows, top layer first), so
the page and the code cannot drift apart: a new module that is in no row, or an import that crosses
the table upwards, fails here with the module, the line and both layers named.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PAGE = ROOT / "docs" / "architecture.md"


def layer_table(text: str) -> dict[str, tuple[int, str]]:
    """``{module prefix: (rank, layer name)}`` from the page's table rows (rank 0: the bottom)."""
    rows = re.findall(r"^\| ([A-Za-z][A-Za-z ]*?) \| (`specdec[^|]*) \|", text, re.M)
    table: dict[str, tuple[int, str]] = {}
    for i, (name, modules) in enumerate(rows):
        for module in re.findall(r"`(specdec[\w.]*)`", modules):
            assert module not in table, f"{module} is in two rows of the layer table"
            table[module] = (len(rows) - 1 - i, name)
    return table


TABLE = layer_table(PAGE.read_text())


def layer(module: str) -> tuple[int, str] | None:
    """The layer of ``module``: the row of its longest listed prefix (``specdec`` itself only for the package)."""
    if module == "specdec":
        return TABLE.get(module)
    parts = module.split(".")
    for k in range(len(parts), 1, -1):
        found = TABLE.get(".".join(parts[:k]))
        if found is not None:
            return found
    return None


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((SRC / "specdec").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out.append((name.removesuffix(".__init__"), path))
    return out


def imports(path: Path) -> list[tuple[str, int]]:
    """Every ``specdec`` module ``path`` imports (inside functions too), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "specdec":
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "specdec")
    return found


def test_the_page_has_a_layer_table():
    assert len({name for _, name in TABLE.values()}) >= 6, "docs/architecture.md lost its layer table"


def test_every_module_is_in_a_layer():
    missing = [name for name, _ in modules() if layer(name) is None]
    assert not missing, f"modules in no row of docs/architecture.md's layer table: {missing}"


def test_no_import_reaches_a_layer_above():
    crossings = []
    for name, path in modules():
        own = layer(name)
        assert own is not None
        for target, line in imports(path):
            theirs = layer(target)
            if theirs is None or theirs[0] > own[0]:
                crossings.append(f"{path.relative_to(ROOT)}:{line} ({own[1]}) imports {target} "
                                 f"({theirs[1] if theirs else 'no layer'})")
    assert not crossings, "imports that cross docs/architecture.md's layer table upwards:\n" + "\n".join(crossings)


def test_the_check_catches_a_crossing(tmp_path):
    """Power: a core module importing the engine is caught (the rank comparison is not vacuous)."""
    assert layer("specdec.engine.step")[0] > layer("specdec.errors")[0]
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from specdec.engine.step import run_step\n")
    assert imports(bad) == [("specdec.engine.step", 2)]


@pytest.mark.parametrize("module", ["specdec.trees", "specdec.verify"])
def test_builders_and_rules_never_know_concrete_models(module):
    """Verifiers and builders know the tree, sampling and rng modules, never concrete models: they may
    import the contracts (``specdec.drafts.base``, ``specdec.targets.base``) but no model, target or draft."""
    concrete = ("specdec.models", "specdec.targets.hf", "specdec.drafts.hf", "specdec.drafts.eagle",
                "specdec.drafts.ngram", "specdec.drafts.processed")
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for name, path in modules() if name == module or name.startswith(module + ".")
           for target, line in imports(path) if target.startswith(concrete)]
    assert not bad, "\n".join(bad)
