"""The rows of ``specdec bench``: what ``--methods`` names and how each row runs.

A *row* is one line of the result table: the autoregressive baseline
(:data:`AUTOREGRESSIVE`), a registered method with a draft kind (``"rheo"``
with the EAGLE-3 head, ``"rheo@eagle2"``, ``"rheo[m=2]@lm"``...), or the
transformers peer (:data:`PEER`). :func:`parse_rows` turns ``--methods`` into
:class:`RowSpec` rows; :func:`batch_refusal` says which of them cannot run
with ``--batch-size`` > 1; :func:`kind_rank` orders the row kinds in tables
and plots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from specdec.bench.budget import method_tree, supports_budget
from specdec.bench.kinds import draft_has_rows, draft_kinds, unknown_draft_message
from specdec.errors import InvalidConfigError, UnknownNameError
from specdec.methods import resolve_method
from specdec.registry import get, list_registered

__all__ = [
    "AUTOREGRESSIVE",
    "PEER",
    "DEFAULT_DRAFT",
    "RowSpec",
    "parse_rows",
    "batch_refusal",
    "kind_rank",
]

AUTOREGRESSIVE = "autoregressive"
"""Name of the baseline row (:func:`specdec.autoregressive_generate`)."""

PEER = "hf-assisted"
"""Name of the peer row: transformers' ``generate(assistant_model=...)``."""

DEFAULT_DRAFT: Mapping[str, str] = {"eagle2": "eagle2", "eagle3": "eagle3", "rheo": "eagle3", "sampled-dynamic": "eagle3"}
"""Draft kind of a method written without ``@draft``; other methods use ``"lm"``.
A head that is not available falls back to ``"lm"`` (the output says so)."""


@attrs.frozen
class RowSpec:
    """One row of the benchmark.

    Attributes:
        name: the row's label (unique): ``autoregressive``, ``hf-assisted``,
            a method name, or ``method@draft`` when the draft is not the default.
        kind: ``"autoregressive"``, ``"speculative"`` or ``"peer"``.
        method: registered method name (speculative rows).
        draft: draft kind (one of :func:`~specdec.bench.kinds.draft_kinds`: ``"lm"``, ``"lm-full"``,
            ``"eagle2"``, ``"eagle3"``, ``"ngram"``, a registered draft with a factory), None for the baseline.
        note: why the draft differs from the method's default, if it does.
        options: builder options written in the row (``rheo[m=2,proxy=residual]``),
            ``(name, value)`` pairs that override the budget's mapping
            (:func:`~specdec.bench.sweep.row_options`); empty for the method's defaults.
        budgeted: the tree budget is mapped onto the row's builder options
            (:func:`~specdec.bench.budget.method_options`); False for a method whose
            builder has no budget mapping (a plug-in's own builder), which runs with
            its method's own options (and the row's), as its ``note`` says.
    """

    name: str
    kind: str
    method: str | None = None
    draft: str | None = None
    note: str = ""
    options: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=lambda o: tuple(tuple(x) for x in o))
    budgeted: bool = True

    def method_and_draft(self) -> tuple[str, str]:
        """``(method, draft kind)`` of a speculative row (:func:`parse_rows` gives it both).

        Raises:
            InvalidConfigError: the row is the baseline, the peer, or a speculative row without them.
        """
        if self.kind != "speculative" or self.method is None or self.draft is None:
            raise InvalidConfigError(f"row {self.name!r} ({self.kind}) is not a speculative row with a method "
                                     "and a draft")
        return self.method, self.draft


def _split_entries(text: str) -> list[str]:
    """``--methods`` split at the commas outside ``[...]``."""
    entries: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidConfigError(f"unbalanced ']' in --methods {text!r}")
        if ch == "," and depth == 0:
            entries.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if depth:
        raise InvalidConfigError(f"unclosed '[' in --methods {text!r}")
    entries.append("".join(current).strip())
    return [e for e in entries if e]


def _option_value(text: str) -> Any:
    """An option's value from its text: int, float, bool (``true``/``false``) or the string itself."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parse_options(method: str, text: str, entry: str) -> tuple[tuple[str, Any], ...]:
    """``k=v,k=v`` of ``method[...]`` checked against the method's tree builder's options, plus
    ``verifier=NAME``: the method's tree verified by another registered verifier (checked when the
    generator is composed: a verifier that cannot verify the tree fails before any timing)."""
    builder = get("tree", method_tree(method))
    known = sorted([*(f.name for f in attrs.fields(builder))] if attrs.has(builder) else []) + ["verifier"]
    out: dict[str, Any] = {}
    for item in (i.strip() for i in text.split(",")):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value:
            raise InvalidConfigError(f"option {item!r} in {entry!r} is not name=value")
        if name not in known:
            raise InvalidConfigError(
                f"{entry!r}: the {method} tree builder has no option {name!r} (its options: {', '.join(known)})"
            )
        if name in out:
            raise InvalidConfigError(f"{entry!r} sets {name!r} twice")
        if name == "verifier":
            get("verifier", value)  # an unknown name fails here, listing the registered verifiers
            out[name] = value
            continue
        out[name] = _option_value(value)
    return tuple(out.items())


def parse_rows(text: str, available: Sequence[str], *, add_baseline: bool = True) -> list[RowSpec]:
    """Parse ``--methods a,b@draft,...`` into rows (the baseline first).

    Args:
        text: comma-separated entries: a registered method (its default draft,
            :data:`DEFAULT_DRAFT`), ``method@draft`` with a draft kind, or
            ``hf-assisted``. ``autoregressive`` is accepted and always present.
            A method may carry builder options, ``method[k=v,...]`` or
            ``method[k=v,...]@draft`` (ablations: ``rheo[m=2]``,
            ``rheo[proxy=residual,M=64]``); they override the budget's mapping;
            ``verifier=NAME`` verifies the method's tree with another rule
            (``sequoia[verifier=traversal]@eagle3``).
        available: draft kinds that can be loaded (``"lm"`` always).
        add_baseline: put the autoregressive row first.

    Raises:
        InvalidConfigError / UnknownNameError: unknown method or draft kind,
            duplicates, empty list. A method whose tree builder has no budget
            mapping (a plug-in's own builder) is a row that runs with its method's
            own options (``budgeted=False``, and its ``note`` says so).

    Example:
        >>> [r.name for r in parse_rows("sd,rheo@lm,hf-assisted", ["lm"])]
        ['autoregressive', 'sd', 'rheo@lm', 'hf-assisted']
        >>> [(r.name, r.options) for r in parse_rows("rheo[m=2,proxy=residual]@lm", ["lm"], add_baseline=False)]
        [('rheo[m=2,proxy=residual]@lm', (('m', 2), ('proxy', 'residual')))]
    """
    entries = _split_entries(text)
    if not entries:
        raise InvalidConfigError("--methods is empty: give at least one method (see `specdec list method`)")
    rows: list[RowSpec] = [RowSpec(AUTOREGRESSIVE, "autoregressive")] if add_baseline else []
    seen: dict[tuple[Any, ...], str] = {}
    methods = list_registered("method")
    for entry in entries:
        if entry == AUTOREGRESSIVE:
            continue
        if entry == PEER:
            key: tuple[Any, ...] = (PEER,)
            row = RowSpec(PEER, "peer", draft="lm")
        else:
            spec, _, draft = entry.partition("@")
            method, bracket, rest = spec.partition("[")
            method = method.strip()
            if bracket and (not rest.endswith("]") or not rest[:-1].strip()):
                raise InvalidConfigError(f"{entry!r}: write builder options as method[name=value,...]")
            if method not in methods:
                glob = " (--methods takes method names, not glob patterns)" if any(c in entry for c in "*?[") else ""
                raise UnknownNameError(
                    f"unknown method {method!r} in --methods; known: {', '.join(methods)}, {PEER} "
                    f"(optionally method@draft with draft in {', '.join(draft_kinds())}){glob}"
                )
            budgeted = supports_budget(method)
            options = _parse_options(method, rest[:-1], entry) if bracket else ()
            label = f"{method}[{rest[:-1].strip()}]" if bracket else method
            note = ""
            if draft:
                if draft not in draft_kinds():
                    raise InvalidConfigError(unknown_draft_message(draft, entry))
                if draft not in available:
                    why = (f"no shipped {draft} head for this target; give --{draft}-head PATH"
                           if draft in ("eagle2", "eagle3") else f"available here: {', '.join(available)}")
                    raise InvalidConfigError(f"{entry!r} asks for the {draft} draft, which is not available ({why})")
            else:
                draft = DEFAULT_DRAFT.get(method, "lm")
                if draft not in available:
                    note = f"{draft} head not available: runs with the draft LM"
                    draft = "lm"
            key = (method, draft, options)
            default = DEFAULT_DRAFT.get(method, "lm")
            name = label if draft == default or (note and not entry.count("@")) else f"{label}@{draft}"
            if not budgeted:  # said in the log and the results, never silently
                own = {**resolve_method(method).defaults, **dict(options)}
                unmapped = (f"its tree builder {method_tree(method)!r} has no tree-budget mapping: runs with "
                            f"options {own} (the method's own, and the row's), not the budget")
                note = f"{note}; {unmapped}" if note else unmapped
            row = RowSpec(name, "speculative", method, draft, note, options, budgeted=budgeted)
        if key in seen:
            raise InvalidConfigError(f"--methods lists {entry!r} twice (same method and draft as {seen[key]!r})")
        seen[key] = entry
        rows.append(row)
    return rows


def batch_refusal(row: RowSpec) -> str | None:
    """Why ``row`` cannot run with ``--batch-size`` > 1 (None when it can): batched
    speculative generation needs a builder that grows batches (level-wise or shaped:
    every built-in one) and a draft with a rows mode (the EAGLE heads, the draft LM)."""
    if row.kind == "autoregressive":
        return None
    if row.kind == "peer":
        return f"{row.name}: transformers' assisted generation decodes one sequence at a time"
    method, draft = row.method_and_draft()
    cls = get("tree", method_tree(method))
    if not cls.batch_form:  # declared by the builder class (TreeBuilder.batch_form)
        return f"{row.name}: its tree builder ({method_tree(method)}) does not grow batches of trees yet"
    if not draft_has_rows(draft):
        return (f"{row.name}: the {draft} draft has no rows mode (its class does not declare supports_rows; "
                "the EAGLE heads, the draft LM and ngram have one)")
    return None


def kind_rank(kind: str) -> int:
    """Where rows of ``kind`` stand in tables and plots: the baseline, the speculative rows, the peer.

    Example:
        >>> sorted(["peer", "speculative", "autoregressive"], key=kind_rank)
        ['autoregressive', 'speculative', 'peer']
    """
    return {"autoregressive": 0, "speculative": 1, "peer": 2}.get(kind, 3)
