"""The role contracts (issue 56): the engine's contracts are the batch forms, small; per-tree
authoring is OneRowDraft / OneRowTarget; 0.1.0's direct one-row subclasses still work, with a
DeprecationWarning (docs/api/public.md, "Deprecation policy")."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import specdec
from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.sampling import SamplingConfig
from specdec.targets.base import OneRowTarget, TargetModel
from specdec.testing.markov import markov_pair
from specdec.trees.base import OneTreeBuilder, TreeBuilder

V = 8
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(2), dtype=torch.float64)


def public(cls: type) -> list[str]:
    """The public methods and properties a class defines itself."""
    return sorted(n for n, v in vars(cls).items()
                  if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, property)))


def test_the_batch_contracts_are_small():
    """DraftModel: at most 10 public members (28 in 0.1.0); TargetModel: at most 8 (13); a builder
    has one build the engine calls (feed_build, driven by build_batch) beside the per-tree build."""
    assert len(public(DraftModel)) <= 10, public(DraftModel)
    assert len(public(TargetModel)) <= 8, public(TargetModel)
    assert {"begin", "root_logits", "tree_logits", "commit", "root_distribution", "expand"} <= set(public(OneRowDraft))
    assert {"prefill", "score_tree", "accept"} <= set(public(OneRowTarget))
    assert not {"begin", "root_logits", "root_distribution", "expand"} & set(public(DraftModel))
    assert not {"prefill", "score_tree", "accept", "reserve"} & set(public(TargetModel))
    assert "feed_build" in public(TreeBuilder) and not {"build", "build_batch"} & set(public(TreeBuilder))
    assert "build" in public(OneTreeBuilder)


def _legacy_classes():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        class LegacyDraft(DraftModel):  # 0.1.0's contract: the one-row methods on DraftModel
            def __init__(self):
                self.context = []

            @property
            def vocab_size(self):
                return V

            def begin(self, prompt_ids, target_hidden=None):
                self.context = list(prompt_ids)

            def root_logits(self):
                return TABLE[self.context[-1]]

            def tree_logits(self, parents, tokens):
                return TABLE[torch.as_tensor(tokens, dtype=torch.int64)]

            def commit(self, tokens, target_hidden=None):
                self.context.extend(tokens)

        class LegacyTarget(TargetModel):
            def __init__(self):
                self.context = []

            @property
            def vocab_size(self):
                return V

            def prefill(self, prompt_ids):
                self.context = list(prompt_ids)

            def score_tree(self, tree):
                return TABLE[tree.tokens]

            def accept(self, accepted_nodes, bonus_token):
                self.context.append(bonus_token)

    return LegacyDraft, LegacyTarget, caught


def test_a_0_1_0_one_row_draft_and_target_warn_and_still_work():
    LegacyDraft, LegacyTarget, caught = _legacy_classes()
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("LegacyDraft subclasses DraftModel" in m and "OneRowDraft" in m and "0.2.0" in m for m in messages)
    assert any("LegacyTarget subclasses TargetModel" in m and "OneRowTarget" in m for m in messages)
    assert LegacyDraft.supports_rows is False and LegacyTarget.supports_batch is False
    sampling, seeds, prompts = SamplingConfig(temperature=1.0), [1, 2], [[1, 2], [3]]

    def gen():
        return specdec.SpeculativeGenerator(LegacyTarget(), LegacyDraft(), "specinfer")

    out = gen().generate_batch(prompts, 8, sampling, seeds)
    for b, prompt in enumerate(prompts):
        assert list(out.tokens[b]) == gen().generate(prompt, 8, sampling, seed=seeds[b]).tokens
    draft = LegacyDraft()
    draft.begin([3])
    assert torch.allclose(draft.root_distribution(SamplingConfig(temperature=1.0)), torch.softmax(TABLE[3], -1))


def test_a_new_one_row_draft_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Fine(OneRowDraft):
            vocab_size = V
            begin = root_logits = tree_logits = commit = lambda self, *a, **k: None  # noqa: E731

    assert Fine.supports_rows is False


def test_a_batch_draft_needs_no_one_row_methods():
    """A draft written for the batch contract alone runs a batch and is proven row by row."""
    target, _ = markov_pair(V, seed=1)
    _, toy = markov_pair(V, seed=1)

    class BatchBigram(DraftModel):
        def __init__(self):
            self.rows = []

        @property
        def vocab_size(self):
            return V

        def begin_rows(self, prompts, target_hidden=None, *, positions=None):
            self.rows = [list(p) for p in prompts]

        def root_rows_logits(self, proposal=False):
            return TABLE[[r[-1] for r in self.rows]]

        def tree_rows_logits(self, parents, tokens, proposal=False):
            return TABLE[tokens]

        def commit_rows(self, emitted, target_hidden=None, *, device_tokens=None, device_counts=None):
            for r, e in zip(self.rows, emitted):
                r.extend(e)

        def keep_rows(self, rows):
            self.rows = [self.rows[r] for r in rows]

    sampling, seeds, prompts = SamplingConfig(temperature=1.0), [4, 5, 6], [[1], [2, 3], [4]]
    out = specdec.SpeculativeGenerator(target, BatchBigram(), "sd", depth=2).generate_batch(prompts, 8, sampling, seeds)
    for b, prompt in enumerate(prompts):
        t, _ = markov_pair(V, seed=1)
        single = specdec.SpeculativeGenerator(t, BatchBigram(), "sd", depth=2).generate(prompt, 8, sampling, seed=seeds[b])
        assert list(out.tokens[b]) == single.tokens
    with pytest.raises(TypeError):
        DraftModel()  # abstract: the batch contract must be written


def test_the_flagged_helpers_of_0_1_0_warn_and_agree_with_the_contract():
    target, draft = markov_pair(V, seed=3)
    draft.begin([1, 2])
    sampling = SamplingConfig(temperature=0.8)
    with pytest.warns(DeprecationWarning, match="root_distribution_flagged is deprecated"):
        q, bad = draft.root_distribution_flagged(sampling)
    assert torch.allclose(q, draft.root_distribution(sampling)) and not bool(bad)
    with pytest.warns(DeprecationWarning, match="expand_rows_laws is deprecated"):
        (qs,), _ = draft.expand_rows_laws(torch.tensor([[0]]), torch.tensor([[3]]), (sampling,))
    draft.begin([1, 2])
    assert torch.allclose(qs[0, 0], draft.expand([0], [3], sampling)[0])


def test_a_0_1_0_rows_mode_draft_keeps_its_begin_rows_signature():
    """0.1.0's begin_rows(prompts, target_hidden) (no positions=) is served: reserve() first, as 0.1.0's loop did."""
    calls = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        class OldRows(DraftModel):
            supports_rows = True

            @property
            def vocab_size(self):
                return V

            def reserve(self, positions):
                calls.append(("reserve", positions))

            def begin(self, prompt_ids, target_hidden=None):
                pass

            def root_logits(self):
                return TABLE[0]

            def tree_logits(self, parents, tokens):
                return TABLE[torch.as_tensor(tokens)]

            def commit(self, tokens, target_hidden=None):
                pass

            def begin_rows(self, prompts, target_hidden=None):
                calls.append(("begin_rows", len(prompts)))

    OldRows().begin_rows([[1], [2]], None, positions=12)
    assert calls == [("reserve", 12), ("begin_rows", 2)]
