"""Drafts are plug-ins like the rest (issue 56): a declared factory (``register("draft", NAME, factory=...)``),
exact laws with any draft, and the batch case that reports what cannot run as SKIP, never as a pass."""

from __future__ import annotations

import unittest

import pytest

import specdec
from specdec.drafts.ngram import NgramDraft
from specdec.drafts.setting import DraftSetting
from specdec.errors import InvalidConfigError, UnknownNameError
from specdec.generate import SpeculativeGenerator
from specdec.registry import draft_factory, list_draft_factories, register, unregister
from specdec.testing import ExactLaws, sparse_markov_pair
from specdec.testing.conformance import PluginCase, check_registered
from specdec.testing.suites import T1, Case, Skipped, SuiteSettings, _batch
from specdec.trees.chain import ChainTreeBuilder


@pytest.fixture
def zz_draft():
    """A draft ``zz-factory-draft`` registered with a factory, and ``zz-plain-draft`` without one."""
    made = []

    def factory(setting: DraftSetting) -> NgramDraft:
        made.append(setting)
        return NgramDraft(setting.vocab_size, branches=2)

    register("draft", "zz-factory-draft", factory=factory)(type("ZZFactoryDraft", (NgramDraft,), {}))
    register("draft", "zz-plain-draft")(type("ZZPlainDraft", (NgramDraft,), {}))
    yield made
    for name in ("zz-factory-draft", "zz-plain-draft"):
        if name in specdec.registry.list_registered("draft"):
            unregister("draft", name)


def test_a_draft_declares_its_factory(zz_draft):
    built = draft_factory("zz-factory-draft")(DraftSetting(vocab_size=5))
    assert isinstance(built, NgramDraft) and built.vocab_size == 5 and zz_draft[0].vocab_size == 5
    assert "zz-factory-draft" in list_draft_factories() and "zz-plain-draft" not in list_draft_factories()
    with pytest.raises(InvalidConfigError, match=r"draft 'zz-plain-draft' \(module '.*'\) declares no factory.*"
                                                 r"register\('draft', 'zz-plain-draft', factory=FACTORY\)"):
        draft_factory("zz-plain-draft")
    with pytest.raises(UnknownNameError, match="unknown draft 'zz-nope'"):
        draft_factory("zz-nope")
    unregister("draft", "zz-factory-draft")  # the factory leaves with its entry
    assert "zz-factory-draft" not in list_draft_factories()
    register("draft", "zz-factory-draft")(type("ZZAgain", (NgramDraft,), {}))  # a new entry, without one
    with pytest.raises(InvalidConfigError, match="declares no factory"):
        draft_factory("zz-factory-draft")


def test_only_a_draft_declares_a_factory():
    with pytest.raises(InvalidConfigError, match="a factory is declared by a draft only"):
        register("tree", "zz-tree-with-factory", factory=lambda s: None)
    with pytest.raises(InvalidConfigError, match="a factory is declared by a draft only"):
        register("draft", "zz-draft-bad-factory", factory="not callable")  # type: ignore[arg-type]


def test_a_draft_setting_is_checked():
    with pytest.raises(InvalidConfigError, match="vocab_size must be an int >= 1, got 0"):
        DraftSetting(vocab_size=0)


@pytest.mark.parametrize("sampling", [T1, specdec.SamplingConfig(temperature=0.0)], ids=["T1", "T0"])
def test_exact_laws_take_any_draft(sampling):
    """ExactLaws with a draft that is not a Markov toy model (the prompt-lookup draft): keyed on the whole
    context, the chain method's law of three tokens is the target's (it raised AttributeError 'order')."""
    target, _ = sparse_markov_pair(4, 0)
    laws = ExactLaws(ChainTreeBuilder(depth=2), specdec.get("verifier", "rejection-iid")(), target,
                     NgramDraft(4, branches=2), sampling)
    gap = laws.check([0, 1, 2, 0, 1], 3)
    assert gap.error < 1e-12 and abs(gap.mass - 1.0) < 1e-12


def test_the_batch_case_reports_a_refusal_as_skip(monkeypatch):
    """A builder without a batch form that generate_batch refuses by name: the case is SKIPPED with the reason,
    never passed; the report says SKIP, and the pytest form skips. A builder that declares a batch form and is
    refused fails the case (it raises)."""
    def refuse(self, *args, **kwargs):
        raise InvalidConfigError(f"generate_batch: {type(self.builder).__name__} has no batch form")

    monkeypatch.setattr(SpeculativeGenerator, "generate_batch", refuse)
    with pytest.raises(InvalidConfigError, match="ChainTreeBuilder has no batch form"):
        _batch("chain", "rejection-iid", {"depth": 2}, "T1")()  # declares a batch form: a refusal is a failure
    monkeypatch.setattr(ChainTreeBuilder, "grows_batches", lambda self, sampling=None: False)
    outcome = _batch("chain", "rejection-iid", {"depth": 2}, "T1")()
    assert isinstance(outcome, Skipped)
    assert outcome.reason.startswith("tree 'chain' (ChainTreeBuilder) has no batch form: generate_batch refuses it")
    report = check_registered("tree", "chain", SuiteSettings.quick(["batch"]))
    assert report.passed and not report.proven and report.counts == {}
    assert report.render().startswith("SKIP  tree 'chain': no case could run (1 skipped)\n      SKIP  batch ")
    case = PluginCase("tree", "chain", Case("batch", "batch", lambda: outcome))
    with pytest.raises(unittest.SkipTest, match="SKIP: tree 'chain'"):
        case.run()
