"""The public generation API: bad input, EOS, streaming, statistics."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingConfig
from specdec.errors import (
    ContextOverflowError,
    InvalidConfigError,
    InvalidDistributionError,
    UnknownNameError,
    UnsupportedTreeError,
    VocabMismatchError,
)
from specdec.models import CallableLM
from specdec.testing import MarkovLM, random_markov_logits

V = 6


@pytest.fixture
def pair() -> tuple[MarkovLM, MarkovLM]:
    g = torch.Generator().manual_seed(7)
    target = MarkovLM(random_markov_logits(V, 2, g), max_length=64)
    draft = MarkovLM(target.table + torch.randn(target.table.shape, generator=g, dtype=torch.float64))
    return target, draft


def test_vocab_mismatch(pair) -> None:
    target, _ = pair
    other = MarkovLM(random_markov_logits(V + 1, 2, torch.Generator().manual_seed(0)))
    with pytest.raises(VocabMismatchError, match="vocabulary"):
        specdec.SpeculativeGenerator(target=target, draft=other, method="sd")


@pytest.mark.parametrize("prompt", [[], [0, V]])
def test_bad_prompt(pair, prompt) -> None:
    target, draft = pair
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd")
    with pytest.raises(InvalidConfigError, match="prompt"):
        gen.generate(prompt, 4)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_bad_max_new_tokens(pair, n) -> None:
    target, draft = pair
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd")
    with pytest.raises(InvalidConfigError, match="max_new_tokens"):
        gen.generate([0, 1], n)


def test_context_overflow_counts_the_tree(pair) -> None:
    target, draft = pair  # target context: 64 positions
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="eagle2", K=4, depth=4, N=20)
    gen.generate([0, 1], 59, seed=0)  # deepest node at position 2 + 59 - 2 + 4 = 63: fits
    with pytest.raises(ContextOverflowError, match="tree depth"):
        gen.generate([0, 1], 60)  # position 64 does not exist


def test_unknown_method_and_option(pair) -> None:
    target, draft = pair
    with pytest.raises(UnknownNameError, match="Did you mean 'rheo'"):
        specdec.SpeculativeGenerator(target=target, draft=draft, method="rhe")
    with pytest.raises(InvalidConfigError, match="unknown option.*depht"):
        specdec.SpeculativeGenerator(target=target, draft=draft, method="sd", depht=3)


def test_bad_budget(pair) -> None:
    target, draft = pair
    with pytest.raises(InvalidConfigError):
        specdec.SpeculativeGenerator(target=target, draft=draft, method="eagle2", N=0)


def test_incompatible_composition(pair) -> None:
    target, draft = pair
    with pytest.raises(UnsupportedTreeError, match="cannot verify"):
        specdec.SpeculativeGenerator(target=target, draft=draft, method=None, tree="eagle", verifier="rejection-iid")


def test_explicit_composition(pair) -> None:
    target, draft = pair
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=None, tree="static",
                                       verifier="rejection-wor", expansion=(2, 2), mode="wor")
    assert len(gen.generate([0, 1], 10, seed=0).tokens) == 10


def test_bad_sampling_config() -> None:
    with pytest.raises(InvalidConfigError):
        SamplingConfig(temperature=-1)
    with pytest.raises(InvalidConfigError):
        SamplingConfig(top_p=0.0)


def test_nan_logits_are_reported() -> None:
    lm = CallableLM(lambda prefixes: torch.full((len(prefixes), 3), float("nan")), vocab_size=3)
    with pytest.raises(InvalidDistributionError, match="NaN"):
        specdec.autoregressive_generate(lm, [0], 3)


@pytest.mark.parametrize("method", specdec.list_registered("method"))
def test_eos_stops_where_autoregressive_does(pair, method) -> None:
    target, draft = pair
    greedy = SamplingConfig(temperature=0.0)
    full = specdec.autoregressive_generate(target, [0, 1], 30, greedy).tokens
    eos = full[5]  # a token that occurs early in the greedy continuation
    reference = specdec.autoregressive_generate(target, [0, 1], 30, greedy, eos_token_id=eos)
    assert reference.tokens == full[: full.index(eos) + 1] and reference.stop_reason == "eos"
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method)
    out = gen.generate([0, 1], 30, greedy, eos_token_id=[eos])
    assert out.tokens == reference.tokens
    assert out.stop_reason == "eos"


def test_streaming_and_callback_agree(pair) -> None:
    target, draft = pair
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", K=3, depth=3, N=8)
    sampling = SamplingConfig(temperature=0.9)
    seen: list[list[int]] = []
    out = gen.generate([0, 1], 25, sampling, seed=3, callback=seen.append)
    assert [t for chunk in seen for t in chunk] == out.tokens
    streamed = list(gen.stream([0, 1], 25, sampling, seed=3))
    assert streamed == seen
    assert not torch.is_inference_mode_enabled()  # never left on between yields


def test_stats_are_consistent(pair) -> None:
    target, draft = pair
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="eagle2", K=3, depth=3, N=8)
    out = gen.generate([0, 1], 40, SamplingConfig(temperature=1.0), seed=0)
    s = out.stats
    assert s.new_tokens == len(out.tokens) == 40
    assert s.emitted == s.accepted + s.steps  # every step emits its accepted drafts plus one bonus
    assert s.tau == pytest.approx(s.emitted / s.target_forwards)
    assert s.new_tokens <= s.emitted < s.new_tokens + 4  # only the last step is truncated
    assert all(0.0 <= a <= 1.0 for a in s.acceptance_by_depth)
    assert s.depth_attempted[0] == s.steps  # depth 1 is tested in every step (trees are never empty here)
    assert sum(s.depth_accepted) == s.accepted
    assert s.time_total >= s.time_draft + s.time_target + s.time_verify
    assert set(s.as_dict()) >= {"tau", "target_forwards", "acceptance_by_depth", "tokens_per_second"}


def test_seed_reproducible(pair) -> None:
    target, draft = pair
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="specinfer", expansion=(2, 2))
    a = gen.generate([0, 1], 20, SamplingConfig(temperature=1.0), seed=11).tokens
    b = gen.generate([0, 1], 20, SamplingConfig(temperature=1.0), seed=11).tokens
    assert a == b
