"""Exact whole-tree losslessness harness (docs/concepts.md, "How losslessness is proved", layer 2).

A second-order Markov target and draft over a tiny vocabulary; every random
draw of the builder and of the verifier is enumerated by
:func:`specdec.testing.exact_law`, steps are chained exactly (a new tree from
each new context), and the joint law of the first ``depth + 1`` emitted
tokens is compared with the target's own law.

Chaining: the law of one speculative step depends only on the last two
committed tokens (both models are order 2, every step starts a fresh tree),
so the law of the first ``L`` tokens is the exact composition
``sum_t P(step emits t) * law(first L - |t| tokens | context + t)``, with
each step's law enumerated by ``exact_law`` over the real builder + target +
verifier code. :func:`whole_program_law` runs the literal single program
(all steps inside one ``exact_law``) for a small case, and the tests check
that both agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import ExactLaws, MarkovLM, exact_law
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier
from specdec.trees import build_tree

PROMPT = (0, 1)


def log_table(probs: torch.Tensor) -> torch.Tensor:
    """Logits ``log(table)`` (``-inf`` for zeros), float64."""
    probs = probs.to(torch.float64)
    probs = probs / probs.sum(-1, keepdim=True)
    return torch.where(probs > 0, probs.log(), torch.full_like(probs, float("-inf")))


def random_table(vocab: int, seed: int, zero_fraction: float = 0.25) -> torch.Tensor:
    """A random ``[V, V, V]`` second-order table of probabilities (float64)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(vocab, vocab, vocab, generator=g, dtype=torch.float64) + 0.05
    drop = torch.rand(vocab, vocab, vocab, generator=g, dtype=torch.float64) < zero_fraction
    keep = torch.nn.functional.one_hot(raw.argmax(-1), vocab).bool()
    raw = raw.masked_fill(drop & ~keep, 0.0)
    return raw / raw.sum(-1, keepdim=True)


def tied_draft_table(vocab: int, seed: int) -> torch.Tensor:
    """A draft table with exact ties: one-hot rows, rows with q(top1) = 1/2
    (so with K - m = 1 the residual mass 1/2 ties the top-1), equal siblings."""
    table = random_table(vocab, seed)
    half = torch.zeros(vocab, dtype=torch.float64)
    half[0] = 0.5
    half[1:] = 0.5 / (vocab - 1)
    for a in range(vocab):
        for b in range(vocab):
            kind = (a * vocab + b + seed) % 4
            if kind == 0:
                row = torch.zeros(vocab, dtype=torch.float64)
                row[(a + b) % vocab] = 1.0
            elif kind == 1:
                row = half.roll((a + 2 * b) % vocab)
            elif kind == 2:
                row = torch.zeros(vocab, dtype=torch.float64)
                row[b % vocab] = 0.5
                row[(b + 1) % vocab] = 0.5
            else:
                continue
            table[a, b] = row
    return table


class Harness(ExactLaws):
    """:class:`~specdec.testing.ExactLaws` on order-2 Markov models given as probability tables,
    with the tests' names (``law``, ``reference``, ``deviation``) and the literal one-step program
    (:meth:`one_step`) that :func:`whole_program_law` runs."""

    def __init__(
        self,
        builder: TreeBuilder,
        verifier: Verifier,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        sampling: SamplingConfig,
        *,
        max_branches: int = 200_000,
        on_tree: Callable | None = None,
    ) -> None:
        super().__init__(builder, verifier, MarkovLM(log_table(target_probs)), MarkovLM(log_table(draft_probs)),
                         sampling, max_branches=max_branches, on_tree=on_tree)

    def one_step(self, context: Sequence[int], rng) -> tuple[int, ...]:
        """One speculative step from ``context`` through the real lifecycle."""
        self.target.prefill(context)
        self.draft.begin(context)
        tree = build_tree(self.builder, context[-1], self.draft, self.sampling, rng)
        if self.on_tree is not None:
            self.on_tree(tree)
        p = process_logits(self.target.score_tree(tree), self.sampling)
        result = self.verifier.verify(tree, p, rng)
        self.target.accept(result.accepted_nodes, result.bonus_token)
        self.draft.commit(result.tokens)
        return tuple(result.tokens)

    def law(self, context: Sequence[int], num_tokens: int) -> dict[tuple[int, ...], float]:
        """Exact law of the next ``num_tokens`` tokens after ``context``."""
        return self.token_law(context, num_tokens)

    def reference(self, context: Sequence[int], num_tokens: int) -> dict[tuple[int, ...], float]:
        return self.target_law(context, num_tokens)

    def deviation(self, num_tokens: int, context: Sequence[int] = PROMPT) -> float:
        gap = self.check(context, num_tokens)
        assert abs(gap.mass - 1.0) < 1e-9, f"law sums to {gap.mass}"
        return gap.error


def whole_program_law(harness: Harness, num_tokens: int, context: Sequence[int] = PROMPT) -> dict:
    """The literal program: generate until ``num_tokens`` tokens inside ONE exact_law."""

    def program(rng):
        ctx = list(context)
        out: list[int] = []
        while len(out) < num_tokens:
            tokens = harness.one_step(ctx, rng)
            out.extend(tokens)
            ctx.extend(tokens)
        return tuple(out[:num_tokens])

    return exact_law(program, max_branches=harness.max_branches)


T1 = SamplingConfig(temperature=1.0)
WARPED = SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)
GREEDY = SamplingConfig(temperature=0.0)
