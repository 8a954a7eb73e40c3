"""Logits processors, log-probabilities and GenerationConfig on a tiny random
Hugging Face Llama (docs/generation.md): at T = 0 every method with
transformers' processors reproduces ``model.generate`` with the same
processors token for token; ``return_logprobs`` gives the processed target
log-probabilities of the emitted text (checked against a teacher-forced
forward); a ``GenerationConfig`` means what it means to transformers, and a
field specdec cannot honour is refused by name."""

from __future__ import annotations

import math

import pytest
import torch

import specdec
from specdec import SamplingConfig
from specdec.errors import InvalidConfigError
from specdec.hf_generation import from_generation_config
from specdec.registry import list_registered
from specdec.sampling import process_logits
from specdec.targets.hf import HFTarget

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    GenerationConfig,
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

GREEDY = SamplingConfig(temperature=0.0)
PROMPT = [5, 17, 42, 8, 3]
EOS = 2  # LlamaConfig's eos_token_id: transformers' generate stops there
NEW = 24
OPTIONS = {
    "sd": {"depth": 3},
    "specinfer": {"expansion": (2, 2, 1)},
    "sequoia": {"num_nodes": 8, "max_depth": 3, "acceptance": (0.6, 0.2, 0.1)},
    "eagle2": {"K": 3, "depth": 3, "N": 8},
    "eagle3": {"K": 3, "depth": 3, "N": 8},
    "rheo": {"K": 3, "m": 1, "M": 8, "depth": 3, "N": 8},
    "sampled-dynamic": {"K": 3, "M": 8, "depth": 3, "N": 8},
}


def tiny_llama(seed: int, vocab: int = 97) -> "transformers.LlamaForCausalLM":
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
    )
    return transformers.LlamaForCausalLM(config).to(torch.float64).eval()


@pytest.fixture(scope="module")
def models():
    return {"target": tiny_llama(0), "draft": tiny_llama(1)}


def hf_generate(model, processors, new: int = NEW, **kwargs) -> list[int]:
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=new, do_sample=False,
                         attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                         logits_processor=processors, pad_token_id=0, **kwargs)
    return out[0, len(PROMPT):].tolist()


def processors():
    return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.8), NoRepeatNGramLogitsProcessor(2)])


@pytest.fixture(scope="module")
def reference(models) -> list[int]:
    ref = hf_generate(models["target"], processors())
    assert ref != hf_generate(models["target"], LogitsProcessorList()), "the processors must change the text"
    ours = specdec.autoregressive_generate(HFTarget(models["target"]), PROMPT, NEW, GREEDY, eos_token_id=EOS,
                                           logits_processor=processors())
    assert ours.tokens == ref
    return ref


@pytest.mark.parametrize("method", list_registered("method"))
def test_greedy_with_processors_equals_transformers_generate(models, reference, method):
    gen = specdec.SpeculativeGenerator(target=models["target"], draft=models["draft"], method=method, kernel="torch",
                                       **OPTIONS.get(method, {}))
    out = gen.generate(PROMPT, NEW, GREEDY, eos_token_id=EOS, logits_processor=processors())
    assert out.tokens == reference
    # the target as its own draft: long accepted paths, so deep nodes' contexts matter
    self_gen = specdec.SpeculativeGenerator(target=models["target"], draft=models["target"], method=method,
                                            kernel="torch", **OPTIONS.get(method, {}))
    assert self_gen.generate(PROMPT, NEW, GREEDY, eos_token_id=EOS, logits_processor=processors()).tokens == reference


def teacher_forced_logprobs(model, tokens: list[int], sampling: SamplingConfig, processor) -> list[float]:
    """Log-probabilities of ``tokens`` after PROMPT from one plain forward, processed
    autoregressively (processor on the sequence so far, then the sampling law)."""
    seq = PROMPT + tokens
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].to(torch.float64)
    out = []
    for t, tok in enumerate(tokens):
        pos = len(PROMPT) + t - 1
        row = processor(torch.tensor([seq[: pos + 1]]), logits[pos : pos + 1].clone())[0]
        if sampling.greedy:
            out.append(float(torch.log_softmax(row, -1)[tok]))
        else:
            out.append(math.log(float(process_logits(row, sampling)[tok])))
    return out


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.8, top_k=20, top_p=0.9), GREEDY], ids=["warped", "T0"])
@pytest.mark.parametrize("method", ["rheo", "specinfer", "sd"])
def test_logprobs_are_the_processed_target_logprobs(models, method, sampling):
    gen = specdec.SpeculativeGenerator(target=models["target"], draft=models["target"], method=method, kernel="torch",
                                       **OPTIONS.get(method, {}))
    out = gen.generate(PROMPT, 16, sampling, seed=3, logits_processor=processors(), return_logprobs=True)
    assert len(out.logprobs) == len(out.tokens) == 16
    expected = teacher_forced_logprobs(models["target"], out.tokens, sampling, processors())
    assert max(abs(a - b) for a, b in zip(out.logprobs, expected)) < 1e-5
    # autoregressive decoding's log-probs of its own text agree with the same definition
    ar = specdec.autoregressive_generate(models["target"], PROMPT, 16, sampling, seed=3, logits_processor=processors(),
                                         return_logprobs=True)
    expected_ar = teacher_forced_logprobs(models["target"], ar.tokens, sampling, processors())
    assert max(abs(a - b) for a, b in zip(ar.logprobs, expected_ar)) < 1e-5
    if sampling.greedy:
        assert ar.tokens == out.tokens and max(abs(a - b) for a, b in zip(ar.logprobs, out.logprobs)) < 1e-6


def test_logprobs_are_truncated_with_the_tokens(models):
    gen = specdec.SpeculativeGenerator(target=models["target"], draft=models["target"], method="sd", depth=4)
    out = gen.generate(PROMPT, 7, GREEDY, return_logprobs=True)
    assert len(out.tokens) == len(out.logprobs) == 7
    assert gen.generate(PROMPT, 7, GREEDY).logprobs is None


def test_generation_config_greedy_equals_transformers(models):
    config = GenerationConfig(max_new_tokens=NEW, repetition_penalty=1.8, no_repeat_ngram_size=2,
                              suppress_tokens=[7, 11], pad_token_id=0, eos_token_id=EOS)
    ref = models["target"].generate(torch.tensor([PROMPT]), generation_config=config,
                                    attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long))[0, len(PROMPT):].tolist()
    gen = specdec.SpeculativeGenerator(target=models["target"], draft=models["draft"], method="rheo", kernel="torch",
                                       **OPTIONS["rheo"])
    assert gen.generate(PROMPT, sampling=config).tokens == ref  # max_new_tokens from the config
    assert specdec.autoregressive_generate(models["target"], PROMPT, sampling=config).tokens == ref


def test_generation_config_fields_are_mapped():
    config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.9, max_length=30, eos_token_id=[2, 3],
                              min_new_tokens=4, bad_words_ids=[[5]])
    hf = from_generation_config(config, prompt_length=10)
    assert hf.sampling == SamplingConfig(temperature=0.7, top_k=50, top_p=0.9)  # transformers' default top_k when sampling
    assert hf.max_new_tokens == 20 and hf.eos_token_id == (2, 3)
    assert [type(p).__name__ for p in hf.processors] == ["NoBadWordsLogitsProcessor", "MinNewTokensLengthLogitsProcessor"]
    greedy = from_generation_config(GenerationConfig(temperature=0.5, top_k=3, max_new_tokens=5), prompt_length=3)
    assert greedy.sampling.greedy and len(greedy.processors) == 0  # do_sample unset = greedy
    explicit = from_generation_config(GenerationConfig(max_new_tokens=5, eos_token_id=1), 3, max_new_tokens=9,
                                      eos_token_id=4)
    assert (explicit.max_new_tokens, explicit.eos_token_id) == (9, 4)


@pytest.mark.parametrize("fields,named", [
    ({"num_beams": 4}, "num_beams"),
    ({"do_sample": True, "epsilon_cutoff": 0.1}, "epsilon_cutoff"),  # (min_p is mapped: tests/test_min_p.py)
    ({"typical_p": 0.5, "output_scores": True}, "output_scores"),
    ({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha"),
])
def test_unsupported_generation_config_fields_are_named(models, fields, named):
    config = GenerationConfig(max_new_tokens=4, **fields)
    with pytest.raises(InvalidConfigError, match=named):
        from_generation_config(config, 3)
    gen = specdec.SpeculativeGenerator(target=models["target"], draft=models["draft"], method="sd")
    with pytest.raises(InvalidConfigError, match=named):
        gen.generate(PROMPT, sampling=config)


def test_generation_config_in_batches_is_the_batch_one_config(models):
    """Batches take a GenerationConfig (every row equals its batch-1 generate: tests/test_entry_points.py);
    one whose processors count from the prompt's length is refused for prompts of different lengths."""
    gen = specdec.SpeculativeGenerator(target=models["target"], draft=models["draft"], method="sd")
    config = GenerationConfig(max_new_tokens=4, min_new_tokens=2, eos_token_id=EOS)
    out = gen.generate_batch([PROMPT, PROMPT[::-1]], sampling=config, seed=3)
    assert [list(t) for t in out.tokens] == [gen.generate(p, sampling=config, seed=3 + b).tokens
                                             for b, p in enumerate([PROMPT, PROMPT[::-1]])]
    with pytest.raises(InvalidConfigError, match="min_new_tokens=2 counts from each prompt's own length"):
        gen.generate_batch([PROMPT, PROMPT[:2]], sampling=config)
