"""Checks of the token ids users pass in: prompts and EOS ids (issue 16, defects 5 and 6;
EOS ids inside the target's vocabulary, issue 57).

Seeds too (defect 10): ``None`` or an integer of any integer type in
:data:`SEED_RANGE` (what ``torch.Generator.manual_seed`` takes); ``1.5`` is not
truncated to 1 and ``2**70`` is not a raw overflow.

One rule for every entry point (``SpeculativeGenerator.generate`` / ``stream``,
``autoregressive_generate``, the batched forms): a prompt is *one* sequence
of integer token ids (a list or tuple, a 1-D integer tensor or numpy array);
an EOS id is an integer of any integer type (``int``, ``numpy.int64``, a
0-d integer tensor) or a sequence of them. Anything else is refused with an
:class:`~specdec.errors.InvalidConfigError` that says what was given, never
coerced: a ``[2, n]`` tensor is a batch, not a prompt; ``1.0`` is not a
token id; the string ``"12"`` is not ``[1, 2]``.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from specdec.errors import InvalidConfigError

__all__ = ["SEED_RANGE", "as_eos_ids", "as_seed", "as_token_ids"]


def _is_integer(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, numbers.Integral):  # int, numpy integers
        return True
    if isinstance(x, torch.Tensor):
        return x.dim() == 0 and not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool
    return False


def as_token_ids(prompt: Any, what: str = "the prompt") -> list[int]:
    """``prompt`` as a list of Python ints, or a clear error.

    Example:
        >>> as_token_ids([1, 2, 3])
        [1, 2, 3]
        >>> as_token_ids("12")
        Traceback (most recent call last):
        ...
        specdec.errors.InvalidConfigError: the prompt is a string ('12'); give token ids (tokenize it first)
    """
    if isinstance(prompt, (str, bytes)):
        raise InvalidConfigError(f"{what} is a string ({prompt!r}); give token ids (tokenize it first)")
    if isinstance(prompt, dict) or hasattr(prompt, "keys"):
        keys = list(prompt.keys())[:3]
        raise InvalidConfigError(
            f"{what} is a mapping (keys {keys}); pass its token ids, e.g. the tokenizer output's ['input_ids']"
        )
    if isinstance(prompt, torch.Tensor) or type(prompt).__module__.startswith("numpy"):
        shape = tuple(prompt.shape)
        if len(shape) != 1:
            raise InvalidConfigError(
                f"{what} has shape {shape}; give one 1-D sequence of token ids (a 2-D tensor is a batch: "
                "use generate_batch with one prompt per row)"
            )
        kind = str(prompt.dtype)
        if "float" in kind or "complex" in kind or "bool" in kind:
            raise InvalidConfigError(f"{what} has dtype {kind}; token ids are integers")
        return [int(t) for t in prompt.tolist()]
    try:
        items = list(prompt)
    except TypeError:
        raise InvalidConfigError(f"{what} must be a sequence of token ids, got {type(prompt).__name__}") from None
    for i, t in enumerate(items):
        if not _is_integer(t):
            if isinstance(t, (list, tuple)) or (isinstance(t, torch.Tensor) and t.dim() > 0):
                raise InvalidConfigError(
                    f"{what} holds a sequence at position {i}; give one flat sequence of token ids "
                    "(several prompts: use generate_batch)"
                )
            raise InvalidConfigError(f"{what}: position {i} holds {t!r} ({type(t).__name__}), not an integer token id")
    return [int(t) for t in items]


def as_eos_ids(eos_token_id: Any, vocab_size: int | None = None) -> set[int]:
    """The EOS ids as a set of ints (empty for None), or a clear error.

    Args:
        eos_token_id: an integer id, a sequence of them, or None.
        vocab_size: the target's ``V``: every id must lie in ``[0, V)`` (an id the target
            cannot emit would never stop generation), checked where the prompt's ids are.

    Example:
        >>> sorted(as_eos_ids(2)), sorted(as_eos_ids([2, 7], vocab_size=8))
        ([2], [2, 7])
    """
    ids = _eos_ids(eos_token_id)
    if vocab_size is not None:
        bad = sorted(e for e in ids if not 0 <= e < vocab_size)
        if bad:
            raise InvalidConfigError(
                f"eos_token_id {bad[0]} is outside the target's vocabulary [0, {vocab_size}): "
                "the target can never emit it, so it would never stop generation"
            )
    return ids


def _eos_ids(eos_token_id: Any) -> set[int]:
    if eos_token_id is None:
        return set()
    if _is_integer(eos_token_id):
        return {int(eos_token_id)}
    if isinstance(eos_token_id, (str, bytes)):
        raise InvalidConfigError(f"eos_token_id is a string ({eos_token_id!r}); give the id as an int")
    if isinstance(eos_token_id, torch.Tensor) or type(eos_token_id).__module__.startswith("numpy"):
        if eos_token_id.ndim != 1:
            raise InvalidConfigError(f"eos_token_id has shape {tuple(eos_token_id.shape)}; give an int or a 1-D sequence")
        eos_token_id = eos_token_id.tolist()
    try:
        items = list(eos_token_id)
    except TypeError:
        raise InvalidConfigError(
            f"eos_token_id must be an int or a sequence of ints, got {type(eos_token_id).__name__}"
        ) from None
    bad = [e for e in items if not _is_integer(e)]
    if bad:
        raise InvalidConfigError(f"eos_token_id holds {bad[0]!r} ({type(bad[0]).__name__}), not an integer id")
    return {int(e) for e in items}


SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
"""The seeds accepted, inclusive: what ``torch.Generator.manual_seed`` takes."""


def as_seed(seed: Any, what: str = "seed") -> int | None:
    """``seed`` as a Python int (or None: seeded from entropy), or a clear error.

    Example:
        >>> as_seed(7), as_seed(None)
        (7, None)
    """
    if seed is None:
        return None
    if not _is_integer(seed):
        raise InvalidConfigError(f"{what} must be an int or None, got {type(seed).__name__} {seed!r}")
    value = int(seed)
    low, high = SEED_RANGE
    if not low <= value <= high:
        raise InvalidConfigError(f"{what} must lie in [-2**63, 2**64 - 1], got {value}")
    return value
