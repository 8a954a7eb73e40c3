"""Fresh models for a training run, started from the target: EAGLE heads, draft LMs, the draft vocabulary.

:func:`new_head` builds an EAGLE-2 or EAGLE-3 head of the reference shape for
a target (EAGLE-3 warm-started from the target's final norm and LM head);
:func:`make_draft_lm` a small causal LM initialised from the target's first
layers; :func:`count_tokens` and :func:`draft_vocab_from_counts` choose
EAGLE-3's draft vocabulary, the most frequent target ids of the training
stream.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from specdec._extras import needs_extra
from specdec.drafts.eagle.head import EagleConfig, EagleHead, target_embeddings
from specdec.errors import InvalidConfigError

__all__ = ["new_head", "make_draft_lm", "count_tokens", "draft_vocab_from_counts"]


def new_head(target_model: Any, version: int, *, draft_vocab: torch.Tensor | None = None,
             seed: int = 0) -> EagleHead:
    """A freshly initialised EAGLE head for ``target_model`` (reference shape).

    EAGLE-3 also copies the target's final norm and the LM-head rows of the
    draft vocabulary into its own ``norm`` / ``lm_head`` (a warm start).
    """
    torch.manual_seed(seed)
    cfg = EagleConfig.for_target(target_model.config, version,
                                 draft_vocab_size=None if draft_vocab is None else int(draft_vocab.numel()))
    embed, lm_head = target_embeddings(target_model)
    head = EagleHead(cfg, embed.float(), lm_head.float() if version == 2 else None)
    if version == 3:
        if draft_vocab is not None:
            head.set_draft_vocab(draft_vocab)
        with torch.no_grad():
            head.lm_head.weight.copy_(lm_head.float()[head.draft_to_target])
            norm = getattr(getattr(target_model, "model", None), "norm", None)
            if norm is not None and getattr(norm, "weight", None) is not None:
                w = norm.weight.float()
                if type(norm).__name__.startswith("Gemma"):  # Gemma's RMSNorm scales by (1 + weight)
                    w = 1.0 + w
                head.norm.weight.copy_(w)
    return head



def make_draft_lm(target_model: Any, num_layers: int = 2, init_from_target: bool = True) -> Any:
    """A small causal LM at the target's width whose embedding and LM head are
    the target's (frozen), initialised from the target's first ``num_layers``
    decoder layers and final norm.

    A LLaMA target (SmolLM2) gets a ``LlamaForCausalLM`` (the shipped draft
    LM's architecture); any other (Gemma 2/3, Mistral, ...) a model of the
    target's own class with ``num_layers`` layers, the target's first
    ``num_layers`` layer types (sliding or full attention) and the rest of its
    configuration (norm convention, embedding scale, rotary bases)."""
    tc = target_model.config
    if getattr(tc, "model_type", None) != "llama":
        return _same_class_draft_lm(target_model, num_layers, init_from_target)
    with needs_extra("train", "make_draft_lm"):
        from transformers import LlamaConfig, LlamaForCausalLM

    heads = int(tc.num_attention_heads)
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=int(getattr(tc, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(tc, "head_dim", None) or tc.hidden_size // heads),
        max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
        rope_parameters=getattr(tc, "rope_parameters", None) or {"rope_type": "default",
                                                                   "rope_theta": getattr(tc, "rope_theta", 10000.0)},
        tie_word_embeddings=bool(getattr(tc, "tie_word_embeddings", False)),
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=getattr(tc, "pad_token_id", None),
    )
    model = LlamaForCausalLM(cfg)
    embed, lm_head = target_embeddings(target_model)
    dtype = embed.dtype
    # transformers wraps PreTrainedModel.to in functools.wraps, whose stub mypy does not bind to the instance
    model = model.to(dtype)  # type: ignore[arg-type]
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        if not cfg.tie_word_embeddings:
            model.lm_head.weight.copy_(lm_head)
        if init_from_target:
            src_layers = target_model.model.layers
            for i in range(min(num_layers, len(src_layers))):
                model.model.layers[i].load_state_dict(src_layers[i].state_dict())
            model.model.norm.load_state_dict(target_model.model.norm.state_dict())
    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    return model


def _same_class_draft_lm(target_model: Any, num_layers: int, init_from_target: bool) -> Any:
    """:func:`make_draft_lm` for a non-LLaMA target: the target's class, ``num_layers`` layers."""
    tc = target_model.config
    if num_layers < 1 or num_layers > int(tc.num_hidden_layers):
        raise InvalidConfigError(f"a draft LM of {num_layers} layers from a target of {tc.num_hidden_layers}")
    cfg = copy.deepcopy(tc)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types[:num_layers])
    attn = getattr(tc, "_attn_implementation", None) or "sdpa"
    model = type(target_model)._from_config(cfg, attn_implementation=attn)
    embed, lm_head = target_embeddings(target_model)
    model = model.to(embed.dtype)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(embed)
        if not getattr(cfg, "tie_word_embeddings", False):
            model.get_output_embeddings().weight.copy_(lm_head)
        if init_from_target:
            for i in range(num_layers):
                model.model.layers[i].load_state_dict(target_model.model.layers[i].state_dict())
            model.model.norm.load_state_dict(target_model.model.norm.state_dict())
    model.get_input_embeddings().weight.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(False)
    return model


# ------------------------------------------------------- draft vocabulary
def count_tokens(batches: Any, vocab_size: int, n_batches: int) -> torch.Tensor:
    """``[V]`` token counts over the first ``n_batches`` batches of a stream."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i, ids in enumerate(batches):
        if i >= n_batches:
            break
        counts += torch.bincount(ids.flatten(), minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocab_from_counts(counts: torch.Tensor, draft_vocab_size: int,
                            always: Sequence[int] = ()) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent target ids (ties by id), forcing
    ``always`` (e.g. EOS) in; sorted ascending."""
    counts = counts.clone().double()
    for t in always:
        counts[int(t)] = float("inf")
    order = sorted(range(counts.numel()), key=lambda i: (-counts[i].item(), i))
    return torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)

