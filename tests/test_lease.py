"""One generation per model at a time (issue 16, defect 1): a second call while
a stream is open, or from another thread, raises ModelBusyError and leaves the
open stream intact; a stream releases its models however it ends."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

import specdec
from specdec.errors import ModelBusyError
from specdec.lease import holder_of
from specdec.testing import markov_pair

V = 6
S = specdec.SamplingConfig


def _models():
    return markov_pair(V)


def _gen(target=None, draft=None):
    t, d = _models()
    return specdec.SpeculativeGenerator(target=target or t, draft=draft or d, method="sd", depth=3)


def test_a_call_while_a_stream_is_open_is_refused_and_the_stream_stays_exact():
    gen = _gen()
    ref = sum(gen.stream([1, 2], 20, S(), seed=0), [])
    it = gen.stream([1, 2], 20, S(), seed=0)
    first = next(it)
    with pytest.raises(ModelBusyError, match=r"the target \(MarkovLM\) is in use by SpeculativeGenerator.stream"):
        gen.generate([5, 4, 3], 10, S(), seed=1)
    assert first + sum(it, []) == ref  # the open stream was not touched
    # the stream ended: the models are free again and give the same text
    assert gen.generate([1, 2], 20, S(), seed=0).tokens == ref


def test_the_draft_is_held_too_and_a_second_generator_on_the_same_models_is_refused():
    target, draft = _models()
    a = _gen(target, draft)
    t2, _ = _models()
    b = specdec.SpeculativeGenerator(target=t2, draft=draft, method="sd", depth=3)  # shares only the draft
    it = a.stream([1], 10, S(), seed=0)
    next(it)
    with pytest.raises(ModelBusyError, match=r"the draft \(MarkovLM\)"):
        next(b.stream([2], 5, S(), seed=0))
    with pytest.raises(ModelBusyError, match="autoregressive_generate|SpeculativeGenerator.stream"):
        specdec.autoregressive_generate(target, [1], 4, S(), seed=0)
    it.close()  # close() releases
    assert holder_of(target) is None and holder_of(draft) is None
    assert len(specdec.autoregressive_generate(target, [1], 4, S(), seed=0).tokens) == 4


def test_an_abandoned_stream_releases_its_models_when_collected():
    gen = _gen()
    it = gen.stream([1, 2], 20, S(), seed=0)
    next(it)
    assert holder_of(gen.target) is not None
    del it
    gc.collect()
    assert holder_of(gen.target) is None
    assert len(gen.generate([1, 2], 5, S(), seed=0).tokens) == 5


def test_an_error_inside_a_generation_releases_its_models():
    gen = _gen()
    with pytest.raises(specdec.SpecDecError):
        gen.generate([1, V + 3], 5, S(), seed=0)  # refused before anything is held
    calls = []

    def boom(chunk):
        calls.append(chunk)
        raise RuntimeError("the caller's callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        gen.generate([1, 2], 10, S(), seed=0, callback=boom)
    assert calls and holder_of(gen.target) is None and holder_of(gen.draft) is None
    assert len(gen.generate([1, 2], 5, S(), seed=0).tokens) == 5


def test_a_second_thread_is_refused_while_the_first_holds_the_models():
    gen = _gen()
    started, release, errors = threading.Event(), threading.Event(), []

    def first():
        it = gen.stream([1, 2], 30, S(), seed=0)
        next(it)
        started.set()
        release.wait(10)
        it.close()

    worker = threading.Thread(target=first, name="stream-thread")
    worker.start()
    try:
        assert started.wait(10)
        try:
            gen.generate([3], 5, S(), seed=1)
        except ModelBusyError as exc:
            errors.append(str(exc))
    finally:
        release.set()
        worker.join(10)
    assert errors and "thread 'stream-thread'" in errors[0]
    assert len(gen.generate([3], 5, S(), seed=1).tokens) == 5


def test_one_model_as_its_own_draft_is_held_once():
    target, _ = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=target, method="sd", depth=2)
    out = gen.generate([1, 2], 8, S(), seed=0)
    assert len(out.tokens) == 8 and out.stats.tau > 1  # the draft is the target: every draft accepted


def test_batched_generation_holds_its_models():
    from specdec.models import CallableLM

    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), V), vocab_size=V)
    gen = specdec.SpeculativeGenerator(target=lm, draft=CallableLM(lm.fn, V), method="eagle2", K=2, depth=2, N=4)
    it = gen.stream_batch([[1, 2], [3]], 6, S(), seeds=[0, 1])
    next(it)
    with pytest.raises(ModelBusyError, match="SpeculativeGenerator.generate_batch"):
        gen.generate([1], 3, S(), seed=0)
    it.close()
    assert len(gen.generate([1], 3, S(), seed=0).tokens) == 3
