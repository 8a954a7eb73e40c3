"""Shared HF plumbing: truncated copies, masks, the KV cache adapter, the
compaction reference, vocabulary checks."""

from __future__ import annotations

import pytest
import torch
from hf_model_helpers import VOCAB, make_tiny_llama, plain_hidden, plain_logits

from specdec.drafts.hf import HFDraft
from specdec.errors import InvalidConfigError, VocabMismatchError
from specdec.kernels.kv_compact import compact_kv_inplace, compact_kv_reference, kv_keep_index
from specdec.models import hf_cache, hf_common
from specdec.models.hf_common import (
    KVCache,
    additive_mask,
    check_tokenizers_match,
    check_vocab_match,
    forward_tokens,
    truncated_copy,
)


# ---------------------------------------------------------- truncated_copy
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_truncated_copy_shares_weights_and_computes_the_first_layers(impl):
    big = make_tiny_llama(impl, torch.float64, layers=3)
    small = truncated_copy(big, 2)
    assert small.config.num_hidden_layers == 2 and big.config.num_hidden_layers == 3
    assert len(small.model.layers) == 2
    assert small.config._attn_implementation == impl
    big_params = {name: p for name, p in big.named_parameters()}
    shared = 0
    for name, p in small.named_parameters():
        assert p.data_ptr() == big_params[name].data_ptr(), name  # no copy
        assert p.dtype == torch.float64
        shared += 1
    assert shared == len(big_params) - sum(1 for n in big_params if n.startswith("model.layers.2."))
    # its logits are lm_head(norm(h_2)) with h_2 the big model's state after layer 2
    sequence = [5, 17, 3, 88, 41]
    with torch.no_grad():
        expected = big.lm_head(big.model.norm(plain_hidden(big, sequence)[2]))
        got = small(torch.tensor([sequence])).logits[0]
    assert float((got - expected).abs().max()) < 1e-9
    # and it runs as a draft
    draft = HFDraft(small)
    draft.begin(sequence)
    assert float((draft.root_logits() - expected[-1]).abs().max()) < 1e-9


def test_truncated_copy_of_a_tied_model_stays_tied():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )
    big = transformers.LlamaForCausalLM(config).eval()
    small = truncated_copy(big, 1)
    assert small.lm_head.weight.data_ptr() == big.model.embed_tokens.weight.data_ptr()
    assert small.model.embed_tokens.weight.data_ptr() == big.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("bad", [0, 4, -1, 1.5, True])
def test_truncated_copy_rejects_bad_layer_counts(bad):
    with pytest.raises(InvalidConfigError, match="num_layers"):
        truncated_copy(make_tiny_llama(layers=3), bad)


# ------------------------------------------------------------------- masks
def test_additive_mask_values_and_dtype():
    allowed = torch.tensor([[True, False, True], [False, True, True]])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        mask = additive_mask(allowed, dtype)
        assert mask.shape == (1, 1, 2, 3) and mask.dtype == dtype
        assert torch.equal(mask[0, 0] == 0, allowed)
        assert bool((mask[0, 0][~allowed] == torch.finfo(dtype).min).all())


# -------------------------------------------------------- KV cache adapter
def test_kv_cache_adapter_compact_and_truncate():
    model = make_tiny_llama("sdpa", torch.float64)
    cache = KVCache(model)
    assert len(cache) == 0 and cache.tensors() == []
    cache.compact(torch.empty(0, dtype=torch.int64))  # nothing cached: no-op
    forward_tokens(model, cache, [1, 2, 3, 4, 5], [0, 1, 2, 3, 4], logits="none")
    tensors = [t.clone() for t in cache.tensors()]
    assert len(tensors) == 2 * model.config.num_hidden_layers
    assert all(t.shape == (1, 2, 5, 16) for t in tensors)
    cache.compact(torch.tensor([0, 2, 4]))
    assert len(cache) == 3
    for before, after in zip(tensors, cache.tensors()):
        assert torch.equal(after, before[:, :, [0, 2, 4]])
    cache.truncate(2)
    assert len(cache) == 2 and torch.equal(cache.tensors()[0], tensors[0][:, :, [0, 2]])
    with pytest.raises(ValueError):
        cache.truncate(3)
    with pytest.raises(ValueError):
        cache.set_tensors(cache.tensors()[:2])


def test_kv_cache_is_one_preallocated_slab_written_in_place():
    model = make_tiny_llama("sdpa", torch.float64, layers=3)
    cache = KVCache(model, capacity=16)
    forward_tokens(model, cache, [1, 2, 3], [0, 1, 2], logits="none")
    assert cache.preallocated and len(cache.slabs) == 1  # every layer on the CPU: one slab
    slab = cache.slabs[0]
    assert slab.slots == 3 and slab.capacity == max(16, hf_common.MIN_CAPACITY)
    storage = slab.buf.data_ptr()
    forward_tokens(model, cache, [4, 5], [3, 4], logits="none")
    assert slab.buf.data_ptr() == storage  # written in place: no concatenation, no new buffer
    for t in cache.tensors():
        assert t.shape[-2] == 5 and t.untyped_storage().data_ptr() == storage


def test_kv_cache_slab_grows_past_its_capacity_and_stays_exact(monkeypatch):
    monkeypatch.setattr(hf_cache, "MIN_CAPACITY", 4)
    model = make_tiny_llama("sdpa", torch.float64)
    cache = KVCache(model, capacity=4)
    sequence = [int(t) for t in torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(0))]
    forward_tokens(model, cache, sequence[:3], [0, 1, 2], logits="none")
    assert cache.slabs[0].capacity == 4
    logits = None
    for i in range(3, 11):  # one token at a time, past the capacity twice
        logits, _ = forward_tokens(model, cache, [sequence[i]], [i], None, logits="last")
    assert cache.slabs[0].capacity == 16 and len(cache) == 11
    assert torch.allclose(logits, plain_logits(model, sequence), atol=1e-9)
    cache.reserve(40)
    assert cache.slabs[0].capacity == 40 and len(cache) == 11


def test_kv_cache_compaction_is_one_gather_per_device_whatever_the_layer_count():
    from specdec.testing.counter import StepCounter

    ops = {}
    for layers in (2, 6):
        model = make_tiny_llama("sdpa", torch.float64, layers=layers)
        cache = KVCache(model)
        forward_tokens(model, cache, [1, 2, 3, 4, 5, 6], list(range(6)), logits="none")
        before = [t.clone() for t in cache.tensors()]
        with StepCounter() as counter:
            cache.compact(torch.tensor([0, 1, 2, 4, 5]), first_moved=3)
        ops[layers] = counter.op_names["step"]
        for old, new in zip(before, cache.tensors(), strict=True):
            assert torch.equal(new, old[:, :, [0, 1, 2, 4, 5]])
    assert ops[2] == ops[6] and ops[2]["index_select"] == 1


def test_forward_tokens_checks_mask_shape_and_mode():
    model = make_tiny_llama()
    cache = KVCache(model)
    with pytest.raises(ValueError, match="allowed must be"):
        forward_tokens(model, cache, [1, 2], [0, 1], torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="logits must be"):
        forward_tokens(model, cache, [1], [0], logits="some")


# ------------------------------------------------------ compaction reference
def test_kv_keep_index_and_compact_reference():
    assert kv_keep_index(0, [0]).tolist() == [0]
    assert kv_keep_index(4, [0, 1, 3]).tolist() == [0, 1, 2, 3, 4, 5, 7]
    with pytest.raises(ValueError):
        kv_keep_index(-1, [0])
    with pytest.raises(ValueError):
        kv_keep_index(2, [-1])
    k = torch.randn(1, 3, 10, 4)
    v = torch.randn(1, 3, 10, 4)
    keep = kv_keep_index(5, [0, 2, 4])
    out_k, out_v = compact_kv_reference([k, v], keep)
    assert out_k.shape == (1, 3, 8, 4)
    assert torch.equal(out_k, k[:, :, [0, 1, 2, 3, 4, 5, 7, 9]]) and torch.equal(out_v, v[:, :, keep])
    assert k.shape == (1, 3, 10, 4)  # inputs untouched
    with pytest.raises(ValueError, match="int64"):
        compact_kv_reference([k], keep.to(torch.int32))
    with pytest.raises(ValueError, match=r"\[B, H, S, D\]"):
        compact_kv_reference([k[0]], keep)


def test_compact_kv_inplace_equals_the_reference():
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        past = int(torch.randint(0, 20, (), generator=g))
        n = int(torch.randint(1, 12, (), generator=g))
        size = int(torch.randint(0, n, (), generator=g))
        nodes = sorted(torch.randperm(n - 1, generator=g)[:size].add(1).tolist())
        keep = kv_keep_index(past, [0, *nodes])
        tensors = [torch.randn(1, 2, past + n, 3, generator=g) for _ in range(4)]
        expected = compact_kv_reference(tensors, keep)
        got = compact_kv_inplace([t.clone() for t in tensors], keep)
        for e, o in zip(expected, got):
            assert torch.equal(e, o), (trial, past, nodes)
    # a keep index with nothing to move only slices
    t = torch.randn(1, 1, 5, 2)
    (view,) = compact_kv_inplace([t], torch.arange(3))
    assert view.data_ptr() == t.data_ptr() and view.shape == (1, 1, 3, 2)
    with pytest.raises(ValueError, match="int64"):
        compact_kv_inplace([t], torch.arange(3, dtype=torch.int32))


# ------------------------------------------------------------ vocabularies
class FakeTokenizer:
    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def test_vocab_checks():
    check_vocab_match(make_tiny_llama().config, make_tiny_llama(seed=3).config)
    with pytest.raises(VocabMismatchError):
        check_vocab_match(make_tiny_llama().config, make_tiny_llama(vocab=50).config)
    check_tokenizers_match(FakeTokenizer({"a": 0, "b": 1}), FakeTokenizer({"b": 1, "a": 0}))
    with pytest.raises(VocabMismatchError, match="first difference"):
        check_tokenizers_match(FakeTokenizer({"a": 0, "b": 1}), FakeTokenizer({"a": 1, "b": 0}))
    with pytest.raises(VocabMismatchError, match="2 vs 3"):
        check_tokenizers_match(FakeTokenizer({"a": 0, "b": 1}), FakeTokenizer({"a": 0, "b": 1, "c": 2}))
