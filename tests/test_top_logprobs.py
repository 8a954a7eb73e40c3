"""Top-n log-probabilities in generation (issue 58): ``generate(..., top_logprobs=n)``.

Per emitted token, the ``n`` largest log-probabilities of the law it was drawn from and their
ids (the law of the sampled log-prob: the processed ``p`` at ``T > 0``, the processed logits'
log-softmax at ``T = 0``), computed by the one helper the serving call uses
(:func:`specdec.engine.step.emitted_top_logprobs`). Checked against a direct computation
from the order-1 Markov target's table at each emitted token's context, for single
generations, batches (the engine loop's rows) and the plain autoregressive run.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.errors import InvalidConfigError
from specdec.request import GenerateOptions, stream_request
from specdec.sampling import SamplingConfig, process_logits
from specdec.engine.stats import StepTally
from specdec.testing import markov_pair
from specdec.testing.counter import StepCounter

V = 8
N = 3
PROMPT = [0, 1]
T1 = SamplingConfig(temperature=1.0)
TOPK = SamplingConfig(temperature=0.7, top_k=5)
GREEDY = SamplingConfig(temperature=0.0)


def generator(method: str) -> specdec.SpeculativeGenerator:
    target, draft = markov_pair(V, seed=3)
    return specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="torch")


def direct(target, context: list[int], sampling: SamplingConfig, n: int) -> tuple[list[int], list[float]]:
    """The ``n`` largest log-probabilities of the law of the token after ``context``, and their ids."""
    logits = target.table[context[-1]]  # [V] float64
    law = torch.log_softmax(logits, -1) if sampling.greedy else process_logits(logits, sampling).log()
    values, ids = torch.topk(law, n)
    return ids.tolist(), values.tolist()


def check_against_direct(target, prompt, tokens, logprobs, top, sampling, n=N) -> None:
    assert len(top) == len(tokens) == len(logprobs) > 0
    for i, (tok, pairs) in enumerate(zip(tokens, top)):
        ids, values = direct(target, list(prompt) + tokens[:i], sampling, n)
        assert [t for t, _ in pairs] == ids
        assert max(abs(v - w) for (_, v), w in zip(pairs, values)) < 1e-9
        assert [v for _, v in pairs] == sorted((v for _, v in pairs), reverse=True)
        if tok in ids:  # the sampled log-prob is one of the same law's values
            assert abs(logprobs[i] - values[ids.index(tok)]) < 1e-9


@pytest.mark.parametrize("sampling", [T1, TOPK], ids=["T1", "T0.7-topk5"])
@pytest.mark.parametrize("method", ["sd", "rheo"])
def test_single_generation_top_logprobs_equal_the_direct_law(method, sampling):
    gen = generator(method)
    for seed in range(3):
        out = gen.generate(PROMPT, 10, sampling, seed=seed, top_logprobs=N)
        assert out.logprobs is not None and out.top_logprobs is not None  # n >= 1 implies the sampled log-probs
        assert all(len(pairs) == N for pairs in out.top_logprobs)
        check_against_direct(gen.target, PROMPT, out.tokens, out.logprobs, out.top_logprobs, sampling)
        plain = gen.generate(PROMPT, 10, sampling, seed=seed, return_logprobs=True)
        assert plain.tokens == out.tokens and plain.logprobs == out.logprobs and plain.top_logprobs is None


def test_autoregressive_top_logprobs_equal_the_direct_law():
    target, _ = markov_pair(V, seed=3)
    out = specdec.autoregressive_generate(target, PROMPT, 10, sampling=T1, seed=0, top_logprobs=N)
    assert out.top_logprobs is not None and out.logprobs is not None
    check_against_direct(target, PROMPT, out.tokens, out.logprobs, out.top_logprobs, T1)


@pytest.mark.parametrize("method", ["sd", "rheo"])
def test_greedy_top1_is_the_argmax_and_the_sampled_token(method):
    gen = generator(method)
    out = gen.generate(PROMPT, 10, GREEDY, seed=0, top_logprobs=2)
    assert out.top_logprobs is not None and out.logprobs is not None
    for i, (tok, pairs) in enumerate(zip(out.tokens, out.top_logprobs)):
        context = PROMPT + out.tokens[:i]
        assert pairs[0][0] == int(gen.target.table[context[-1]].argmax()) == tok
        assert pairs[0][1] == out.logprobs[i]
        assert pairs[0][1] >= pairs[1][1]
    check_against_direct(gen.target, PROMPT, out.tokens, out.logprobs, out.top_logprobs, GREEDY, n=2)


@pytest.mark.parametrize("method", ["sd", "rheo"])
def test_batch_rows_top_logprobs_equal_the_direct_law(method):
    """The engine loop's rows (a batch of three prompts, each under its own seed): every row's
    top log-probs are its own tokens' laws."""
    gen = generator(method)
    prompts = [[0, 1], [2, 5], [7, 7]]
    request = GenerateOptions(8, T1, seeds=[4, 5, 6], top_logprobs=N).resolve(prompts, gen.target.device, batch=True)
    assert request.return_logprobs and request.top_logprobs == N
    tallies = [StepTally() for _ in prompts]
    tokens: dict[int, list[int]] = {r: [] for r in range(3)}
    logprobs: dict[int, list[float]] = {r: [] for r in range(3)}
    top: dict[int, list] = {r: [] for r in range(3)}
    for report in stream_request(gen._decoder(), prompts, request, tallies, what="test", batch=True):
        for r, kept in report.kept.items():
            values, ids = report.top_logprobs[r]  # [m, N]
            assert values.shape == ids.shape == (len(kept), N)
            tokens[r] += kept
            logprobs[r] += report.logprobs[r].tolist()
            top[r] += [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    for r, prompt in enumerate(prompts):
        check_against_direct(gen.target, prompt, tokens[r], logprobs[r], top[r], T1)


def test_the_law_is_the_parent_nodes_not_the_tokens_own():
    """Power: the direct law one position off (after the emitted token itself) differs."""
    gen = generator("sd")
    out = gen.generate(PROMPT, 10, T1, seed=0, top_logprobs=N)
    assert out.top_logprobs is not None
    off = [direct(gen.target, PROMPT + out.tokens[: i + 1], T1, N) for i in range(len(out.tokens))]
    assert any([t for t, _ in pairs] != ids or max(abs(v - w) for (_, v), w in zip(pairs, values)) > 1e-3
               for pairs, (ids, values) in zip(out.top_logprobs, off))


@pytest.mark.parametrize("bad", [-1, V + 1, True, 1.5, "3", None])
def test_bad_top_logprobs_is_a_clear_error(bad):
    gen = generator("sd")
    with pytest.raises(InvalidConfigError, match="top_logprobs"):
        gen.generate(PROMPT, 4, T1, seed=0, top_logprobs=bad)
    with pytest.raises(InvalidConfigError, match="top_logprobs"):
        specdec.autoregressive_generate(gen.target, PROMPT, 4, sampling=T1, seed=0, top_logprobs=bad)


def test_top_logprobs_cost_no_host_read_beyond_the_sampled_log_probs():
    gen = generator("rheo")
    counts = {}
    for name, extra in (("logprobs", {"return_logprobs": True}), ("top", {"top_logprobs": N})):
        gen.generate(PROMPT, 4, T1, seed=0, **extra)  # warm-up
        with StepCounter() as counter:
            out = gen.generate(PROMPT, 12, T1, seed=0, **extra)
        counts[name] = (counter.syncs, out.stats.steps)
    assert counts["top"] == counts["logprobs"]
