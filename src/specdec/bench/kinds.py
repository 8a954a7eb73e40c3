"""The draft kinds of ``specdec bench``: the built-in ones and the registered drafts with a factory.

A row names its draft kind after ``@`` (``sd@ngram``, ``rheo@eagle2``, ``sd@my-draft``).
:data:`BUILTIN_DRAFT_KINDS` are loaded by :func:`~specdec.bench.models.load_bench_models` from the
bench's own flags; every other kind is a registered draft that declares a factory
(``register("draft", NAME, factory=...)``, :mod:`specdec.drafts.setting`), built by it for the
bench's target (:func:`plugin_draft`). :func:`draft_kinds` lists them all, read from the registry
at the call, so a plug-in loaded with ``--plugin`` adds its drafts.
"""

from __future__ import annotations

from specdec.drafts.base import DraftModel
from specdec.drafts.setting import DraftSetting
from specdec.errors import InvalidConfigError, PluginError, SpecDecError, VocabMismatchError
from specdec.registry import draft_factory, get, list_draft_factories, list_registered, origin

__all__ = ["BUILTIN_DRAFT_KINDS", "draft_has_rows", "draft_kinds", "plugin_draft", "unknown_draft_message"]

BUILTIN_DRAFT_KINDS: tuple[str, ...] = ("lm", "lm-full", "eagle2", "eagle3", "ngram")
"""The draft kinds :func:`~specdec.bench.models.load_bench_models` loads from the bench's own flags (``--draft``,
``--eagle2-head``, ``--eagle3-head``); each has a rows mode. :func:`draft_kinds` adds the registered
drafts that declare a factory."""


def draft_kinds() -> tuple[str, ...]:
    """Every draft kind a benchmark row can use (``method@KIND``): :data:`BUILTIN_DRAFT_KINDS`, then
    every registered draft that declares a factory (:func:`specdec.registry.list_draft_factories`,
    read at the call: a plug-in loaded with ``--plugin`` adds its drafts).

    Raises:
        PluginError: a registered draft with a factory is named like a built-in kind (it could not
            be told apart from it), naming the draft and its module.
    """
    plugins = list_draft_factories()
    clash = [n for n in plugins if n in BUILTIN_DRAFT_KINDS]
    if clash:
        raise PluginError("; ".join(f"draft {n!r} (module {origin('draft', n)!r}) declares a factory but {n!r} is a "
                                    "built-in bench draft kind: register it under another name" for n in clash))
    return BUILTIN_DRAFT_KINDS + tuple(plugins)


def unknown_draft_message(draft: str, entry: str) -> str:
    """Why ``draft`` (written in ``entry``) is no draft kind: unknown, or registered without a factory."""
    kinds = draft_kinds()
    if draft in list_registered("draft"):
        try:
            draft_factory(draft)
        except InvalidConfigError as exc:
            return f"{entry!r}: the bench cannot build the draft {draft!r}: {exc}"
    return f"unknown draft kind {draft!r} in {entry!r}; use one of: {', '.join(kinds)}"


def draft_has_rows(kind: str) -> bool:
    """Whether draft ``kind`` serves several rows (``--batch-size`` > 1): every built-in kind does; a
    registered draft as its class declares (:attr:`~specdec.drafts.base.DraftModel.supports_rows`)."""
    if kind in BUILTIN_DRAFT_KINDS:
        return True
    return bool(get("draft", kind).supports_rows)


def plugin_draft(kind: str, setting: DraftSetting) -> DraftModel:
    """The registered draft ``kind`` built by its declared factory (:func:`specdec.registry.draft_factory`)
    for ``setting``, checked: a draft model over the target's vocabulary.

    Raises:
        UnknownNameError / InvalidConfigError: no such draft, or it declares no factory (by name).
        PluginError: the factory fails or returns something else than a draft of ``setting.vocab_size`` tokens.
    """
    factory = draft_factory(kind)
    where = f"the factory of draft {kind!r} (module {origin('draft', kind)!r})"
    try:
        draft = factory(setting)
    except SpecDecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plug-in's own failure, reported with its name and chained
        raise PluginError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(draft, DraftModel):
        raise PluginError(f"{where} returned {type(draft).__name__}, not a DraftModel")
    if draft.vocab_size != setting.vocab_size:
        raise VocabMismatchError(f"{where} built a draft over {draft.vocab_size} tokens; the target has "
                                 f"{setting.vocab_size}")
    return draft
