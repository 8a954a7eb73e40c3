"""The attention implementation is checked (issue 16, defect 2): eager and sdpa
are proven here to honour the tree mask; FlashAttention, flex and paged
attention are refused with the reason; a custom attention is probed once at
construction and refused when it ignores the mask."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import specdec
from specdec.drafts.hf import HFDraft
from specdec.errors import InvalidConfigError
from specdec.models.hf_common import TREE_MASK_ATTENTION, check_attention, probe_tree_attention
from specdec.targets.hf import HFTarget

from hf_model_helpers import make_tiny_llama


def _honest(module, query, key, value, attention_mask, **kwargs):
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _mask_blind(module, query, key, value, attention_mask, **kwargs):
    # plain causal attention over the whole sequence: what a kernel that drops the 4D mask computes
    q, k = query.shape[-2], key.shape[-2]
    causal = torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q)
    mask = torch.zeros(q, k, dtype=query.dtype, device=query.device).masked_fill(~causal, torch.finfo(query.dtype).min)
    return sdpa_attention_forward(module, query, key, value, mask[None, None], **kwargs)


AttentionInterface.register("specdec_test_honest", _honest)
AttentionInterface.register("specdec_test_mask_blind", _mask_blind)


@pytest.mark.parametrize("impl", TREE_MASK_ATTENTION)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eager_and_sdpa_tree_logits_equal_per_path_logits(impl, dtype):
    assert probe_tree_attention(make_tiny_llama(impl, dtype)) < 1e-5


def test_the_probe_has_power_a_mask_blind_attention_differs_by_order_one():
    assert probe_tree_attention(make_tiny_llama("specdec_test_mask_blind", torch.float32)) > 1e-2


@pytest.mark.parametrize(
    ("impl", "reason"),
    [("flash_attention_2", "FlashAttention kernels take no arbitrary 4D mask"),
     ("flash_attention_3", "FlashAttention"),
     ("flex_attention", "transformers builds flex attention's block mask"),
     ("paged|sdpa", "paged attention keeps its own cache")],
)
@pytest.mark.parametrize("wrapper", [HFTarget, HFDraft])
def test_known_unsupported_attentions_are_refused_at_construction(impl, reason, wrapper):
    model = make_tiny_llama("sdpa", torch.float32)
    model.config._attn_implementation = impl  # as from_pretrained(attn_implementation=impl) records it
    with pytest.raises(InvalidConfigError, match=rf"attn_implementation '{impl.replace('|', '[|]')}' is not supported: {reason}.*'eager' and 'sdpa'"):
        wrapper(model)


def test_flex_attention_model_is_refused_before_any_forward():
    model = make_tiny_llama("sdpa", torch.float32)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(InvalidConfigError, match="flex"):
        specdec.SpeculativeGenerator(target=model, draft=make_tiny_llama("sdpa", torch.float32, seed=1), method="sd")


def test_a_custom_attention_that_ignores_the_mask_is_refused_with_the_difference():
    model = make_tiny_llama("specdec_test_mask_blind", torch.float32)
    with pytest.raises(InvalidConfigError, match=r"'specdec_test_mask_blind' ignores the tree mask: .* differ .* by \d"):
        HFTarget(model)
    with pytest.raises(InvalidConfigError, match="ignores the tree mask"):
        HFDraft(model)


def test_a_custom_attention_that_honours_the_mask_is_accepted_and_decodes_as_sdpa():
    honest = make_tiny_llama("specdec_test_honest", torch.float64)
    sdpa = make_tiny_llama("sdpa", torch.float64)
    draft = make_tiny_llama("sdpa", torch.float64, seed=3)
    outs = []
    for target in (honest, sdpa):
        gen = specdec.SpeculativeGenerator(target=HFTarget(target), draft=HFDraft(draft), method="specinfer")
        outs.append(gen.generate([1, 2, 3], 12, specdec.SamplingConfig(temperature=0), seed=0).tokens)
    assert outs[0] == outs[1]


def test_a_custom_attention_that_crashes_is_refused_with_its_cause():
    def broken(module, query, key, value, attention_mask, **kwargs):
        raise RuntimeError("kernel launch failed")

    AttentionInterface.register("specdec_test_broken", broken)
    with pytest.raises(InvalidConfigError, match="failed on a probe tree .*kernel launch failed"):
        check_attention(make_tiny_llama("specdec_test_broken", torch.float32), "HFTarget")


def test_a_model_left_in_training_mode_with_dropout_warns():
    config = transformers.GPT2Config(vocab_size=31, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).train()  # dropout 0.1
    with pytest.warns(UserWarning, match=r"training mode \(dropout on\).*model.eval\(\)"):
        HFTarget(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        HFTarget(model.eval())  # eval mode: silent
        HFDraft(make_tiny_llama("sdpa", torch.float32).train())  # training mode, every dropout 0: silent
