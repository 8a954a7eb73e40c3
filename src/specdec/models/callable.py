"""``CallableLM``: a functional language model, usable as target and as draft.

Researchers use it to try ideas without a neural network; specdec's tests use
it for models whose sequence law is known exactly (Markov tables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specdec.drafts.base import OneRowDraft
from specdec.errors import InvalidConfigError, InvalidDistributionError, VocabMismatchError
from specdec.registry import register
from specdec.targets.base import OneRowTarget
from specdec.tree import DraftTree
from specdec.tree_batch import TreeBatch

__all__ = ["CallableLM", "LogitsFn"]

LogitsFn = Callable[[list[list[int]]], torch.Tensor]
"""``fn(prefixes) -> logits [len(prefixes), V]``: next-token logits after each
full token prefix (prompt included)."""


def _looks_like_probabilities(out: torch.Tensor) -> bool:
    """:class:`CallableLM`'s rule: ``V >= 2`` and every row of ``out`` ``[n, V]`` in ``[0, 1]``
    summing to 1 (within ``1e-6``; ``1e-5`` below float64), with some entry strictly between
    0 and 1 (rows of 0s and 1s pass: a one-hot row is plausible logits). One host read."""
    if out.shape[1] < 2 or out.shape[0] == 0 or not out.dtype.is_floating_point:
        return False
    tolerance = 1e-6 if out.dtype == torch.float64 else 1e-5
    x = out.detach()
    in_unit = ((x >= 0) & (x <= 1)).all()  # False where NaN
    sums_to_one = ((x.to(torch.float64).sum(dim=-1) - 1.0).abs() <= tolerance).all()
    fractional = ((x > 0) & (x < 1)).any()
    return bool(in_unit & sums_to_one & fractional)


@register("draft", "callable")
@register("target", "callable")
class CallableLM(OneRowTarget, OneRowDraft):
    """Wrap ``fn(prefixes: list[list[int]]) -> logits [n, V]`` as a model.

    The same object can be the target and the draft of one generator: the two
    roles keep separate state (``target_context`` / ``draft_context``).

    Args:
        fn: maps a batch of full prefixes to raw next-token logits ``[n, V]``
            (use ``log`` of probabilities for a model given by tables; ``-inf``
            marks impossible tokens). Returning probabilities instead of logits
            is refused (:class:`~specdec.errors.InvalidConfigError`, raised by
            the call): for ``V >= 2``, an output every row of which lies in
            ``[0, 1]`` and sums to 1 (within ``1e-6``, ``1e-5`` below float64),
            with at least one entry strictly between 0 and 1, is taken for
            probabilities. Rows of only 0s and 1s (a one-hot row is plausible
            logits) and any row outside the simplex (a negative or ``-inf``
            entry, a sum other than 1) pass; logits essentially never look
            like probabilities otherwise.
            Logits of a non-floating dtype (integer, bool, complex) are refused
            (:class:`~specdec.errors.InvalidDistributionError`, raised by the call).
        vocab_size: ``V``.
        max_length: optional context limit, enforced like a real model's.

    Example:
        >>> import torch
        >>> uniform = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 3), vocab_size=3)
        >>> uniform.begin([0]); uniform.root_logits().tolist()
        [0.0, 0.0, 0.0]
    """

    supports_batch = True
    supports_rows = True

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
        # rows (batch > 1): the target role's contexts (prefill_batch) and the draft role's (begin_rows)
        self.target_rows: list[list[int]] | None = None
        self.draft_rows: list[list[int]] | None = None
        self._row_paths: list[list[list[int]]] = []

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
        if not out.dtype.is_floating_point:
            raise InvalidDistributionError(
                f"CallableLM fn returned {out.dtype} logits; logits must be floating point (e.g. "
                "out.float(); -inf marks an impossible token)"
            )
        if _looks_like_probabilities(out):
            raise InvalidConfigError(
                f"CallableLM fn returned probabilities, not logits: every row of its [{out.shape[0]}, {out.shape[1]}] "
                "output is in [0, 1] and sums to 1. Return logits, e.g. probs.log() (log 0 = -inf marks an "
                "impossible token); probabilities read as logits are a different law (softmax(p) != p)"
            )
        return out

    @staticmethod
    def _prompt(prompt_ids: Sequence[int]) -> list[int]:
        if len(prompt_ids) == 0:
            raise ValueError("the prompt must contain at least one token")
        return [int(t) for t in prompt_ids]

    # -------------------------------------------------------------- as draft
    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        self.draft_context = self._prompt(prompt_ids)
        self._draft_paths = [[]]
        self.draft_rows = None

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
        self.target_rows = None

    def score_tree(self, tree: DraftTree) -> torch.Tensor:
        if int(tree.tokens[0]) != self.target_context[-1]:
            raise ValueError("the tree's root must be the last committed token")
        prefixes = [self.target_context + [int(tree.tokens[i]) for i in tree.path_to(n)] for n in range(tree.num_nodes)]
        self._last_tree = tree
        return self._logits(prefixes)

    def score_batch(self, tree: TreeBatch) -> torch.Tensor:
        """``[1, n, V]`` logits of a one-tree batch: tokens and parents read in
        one host copy (this model computes on the host), padding slots get row 0."""
        if self.target_rows is not None:
            return self._score_rows(tree)
        if tree.batch_size != 1:
            raise ValueError(
                f"a batch of {tree.batch_size} trees after prefill() of one prompt; use prefill_batch() for several rows"
            )
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

    # ------------------------------------------------------ rows (batch > 1)
    # The target role (prefill_batch, score_batch, accept_rows) and the draft
    # role (begin_rows, root_rows_logits, tree_rows_logits, commit_rows) keep
    # separate rows; keep_rows applies to both (one call, even when the same
    # object plays both roles).
    def prefill_batch(self, prompts: Sequence[Sequence[int]], *, positions: int | None = None) -> None:
        """Target role: start ``B`` rows (batched generation); one row is :meth:`prefill` (``positions``: unused)."""
        if len(prompts) == 0:
            raise ValueError("prefill_batch needs at least one prompt")
        if len(prompts) == 1:
            self.prefill(prompts[0])
            return
        self.target_rows = [self._prompt(p) for p in prompts]
        self._last_tree = None

    def _rows_contexts(self, b: int) -> list[int]:
        """The target-role context of row ``b`` (a hook for the tests' mutants)."""
        assert self.target_rows is not None
        return self.target_rows[b]

    def _score_rows(self, tree: TreeBatch) -> torch.Tensor:
        assert self.target_rows is not None
        B = tree.batch_size
        if B != len(self.target_rows):
            raise ValueError(f"a batch of {B} trees for {len(self.target_rows)} rows")
        tokens, parents = torch.stack([tree.tokens, tree.parents]).tolist()  # one host read, [2, B, n]
        counts = tree.num_nodes.tolist()
        prefixes = []
        for b in range(B):
            if tokens[b][0] != self.target_rows[b][-1]:
                raise ValueError(f"row {b}: the tree's root must be the row's last committed token")
            paths: list[list[int]] = [[]]
            for i in range(1, int(counts[b])):
                paths.append(paths[parents[b][i]] + [tokens[b][i]])
            prefixes += [self._rows_contexts(b) + path for path in paths]
        logits = self._logits(prefixes)  # [sum k_b, V]
        out = torch.empty(B, tree.node_slots, self._vocab_size, dtype=logits.dtype)
        start = 0
        for b in range(B):
            k = int(counts[b])
            out[b, :k] = logits[start : start + k]
            out[b, k:] = logits[start]  # padding slots: a copy of the root's row
            start += k
        self._last_tree = tokens
        return out

    def accept_rows(
        self,
        accepted: torch.Tensor,
        num_accepted: torch.Tensor,
        emitted: Sequence[Sequence[int]],
        *,
        nodes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Target role: append each row's emitted tokens (accepted + bonus); one row is :meth:`accept`."""
        if self.target_rows is None and nodes is not None:
            OneRowTarget.accept_rows(self, accepted, num_accepted, emitted, nodes=nodes)
            return
        if self.target_rows is None or self._last_tree is None:
            raise RuntimeError("accept_rows() called before a batch of trees was scored")
        if len(emitted) != len(self.target_rows):
            raise ValueError(f"{len(emitted)} rows of emitted tokens for a batch of {len(self.target_rows)}")
        for row, tokens in zip(self.target_rows, emitted):
            row.extend(int(t) for t in tokens)
        self._last_tree = None

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only the rows ``rows`` of both roles' batches."""
        keep = [int(r) for r in rows]
        if self.target_rows is not None:
            self.target_rows = [self.target_rows[r] for r in keep]
        if self.draft_rows is not None:
            self.draft_rows = [self.draft_rows[r] for r in keep]
            self._row_paths = [[[]] for _ in keep]

    @property
    def rows_mode(self) -> bool:
        return self.draft_rows is not None

    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: Any = None, *,
                   positions: int | None = None) -> None:
        """Draft role: start ``B`` rows (batched generation); one row is :meth:`begin` (``positions``: unused)."""
        if len(prompts) == 1:
            self.begin(prompts[0])
            return
        self.draft_rows = [self._prompt(p) for p in prompts]
        self._row_paths = [[[]] for _ in prompts]

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        assert self.draft_rows is not None, "root_rows_logits() outside rows mode"
        self._row_paths = [[[]] for _ in self.draft_rows]
        return self._logits([list(r) for r in self.draft_rows])

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        assert self.draft_rows is not None, "tree_rows_logits() outside rows mode"
        B, k = tokens.shape
        par, tok = torch.stack([parents, tokens.to(parents.dtype)]).tolist()  # one host read, [2, B, k]
        prefixes = []
        for b in range(B):
            for parent, token in zip(par[b], tok[b]):
                path = self._row_paths[b][parent] + [int(token)]
                self._row_paths[b].append(path)
                prefixes.append(self.draft_rows[b] + path)
        return self._logits(prefixes).reshape(B, k, self._vocab_size)

    def commit_rows(
        self,
        emitted: Sequence[Sequence[int]],
        target_hidden: Any = None,
        *,
        device_tokens: torch.Tensor | None = None,
        device_counts: torch.Tensor | None = None,
    ) -> None:
        if self.draft_rows is None:
            OneRowDraft.commit_rows(self, emitted, target_hidden)
            return
        for row, tokens in zip(self.draft_rows, emitted):
            row.extend(int(t) for t in tokens)
        self._row_paths = [[[]] for _ in self.draft_rows]
