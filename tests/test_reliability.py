"""Issue 16, defects 7, 9 and 10: composition errors at construction,
draft output rows checked, seeds / names / depths / NaN sources reported."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError, InvalidDistributionError, UnsupportedTreeError
from specdec.models import CallableLM
from specdec.testing import markov_pair

V = 6
S = specdec.SamplingConfig


def _models():
    return markov_pair(V)


# ----------------------------------------------------------------- defect 7

@pytest.mark.parametrize(
    ("options", "drawn", "verifier"),
    [
        ({"method": "specinfer", "mode": "wor"}, "'wor'", "rejection-iid"),
        ({"method": "sequoia", "verifier": "rejection-iid"}, "'wor'", "rejection-iid"),
        ({"method": "sequoia", "verifier": "kseq"}, "'wor'", "kseq"),
        ({"method": None, "tree": "static", "verifier": "rejection-wor"}, "'iid'", "rejection-wor"),
        ({"method": None, "tree": "rheo", "verifier": "kseq", "m": 2}, None, "kseq"),  # kinds: caught as before
    ],
)
def test_sampling_mode_mismatches_fail_when_the_generator_is_made(options, drawn, verifier):
    target, draft = _models()
    with pytest.raises(UnsupportedTreeError, match=f"verifier {verifier!r} cannot verify"):
        specdec.SpeculativeGenerator(target=target, draft=draft, **options)
    if drawn is not None:
        with pytest.raises(UnsupportedTreeError, match=f"several sampled children of one node {drawn}.*verifiers that fit"):
            specdec.SpeculativeGenerator(target=target, draft=draft, **options)


@pytest.mark.parametrize(
    "options",
    [{"method": "specinfer"}, {"method": "specinfer", "mode": "wor", "verifier": "rejection-wor"},
     {"method": "sequoia"}, {"method": None, "tree": "static", "verifier": "kseq"},
     {"method": "sd", "verifier": "rejection-wor"},  # a chain has one child per node: any mode fits
     {"method": "rheo", "m": 2}, {"method": "eagle2", "verifier": "greedy"}],
)
def test_fitting_compositions_still_compose(options):
    target, draft = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, **options)
    temperature = 0.0 if gen.verifier.requires_greedy else 1.0
    assert len(gen.generate([1], 6, S(temperature=temperature), seed=0).tokens) == 6


def test_greedy_verifier_at_positive_temperature_fails_before_any_forward():
    target, draft = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="eagle2", verifier="greedy")

    def no_forward(*args, **kwargs):
        raise AssertionError("a model was touched before the check")

    target.prefill = target.reserve = draft.begin = no_forward
    with pytest.raises(InvalidDistributionError, match="needs one-hot p"):
        gen.generate([1], 5, S(temperature=0.7), seed=0)


def test_greedy_verifier_at_positive_temperature_fails_before_any_forward_in_a_batch():
    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), V), vocab_size=V)
    gen = specdec.SpeculativeGenerator(target=lm, draft=CallableLM(lm.fn, V), method="eagle2", verifier="greedy")

    def no_forward(*args, **kwargs):
        raise AssertionError("a model was touched before the check")

    lm.prefill_batch = no_forward
    with pytest.raises(InvalidDistributionError, match="needs one-hot p"):
        gen.generate_batch([[1], [2]], 5, S(temperature=0.7), seeds=[0, 1])


# ----------------------------------------------------------------- defect 9

class _RowsOff(DraftModel):
    """A draft whose tree_logits returns ``extra`` more rows than nodes asked for (negative: fewer)."""

    def __init__(self, extra: int) -> None:
        self.inner = CallableLM(lambda prefixes: torch.zeros(len(prefixes), V), vocab_size=V)
        self.extra = extra

    @property
    def vocab_size(self) -> int:
        return V

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)

    def root_logits(self):
        return self.inner.root_logits()

    def tree_logits(self, parents, tokens):
        logits = self.inner.tree_logits(parents, tokens)
        if self.extra >= 0:
            return torch.cat([logits, torch.zeros(self.extra, V)])
        return logits[: self.extra]

    def commit(self, tokens, target_hidden=None):
        self.inner.commit(tokens, target_hidden)


@pytest.mark.parametrize("extra", [2, -1])
@pytest.mark.parametrize("method", ["sd", "specinfer", "eagle2", "rheo"])
def test_a_draft_returning_the_wrong_number_of_rows_is_refused_with_the_shapes(extra, method):
    target, _ = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=_RowsOff(extra), method=method)
    with pytest.raises(InvalidDistributionError, match=r"returned logits of shape \(\d+, 6\) for \d+ added node\(s\); expected \[\d+, 6\]"):
        gen.generate([1], 8, S(), seed=0)


def test_a_rows_mode_draft_returning_the_wrong_rows_is_refused():
    class Short(CallableLM):
        def tree_rows_logits(self, parents, tokens, proposal=False):
            return super().tree_rows_logits(parents, tokens, proposal)[:, :-1]

    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), V), vocab_size=V)
    gen = specdec.SpeculativeGenerator(target=lm, draft=Short(lm.fn, V), method="eagle2", K=2, depth=3, N=4)
    with pytest.raises(InvalidDistributionError, match=r"for \d+ added node\(s\); expected \[2, \d+, 6\]"):
        gen.generate_batch([[1], [2, 3]], 5, S(), seeds=[0, 1])


# ----------------------------------------------------------------- defect 10

@pytest.mark.parametrize(("seed", "message"), [(2**70, r"lie in \[-2\*\*63, 2\*\*64 - 1\]"), (1.5, "got float 1.5"),
                                               ("3", "got str '3'"), (True, "got bool True"), (np.float64(2.0), "float")])
def test_bad_seeds_are_refused_not_truncated(seed, message):
    target, draft = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd")
    with pytest.raises(InvalidConfigError, match=f"seed must .*{message}"):
        gen.generate([1], 4, S(), seed=seed)
    with pytest.raises(InvalidConfigError, match=message):
        specdec.autoregressive_generate(target, [1], 4, S(), seed=seed)


@pytest.mark.parametrize("seed", [np.int64(5), torch.tensor(5), 2**64 - 1, -(2**63)])
def test_seeds_of_any_integer_type_and_the_whole_range_work(seed):
    target, draft = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd")
    out = gen.generate([1], 6, S(), seed=seed)
    assert out.tokens == gen.generate([1], 6, S(), seed=int(seed)).tokens


def test_batch_seeds_are_checked_per_row():
    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), V), vocab_size=V)
    gen = specdec.SpeculativeGenerator(target=lm, draft=CallableLM(lm.fn, V), method="eagle2")
    with pytest.raises(InvalidConfigError, match=r"seeds\[1\] must be an int or None, got float 1.5"):
        gen.generate_batch([[1], [2]], 3, S(), seeds=[0, 1.5])
    with pytest.raises(InvalidConfigError, match="one per prompt, got 1"):
        gen.generate_batch([[1], [2]], 3, S(), seeds=[0])


@pytest.mark.parametrize(("options", "name"), [({"method": 123}, "method"), ({"method": ["sd"]}, "method"),
                                               ({"method": None, "tree": 3, "verifier": "match"}, "tree"),
                                               ({"method": None, "tree": "chain", "verifier": b"match"}, "verifier")])
def test_non_string_names_are_refused_naming_the_argument(options, name):
    target, draft = _models()
    with pytest.raises(InvalidConfigError, match=f"{name} must be a registered name"):
        specdec.SpeculativeGenerator(target=target, draft=draft, **options)


def test_registry_lookups_with_non_string_names_are_clear():
    with pytest.raises(InvalidConfigError, match=r"a verifier is named by a str .*got int 5"):
        specdec.registry.get("verifier", 5)


@pytest.mark.parametrize(("tree", "option"), [("chain", "depth"), ("eagle", "depth"), ("eagle", "N"), ("rheo", "K")])
def test_tree_sizes_have_an_upper_bound(tree, option):
    target, draft = _models()
    with pytest.raises(InvalidConfigError, match=f"{option} must be an int <= 65535, got 1000000000"):
        specdec.SpeculativeGenerator(target=target, draft=draft, method=None, tree=tree, verifier="match",
                                     **{option: 10**9})


def test_nan_errors_name_the_model_that_produced_them():
    nan = CallableLM(lambda prefixes: torch.full((len(prefixes), V), float("nan")), vocab_size=V)
    nan.begin([1])
    with pytest.raises(InvalidDistributionError, match=r"the logits of the draft \(CallableLM\) contain NaN"):
        nan.root_distribution(S())
    with pytest.raises(InvalidDistributionError, match=r"the logits of the draft \(CallableLM\) contain NaN"):
        nan.expand([0], [2], S())
    # the step path (every built-in method) names them too
    good = CallableLM(lambda prefixes: torch.zeros(len(prefixes), V), vocab_size=V)
    for target, draft, who in ((good, nan, "the draft's logits"), (nan, good, "the target's logits")):
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="specinfer")
        with pytest.raises(InvalidDistributionError, match=who):
            gen.generate([1], 4, S(), seed=0)
