"""``logit_bias``: an additive bias per token on the target's raw logits, as OpenAI's and vLLM's
``logit_bias`` define it (a ``{token id: bias}`` map added to the logits before temperature,
top-k, top-p and min-p).

It is a transform of the *target's* logits, applied where the logits processors are
(docs/generation.md, "Logits processors"): the output law is the processed target law, the
softmax of ``logits + bias`` under the row's sampling. The draft law ``q`` is left as the
draft made it: every registered rule is exact for any proposal law (the rejection rules verify
``p`` against whatever ``q`` drew the children; a deterministic child is accepted by ``p``
alone), so biasing ``q`` too would change only the acceptance rate, never the output law.

- In generation: :class:`LogitBias` is a logits processor (``logits_processor=LogitBias({...})``),
  one map for every row; equal to transformers' ``SequenceBiasLogitsProcessor`` on
  single-token sequences, bit for bit.
- In the engine call: :func:`specdec.engine.serving.verify_for_engine` takes one map per row
  (``logit_bias=[{...}, None, ...]``), made into a ``[B, V]`` tensor by :func:`logit_bias_rows`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from specdec.errors import InvalidConfigError

__all__ = ["LogitBias", "check_logit_bias", "logit_bias_rows"]


def check_logit_bias(bias: object, vocab: int | None = None, name: str = "logit_bias") -> dict[int, float]:
    """``bias`` as a ``{token: bias}`` dict, checked: int token ids ``>= 0`` (``< vocab`` when
    given), finite numbers (a ban is a large negative bias, e.g. ``-100`` as OpenAI caps it).

    Raises:
        InvalidConfigError: not a mapping, a token id that is not an int in range, a bias that is
            not a finite number; naming ``name`` and the entry.
    """
    if not isinstance(bias, Mapping):
        raise InvalidConfigError(f"{name} must be a mapping {{token id: bias}}, got {type(bias).__name__}")
    out: dict[int, float] = {}
    for token, value in bias.items():
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise InvalidConfigError(f"{name}: token id {token!r} must be an int >= 0")
        if vocab is not None and token >= vocab:
            raise InvalidConfigError(f"{name}: token id {token} is outside the vocabulary of {vocab}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidConfigError(f"{name}: the bias of token {token} must be a finite number, got {value!r}")
        out[token] = float(value)
    return out


def _dense(bias: Mapping[int, float], vocab: int, device: torch.device | str) -> torch.Tensor:
    """``[V]`` float32 bias (0 off the map), as transformers' ``length_1_bias``."""
    dense = torch.zeros(vocab, dtype=torch.float32, device=device)
    if bias:
        dense[list(bias)] = torch.tensor(list(bias.values()), dtype=torch.float32, device=device)
    return dense


def logit_bias_rows(biases: Sequence[Mapping[int, float] | None], rows: int, vocab: int,
                    device: torch.device | str) -> torch.Tensor | None:
    """``[B, V]`` float32: row ``b``'s bias (0 where its map is None or has no entry), or None
    when no row has a map (nothing to add). One host-to-device copy.

    Raises:
        InvalidConfigError: not one entry per row, or an entry :func:`check_logit_bias` refuses
            (naming the row).
    """
    if isinstance(biases, (Mapping, str, bytes)) or not isinstance(biases, Sequence):
        raise InvalidConfigError(f"logit_bias must be one mapping (or None) per row, got {type(biases).__name__}")
    if len(biases) != rows:
        raise InvalidConfigError(f"logit_bias: {len(biases)} entries for {rows} rows")
    checked = [None if b is None else check_logit_bias(b, vocab, f"logit_bias row {r}") for r, b in enumerate(biases)]
    if not any(checked):
        return None
    host = torch.zeros(rows, vocab, dtype=torch.float32)
    for r, b in enumerate(checked):
        if b:
            host[r] = _dense(b, vocab, "cpu")
    return host.to(device)


class LogitBias:
    """A logits processor adding ``bias[token]`` to every row's scores (transformers' signature:
    ``(input_ids [b, len], scores [b, V]) -> [b, V]``), for ``logits_processor=``.

    The scores plus the float32 bias in the scores' dtype: transformers'
    ``SequenceBiasLogitsProcessor`` with the same single-token sequences, bit for bit.

    Args:
        bias: ``{token id: bias}`` (checked by :func:`check_logit_bias`; ids against the
            vocabulary at the first call).

    Example:
        >>> import torch
        >>> LogitBias({1: -100.0})(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 3)).tolist()
        [[0.0, -100.0, 0.0]]
    """

    def __init__(self, bias: Mapping[int, float]) -> None:
        self.bias = check_logit_bias(bias)
        self._dense: torch.Tensor | None = None  # [V] float32 on the scores' device, made at the first call

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        if self._dense is None or self._dense.shape[0] != vocab or self._dense.device != scores.device:
            check_logit_bias(self.bias, vocab)
            self._dense = _dense(self.bias, vocab, scores.device)
        bias = torch.zeros_like(scores)  # [b, V] in the scores' dtype, as transformers' (+= rounds the float32 bias)
        bias += self._dense
        return scores + bias

    def __repr__(self) -> str:
        return f"LogitBias({self.bias!r})"
