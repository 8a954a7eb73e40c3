"""Language models with exactly known sequence laws: Markov tables.

A :class:`MarkovLM` of order ``k`` gives the next-token logits as a function
of the last ``k`` tokens. Its exact law over the next few tokens, after the
same :func:`~specdec.sampling.process_logits` the generator applies, is
computed by :meth:`MarkovLM.joint_law`, so end-to-end tests can compare the
generator's output against the truth.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from specdec.models.callable import CallableLM
from specdec.sampling import SamplingConfig, process_logits

__all__ = ["MarkovLM", "markov_pair", "random_markov_logits"]


def random_markov_logits(
    vocab_size: int, order: int, generator: torch.Generator, scale: float = 2.0, zero_fraction: float = 0.0
) -> torch.Tensor:
    """Random logits table ``[V] * order + [V]`` (float64); a fraction of entries set to ``-inf``
    (never a whole row)."""
    shape = [vocab_size] * order + [vocab_size]
    logits = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    if zero_fraction > 0:
        drop = torch.rand(shape, generator=generator, dtype=torch.float64) < zero_fraction
        keep_one = torch.nn.functional.one_hot(logits.argmax(-1), vocab_size).bool()
        logits = logits.masked_fill(drop & ~keep_one, float("-inf"))
    return logits


class MarkovLM(CallableLM):
    """A :class:`~specdec.models.CallableLM` whose logits depend on the last ``order`` tokens.

    Args:
        logits: ``[V] * order + [V]`` table; ``logits[a, b]`` (order 2) are
            the next-token logits after ``... a b``.

    Example:
        >>> import torch
        >>> lm = MarkovLM(torch.log(torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)))
        >>> law = lm.joint_law([0], 2, SamplingConfig(temperature=1.0))
        >>> {k: round(v, 3) for k, v in sorted(law.items())}
        {(0, 0): 0.25, (0, 1): 0.25, (1, 0): 0.5}
    """

    def __init__(self, logits: torch.Tensor, max_length: int | None = None) -> None:
        self.order = logits.dim() - 1
        if self.order < 1 or any(s != logits.shape[-1] for s in logits.shape):
            raise ValueError(f"logits must have shape [V]*order + [V], got {tuple(logits.shape)}")
        self.table = logits
        super().__init__(self._fn, vocab_size=int(logits.shape[-1]), max_length=max_length)

    def _row(self, prefix: Sequence[int]) -> torch.Tensor:
        if len(prefix) < self.order:
            raise ValueError(f"a prefix needs at least {self.order} tokens for an order-{self.order} model")
        return self.table[tuple(prefix[-self.order:])]

    def _fn(self, prefixes: list[list[int]]) -> torch.Tensor:
        return torch.stack([self._row(p) for p in prefixes])

    def joint_law(self, prompt: Sequence[int], num_tokens: int, sampling: SamplingConfig) -> dict[tuple[int, ...], float]:
        """Exact law of the next ``num_tokens`` tokens after ``prompt`` under ``sampling``."""
        probs = process_logits(self.table, sampling)
        law: dict[tuple[int, ...], float] = {}
        for seq in itertools.product(range(self.vocab_size), repeat=num_tokens):
            ctx = list(prompt)
            prob = 1.0
            for tok in seq:
                prob *= float(probs[tuple(ctx[-self.order:])][tok])
                if prob == 0.0:
                    break
                ctx.append(tok)
            if prob > 0.0:
                law[seq] = prob
        return law


def markov_pair(vocab_size: int, seed: int = 0, order: int = 1) -> tuple[MarkovLM, MarkovLM]:
    """A target and a draft: two fresh :class:`MarkovLM` over ``vocab_size``
    tokens with independent random logits (the same pair for the same seed).

    Example:
        >>> target, draft = markov_pair(5)
        >>> target.vocab_size, bool((target.table != draft.table).any())
        (5, True)
    """
    g = torch.Generator().manual_seed(seed)
    return (MarkovLM(random_markov_logits(vocab_size, order, g, scale=1.0)),
            MarkovLM(random_markov_logits(vocab_size, order, g, scale=1.0)))
