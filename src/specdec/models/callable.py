"""``CallableLM``: a functional language model, usable as target and as draft.

Researchers use it to try ideas without a neural network; specdec's tests use
it for models whose sequence law is known exactly (Markov tables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specdec.drafts.base import DraftModel
from specdec.errors import InvalidDistributionError, VocabMismatchError
from specdec.registry import register
from specdec.targets.base import TargetModel
from specdec.tree import DraftTree
from specdec.tree_batch import TreeBatch

__all__ = ["CallableLM", "LogitsFn"]

LogitsFn = Callable[[list[list[int]]], torch.Tensor]
"""``fn(prefixes) -> logits [len(prefixes), V]``: next-token logits after each
full token prefix (prompt included)."""


@register("draft", "callable")
@register("target", "callable")
class CallableLM(TargetModel, DraftModel):
    """Wrap ``fn(prefixes: list[list[int]]) -> logits [n, V]`` as a model.

    The same object can be the target and the draft of one generator: the two
    roles keep separate state (``target_context`` / ``draft_context``).

    Args:
        fn: maps a batch of full prefixes to raw next-token logits ``[n, V]``
            (use ``log`` of probabilities for a model given by tables; ``-inf``
            marks impossible tokens).
        vocab_size: ``V``.
        max_length: optional context limit, enforced like a real model's.

    Example:
        >>> import torch
        >>> uniform = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 3), vocab_size=3)
        >>> uniform.begin([0]); uniform.root_logits().tolist()
        [0.0, 0.0, 0.0]
    """

    def __init__(self, fn: LogitsFn, vocab_size: int, max_length: int | None = None) -> None:
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        self.fn = fn
        self._vocab_size = vocab_size
        self._max_length = max_length
        self.target_context: list[int] = []
        self.draft_context: list[int] = []
        self._draft_paths: list[list[int]] = [[]]
        self._last_tree: DraftTree | list[int] | None = None
        self.calls = 0

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_length(self) -> int | None:
        return self._max_length

    def _logits(self, prefixes: list[list[int]]) -> torch.Tensor:
        self.calls += 1
        out = self.fn(prefixes)
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != len(prefixes):
            raise InvalidDistributionError(
                f"CallableLM fn must return [n, V] logits for n = {len(prefixes)} prefixes, "
                f"got {getattr(out, 'shape', type(out))}"
            )
        if out.shape[1] != self._vocab_size:
            raise VocabMismatchError(f"CallableLM fn returned V = {out.shape[1]}, expected {self._vocab_size}")
        return out

    @staticmethod
    def _prompt(prompt_ids: Sequence[int]) -> list[int]:
        if len(prompt_ids) == 0:
            raise ValueError("the prompt must contain at least one token")
        return [int(t) for t in prompt_ids]

    # -------------------------------------------------------------- as draft
    def begin(self, prompt_ids: Sequence[int]) -> None:
        self.draft_context = self._prompt(prompt_ids)
        self._draft_paths = [[]]

    def root_logits(self) -> torch.Tensor:
        self._draft_paths = [[]]
        return self._logits([list(self.draft_context)])[0]

    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(parents, torch.Tensor) and isinstance(tokens, torch.Tensor):  # one host read for the level
            parents, tokens = torch.stack([parents.reshape(-1), tokens.reshape(-1).to(parents.dtype)]).tolist()
        new = []
        for parent, token in zip(parents, tokens, strict=True):
            if not 0 <= parent < len(self._draft_paths):
                raise ValueError(f"tree_logits: unknown parent node {parent}")
            path = self._draft_paths[parent] + [int(token)]
            self._draft_paths.append(path)
            new.append(self.draft_context + path)
        if not new:
            return torch.empty(0, self._vocab_size)
        return self._logits(new)

    def commit(self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        self.draft_context.extend(int(t) for t in tokens)
        self._draft_paths = [[]]

    # ------------------------------------------------------------- as target
    def prefill(self, prompt_ids: Sequence[int]) -> None:
        self.target_context = self._prompt(prompt_ids)
        self._last_tree = None

    def score_tree(self, tree: DraftTree) -> torch.Tensor:
        if int(tree.tokens[0]) != self.target_context[-1]:
            raise ValueError("the tree's root must be the last committed token")
        prefixes = [self.target_context + [int(tree.tokens[i]) for i in tree.path_to(n)] for n in range(tree.num_nodes)]
        self._last_tree = tree
        return self._logits(prefixes)

    def score_batch(self, tree: TreeBatch) -> torch.Tensor:
        """``[1, n, V]`` logits of a one-tree batch: tokens and parents read in
        one host copy (this model computes on the host), padding slots get row 0."""
        if tree.batch_size != 1:
            raise NotImplementedError(f"{type(self).__name__} scores one tree per step, got a batch of {tree.batch_size}")
        tokens, parents = torch.stack([tree.tokens[0], tree.parents[0]]).tolist()
        k = int(tree.num_nodes[0])
        if tokens[0] != self.target_context[-1]:
            raise ValueError("the tree's root must be the last committed token")
        paths: list[list[int]] = [[]]
        for i in range(1, k):
            paths.append(paths[parents[i]] + [tokens[i]])
        self._last_tree = tokens[:k]
        logits = self._logits([self.target_context + path for path in paths])  # [k, V]
        pad = tree.node_slots - k
        if pad:
            logits = torch.cat([logits, logits[:1].expand(pad, -1)])
        return logits.unsqueeze(0)

    def accept(self, accepted_nodes: Sequence[int], bonus_token: int) -> None:
        if self._last_tree is None:
            raise RuntimeError("accept() called before score_tree()")
        tokens = self._last_tree if isinstance(self._last_tree, list) else self._last_tree.tokens.tolist()
        self.target_context.extend(int(tokens[int(i)]) for i in accepted_nodes)
        self.target_context.append(int(bonus_token))
        self._last_tree = None
