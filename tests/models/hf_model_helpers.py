"""Helpers for the Hugging Face model tests: tiny random LLaMA models, plain
reference forwards, random draft trees.

The weights use a large init range (0.2) so logits are O(1-10) and a wrong
mask, position or cache entry changes them far beyond the tolerances.
"""

from __future__ import annotations

import os
import random

import torch
import transformers

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 97


def make_tiny_llama(
    impl: str = "sdpa",
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    *,
    layers: int = 2,
    vocab: int = VOCAB,
    max_positions: int = 256,
):
    """A random ``LlamaForCausalLM``: 2 layers, hidden 64, 4 heads / 2 KV heads, vocab 97."""
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    config._attn_implementation = impl
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval().to(dtype)
    assert model.config._attn_implementation == impl
    return model


def plain_logits(model, sequence: list[int]) -> torch.Tensor:
    """``[V]`` next-token logits after ``sequence`` from a fresh, cache-less forward."""
    with torch.no_grad():
        return model(torch.tensor([sequence])).logits[0, -1].to(torch.float64)


def plain_hidden(model, sequence: list[int]) -> tuple[torch.Tensor, ...]:
    """All hidden states ``[S, H]`` of a fresh forward over ``sequence``."""
    with torch.no_grad():
        out = model(torch.tensor([sequence]), output_hidden_states=True)
    return tuple(h[0] for h in out.hidden_states)


def tolerance(dtype: torch.dtype) -> float:
    """Tolerance on logits of the tiny models (|logits| <= ~10). float64 models
    still take the softmax in float32 on the eager path, hence not 1e-12."""
    return 1e-5 if dtype == torch.float64 else 5e-5


def random_tree(rng: random.Random, root: int, size: int, vocab: int = VOCAB):
    """A random valid DraftTree of ``size`` draft nodes mixing deterministic
    children and sampled children (i.i.d. and without replacement)."""
    from specdec.tree import SampleMode, SparseLaw, TreeAssembler

    asm = TreeAssembler(root, vocab)
    laws: dict[int, tuple[SparseLaw, list[int]]] = {}
    used_det: dict[int, set[int]] = {}
    while len(asm) <= size:
        parent = rng.randrange(len(asm))
        if rng.random() < 0.5:
            taken = used_det.setdefault(parent, set())
            token = rng.choice([t for t in range(vocab) if t not in taken])
            taken.add(token)
            asm.add_deterministic(parent, token, weight=rng.random())
        else:
            if parent not in laws:
                support = rng.sample(range(vocab), 4)
                mode = rng.choice([SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT])
                law = SparseLaw(torch.tensor(support), torch.full((4,), 0.25, dtype=torch.float64), mode)
                laws[parent] = (law, list(support))
            law, remaining = laws[parent]
            if not remaining:
                continue
            token = rng.choice(remaining)
            if law.mode == SampleMode.WITHOUT_REPLACEMENT:
                remaining.remove(token)
            asm.add_sampled(parent, token, law, weight=rng.random())
    return asm.build()

