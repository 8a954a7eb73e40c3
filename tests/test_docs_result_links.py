"""The docs hook ``docs/_ext/result_links.py`` links the committed results the docs name.

Building the site is too slow for a test; these run the hook's functions on
sample Markdown and on the real docs pages instead (``mkdocs build --strict``
in ``.ci/run`` builds the site).
"""

from __future__ import annotations

import importlib.util
import posixpath
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")

from mkdocs.config.defaults import MkDocsConfig  # noqa: E402
from mkdocs.exceptions import PluginError  # noqa: E402
from mkdocs.structure.files import get_files  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("result_links", ROOT / "docs" / "_ext" / "result_links.py")
assert _spec is not None and _spec.loader is not None
result_links = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("result_links", result_links)
_spec.loader.exec_module(result_links)

SAMPLE = """\
# Results

The table is `benchmarks/results/table.md`; the runs are in
`benchmarks/results/run1/` and `benchmarks/results/run2`, the sweep in
`benchmarks/results/sweep`.

```bash
specdec bench --out benchmarks/results/run1
cat `benchmarks/results/table.md`
```

Not linked: `benchmarks/results/`, `benchmarks/results`, `benchmarks/results/run*`,
`benchmarks/results/missing.md`, `benchmarks/results/../benchmarks/other.py`,
`benchmarks/results/big.json`, ``benchmarks/results/table.md``,
`python benchmarks/results/table.md` and [`benchmarks/results/table.md`](elsewhere.md).

    ~~~
    `benchmarks/results/run2`
    ~~~
"""

EXPECTED = """\
# Results

The table is [`benchmarks/results/table.md`](benchmarks/results/table.md); the runs are in
[`benchmarks/results/run1/`](benchmarks/results/run1/index.md) and [`benchmarks/results/run2`](benchmarks/results/run2/README.md), the sweep in
[`benchmarks/results/sweep`](benchmarks/results/sweep/index.md).

```bash
specdec bench --out benchmarks/results/run1
cat `benchmarks/results/table.md`
```

Not linked: `benchmarks/results/`, `benchmarks/results`, `benchmarks/results/run*`,
`benchmarks/results/missing.md`, `benchmarks/results/../benchmarks/other.py`,
`benchmarks/results/big.json`, ``benchmarks/results/table.md``,
`python benchmarks/results/table.md` and [`benchmarks/results/table.md`](elsewhere.md).

    ~~~
    `benchmarks/results/run2`
    ~~~
"""


def _write(path: Path, size: int = 10, text: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is not None:
        path.write_text(text)
    else:
        path.write_bytes(b"x" * size)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    res = tmp_path / "benchmarks" / "results"
    _write(res / "table.md", text="| a |\n|---|\n| 1 |\n")
    _write(res / "big.json", size=1_000_001)
    _write(res / "run1" / "meta.json")
    _write(res / "run1" / "results.json")
    _write(res / "run1" / "runs.jsonl", size=1_500_000)
    _write(res / "run1" / "tau.png")
    _write(res / "run1" / "model.safetensors")
    _write(res / "run2" / "README.md", text="# Run 2\n\nSee [Bench](../../../docs/bench.md#runs).\n")
    _write(res / "run2" / "runs.jsonl", size=2_000_001)
    _write(res / "sweep" / "t0" / "meta.json")
    _write(res / "sweep" / "t0" / "table.md", text="# t0\n")
    _write(res / "unnamed" / "meta.json")
    _write(tmp_path / "benchmarks" / "other.py")
    _write(tmp_path / "docs" / "index.md", text=SAMPLE)
    _write(tmp_path / "docs" / "methods" / "sd.md", text="See `benchmarks/results/run2/README.md`.\n")
    return tmp_path


def test_sample_markdown_links_named_results_and_lists_what_the_site_gets(repo: Path) -> None:
    site = result_links.plan_site([SAMPLE], repo)

    assert result_links.rewrite_markdown(SAMPLE, "index.md", site) == EXPECTED
    # only the allowed kinds under their caps, from the named entries; nothing else of benchmarks/
    assert site.copies == (
        "benchmarks/results/run1/meta.json",
        "benchmarks/results/run1/results.json",
        "benchmarks/results/run1/runs.jsonl",
        "benchmarks/results/run1/tau.png",
        "benchmarks/results/run2/README.md",
        "benchmarks/results/sweep/t0/meta.json",
        "benchmarks/results/sweep/t0/table.md",
        "benchmarks/results/table.md",
    )
    assert set(site.generated) == {"benchmarks/results/run1/index.md", "benchmarks/results/sweep/index.md"}
    index = site.generated["benchmarks/results/run1/index.md"]
    for listed in ("[`meta.json`](meta.json)", "[`runs.jsonl`](runs.jsonl)", "[`tau.png`](tau.png)"):
        assert listed in index
    assert "- `model.safetensors` (0.0 kB)" in index.split("Not published")[1]
    assert "[`t0/table.md`](t0/table.md)" in site.generated["benchmarks/results/sweep/index.md"]


def test_links_are_relative_to_the_page_and_result_pages_link_back_into_the_docs(repo: Path) -> None:
    site = result_links.plan_site([SAMPLE, "`benchmarks/results/run2/README.md`"], repo)

    nested = result_links.rewrite_markdown("See `benchmarks/results/run2/README.md`.", "methods/sd.md", site)
    assert nested == "See [`benchmarks/results/run2/README.md`](../benchmarks/results/run2/README.md)."
    readme = (repo / "benchmarks/results/run2/README.md").read_text()
    page = result_links.rewrite_markdown(readme, "benchmarks/results/run2/README.md", site)
    assert page == "# Run 2\n\nSee [Bench](../../../bench.md#runs).\n"


def _config(repo: Path) -> MkDocsConfig:
    config = MkDocsConfig(config_file_path=str(repo / "mkdocs.yml"))
    hook = str(ROOT / "docs" / "_ext" / "result_links.py")  # loaded by mkdocs, as mkdocs.yml does
    config.load_dict(
        {"site_name": "t", "docs_dir": str(repo / "docs"), "site_dir": str(repo / "site"), "hooks": [hook]}
    )
    errors, _ = config.validate()
    assert not errors
    return config


def test_on_files_adds_the_files_outside_the_nav_and_refuses_two_on_one_site_file(repo: Path) -> None:
    config = _config(repo)
    files = config.plugins.on_files(get_files(config), config=config)

    added = {f.src_uri: f for f in files if f.src_uri.startswith("benchmarks/")}
    assert set(added) == set(result_links.plan_site([SAMPLE], repo).copies) | {
        "benchmarks/results/run1/index.md",
        "benchmarks/results/sweep/index.md",
    }
    assert all(f.inclusion.is_not_in_nav() for f in added.values())
    assert added["benchmarks/results/run2/README.md"].dest_uri == "benchmarks/results/run2/index.html"
    assert added["benchmarks/results/run1/meta.json"].abs_src_path == str(repo / "benchmarks/results/run1/meta.json")

    # a named page `x.md` and a named folder `x/` both render to x/index.html
    _write(repo / "benchmarks/results/run1.md", text="# run1\n")
    _write(repo / "docs" / "more.md", text="`benchmarks/results/run1.md`\n")
    with pytest.raises(PluginError, match="run1.md.*run1/index.md|run1/index.md.*run1.md"):
        config.plugins.on_files(get_files(config), config=config)


@pytest.mark.skipif(
    not (ROOT / "benchmarks" / "results").is_dir(), reason="the sdist leaves out benchmarks/results (MANIFEST.in)"
)
def test_every_existing_result_path_the_docs_name_gets_a_link() -> None:
    pages = {p.relative_to(ROOT / "docs").as_posix(): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))}
    site = result_links.plan_site(pages.values(), ROOT)
    published = set(site.copies) | set(site.generated)
    named = 0
    for src_uri, text in pages.items():
        out = result_links.rewrite_markdown(text, src_uri, site)
        before, after = text.split("\n"), out.split("\n")
        fenced = result_links._fenced_lines(text)
        assert [b for b, f in zip(before, fenced) if f] == [a for a, f in zip(after, fenced) if f], src_uri
        for match in result_links.iter_result_spans(text):
            path = match.group("text").rstrip("/")
            if path == "benchmarks/results" or not (ROOT / path).exists():
                continue
            named += 1
            span = match.group(0)
            assert f"[{span}](" in out, f"{src_uri}: {span} names an existing result but is not linked"
            target = out.split(f"[{span}](", 1)[1].split(")", 1)[0]
            assert posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), target)) in published, (src_uri, span)
    assert named >= 30  # the docs name dozens of committed results
    assert all(path.startswith("benchmarks/results/") for path in published)
    assert sum((ROOT / path).stat().st_size for path in site.copies) < 20_000_000
