"""Repetition, presence and frequency penalties on a draft tree, per row, as vLLM applies them.

A penalty depends on the tokens so far, so on a tree every node has its own history: the row's
committed tokens (the prompt, and the output so far) followed by the tokens on the path from the
root to the node, the node's own token last (the node's row of logits predicts the token after it;
docs/generation.md, "Logits processors"). With ``counts`` the number of times each token occurs in
the node's *output* (the committed output and the path) and ``seen`` the tokens of the prompt or of
that output, vLLM's ``apply_penalties`` on the raw logits ``l``:

1. repetition ``r`` (``1`` off): ``l / r`` where ``seen`` and ``l > 0``, ``l * r`` where ``seen``
   and ``l <= 0``;
2. frequency ``f`` (``0`` off): ``l - f * counts``;
3. presence ``p`` (``0`` off): ``l - p * (counts > 0)``.

They transform the *target's* logits (as the logits processors do): the output law is the
processed target law at every node, so every registered rule stays exact (the draft law is left
as drafted; any proposal law is verified exactly). :func:`apply_penalties` computes every node's
counts from the tree's ancestor mask on the device (one ``[B, n, n] @ [B, n, V]`` product, no host
read). In generation, :class:`OutputPenalties` is the same as a logits processor
(``logits_processor=``; transformers' ``RepetitionPenaltyLogitsProcessor`` is the repetition
penalty there), which the loop calls on every node with its own context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import torch

from specdec.errors import InvalidConfigError
from specdec.tree_batch import TreeBatch

__all__ = ["OutputPenalties", "Penalties", "apply_penalties"]


def _numbers(name: str, values: Sequence[float], rows: int, low: float, strict: bool) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != rows:
        raise InvalidConfigError(f"penalties: {name} must be one number per row ({rows}), got {values!r}")
    for b, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
                v <= low if strict else v < low):
            bound = f"> {low}" if strict else "finite"
            raise InvalidConfigError(f"penalties: row {b}: {name} must be a number {bound}, got {v!r}")
    return [float(v) for v in values]


@attrs.frozen(eq=False)
class Penalties:
    """Each row's penalties and the history they read (vLLM's layout), as device tensors.

    Attributes:
        repetition: ``[B]`` float64 (``1``: off), ``> 0``.
        presence: ``[B]`` float64 (``0``: off).
        frequency: ``[B]`` float64 (``0``: off).
        prompt_mask: ``[B, V]`` bool, the tokens of each row's prompt.
        output_counts: ``[B, V]`` int64, each token's count in each row's committed output.
    """

    repetition: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    prompt_mask: torch.Tensor
    output_counts: torch.Tensor

    @classmethod
    def of(cls, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], vocab: int, *,
           repetition: Sequence[float] | None = None, presence: Sequence[float] | None = None,
           frequency: Sequence[float] | None = None, device: torch.device | str = "cpu") -> "Penalties":
        """The rows' penalties from their prompts and committed outputs (token ids, host lists).

        Raises:
            InvalidConfigError: not one entry per row; a penalty that is not a finite number (a
                repetition penalty ``<= 0``); a token id outside ``[0, vocab)``; naming the row.
        """
        rows = len(prompts)
        if len(outputs) != rows:
            raise InvalidConfigError(f"penalties: {len(outputs)} outputs for {rows} prompts")
        rep = _numbers("repetition", [1.0] * rows if repetition is None else repetition, rows, 0.0, True)
        pre = _numbers("presence", [0.0] * rows if presence is None else presence, rows, -math.inf, False)
        fre = _numbers("frequency", [0.0] * rows if frequency is None else frequency, rows, -math.inf, False)
        mask = torch.zeros(rows, vocab, dtype=torch.bool)
        counts = torch.zeros(rows, vocab, dtype=torch.int64)
        for what, lists in (("prompt", prompts), ("output", outputs)):
            for b, ids in enumerate(lists):
                for t in ids:
                    if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                        raise InvalidConfigError(f"penalties: row {b}: {what} token {t!r} is outside [0, {vocab})")
                    if what == "prompt":
                        mask[b, t] = True
                    else:
                        counts[b, t] += 1
        params = torch.tensor([rep, pre, fre], dtype=torch.float64)
        return cls(*(x.to(device) for x in (params[0], params[1], params[2], mask, counts)))


def apply_penalties(logits: torch.Tensor, tree: TreeBatch, penalties: Penalties) -> torch.Tensor:
    """``[B, n, V]`` the penalised ``logits`` (module docstring): every node's row under its own
    history (the committed tokens, then the node's path below the root, its own token last).

    Args:
        logits: ``[B, n, V]`` raw target logits at the tree's slots.
        tree: the ``B`` trees (slot 0 the root, the last committed token).
        penalties: the rows' penalties (``B`` rows, ``V`` columns).

    Raises:
        InvalidConfigError: ``penalties`` of another batch size or vocabulary.
    """
    B, n, V = logits.shape
    if tuple(penalties.output_counts.shape) != (B, V) or tuple(penalties.prompt_mask.shape) != (B, V):
        raise InvalidConfigError(f"penalties: the history is {tuple(penalties.output_counts.shape)} for logits "
                                 f"[{B}, {n}, {V}] (one row of V per batch row)")
    dev, dtype = logits.device, logits.dtype
    slots = torch.arange(n, device=dev).view(1, n)
    path = (slots > 0) & (slots < tree.num_nodes.to(dev).view(B, 1))  # [B, n] the nodes below the root
    onehot = torch.zeros(B, n, V, dtype=torch.float32, device=dev)
    onehot.scatter_(-1, tree.tokens.to(dev).clamp_min(0).unsqueeze(-1), path.to(torch.float32).unsqueeze(-1))
    on_path = torch.bmm(tree.ancestors.to(dev).to(torch.float32), onehot)  # [B, n, V] counts on each path
    counts = penalties.output_counts.to(dev).unsqueeze(1) + on_path.round().long()  # [B, n, V]
    out_mask = counts > 0
    seen = out_mask | penalties.prompt_mask.to(dev).unsqueeze(1)  # [B, n, V]
    r = penalties.repetition.to(dev, dtype).view(B, 1, 1).expand(B, n, V)
    r = torch.where(seen, r, torch.ones_like(r))
    x = torch.where(logits > 0, logits / r, logits * r)
    x = x - penalties.frequency.to(dev, dtype).view(B, 1, 1) * counts.to(dtype)
    return x - penalties.presence.to(dev, dtype).view(B, 1, 1) * out_mask.to(dtype)


class OutputPenalties:
    """vLLM's presence and frequency penalties as a logits processor (transformers' signature:
    ``(input_ids [b, len], scores [b, V]) -> [b, V]``), for ``logits_processor=`` of one prompt
    (or a batch of prompts of one length): a token's count is its count in
    ``input_ids[:, prompt_length:]``, the output so far (on a tree: the committed output and the
    node's path, which the loop passes as the context).

    Args:
        prompt_length: the prompt's length (the tokens before it are not counted).
        presence: subtracted once from every token that occurs in the output (``0``: off).
        frequency: subtracted per occurrence (``0``: off).

    Raises:
        InvalidConfigError: a penalty that is not a finite number, a ``prompt_length`` that is
            not an int ``>= 0``; at a call, ``input_ids`` shorter than ``prompt_length``.
    """

    def __init__(self, prompt_length: int, *, presence: float = 0.0, frequency: float = 0.0) -> None:
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 0:
            raise InvalidConfigError(f"OutputPenalties: prompt_length must be an int >= 0, got {prompt_length!r}")
        self.presence = _numbers("presence", [presence], 1, -math.inf, False)[0]
        self.frequency = _numbers("frequency", [frequency], 1, -math.inf, False)[0]
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] < self.prompt_length:
            raise InvalidConfigError(f"OutputPenalties: a context of {input_ids.shape[-1]} tokens is shorter than "
                                     f"prompt_length={self.prompt_length} (prompts of another length?)")
        output = input_ids[:, self.prompt_length:]  # [b, len - prompt_length]
        counts = torch.zeros(scores.shape, dtype=torch.int64, device=scores.device)  # [b, V]
        counts.scatter_add_(-1, output.to(scores.device), torch.ones_like(output, device=scores.device))
        scores = scores - self.frequency * counts.to(scores.dtype)
        return scores - self.presence * (counts > 0).to(scores.dtype)
