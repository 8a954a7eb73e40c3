"""Content hashes of the drafts a ``specdec bench`` run uses, for its run log (docs/bench.md, "Run logs").

Every ``runs.jsonl`` header records, under ``config.draft_sha256``, one entry per draft kind its rows
use (:func:`draft_hashes`): the file or folder the draft was loaded from and its SHA-256, so that
two runs of "the EAGLE-3 head" can be told apart when the head was retrained in between. The hash
is computed from the files alone, before any model loads, and is part of the run's identity: a
sweep is resumed only with the same files. A folder's hash is :func:`folder_sha256`, reproducible
with standard tools:

    (cd DIR && find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs sha256sum) | sha256sum

A draft with no file (a truncated copy of the target, made at load time; the model-free ``ngram``
draft) is recorded with ``sha256`` None and the reason.
The plug-ins loaded (``--plugin``, installed ones) are part of the identity too
(:func:`plugin_identity`): one key ``plugin:<module>`` per module outside specdec that registered
an entry (its source file and that file's SHA-256, and the names it registered), and one key
``override:<role>:<name>`` per name a module replaced that another module had registered
(:func:`specdec.registry.overrides`). A sweep is resumed only with the same plug-ins, their
sources unchanged; a refusal names the key that differs. A run without plug-ins has no such key
(as every log written before they were recorded).

``--budget auto``'s choices (a budget per temperature and draft kind, rheo's ``m`` per temperature) are
made after the models load, so they are not in the identity a command is compared with before loading;
they are part of the run's identity all the same: the header records their digest
(:func:`budget_sha256`, under ``resolved.budget.sha256``) and a resumed sweep reuses them as logged,
never re-chosen. :func:`check_budget_choices` refuses to resume a log whose choices do not match
their digest, or whose generations ran at another budget than the header's choice for their
temperature and draft kind (an edited or mixed log).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specdec.bench.budget import Budget, BudgetPlan, budget_at
from specdec.bench.kinds import BUILTIN_DRAFT_KINDS
from specdec.bench.models import DEFAULT_TARGET, auto_head_path, shipped_draft_available
from specdec.bench.runlog import logged_budget
from specdec.drafts.eagle.checkpoints import shipped_draft_lm_path
from specdec.errors import InvalidConfigError
from specdec.models import gemma3
from specdec.registry import ROLES, list_registered, origin, overrides

__all__ = ["HASH_KEY", "budget_sha256", "check_budget_choices", "draft_hashes", "draft_source", "file_sha256",
           "folder_sha256", "path_sha256", "plugin_identity"]

HASH_KEY = "draft_sha256"
"""The key of the drafts' hashes in a run log header's ``config``."""

_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of one file's bytes, as ``sha256sum`` prints it."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def folder_sha256(path: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """``(hash, {relative path: file hash})`` of every file under ``path`` (followed in sorted
    order of their ``/``-separated relative paths): the hash is the SHA-256 of the lines
    ``"<file hash>  <relative path>\\n"``, i.e. of ``sha256sum``'s output over the sorted files.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "b.txt").write_text("b\\n"); _ = (d / "a.txt").write_text("a\\n")
        >>> digest, files = folder_sha256(d)
        >>> sorted(files) == ["a.txt", "b.txt"] and len(digest) == 64
        True
    """
    root = Path(path)
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file())
    if not files:
        raise InvalidConfigError(f"{root} holds no file to hash")
    per = {rel: file_sha256(p) for rel, p in files}
    listing = "".join(f"{digest}  {rel}\n" for rel, digest in per.items())
    return hashlib.sha256(listing.encode("utf-8")).hexdigest(), per


def path_sha256(path: str | os.PathLike) -> dict[str, Any]:
    """The log entry of a draft loaded from ``path`` (a file or a folder): ``{"source", "sha256"}``,
    and ``"files"`` (each file's hash) for a folder."""
    p = Path(path).expanduser().resolve()
    if p.is_dir():
        digest, files = folder_sha256(p)
        return {"source": str(p), "sha256": digest, "files": files}
    if p.is_file():
        return {"source": str(p), "sha256": file_sha256(p)}
    raise InvalidConfigError(f"cannot hash {p}: no such file or folder")


def _hub_snapshot(name: str) -> Path | None:
    """The local snapshot folder of hub model ``name`` (no download), or None."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - no local copy (or no huggingface_hub): nothing to hash
        return None


def draft_source(target: str, draft: str, heads: Mapping[int, str], kind: str) -> Path | str:
    """Where draft ``kind`` of a bench run comes from: the file or folder it loads (a
    :class:`~pathlib.Path`), or a sentence saying why there is none (a truncated copy of the target, the
    model-free ``ngram`` draft, a head ``auto`` finds none of). Follows
    :func:`~specdec.bench.models.load_bench_models`'s choices without loading anything.

    Args:
        target: ``--target`` (as :func:`~specdec.bench.settings.model_source` records it).
        draft: ``--draft`` (likewise).
        heads: ``{2: --eagle2-head, 3: --eagle3-head}``.
        kind: ``"lm"``, ``"lm-full"`` (the same files as ``"lm"``), ``"eagle2"``, ``"eagle3"``, ``"ngram"``, or a
            registered draft with a factory (its source: the file of the module that registered it).
    """
    if kind == "ngram":
        return "model-free prompt lookup: no weights"
    if kind not in BUILTIN_DRAFT_KINDS:  # a registered draft built by its factory: the module that registered it
        module = origin("draft", kind)
        file = getattr(sys.modules.get(module), "__file__", None)
        return Path(file) if file else f"registered draft {kind!r} of module {module!r}, which has no file to hash"
    if kind in ("lm", "lm-full"):
        if draft == "auto":
            if target == "gemma3" and gemma3.cached_draft_lm_path() is not None:
                return Path(str(gemma3.cached_draft_lm_path()))
            if target == DEFAULT_TARGET and shipped_draft_available():
                return Path(shipped_draft_lm_path())
            return "a truncated copy of the target, made at load time: no file of its own"
        if draft.startswith("truncated:"):
            return "a truncated copy of the target, made at load time: no file of its own"
        local = Path(draft).expanduser()
        if local.exists():
            return local
        snapshot = _hub_snapshot(draft)
        return snapshot if snapshot is not None else f"hub model {draft!r} with no local copy to hash"
    version = int(kind[-1])
    spec = heads.get(version, "auto")
    if spec == "none":
        return "no head (--eagle{}-head none)".format(version)
    if spec == "auto":
        found = auto_head_path(target, version)
        return Path(found) if found is not None else f"no EAGLE-{version} head found for {target!r}"
    return Path(spec).expanduser()


def draft_hashes(target: str, draft: str, heads: Mapping[int, str], kinds: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{kind: entry}`` for every draft kind in ``kinds``: :func:`path_sha256` of its
    :func:`draft_source`, or ``{"source": why, "sha256": None}`` for a draft with no file.

    Example:
        >>> draft_hashes("smollm2", "truncated:2", {}, ["lm", "ngram"])["lm"]["sha256"] is None
        True
    """
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted(set(kinds)):
        source = draft_source(target, draft, heads, kind)
        out[kind] = path_sha256(source) if isinstance(source, Path) else {"source": source, "sha256": None}
    return out


def plugin_identity() -> dict[str, Any]:
    """The plug-ins' part of a run's identity, from the registry as it is now: per module outside
    specdec that registered an entry, ``"plugin:<module>": {"file", "sha256", "registered"}`` (its
    source file and the file's SHA-256, None for a module without a file; per role, the sorted names
    it registered), and per name a module replaced that another one had registered,
    ``"override:<role>:<name>": {"owner", "by"}``. Empty when only specdec's entries are registered.

    Example:
        >>> plugin_identity()  # the built-ins only
        {}
    """
    modules: dict[str, dict[str, list[str]]] = {}
    for role in ROLES:
        for name in list_registered(role):
            module = origin(role, name)
            if module != "specdec" and not module.startswith("specdec."):
                modules.setdefault(module, {}).setdefault(role, []).append(name)
    out: dict[str, Any] = {}
    for module, registered in sorted(modules.items()):
        file = getattr(sys.modules.get(module), "__file__", None)
        source = Path(file).resolve() if file else None
        out[f"plugin:{module}"] = {"file": str(source) if source else None,
                                   "sha256": file_sha256(source) if source and source.is_file() else None,
                                   "registered": registered}
    for o in overrides():
        out[f"override:{o.role}:{o.name}"] = {"owner": o.owner, "by": o.by}
    return out


def budget_sha256(budget: BudgetPlan, slots: Mapping[float, int] | None = None) -> str:
    """SHA-256 (hex) of a sweep's tree budget and rheo's sampled slots: of the JSON list of
    ``[T, kind, N, d]`` (kind None where the budget is not per kind; T None for one budget at every
    temperature) sorted, then ``[T, m]`` sorted. Any kind's choice at any temperature changes it.

    Example:
        >>> a = budget_sha256({0.0: {"lm": Budget(1, 1), "eagle3": Budget(4, 2)}})
        >>> a == budget_sha256({0.0: {"eagle3": Budget(4, 2), "lm": Budget(1, 1)}})  # order does not matter
        True
        >>> a == budget_sha256({0.0: {"lm": Budget(2, 2), "eagle3": Budget(4, 2)}})
        False
    """
    items: list[list[Any]] = []
    if isinstance(budget, Budget):
        items.append([None, None, budget.nodes, budget.depth])
    else:
        for t, entry in budget.items():
            if isinstance(entry, Budget):
                items.append([float(t), None, entry.nodes, entry.depth])
            else:
                items += [[float(t), str(k), b.nodes, b.depth] for k, b in entry.items()]
    key = lambda x: tuple("" if v is None else v for v in x)  # noqa: E731 - None sorts first
    text = json.dumps({"budget": sorted(items, key=key),
                       "sampled_slots": sorted([float(t), int(m)] for t, m in (slots or {}).items())})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_budget_choices(header: Mapping[str, Any], records: Iterable[Mapping[str, Any]], path: str) -> None:
    """Refuse to resume a log whose tree budget is not the one its header's digest and its generations say.

    - ``resolved.budget.sha256`` (written since the budget is chosen per draft kind) must be the
      :func:`budget_sha256` of the budget and slots the header holds (:func:`~specdec.bench.runlog.logged_budget`);
    - every generation of a speculative row whose builder the budget maps onto, logged with
      ``budget_nodes`` / ``budget_depth``, must carry the budget of its temperature and its row's draft kind.

    Logs without a digest (written before) are checked on their generations alone.

    Raises:
        InvalidConfigError: naming ``path``, the temperature and draft kind, and both budgets.
    """
    res = header["resolved"]
    budget, slots = logged_budget(res)
    entry = res.get("budget") or {}
    logged = entry.get("sha256") if isinstance(entry, Mapping) else None
    if logged is not None and logged != budget_sha256(budget, slots):
        raise InvalidConfigError(
            f"{path}: the header's tree budget choices do not match their digest (resolved.budget.sha256): the "
            "header was edited; a sweep is resumed only with the choices its generations ran with: rerun with "
            "--overwrite or in another folder")
    rows = {str(r["name"]): r for r in res.get("rows", [])}
    for rec in records:
        row = rows.get(str(rec.get("row")))
        if row is None or row.get("kind") != "speculative" or not row.get("budgeted", True) \
                or rec.get("budget_nodes") is None:
            continue
        t, kind = float(rec["temperature"]), row.get("draft")
        want = budget_at(budget, t, kind)
        got = (int(rec["budget_nodes"]), int(rec.get("budget_depth") or 0))
        if got != (want.nodes, want.depth):
            raise InvalidConfigError(
                f"{path}: generation {rec.get('row')!r} T={t:g} prompt {rec.get('prompt_index')} seed "
                f"{rec.get('seed')} ran at {got[0]} nodes, depth {got[1]}, but the header's budget for draft "
                f"{kind} at T={t:g} is {want}: its generations and its choices disagree (a mixed or edited log), "
                "so it cannot be resumed: rerun with --overwrite or in another folder")
