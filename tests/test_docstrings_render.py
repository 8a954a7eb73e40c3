"""Issue 57, item 21: docstrings written for the Markdown renderer of the API pages.

mkdocstrings renders specdec's docstrings as Markdown (Google style, ``mkdocs.yml``), so a
reStructuredText literal marker ``::`` shows as text at the end of a sentence; an
``Attributes:`` entry naming several attributes renders as one name with the others in the
Type column. Both are checked on the source, without building the docs (fast).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs

from specdec.engine.stats import GenerationStats

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "specdec"


def docstring_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every line of every bare string statement in ``path``: module,
    class and function docstrings and attribute docstrings."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for k, line in enumerate(node.value.value.splitlines()):
                out.append((node.lineno + k, line))
    return out


def test_no_docstring_line_ends_in_a_rest_literal_marker():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 100  # the scan sees the package
    bad = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
           for path in files for n, line in docstring_lines(path) if re.search(r"::\s*$", line)]
    assert not bad, ("a line ends in the reST literal marker '::', which the API pages show as text; end it "
                     "with ':' (the indented block below renders as code):\n" + "\n".join(bad))


def test_the_scan_catches_a_literal_marker(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('def f():\n    """Use it so::\n\n        f()\n    """\n')
    assert [n for n, line in docstring_lines(sample) if re.search(r"::\s*$", line)] == [2]


def attributes_entries(doc: str) -> list[str]:
    """The names of the entries of a Google-style ``Attributes:`` section."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    indent = len(lines[start]) - len(lines[start].lstrip()) + 4
    names = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        if line.strip() and len(line) - len(line.lstrip()) == indent:
            names.append(line.strip().split(":", 1)[0])
    return names


def test_generation_stats_documents_each_attribute_in_its_own_entry():
    assert GenerationStats.__doc__ is not None
    entries = attributes_entries(GenerationStats.__doc__)
    grouped = [e for e in entries if not e.isidentifier()]
    assert not grouped, f"grouped Attributes entries render as one name: {grouped}"
    assert set(entries) == {f.name for f in attrs.fields(GenerationStats)}


def test_rheo_results_opens_with_its_first_figure_before_any_note():
    page = (ROOT / "docs" / "rheo_results.md").read_text()
    first_figure = page.index("![")
    notes = [m.start() for m in re.finditer(r"^!!! ", page, re.MULTILINE)]
    assert all(n > first_figure for n in notes)
