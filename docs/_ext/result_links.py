"""MkDocs hook: committed benchmark results named in the docs become links (``mkdocs.yml``: ``hooks:``).

The docs cite committed result files and folders as inline code, e.g.
``benchmarks/results/verify44_smollm2_t1.md``. The repository has no public URL
and ``benchmarks/`` lies outside ``docs/``, so this hook copies what the docs
name into the site and links it:

- An inline-code span (one backtick pair) whose whole text is a path under
  ``benchmarks/results/`` that exists becomes ``[`path`](target)``, the code
  formatting kept inside the link. A trailing ``/`` is allowed. Paths inside
  fenced code blocks (commands) are left alone, and so are globs (``*``),
  paths with ``..``, paths that do not exist and ``benchmarks/results`` itself
  (the whole tree is not published).
- A named **file** is published when its kind and size are allowed
  (:data:`SIZE_CAPS`); otherwise it stays code text.
- A named **folder** publishes its allowed files, subfolders included (Markdown,
  JSON, text and PNG files up to 1 MB each, ``*.jsonl`` logs such as
  ``runs.jsonl`` up to 2 MB). It links to its ``report.md``, else its
  ``README.md``, else to a generated ``index.md`` that lists the published files
  and names the ones left out.
- Two published files that would land on the same site file (a named
  ``x.md`` page and a named folder ``x/`` both render to ``x/index.html``)
  stop the build with an error naming both.
- Published Markdown files render as site pages outside the navigation; a
  relative link in them that points into ``docs/`` is rewritten to the page.

Nothing else under ``benchmarks/`` reaches the site. The functions below that
do the work (:func:`plan_site`, :func:`rewrite_markdown`) take plain strings
and paths, so they are tested without building the site.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files, InclusionLevel

RESULTS = "benchmarks/results"
"""Repository folder whose entries the hook may publish."""

SIZE_CAPS: dict[str, int] = {
    ".md": 1_000_000,
    ".json": 1_000_000,
    ".txt": 1_000_000,
    ".png": 1_000_000,
    ".jsonl": 2_000_000,
}
"""Largest size in bytes of a published file, by suffix; other suffixes are never published."""

LANDING_NAMES = ("report.md", "README.md", "index.md")
"""A folder links to the first of these it holds, else to a generated ``index.md``."""

_FENCE = re.compile(r"^[ \t>]*(?P<fence>`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(?<![`\\])`(?P<text>benchmarks/results[^`\s]*)`(?!`)")
_LINK = re.compile(r"(?P<head>\]\()(?P<target>[^)\s#]+)(?P<tail>[^)]*\))")


@attrs.frozen
class ResultSite:
    """What the hook adds to the site.

    Args:
        targets: Repository path as named in the docs (no trailing ``/``) to the
            repository path the link points at (a file, a folder's landing page
            or its generated ``index.md``).
        copies: Repository paths of the files copied into the site (sorted).
        generated: Repository-relative path of each generated index page to its
            Markdown text.
    """

    targets: dict[str, str] = attrs.field(factory=dict)
    copies: tuple[str, ...] = ()
    generated: dict[str, str] = attrs.field(factory=dict)


def _fenced_lines(markdown: str) -> list[bool]:
    """For each line of ``markdown``, whether it belongs to a fenced code block."""
    inside: list[bool] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group("fence")
            inside.append(fence is not None)
            continue
        inside.append(True)
        if match and match.group("fence")[0] == fence[0] and len(match.group("fence")) >= len(fence):
            rest = line[match.end():].strip()
            if not rest:
                fence = None
    return inside


def iter_result_spans(markdown: str) -> Iterator[re.Match[str]]:
    """The inline-code spans of ``markdown`` outside fenced code whose text starts with ``benchmarks/results``."""
    offset = 0
    for line, fenced in zip(markdown.split("\n"), _fenced_lines(markdown)):
        if not fenced:
            for match in _CODE_SPAN.finditer(markdown, offset, offset + len(line)):
                before = markdown[match.start() - 1] if match.start() else ""
                after = markdown[match.end(): match.end() + 1]
                if before == "[" and after == "]":  # already a link's text
                    continue
                yield match
        offset += len(line) + 1


def named_path(text: str) -> str | None:
    """The repository path an inline-code text names, or None when the hook never links it.

    Args:
        text: The span's text, e.g. ``benchmarks/results/bench_quick/``.

    Returns:
        The path without a trailing ``/``; None for ``benchmarks/results``
        itself, globs and paths with ``.``/``..`` segments.
    """
    path = text.rstrip("/")
    if not path.startswith(RESULTS + "/") or any(c in path for c in "*?[]"):
        return None
    if any(part in ("", ".", "..") for part in path.split("/")):
        return None
    return path


def _allowed(path: Path) -> bool:
    cap = SIZE_CAPS.get(path.suffix)
    return cap is not None and path.is_file() and not path.is_symlink() and path.stat().st_size <= cap


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _folder_index(folder: str, published: list[str], left_out: list[tuple[str, int]]) -> str:
    """Markdown of a generated index page for ``folder`` (repository path)."""
    lines = [
        f"# {folder}",
        "",
        "Files of this committed result folder that are published with the documentation "
        "(Markdown, JSON and text files and plots up to 1 MB, `*.jsonl` logs up to 2 MB). "
        "The whole folder is in the repository.",
        "",
    ]
    lines += [f"- [`{rel}`]({rel})" for rel in published] or ["No file of this folder is published."]
    if left_out:
        lines += ["", "Not published here (kind or size):", ""]
        lines += [f"- `{rel}` ({_size(size)})" for rel, size in left_out]
    return "\n".join(lines) + "\n"


def plan_site(doc_texts: Iterable[str], repo_root: Path) -> ResultSite:
    """Which result files the docs name, what each link points at and what to copy.

    Args:
        doc_texts: The Markdown text of every documentation page.
        repo_root: The repository root (the folder holding ``mkdocs.yml``).

    Returns:
        The links, the files to copy and the generated index pages.
    """
    results_root = (repo_root / RESULTS).resolve()
    targets: dict[str, str] = {}
    copies: set[str] = set()
    generated: dict[str, str] = {}
    for text in doc_texts:
        for match in iter_result_spans(text):
            path = named_path(match.group("text"))
            if path is None or path in targets:
                continue
            full = repo_root / path
            if not full.exists() or not full.resolve().is_relative_to(results_root):
                continue
            if full.is_file():
                if _allowed(full):
                    targets[path] = path
                    copies.add(path)
                continue
            published: list[str] = []
            left_out: list[tuple[str, int]] = []
            for child in sorted(p for p in full.rglob("*") if p.is_file()):
                rel = child.relative_to(full).as_posix()
                if _allowed(child):
                    published.append(rel)
                else:
                    left_out.append((rel, child.stat().st_size))
            copies.update(f"{path}/{rel}" for rel in published)
            landing = next((name for name in LANDING_NAMES if name in published), None)
            if landing is not None:
                targets[path] = f"{path}/{landing}"
            else:
                targets[path] = f"{path}/index.md"
                generated[targets[path]] = _folder_index(path, published, left_out)
    return ResultSite(targets=targets, copies=tuple(sorted(copies)), generated=generated)


def _relative(target: str, page_src_uri: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page_src_uri) or ".")


def rewrite_markdown(markdown: str, page_src_uri: str, site: ResultSite, docs_dir: str = "docs") -> str:
    """Link the result paths ``markdown`` names, and, on a result page, its links into the docs.

    Args:
        markdown: A page's Markdown.
        page_src_uri: The page's path in the site sources (``bench.md``; a
            published result page keeps its repository path).
        site: What :func:`plan_site` decided.
        docs_dir: The docs folder, relative to the repository root.

    Returns:
        The Markdown with each linked span written ``[`path`](relative target)``.
    """
    pieces: list[str] = []
    last = 0
    for match in iter_result_spans(markdown):
        path = named_path(match.group("text"))
        if path is None or path not in site.targets:
            continue
        pieces += [markdown[last: match.start()], f"[{match.group(0)}]({_relative(site.targets[path], page_src_uri)})"]
        last = match.end()
    pieces.append(markdown[last:])
    out = "".join(pieces)
    if not page_src_uri.startswith(RESULTS + "/"):
        return out

    def into_docs(link: re.Match[str]) -> str:
        target = link.group("target")
        if "://" in target or target.startswith(("/", "mailto:")):
            return link.group(0)
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_src_uri), target))
        if not resolved.startswith(docs_dir.rstrip("/") + "/"):
            return link.group(0)
        in_site = resolved[len(docs_dir.rstrip("/")) + 1:]
        return f"{link.group('head')}{_relative(in_site, page_src_uri)}{link.group('tail')}"

    return _LINK.sub(into_docs, out)


_STATE: dict[str, ResultSite] = {}


def on_files(files: Files, *, config: Any) -> Files:
    """Add the named result files and generated index pages to the site (outside the nav)."""
    repo_root = Path(config["config_file_path"]).resolve().parent
    texts = [f.content_string for f in files.documentation_pages()]
    site = plan_site(texts, repo_root)
    _STATE["site"] = site
    added = [
        File.generated(config, path, abs_src_path=str(repo_root / path), inclusion=InclusionLevel.NOT_IN_NAV)
        for path in site.copies
    ]
    added += [
        File.generated(config, path, content=content, inclusion=InclusionLevel.NOT_IN_NAV)
        for path, content in site.generated.items()
    ]
    by_dest = {f.dest_uri: f for f in files}
    for new in added:
        old = by_dest.get(new.dest_uri)
        if old is not None:
            # e.g. a named `x.md` page and a named folder `x/` both render to x/index.html
            raise PluginError(
                f"result_links: {new.src_uri!r} and {old.src_uri!r} would both be written to "
                f"{new.dest_uri!r} in the site; name only one of them in the docs"
            )
        by_dest[new.dest_uri] = new
        files.append(new)
    return files


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Files) -> str:
    """Link the result paths a page names (see the module docstring)."""
    site = _STATE.get("site")
    if site is None:
        return markdown
    repo_root = Path(config["config_file_path"]).resolve().parent
    docs_dir = Path(config["docs_dir"]).resolve().relative_to(repo_root).as_posix()
    return rewrite_markdown(markdown, page.file.src_uri, site, docs_dir)
