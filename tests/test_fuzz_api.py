"""Fuzz the public API's argument types and values (issue 16): every call either
succeeds or raises a SpecDecError subclass, or a TypeError/ValueError whose
message names the argument; never a raw exception from deep inside.

Seeded (``derandomize=True``): the same examples every run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specdec
from specdec.errors import SpecDecError
from specdec.testing import MarkovLM

V = 5
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _models():
    g = torch.Generator().manual_seed(0)
    return (MarkovLM(torch.randn(V, V, generator=g, dtype=torch.float64)),
            MarkovLM(torch.randn(V, V, generator=g, dtype=torch.float64)))


TARGET, DRAFT = _models()

junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4), st.binary(max_size=3), st.lists(st.integers(-3, 8), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.builds(lambda x: np.int64(x), st.integers(-5, 10)), st.builds(lambda x: torch.tensor(x), st.integers(-5, 10)),
    st.builds(lambda xs: torch.tensor(xs, dtype=torch.int64), st.lists(st.integers(-2, 8), max_size=4)),
    st.builds(lambda x: torch.tensor([[x, x]]), st.integers(0, 4)),
)
small_ints = st.integers(-2, 12)
names = st.one_of(st.sampled_from(["sd", "specinfer", "sequoia", "eagle2", "rheo", "eagle3", "nope", "", "*"]), junk)


def _acceptable(exc: BaseException, *arguments: str) -> bool:
    """The contract: a SpecDecError, or a TypeError/ValueError naming one of ``arguments``."""
    if isinstance(exc, SpecDecError):
        return True
    if isinstance(exc, (TypeError, ValueError)):
        return any(a in str(exc) for a in arguments)
    return False


def _check(call, *arguments: str):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the point is to see every exception
        assert _acceptable(exc, *arguments), f"raw {type(exc).__name__} escaped: {exc!r}"


@FUZZ
@given(temperature=st.one_of(st.floats(allow_nan=True), junk), top_k=st.one_of(small_ints, junk),
       top_p=st.one_of(st.floats(allow_nan=True), junk))
def test_sampling_config(temperature, top_k, top_p):
    _check(lambda: specdec.SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p),
           "temperature", "top_k", "top_p")


@FUZZ
@given(method=names, kernel=st.one_of(st.sampled_from(["auto", "torch", "triton", "cuda"]), junk),
       compile=st.one_of(st.booleans(), junk), random=st.one_of(st.sampled_from(["torch", "counter"]), junk),
       option=st.sampled_from(["depth", "K", "N", "m", "mode", "num_nodes", "width", "bogus"]),
       value=st.one_of(small_ints, junk))
def test_generator_construction(method, kernel, compile, random, option, value):
    _check(lambda: specdec.SpeculativeGenerator(target=TARGET, draft=DRAFT, method=method, kernel=kernel,
                                                compile=compile, random=random, **{option: value}),
           "method", "kernel", "compile", "random", option)


@FUZZ
@given(target=st.one_of(st.just(TARGET), junk), draft=st.one_of(st.just(DRAFT), junk))
def test_generator_models(target, draft):
    _check(lambda: specdec.SpeculativeGenerator(target=target, draft=draft, method="sd"), "target", "draft")
    _check(lambda: specdec.autoregressive_generate(target, [1], 2), "target")


GEN = {m: specdec.SpeculativeGenerator(target=TARGET, draft=DRAFT, method=m, kernel="torch")
       for m in ("sd", "specinfer", "eagle2", "rheo")}


@FUZZ
@given(method=st.sampled_from(sorted(GEN)), prompt=st.one_of(st.lists(st.integers(-1, V + 1), max_size=4), junk),
       max_new_tokens=st.one_of(small_ints, junk), temperature=st.sampled_from([0.0, 0.5, 1.0]),
       seed=st.one_of(st.integers(-(2**65), 2**65), junk), eos=st.one_of(st.integers(-1, V), junk))
def test_generate(method, prompt, max_new_tokens, temperature, seed, eos):
    gen = GEN[method]
    sampling = specdec.SamplingConfig(temperature=temperature)
    _check(lambda: gen.generate(prompt, max_new_tokens, sampling, seed=seed, eos_token_id=eos),
           "prompt", "max_new_tokens", "seed", "eos_token_id")
    _check(lambda: [c for c in gen.stream(prompt, max_new_tokens, sampling, seed=seed, eos_token_id=eos)],
           "prompt", "max_new_tokens", "seed", "eos_token_id")


@FUZZ
@given(prompt=st.one_of(st.lists(st.integers(-1, V + 1), max_size=4), junk), max_new_tokens=st.one_of(small_ints, junk),
       sampling=st.one_of(st.just(specdec.SamplingConfig()), junk), seed=junk)
def test_autoregressive_generate(prompt, max_new_tokens, sampling, seed):
    _check(lambda: specdec.autoregressive_generate(TARGET, prompt, max_new_tokens, sampling, seed=seed),
           "prompt", "max_new_tokens", "sampling", "seed")


@FUZZ
@given(prompts=st.one_of(st.lists(st.lists(st.integers(-1, V + 1), max_size=3), max_size=3), junk),
       seeds=st.one_of(st.none(), st.lists(st.one_of(st.integers(-3, 3), junk), max_size=3), junk),
       max_new_tokens=st.one_of(small_ints, junk))
def test_generate_batch(prompts, seeds, max_new_tokens):
    from specdec.models import CallableLM

    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), V), vocab_size=V)
    gen = specdec.SpeculativeGenerator(target=lm, draft=CallableLM(lm.fn, V), method="eagle2", K=2, depth=2, N=3)
    _check(lambda: gen.generate_batch(prompts, max_new_tokens, specdec.SamplingConfig(), seeds=seeds),
           "prompts", "seeds", "max_new_tokens")


@FUZZ
@given(role=st.one_of(st.sampled_from(["tree", "verifier", "draft", "method", "target", "nope"]), junk),
       name=names, pattern=st.one_of(st.text(max_size=3), junk))
def test_registry(role, name, pattern):
    _check(lambda: specdec.registry.get(role, name), "role", "name")
    _check(lambda: specdec.registry.list_registered(role, pattern), "role", "pattern")


def test_the_contract_has_power():
    """A raw error from deep inside fails the check; a SpecDecError or a named argument passes."""
    with pytest.raises(AssertionError, match="raw IndexError escaped"):
        _check(lambda: [][1], "prompt")
    with pytest.raises(AssertionError, match="raw TypeError escaped"):
        _check(lambda: int([]), "prompt")  # a TypeError that names nothing of ours
    _check(lambda: specdec.SamplingConfig(temperature=-1.0), "temperature")
    _check(lambda: (_ for _ in ()).throw(ValueError("prompt is bad")), "prompt")
    assert math.isfinite(1.0)
