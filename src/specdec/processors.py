"""Logits processors on a draft tree: every node scored with its own path as context.

A *logits processor* is transformers' ``LogitsProcessor`` signature (a
``LogitsProcessorList`` included, or any callable with it):

    processor(input_ids: LongTensor [b, len], scores: FloatTensor [b, V]) -> FloatTensor [b, V]

Autoregressive decoding calls it once per token, with the sequence so far as
``input_ids``. In a speculative step the target scores a whole tree at once,
and each node's row of logits predicts the token after *that node's path*:
the node's context is the committed sequence (prompt + emitted tokens, whose
last token is the tree's root) followed by the tokens on the path from the
root to the node, the node's own token last (docs/generation.md, "Logits
processors"). The processed law at every node is then exactly the law
autoregressive decoding with the same processor would use after that context,
so the verifier reproduces the *processed* target law (docs/concepts.md,
glossary: processed target law).

Nodes of one depth ``d`` share a context length ``L + d``, so
:func:`process_tree_logits` calls the processor once per depth with
``input_ids [n_d, L + d]`` on the rows of the ``n_d`` nodes at depth ``d``
only; the contexts are gathered from the tree's tensors on the device (no
Python loop over nodes). Knowing ``n_d`` costs one host read per step (the
nodes per depth), on top of the step's own read. Processors run on the raw logits, before
temperature, top-k and top-p (transformers' order: processors, then warpers).

A processor that can take a whole tree at once (a :class:`TreeLogitsProcessor`, such as
:class:`specdec.grammar.GrammarProcessor`, which masks every node in one call of xgrammar's
tree traversal) is called once per tree instead, with each node's parent (:func:`node_parents`)
in place of the per-depth contexts; its rows must be those the per-depth calls would give.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

from specdec.errors import InvalidConfigError

__all__ = [
    "LogitsProcessorLike",
    "TreeLogitsProcessor",
    "call_processor",
    "check_processor",
    "node_contexts",
    "node_parents",
    "node_paths",
    "process_batch_row",
    "process_host_tree",
    "process_tree_logits",
]

LogitsProcessorLike = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(input_ids [b, len] int64, scores [b, V] float) -> [b, V] float``: transformers'
``LogitsProcessor`` / ``LogitsProcessorList`` or any callable with that signature."""


class TreeLogitsProcessor(ABC):
    """A logits processor that also processes a whole draft tree in one call (declared: a
    processor subclasses this class; nothing is probed).

    :func:`process_tree_logits` calls :meth:`process_tree` once per tree instead of the
    processor once per depth; the result must equal what the per-depth calls give (each node's
    row processed in its own context: the committed sequence, then the node's path).
    """

    @abstractmethod
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """transformers' ``LogitsProcessor`` call: ``input_ids [b, len]``, ``scores [b, V]``."""

    @abstractmethod
    def process_tree(self, scores: torch.Tensor, context: torch.Tensor, tokens: torch.Tensor,
                     parents: torch.Tensor) -> torch.Tensor:
        """``scores [n, V]`` (a copy: it may be written in place) processed row by row in each
        node's context; ``context [L]`` int64 the committed sequence (its last token the
        root's); ``tokens [n]`` int64; ``parents [n]`` int64, ``-1`` for the nodes of depth 0
        (the root and padding slots, which all see the committed context only)."""


def check_processor(processor: Any, name: str = "logits_processor") -> LogitsProcessorLike | None:
    """``processor`` itself if callable (None passes), else :class:`InvalidConfigError`.

    An empty ``LogitsProcessorList`` is returned as None (nothing to apply).
    """
    if processor is None:
        return None
    if not callable(processor):
        raise InvalidConfigError(
            f"{name} must be a callable (input_ids [b, len], scores [b, V]) -> [b, V], such as "
            f"transformers' LogitsProcessorList, got {type(processor).__name__}"
        )
    if isinstance(processor, list) and len(processor) == 0:
        return None
    return processor


def call_processor(processor: LogitsProcessorLike, ids: torch.Tensor, scores: torch.Tensor, whose: str = "") -> torch.Tensor:
    """``processor(ids, scores)``, checked to be one row of scores per input row.

    Raises:
        InvalidConfigError: the processor returned something else (``whose``: e.g. ``"draft "``).
    """
    out = processor(ids, scores)
    if not isinstance(out, torch.Tensor) or out.shape != scores.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise InvalidConfigError(
            f"the logits processor returned {got} for {whose}scores of shape {tuple(scores.shape)}; "
            "it must return one row of scores per input row"
        )
    return out


def node_paths(tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor, max_depth: int) -> torch.Tensor:
    """``[n, D]`` int64: row ``i`` holds node ``i``'s path below the root, the token at depth
    ``k`` in column ``k - 1`` (its own token at column ``depth_i - 1``), 0 past its depth.

    Args:
        tokens: ``[n]`` int64 node tokens.
        depths: ``[n]`` int64 node depths (root and padding 0).
        ancestors: ``[n, n]`` bool, ``[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``.
        max_depth: ``D``, a bound on ``depths``.
    """
    n = tokens.shape[0]
    if max_depth == 0:
        return tokens.new_zeros((n, 0))
    levels = torch.arange(1, max_depth + 1, device=tokens.device)  # [D]
    # at_level[k, i, j]: j is the ancestor-or-self of i at depth k + 1 (at most one j per (k, i))
    at_level = ancestors.unsqueeze(0) & (depths.unsqueeze(0) == levels.unsqueeze(1)).unsqueeze(1)  # [D, n, n]
    path = (at_level.to(tokens.dtype) * tokens.view(1, 1, n)).sum(-1)  # [D, n]
    return path.transpose(0, 1)  # [n, D]


def node_parents(depths: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """``[n]`` int64: each node's parent slot, ``-1`` for the nodes of depth 0 (root, padding).

    Args:
        depths: ``[n]`` int64 node depths.
        ancestors: ``[n, n]`` bool, ``[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``.
    """
    n = depths.shape[0]
    is_parent = ancestors & (depths.view(1, n) == depths.view(n, 1) - 1)  # [n, n]: j is i's parent
    return torch.where(is_parent.any(1), is_parent.to(torch.int64).argmax(1), -1)  # [n]


def node_contexts(context: torch.Tensor, paths: torch.Tensor, depth: int) -> torch.Tensor:
    """``[n, L + depth]``: the context of a depth-``depth`` node, for every row of ``paths``
    (``context [L]`` the committed sequence, ending with the root's token)."""
    n = paths.shape[0]
    return torch.cat([context.view(1, -1).expand(n, -1), paths[:, :depth]], dim=1)


def process_tree_logits(
    processor: LogitsProcessorLike,
    logits: torch.Tensor,
    context: torch.Tensor,
    tokens: torch.Tensor,
    depths: torch.Tensor,
    ancestors: torch.Tensor,
    max_depth: int,
) -> torch.Tensor:
    """The tree's logits with ``processor`` applied to each node's row in that node's context.

    Args:
        processor: a :data:`LogitsProcessorLike`.
        logits: ``[n, V]`` raw target (or draft) logits, row ``i`` after node ``i``.
        context: ``[L]`` int64 committed sequence (prompt + emitted; its last token is the root's).
        tokens, depths, ancestors: ``[n]``, ``[n]``, ``[n, n]`` the tree's
            tensors (:class:`~specdec.tree_batch.TreeBatch` row ``b``).
        max_depth: a bound on ``depths`` (the processor is called at most ``max_depth + 1`` times, once per depth that
            has nodes; a :class:`TreeLogitsProcessor` once).

    Returns:
        ``[n, V]`` processed logits (a new tensor; ``logits`` is not modified).

    Raises:
        InvalidConfigError: the processor returned a tensor of another shape.
    """
    context = context.to(device=logits.device, dtype=torch.int64)
    if isinstance(processor, TreeLogitsProcessor):  # the whole tree in one call
        parents = node_parents(depths.to(logits.device), ancestors.to(logits.device))  # [n]
        processed = processor.process_tree(logits.clone(), context, tokens.to(logits.device), parents)
        if not isinstance(processed, torch.Tensor) or processed.shape != logits.shape:
            got = tuple(processed.shape) if isinstance(processed, torch.Tensor) else type(processed).__name__
            raise InvalidConfigError(f"the logits processor's process_tree returned {got} for scores of shape "
                                     f"{tuple(logits.shape)}; it must return one row of scores per node")
        return processed.to(logits.dtype)
    paths = node_paths(tokens.to(logits.device), depths.to(logits.device), ancestors.to(logits.device), max_depth)
    depths = depths.to(logits.device)
    order = torch.argsort(depths, stable=True)  # [n] node rows grouped by depth
    # one host read: the nodes per depth, so that each node's row is processed once (a processor's
    # cost grows with its rows: calling it on all n rows at every depth cost 7x more at depth 6)
    counts = torch.bincount(depths, minlength=max_depth + 1).tolist()
    out = torch.empty_like(logits)  # [n, V]; every row is written below (each node has one depth)
    start = 0
    for d, count in enumerate(counts):
        if count == 0:
            continue
        rows = order[start : start + count]  # [count]
        start += count
        ids = node_contexts(context, paths.index_select(0, rows), d)  # [count, L + d]
        rows_logits = logits.index_select(0, rows)  # [count, V], a copy: processors may write in place
        out.index_copy_(0, rows, call_processor(processor, ids, rows_logits).to(logits.dtype))
    return out


def process_batch_row(processor: LogitsProcessorLike, logits: torch.Tensor, context: torch.Tensor, tree: Any, b: int = 0) -> torch.Tensor:
    """:func:`process_tree_logits` for row ``b`` of a :class:`~specdec.tree_batch.TreeBatch` (``logits [n, V]``)."""
    return process_tree_logits(processor, logits, context, tree.tokens[b], tree.depths[b], tree.ancestors[b], tree.max_depth)


def process_host_tree(processor: LogitsProcessorLike, logits: torch.Tensor, context: torch.Tensor, tree: Any) -> torch.Tensor:
    """:func:`process_tree_logits` for a host :class:`~specdec.tree.DraftTree` (``logits [n, V]``)."""
    depths = tree.depths
    return process_tree_logits(processor, logits, context, torch.as_tensor(tree.tokens, dtype=torch.int64),
                               depths, tree.ancestor_mask(), int(depths.max()) if len(depths) else 0)
