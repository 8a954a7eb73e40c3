"""Tiny random LLaMA models with a word-level tokenizer and a chat template,
for the ``specdec bench`` tests (no SmolLM2, no download)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

VOCAB = 64
WORDS = [f"w{i}" for i in range(VOCAB - 4)]


def make_tokenizer():
    """A word-level tokenizer over ``[UNK] <eos> <user> <assistant> w0 .. w59`` with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<eos>": 1, "<user>": 2, "<assistant>": 3}
    vocab.update({w: i + 4 for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>",
                                                pad_token="<eos>")
    fast.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return fast


def make_model(seed: int, layers: int = 2, vocab: int = VOCAB):
    """A random float32 ``LlamaForCausalLM`` (hidden 32)."""
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=1, pad_token_id=1,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def save_model(path: Path, seed: int, layers: int = 2, vocab: int = VOCAB, tokenizer: bool = True) -> Path:
    make_model(seed, layers, vocab).save_pretrained(path)
    if tokenizer:
        make_tokenizer().save_pretrained(path)
    return path
