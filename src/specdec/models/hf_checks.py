"""Checks of what a caller hands a Hugging Face model: prompt and token ids,
positions against the context, and target / draft vocabularies.

Every check raises a :mod:`specdec.errors` error (or ``ValueError``) that says
what is wrong. Part of the plumbing gathered in :mod:`specdec.models.hf_common`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec.errors import ContextOverflowError, VocabMismatchError

__all__ = ["check_context", "check_prompt", "check_tokenizers_match", "check_tokens", "check_vocab_match"]


def check_prompt(prompt_ids: Sequence[int], vocab_size: int, max_length: int | None) -> list[int]:
    """Validate a prompt and return it as a list of ints.

    Raises:
        ValueError: empty prompt or a token outside ``[0, vocab_size)``.
        ContextOverflowError: the prompt is longer than ``max_length``.
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt must contain at least one token")
    tokens = check_tokens(prompt_ids, vocab_size, "prompt")
    if max_length is not None and len(tokens) > max_length:
        raise ContextOverflowError(f"the prompt has {len(tokens)} tokens; the model's context is {max_length} positions")
    return tokens


def check_tokens(tokens: Sequence[int] | torch.Tensor, vocab_size: int, what: str = "tokens") -> list[int]:
    """Token ids as a list of ints; ValueError if one lies outside ``[0, vocab_size)``."""
    out = [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    bad = [t for t in out if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{what}: token id {bad[0]} outside the model's vocabulary [0, {vocab_size})")
    return out


def check_context(last_position: int, max_length: int | None, what: str) -> None:
    """ContextOverflowError if position ``last_position`` does not exist (``>= max_length``)."""
    if max_length is not None and last_position >= max_length:
        raise ContextOverflowError(
            f"{what} needs position {last_position}, but the model's context is {max_length} positions "
            f"(0..{max_length - 1}); shorten the prompt, max_new_tokens or the tree depth"
        )


def check_vocab_match(target: Any, draft: Any) -> None:
    """Raise :class:`~specdec.errors.VocabMismatchError` unless the target and
    draft return logits over the same vocabulary size (any objects with a
    ``vocab_size`` attribute: specdec targets/drafts or HF configs).

    Same size is necessary, not sufficient: also compare the tokenizers with
    :func:`check_tokenizers_match` when they are at hand.
    """
    vt, vd = int(target.vocab_size), int(draft.vocab_size)
    if vt != vd:
        raise VocabMismatchError(
            f"target and draft vocabularies differ: target has V = {vt}, draft has V = {vd}; "
            "speculative decoding needs a draft that shares the target's tokenizer"
        )


def check_tokenizers_match(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise :class:`~specdec.errors.VocabMismatchError` unless both HF
    tokenizers map the same strings to the same ids (``get_vocab()``)."""
    a, b = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if a == b:
        return
    diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])
    example = diff[0] if diff else None
    raise VocabMismatchError(
        f"target and draft tokenizers differ ({len(a)} vs {len(b)} entries; first difference: {example!r})"
    )
