"""``NgramDraft``: a model-free draft (prompt lookup, n-gram matching).

The draft proposes the text that followed an earlier occurrence of the
sequence's last tokens, as transformers' prompt lookup decoding
(``generate(prompt_lookup_num_tokens=...)``, ``PromptLookupCandidateGenerator``):
no weights, no forward, only the committed context (prompt and generated
text) and the step's draft tree.

The matching rule (transformers'): for ``n`` from ``max_ngram`` down to
``min_ngram``, the *matches* are the earlier positions ``i`` where the
``n`` tokens ``S[i : i + n]`` equal the last ``n`` tokens of the sequence
``S`` and a continuation ``S[i + n]`` exists; the first ``n`` with a match
wins. Each match is a *pointer* to its continuation ``S[i + n]``, kept in
left-to-right order (transformers takes the first match).

The law ``q`` of a node (docs/drafts.md): over the distinct continuation
tokens of the node's pointers, the first ``branches`` of them in pointer
order, each weighted by its number of pointers; raw logits ``log(count)``,
``-inf`` elsewhere. With ``branches=1`` it is one-hot at the first match's
continuation: transformers' candidate. A real law over ``V`` at every node,
so every builder and every verifier use it exactly (docs/verifiers.md: the
rules read ``q`` only through the recorded law).

Pointers follow the tree: a child with token ``t`` keeps its parent's pointers
whose continuation is ``t``, each advanced by one (so a chain copies the
matched text token after token, as transformers' candidate does, and goes on
into the drafted tokens themselves where the copy reaches the end of the
committed context). A node left with no pointer looks up its own sequence
(committed context + its path) afresh. When nothing matches at all, ``q`` is
one-hot at the node's own token (the sequence's last token, repeated): an
exact law like any other, whose drafts are simply rarely accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specdec.drafts.base import OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.registry import register

__all__ = ["NgramDraft", "ngram_matches"]


def ngram_matches(seq: np.ndarray, max_ngram: int, min_ngram: int = 1) -> np.ndarray:
    """Pointers of the longest n-gram matches of ``seq``'s suffix (transformers' rule).

    For ``n`` from ``min(max_ngram, len(seq) - 1)`` down to ``min_ngram``:
    the positions ``i`` with ``seq[i : i + n] == seq[-n:]`` and
    ``i + n < len(seq)``; the first ``n`` with any match returns ``i + n`` for
    each, ascending (left to right, as transformers scans them).

    Args:
        seq: ``[L]`` int64 token ids.
        max_ngram, min_ngram: the n-gram sizes tried, largest first.

    Returns:
        ``[m]`` int64 continuation positions (empty when nothing matches).

    Example:
        >>> import numpy as np
        >>> ngram_matches(np.array([5, 6, 7, 5, 6, 8, 5, 6]), 2).tolist()   # "5 6" matched twice
        [2, 5]
        >>> ngram_matches(np.array([5, 6, 7, 6]), 2).tolist()              # no "7 6": the 1-gram "6"
        [2]
    """
    L = len(seq)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        m = L - n  # candidate starts 0 .. m - 1 (each has a continuation at i + n <= L - 1)
        ok = seq[:m] == seq[L - n]
        for j in range(1, n):
            ok &= seq[j : j + m] == seq[L - n + j]
        hits = np.flatnonzero(ok)
        if hits.size:
            return hits + n
    return np.empty(0, dtype=np.int64)


class _Sequence:
    """One sequence's state: the committed tokens and this step's draft tree.

    Per tree node (index = node id, 0 = the root): its path below the root,
    and its pointers (continuation positions into ``committed + path``), made
    when the node is added (inherited from its parent) or, where it inherits
    none, by a fresh lookup the first time they are asked for."""

    def __init__(self, prompt: Sequence[int], max_ngram: int, min_ngram: int) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens = np.asarray(list(prompt), dtype=np.int64)  # [L] committed
        self._drop_tree()

    def _drop_tree(self) -> None:
        self.paths: list[list[int]] = [[]]
        self.inherited: list[np.ndarray] = [np.empty(0, dtype=np.int64)]  # the root inherits nothing
        self.looked_up: dict[int, np.ndarray] = {}

    def seq(self, node: int) -> np.ndarray:
        """``[L + depth]`` the committed tokens followed by ``node``'s path."""
        path = self.paths[node]
        return self.tokens if not path else np.concatenate([self.tokens, np.asarray(path, dtype=np.int64)])

    def at(self, node: int, positions: np.ndarray) -> np.ndarray:
        """``[m]`` the tokens of ``seq(node)`` at ``positions`` (without building the sequence)."""
        L = len(self.tokens)
        path = self.paths[node]
        if not path or not positions.size or int(positions.max()) < L:
            return self.tokens[positions]
        tail = np.asarray(path, dtype=np.int64)
        return np.where(positions < L, self.tokens[np.minimum(positions, L - 1)], tail[np.maximum(positions - L, 0)])

    def pointers(self, node: int) -> np.ndarray:
        """``[m]`` ``node``'s pointers, ascending: inherited, else looked up (a function
        of the committed tokens and the node's path only)."""
        if self.inherited[node].size:
            return self.inherited[node]
        if node not in self.looked_up:
            self.looked_up[node] = ngram_matches(self.seq(node), self.max_ngram, self.min_ngram)
        return self.looked_up[node]

    def add(self, parent: int, token: int) -> int:
        """Add a child of ``parent`` with ``token``; it inherits the parent's pointers
        whose continuation is ``token``, each advanced by one (the copy goes on)."""
        before = self.pointers(parent)
        self.inherited.append(before[self.at(parent, before) == token] + 1 if before.size else before)
        self.paths.append(self.paths[parent] + [token])
        return len(self.paths) - 1

    def law(self, node: int, branches: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens [c], counts [c])``: ``node``'s distinct continuations (``c <= branches``,
        in pointer order) and their numbers of pointers; one-hot at the last token when none."""
        pointers = self.pointers(node)
        if not pointers.size:  # nothing matches: repeat the last token (one-hot, exact)
            last = self.paths[node][-1] if self.paths[node] else int(self.tokens[-1])
            return np.array([last], dtype=np.int64), np.ones(1, dtype=np.int64)
        uniq, first, counts = np.unique(self.at(node, pointers), return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")[:branches]  # first appearance, left to right
        return uniq[order], counts[order]

    def commit(self, tokens: Sequence[int]) -> None:
        if tokens:
            self.tokens = np.concatenate([self.tokens, np.asarray(list(tokens), dtype=np.int64)])
        self._drop_tree()


@register("draft", "ngram")
class NgramDraft(OneRowDraft):
    """Prompt lookup: the draft law ``q`` from n-gram matches in the prompt and the generated text.

    Args:
        vocab_size: ``V``, the target's vocabulary size.
        max_ngram: the longest n-gram matched (transformers'
            ``max_matching_ngram_size``, default 2).
        min_ngram: the shortest n-gram matched (default 1, as transformers).
        branches: how many distinct continuations a node's law spreads over
            (the first ones in match order, each weighted by its number of
            matches). ``1`` (the default): one-hot at the first match's
            continuation, transformers' candidate chain; ``> 1``: trees of
            several matches (static, Sequoia, EAGLE or Rheo trees draw or rank
            the distinct continuations).
        device: where logits are returned (``"cpu"``).

    The law of every node is a probability law over ``V`` (``-inf`` logits
    outside the matched continuations), processed like any draft's
    (:meth:`~specdec.drafts.base.DraftModel.root_distribution`), so it is
    verified exactly by every verifier; see docs/drafts.md for which builders
    make use of it.

    Example:
        >>> draft = NgramDraft(vocab_size=10, max_ngram=2)
        >>> draft.begin([1, 2, 3, 1, 2])          # "1 2" occurred before, followed by 3
        >>> int(draft.root_logits().argmax())
        3
        >>> int(draft.tree_logits([0], [3]).argmax())   # the copy goes on: "1 2 3" was followed by 1
        1
        >>> draft.commit([3, 1]); draft.committed_tokens
        (1, 2, 3, 1, 2, 3, 1)
    """

    supports_rows = True

    def __init__(
        self,
        vocab_size: int,
        *,
        max_ngram: int = 2,
        min_ngram: int = 1,
        branches: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        for name, value in (("vocab_size", vocab_size), ("max_ngram", max_ngram), ("min_ngram", min_ngram),
                            ("branches", branches)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidConfigError(f"NgramDraft: {name} must be an int >= 1, got {value!r}")
        if min_ngram > max_ngram:
            raise InvalidConfigError(f"NgramDraft: min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")
        self._vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.branches = branches
        self.device = torch.device(device)
        self._one: _Sequence | None = None
        self._rows: list[_Sequence] | None = None

    def __repr__(self) -> str:
        return (f"NgramDraft(vocab_size={self._vocab_size}, max_ngram={self.max_ngram}, "
                f"min_ngram={self.min_ngram}, branches={self.branches})")

    # ----------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def committed_tokens(self) -> tuple[int, ...]:
        """The committed context (prompt + committed tokens)."""
        return tuple(int(t) for t in self._state().tokens)

    @property
    def num_tree_nodes(self) -> int:
        """Nodes (root excluded) added to this step's tree so far."""
        return len(self._state().paths) - 1

    # ------------------------------------------------------------ the law
    def _logits(self, state: _Sequence, nodes: Sequence[int]) -> torch.Tensor:
        out = torch.full((len(nodes), self._vocab_size), float("-inf"), dtype=torch.float32)
        for row, node in enumerate(nodes):
            tokens, counts = state.law(node, self.branches)
            out[row, torch.from_numpy(tokens)] = torch.from_numpy(np.log(counts.astype(np.float64))).float()
        return out.to(self.device)

    # ------------------------------------------------------------ lifecycle
    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        """Start a sequence whose committed context is ``prompt_ids`` (non-empty; ``target_hidden``
        is ignored: a model-free draft)."""
        self._one = _Sequence(self._check(prompt_ids, "the prompt", empty=False), self.max_ngram, self.min_ngram)
        self._rows = None

    def root_logits(self) -> torch.Tensor:
        """``[V]`` logits after the committed context (``log(count)`` at the matched continuations)."""
        return self._logits(self._state(), [0])[0]

    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Add ``k`` nodes (ids ``num_tree_nodes + 1 ...``) and return their ``[k, V]`` logits."""
        state = self._state()
        parents, tokens = self._host(parents, tokens)
        nodes = [self._add(state, p, t) for p, t in zip(parents, tokens)]
        return self._logits(state, nodes)

    def commit(self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        """Append the emitted tokens to the committed context and drop the step's tree
        (``target_hidden`` is ignored: a model-free draft)."""
        self._state().commit(self._check(tokens, "commit"))

    # ------------------------------------------------------ rows (batch > 1)
    @property
    def rows_mode(self) -> bool:
        return self._rows is not None

    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: Any = None, *,
                   positions: int | None = None) -> None:
        """Start ``B`` rows at once (batched generation); each row is its own
        :meth:`begin` (its own context, its own tree); one prompt is served by :meth:`begin`."""
        if len(prompts) == 0:
            raise ValueError("begin_rows needs at least one prompt")
        if len(prompts) == 1:
            return OneRowDraft.begin_rows(self, prompts, positions=positions)
        self._rows = [_Sequence(self._check(p, f"prompt {b}", empty=False), self.max_ngram, self.min_ngram) for b, p in enumerate(prompts)]
        self._one = None

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        """Rows mode: ``[B, V]`` root logits, row ``b`` as its own :meth:`root_logits`."""
        rows = self._rows_state()
        return torch.stack([self._logits(row, [0])[0] for row in rows])

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        """Rows mode: add ``k`` nodes to every row's tree (``[B, k]``) and return ``[B, k, V]`` logits."""
        rows = self._rows_state()
        if parents.shape != tokens.shape or parents.dim() != 2 or parents.shape[0] != len(rows):
            raise ValueError(f"tree_rows_logits: parents {tuple(parents.shape)} and tokens {tuple(tokens.shape)} "
                             f"must both be [{len(rows)}, k]")
        par, tok = torch.stack([parents.reshape(len(rows), -1), tokens.reshape(len(rows), -1).to(parents.dtype)]).tolist()
        out = []
        for row, ps, ts in zip(rows, par, tok):
            ts = self._check(ts, "tree_rows_logits")
            out.append(self._logits(row, [self._add(row, p, t) for p, t in zip(ps, ts)]))
        return torch.stack(out)

    def commit_rows(
        self,
        emitted: Sequence[Sequence[int]],
        target_hidden: Any = None,
        *,
        device_tokens: torch.Tensor | None = None,
        device_counts: torch.Tensor | None = None,
    ) -> None:
        """Rows mode: append each row's emitted tokens and drop every row's tree (outside
        rows mode: :meth:`commit`)."""
        if self._rows is None:
            return OneRowDraft.commit_rows(self, emitted, target_hidden)
        rows = self._rows_state()
        if len(emitted) != len(rows):
            raise ValueError(f"{len(emitted)} rows of emitted tokens for {len(rows)} rows")
        for b, (row, tokens) in enumerate(zip(rows, emitted)):
            row.commit(self._check(tokens, f"row {b}'s emitted tokens"))

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Rows mode: keep only the rows ``rows``, renumbered in order."""
        state = self._rows_state()
        keep = [int(r) for r in rows]
        if not keep or any(not 0 <= r < len(state) for r in keep) or len(set(keep)) != len(keep):
            raise ValueError(f"keep_rows: {keep} is not a non-empty set of rows of a batch of {len(state)}")
        self._rows = [state[r] for r in keep]

    # -------------------------------------------------------------- helpers
    def _state(self) -> _Sequence:
        if self._one is None:
            raise RuntimeError("NgramDraft: begin() first" + (" (it is in rows mode)" if self._rows is not None else ""))
        return self._one

    def _rows_state(self) -> list[_Sequence]:
        if self._rows is None:
            raise RuntimeError("NgramDraft: outside rows mode (begin_rows)")
        return self._rows

    def _add(self, state: _Sequence, parent: int, token: int) -> int:
        if not 0 <= parent < len(state.paths):
            raise ValueError(f"tree_logits: unknown parent node {parent} (the tree has nodes 0..{len(state.paths) - 1})")
        return state.add(parent, token)

    def _host(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> tuple[list[int], list[int]]:
        if len(parents) != len(tokens):
            raise ValueError(f"tree_logits: {len(parents)} parents but {len(tokens)} tokens")
        if isinstance(parents, torch.Tensor) and isinstance(tokens, torch.Tensor):  # one host read for the level
            parents, tokens = torch.stack([parents.reshape(-1), tokens.reshape(-1).to(parents.dtype)]).tolist()
        return [int(p) for p in parents], self._check(tokens, "tree_logits")

    def _check(self, tokens: Sequence[int] | torch.Tensor, what: str, empty: bool = True) -> list[int]:
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.reshape(-1).tolist()
        out = [int(t) for t in tokens]
        if not empty and not out:
            raise ValueError(f"NgramDraft: {what} must contain at least one token")
        bad = [t for t in out if not 0 <= t < self._vocab_size]
        if bad:
            raise ValueError(f"NgramDraft: {what} has token ids outside the vocabulary [0, {self._vocab_size}): {bad[:5]}")
        return out
