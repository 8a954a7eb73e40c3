"""A toy parallel draft whose per-position laws are known exactly (docs/drafts.md, "Parallel drafts").

:class:`MarginalMarkovDraft` is a :class:`~specdec.testing.markov.MarkovLM` draft that also has the
parallel form: one call gives, for every row, the exact marginal law of each of the next ``k``
tokens the Markov chain would generate after the row's committed context (at temperature 1,
summed over every path before it), conditioned on the context only. Its first position is the
chain's own next-token law; position ``d > 1`` is the marginal ``sum_path P(path) q(. | path)``,
which :func:`markov_marginals` computes by one matrix product per position (the tests compare it
with an enumeration of the paths).
"""

from __future__ import annotations

from collections.abc import Sequence
import torch

from specdec.drafts.parallel import ParallelDraft
from specdec.errors import InvalidConfigError
from specdec.testing.markov import MarkovLM

__all__ = ["MarginalMarkovDraft", "markov_marginals"]


def markov_marginals(table: torch.Tensor, context: Sequence[int], depth: int) -> torch.Tensor:
    """``[depth, V]`` float64 the marginal law of each of the next ``depth`` tokens of the Markov
    chain with next-token logits ``table`` (``[V] * order + [V]``, temperature 1) after ``context``.

    Raises:
        InvalidConfigError: ``context`` shorter than the chain's order; ``depth < 1``.
    """
    order, V = table.dim() - 1, int(table.shape[-1])
    if len(context) < order or depth < 1:
        raise InvalidConfigError(f"markov_marginals: a context of at least {order} tokens and depth >= 1, "
                                 f"got {len(context)} tokens and depth={depth}")
    probs = torch.softmax(table.double(), dim=-1)  # [V]*order + [V]
    state = torch.zeros([V] * order, dtype=torch.float64)  # law of the last `order` tokens
    state[tuple(int(t) for t in context[-order:])] = 1.0
    laws = []
    for _ in range(depth):
        joint = state.unsqueeze(-1) * probs  # [V]*order + [V]: (last tokens, next token)
        state = joint.sum(0)  # [V]*order: the window moves on by one token
        laws.append(state.reshape(-1, V).sum(0) if order > 1 else state)  # [V] the next token's marginal
    return torch.stack(laws)


class MarginalMarkovDraft(MarkovLM, ParallelDraft):
    """A Markov draft with the parallel form (module docstring): :meth:`block_rows_logits` gives
    ``log`` of :func:`markov_marginals` for each row (one row out of rows mode).

    Args:
        logits: the chain's ``[V] * order + [V]`` next-token logits (as :class:`MarkovLM`).
        block_size: positions one parallel call can give (``>= 1``).
    """

    def __init__(self, logits: torch.Tensor, block_size: int = 4, max_length: int | None = None) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise InvalidConfigError(f"MarginalMarkovDraft block_size must be an integer >= 1, got {block_size!r}")
        super().__init__(logits, max_length=max_length)
        self._block = block_size

    @property
    def block_size(self) -> int:
        return self._block

    def block_rows_logits(self, depth: int, proposal: bool = False) -> torch.Tensor:
        """``[B, depth, V]`` the log-marginals of the next ``depth`` positions of every row."""
        contexts = self.draft_rows if self.draft_rows is not None else [self.draft_context]
        return torch.stack([markov_marginals(self.table, ctx, depth) for ctx in contexts]).log()
