"""Per-row sampling: every row of a batch under its own temperature, top-k and top-p.

Rows that share a :class:`~specdec.sampling.SamplingConfig` form a *group*
(:attr:`RowSampling.groups`). The step (:func:`specdec.engine.step.step_rows`) treats a
batch with one configuration as one group, with no extra op; with several:

- **building** (:func:`build_groups`): each group's trees are grown by the builder's own
  caller-driven build (:meth:`TreeBuilder.feed_build <specdec.trees.base.TreeBuilder.feed_build>`)
  under the group's configuration and from the group's rows' random sources; at every level the
  groups' requests are merged into one :class:`~specdec.draft_request.DraftRequest` over all
  ``B`` rows (a group's node ids renumbered after the others', filler slots where a group asks
  fewer nodes or has finished), answered by **one** draft call, and each group gets its rows
  back. The groups' tree batches are stacked (:meth:`TreeBatch.scatter_rows
  <specdec.tree_batch.TreeBatch.scatter_rows>`) for **one** target forward;
- **verification**: one pass over all rows. The rows' parameters are ``[B]`` tensors
  (:class:`~specdec.sampling.RowSampling`): ``p`` is processed per row in one set of ops
  (:func:`~specdec.sampling.process_logits_rows`), the tensor rule and the walk decide every
  row at once (a greedy row's law one-hot, so its decision is the greedy one), and the fused
  Triton kernel takes each row's temperature, top-k threshold and mode (logits fused, or ``p``
  given for greedy and top-p rows) in **one** launch.

So a row takes exactly the draws and decisions it takes in a batch of its own configuration:
its output law is its configuration's target law, and it emits what its batch-1 run with the
same source emits wherever the models' logits agree across batch sizes (exact by enumeration
and equal token for token on toy models, ``tests/engine/test_row_sampling.py``;
``tests/engine/test_row_sampling_kernel.py`` under the Triton kernel). Cost: one build per
group on the host side (one draft call per level for all groups), one verification for all rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.rng import RandomSource
from specdec.sampling import RowSampling
from specdec.tree_batch import TreeBatch
from specdec.trees.base import TreeBuilder, build_trees
from specdec.trees.feed import DraftSpec, drive, group_build, group_sources
from specdec.verify.fast import TreeDecision

__all__ = ["RowSampling", "build_groups", "group_sources", "scatter_decisions"]


def build_groups(
    builder: TreeBuilder,
    roots: torch.Tensor,
    draft: DraftModel | None,
    rows: RowSampling,
    rngs: Sequence[RandomSource],
) -> TreeBatch:
    """Every row's tree under its own configuration (module docstring): the merged build
    (:func:`specdec.trees.feed.group_build`) answered by ``draft``, one draft call per level for
    all rows; a builder that drafts nothing (``draft`` None, the root-only tree) builds per group.

    Args:
        roots: ``[B]`` int64 the rows' last committed tokens.
        rows: the rows' configurations (more than one group).
        rngs: one source per group (:func:`specdec.trees.feed.group_sources`).
    """
    index = [rows_ix.to(roots.device) for _, rows_ix in rows.groups]
    if draft is None:
        parts = [(ix, build_trees(builder, roots.index_select(0, ix), None, cfg, rng))
                 for ix, (cfg, _), rng in zip(index, rows.groups, rngs)]
        return TreeBatch.scatter_rows(parts, rows.rows)
    groups = [(cfg, ix) for ix, (cfg, _) in zip(index, rows.groups)]
    return drive(group_build(builder, roots, DraftSpec.of(draft), groups, rngs), draft)


def scatter_decisions(parts: Sequence[tuple[torch.Tensor, TreeDecision]], rows: int) -> TreeDecision:
    """The groups' decisions (each over its rows of one tree batch: the same walk length) in row order."""
    fields = [f.name for f in attrs.fields(TreeDecision)]
    first = parts[0][1]
    out = {name: getattr(first, name).new_empty((rows, *getattr(first, name).shape[1:])) for name in fields}
    for index, decision in parts:
        for name in fields:
            out[name].index_copy_(0, index, getattr(decision, name))
    return TreeDecision(**out)
