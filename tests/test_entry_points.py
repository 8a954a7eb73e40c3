"""The public generation entry points share one options record (specdec.request; issue 56, 7).

- ``seed`` / ``seeds`` mean the same everywhere: ``seeds`` one int per prompt, ``seed=s`` the
  seeds ``s, s + 1, ...``; both at once, a wrong-length ``seeds`` and a processor that is not
  callable are refused by name, by every entry point.
- Batches apply logits processors (each row in its own contexts) and take a
  ``GenerationConfig``: every row of a batch equals its batch-1 ``generate`` with the same
  processor (or config) and seed, at T = 0 and T = 1, on order-2 Markov models (exact in float64)
  and on a tiny float64 Llama (the Hugging Face batch mode, ragged prompts).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import specdec
from specdec import SamplingConfig
from specdec.batch import autoregressive_generate_batch, autoregressive_stream_batch, speculative_stream_batch
from specdec.errors import InvalidConfigError
from specdec.testing import MarkovLM, random_markov_logits

sys.path.insert(0, str(Path(__file__).parent / "models"))
from hf_model_helpers import make_tiny_llama  # noqa: E402

V = 6
PROMPTS = [[0, 1], [2, 3, 4], [1, 1], [5, 0, 2, 3]]
SEEDS = [11, 12, 13, 14]
T0 = SamplingConfig(temperature=0.0)
T1 = SamplingConfig(temperature=1.0)


class BanLastAndEvenSums:
    """Bans the context's last token, and token ``sum(context) % V`` when that sum is even:
    a ban that depends on the whole row context, so a row processed in another row's context
    (or in its parent's) draws differently."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        rows = torch.arange(scores.shape[0])
        out[rows, input_ids[:, -1]] = float("-inf")
        total = input_ids.sum(1)
        even = rows[total % 2 == 0]
        out[even, (total % V)[even]] = float("-inf")
        return out


PROCESSORS = {
    "repetition": lambda: LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0)]),
    "ban": lambda: BanLastAndEvenSums(),
}


def markov_pair(seed: int = 3) -> tuple[MarkovLM, MarkovLM]:
    g = torch.Generator().manual_seed(seed)
    return MarkovLM(random_markov_logits(V, 2, g, scale=1.5)), MarkovLM(random_markov_logits(V, 2, g, scale=1.5))


def generator(method: str = "sd", **options: object) -> specdec.SpeculativeGenerator:
    target, draft = markov_pair()
    defaults: dict[str, object] = {"sd": {"depth": 3}, "specinfer": {"expansion": (2, 2, 1)}}.get(method, {})
    return specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="torch",
                                        **{**defaults, **options})


@pytest.mark.parametrize("method", ["sd", "specinfer"])
@pytest.mark.parametrize("sampling", [T0, T1], ids=["T0", "T1"])
@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_batch_rows_with_a_processor_equal_their_batch_one_generation(method, sampling, name):
    gen = generator(method)
    out = gen.generate_batch(PROMPTS, 10, sampling, SEEDS, logits_processor=PROCESSORS[name]())
    plain = gen.generate_batch(PROMPTS, 10, sampling, SEEDS)
    assert out.tokens != plain.tokens  # the processor changes what the rows emit
    streamed: list[list[int]] = [[] for _ in PROMPTS]
    for chunk in gen.stream_batch(PROMPTS, 10, sampling, SEEDS, logits_processor=PROCESSORS[name]()):
        for r, new in chunk.items():
            streamed[r].extend(new)
    for b, prompt in enumerate(PROMPTS):
        ref = gen.generate(prompt, 10, sampling, seed=SEEDS[b], logits_processor=PROCESSORS[name]()).tokens
        assert list(out.tokens[b]) == ref, f"row {b}"
        assert streamed[b] == ref, f"row {b}"


@pytest.mark.parametrize("sampling", [T0, T1], ids=["T0", "T1"])
def test_plain_batch_rows_with_a_processor_equal_their_batch_one_decoding(sampling):
    target, _ = markov_pair()
    processor = BanLastAndEvenSums()
    out = autoregressive_generate_batch(target, PROMPTS, 10, sampling, SEEDS, logits_processor=processor)
    chunks = list(autoregressive_stream_batch(target, PROMPTS, 10, sampling, seed=SEEDS[0], logits_processor=processor))
    for b, prompt in enumerate(PROMPTS):
        ref = specdec.autoregressive_generate(target, prompt, 10, sampling, seed=SEEDS[b], logits_processor=processor)
        assert list(out.tokens[b]) == ref.tokens, f"row {b}"
        assert [t for c in chunks for t in c.get(b, [])] == ref.tokens, f"row {b}"
        assert all(x != y for x, y in zip([prompt[-1], *ref.tokens], ref.tokens))  # the ban held


def test_per_row_sampling_with_a_processor_equals_batch_one():
    gen = generator("sd")
    configs = [T0, T1, SamplingConfig(temperature=0.7, top_k=3), T1]
    processor = PROCESSORS["repetition"]()
    out = gen.generate_batch(PROMPTS, 10, configs, SEEDS, logits_processor=processor)
    for b, prompt in enumerate(PROMPTS):
        ref = gen.generate(prompt, 10, configs[b], seed=SEEDS[b], logits_processor=processor).tokens
        assert list(out.tokens[b]) == ref, f"row {b}"


def test_seed_means_consecutive_seeds_everywhere():
    gen = generator("sd")
    target, _ = markov_pair()
    by_seeds = gen.generate_batch(PROMPTS, 8, T1, seeds=[7, 8, 9, 10]).tokens
    assert gen.generate_batch(PROMPTS, 8, T1, seed=7).tokens == by_seeds
    assert [list(t) for t in by_seeds] == [gen.generate(p, 8, T1, seed=7 + b).tokens for b, p in enumerate(PROMPTS)]
    chunks = list(gen.stream_batch(PROMPTS, 8, T1, seed=7))
    assert [[t for c in chunks for t in c.get(b, [])] for b in range(4)] == [list(t) for t in by_seeds]
    plain = autoregressive_generate_batch(target, PROMPTS, 8, T1, seeds=[7, 8, 9, 10]).tokens
    assert autoregressive_generate_batch(target, PROMPTS, 8, T1, seed=7).tokens == plain
    # the batch form on one prompt: seeds=[s] is seed=s
    assert gen.generate(PROMPTS[1], 8, T1, seeds=[8]).tokens == list(by_seeds[1])
    assert [t for c in gen.stream(PROMPTS[1], 8, T1, seeds=[8]) for t in c] == list(by_seeds[1])
    assert specdec.autoregressive_generate(target, PROMPTS[2], 8, T1, seeds=[9]).tokens == list(plain[2])
    # the default of a batch is unchanged: rows 0 .. B - 1
    assert gen.generate_batch(PROMPTS, 8, T1).tokens == gen.generate_batch(PROMPTS, 8, T1, seed=0).tokens


def _entry_points(gen, target):
    """Each public entry point as ``call(prompts, **kwargs)`` run to its first tokens."""
    return {
        "generate": lambda prompts, **kw: gen.generate(prompts[0], 4, **kw),
        "stream": lambda prompts, **kw: next(gen.stream(prompts[0], 4, **kw)),
        "generate_batch": lambda prompts, **kw: gen.generate_batch(prompts, 4, **kw),
        "stream_batch": lambda prompts, **kw: next(gen.stream_batch(prompts, 4, **kw)),
        "autoregressive_generate": lambda prompts, **kw: specdec.autoregressive_generate(target, prompts[0], 4, **kw),
        "autoregressive_generate_batch": lambda prompts, **kw: autoregressive_generate_batch(target, prompts, 4, **kw),
        "autoregressive_stream_batch": lambda prompts, **kw: next(autoregressive_stream_batch(target, prompts, 4, **kw)),
        "speculative_stream_batch": lambda prompts, **kw: next(speculative_stream_batch(
            target, gen.draft, gen.builder, gen.verifier, prompts, 4, **kw)),
    }


@pytest.mark.parametrize("entry", ["generate", "stream", "generate_batch", "stream_batch", "autoregressive_generate",
                                   "autoregressive_generate_batch", "autoregressive_stream_batch",
                                   "speculative_stream_batch"])
def test_bad_options_are_refused_by_name_by_every_entry_point(entry):
    gen = generator("sd")
    call = _entry_points(gen, gen.target)[entry]
    one = [PROMPTS[0]]
    with pytest.raises(InvalidConfigError, match=r"give seed or seeds, not both .* seed=1 and seeds=\[1\]"):
        call(one, seed=1, seeds=[1])
    with pytest.raises(InvalidConfigError, match=r"seeds must be 1 ints, one per prompt, got 2"):
        call(one, seeds=[1, 2])
    with pytest.raises(InvalidConfigError, match=r"seeds must be a sequence"):
        call(one, seeds=5)
    with pytest.raises(InvalidConfigError, match=r"seed must be an int or None"):
        call(one, seed="3")
    with pytest.raises(InvalidConfigError, match=r"logits_processor must be a callable"):
        call(one, logits_processor=3)
    with pytest.raises(InvalidConfigError, match=r"seed must lie in"):
        call(one, seed=2**64)  # out of range
    call(one, seed=1, logits_processor=BanLastAndEvenSums())  # and the same arguments run


def test_the_entry_points_take_the_same_option_names():
    gen = generator("sd")
    options = {"max_new_tokens", "sampling", "seed", "seeds", "eos_token_id", "logits_processor"}
    for name, fn in [("generate", gen.generate), ("stream", gen.stream), ("generate_batch", gen.generate_batch),
                     ("stream_batch", gen.stream_batch), ("autoregressive_generate", specdec.autoregressive_generate),
                     ("autoregressive_generate_batch", autoregressive_generate_batch),
                     ("autoregressive_stream_batch", autoregressive_stream_batch),
                     ("speculative_stream_batch", speculative_stream_batch)]:
        missing = options - set(inspect.signature(fn).parameters)
        assert not missing, f"{name} lacks {sorted(missing)}"


def test_seed_range_is_checked_for_the_last_row():
    gen = generator("sd")
    with pytest.raises(InvalidConfigError, match=r"seed \+ 3 \(the seed of prompt 3\)"):
        gen.generate_batch(PROMPTS, 4, seed=2**64 - 3)


# ---- GenerationConfig in batches, on a tiny float64 Llama --------------------------------------

HF_PROMPTS = [[5, 17, 42, 8, 3], [9, 4], [33, 2, 61], [7, 7, 7, 7]]


@pytest.fixture(scope="module")
def llamas():
    return make_tiny_llama(seed=0), make_tiny_llama(seed=1)


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_generation_config_batch_rows_equal_their_batch_one_generation(llamas, do_sample):
    target, draft = llamas
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd", depth=3, kernel="torch")
    config = GenerationConfig(do_sample=do_sample, temperature=1.0, top_k=20, repetition_penalty=1.5,
                              no_repeat_ngram_size=2, max_new_tokens=10, suppress_tokens=[0, 1])
    out = gen.generate_batch(HF_PROMPTS, sampling=config, seeds=SEEDS)
    plain = gen.generate_batch(HF_PROMPTS, 10, SamplingConfig(temperature=1.0 if do_sample else 0.0), SEEDS)
    assert out.tokens != plain.tokens  # the config's processors act
    base = autoregressive_generate_batch(gen.target, HF_PROMPTS, sampling=config, seed=SEEDS[0])
    for b, prompt in enumerate(HF_PROMPTS):
        ref = gen.generate(prompt, sampling=config, seed=SEEDS[b]).tokens
        assert list(out.tokens[b]) == ref, f"row {b}"
        assert len(ref) == 10 and not {0, 1} & set(ref)
        assert list(base.tokens[b]) == specdec.autoregressive_generate(gen.target, prompt, sampling=config,
                                                                       seed=SEEDS[b]).tokens, f"row {b}"
        if not do_sample:  # greedy: the speculative rows are the plain rows
            assert out.tokens[b] == base.tokens[b]


def test_generation_config_counting_from_the_prompt_length_needs_one_length(llamas):
    target, draft = llamas
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd", depth=3, kernel="torch")
    for fields, named in (({"min_new_tokens": 3, "eos_token_id": 2, "max_new_tokens": 6}, "min_new_tokens=3"),
                          ({"begin_suppress_tokens": [4], "max_new_tokens": 6}, "begin_suppress_tokens"),
                          ({"forced_eos_token_id": 2, "max_new_tokens": 6}, "forced_eos_token_id=2"),
                          ({"max_length": 12}, "max_length=12")):
        with pytest.raises(InvalidConfigError, match=rf"{named}.*prompts 0 and 1 have different lengths \(5, 2\)"):
            gen.generate_batch(HF_PROMPTS, sampling=GenerationConfig(**fields))
    # prompts of one length share the translation: each row equals its batch-1 generation
    same = [[5, 17, 42], [9, 4, 1], [33, 2, 61]]
    config = GenerationConfig(do_sample=True, top_k=0, min_new_tokens=4, eos_token_id=2, forced_eos_token_id=2,
                              max_length=10, begin_suppress_tokens=[4])
    out = gen.generate_batch(same, sampling=config, seed=3)
    for b, prompt in enumerate(same):
        ref = gen.generate(prompt, sampling=config, seed=3 + b).tokens
        assert list(out.tokens[b]) == ref and ref[-1] == 2 and len(ref) == 7 and 2 not in ref[:4] and ref[0] != 4
