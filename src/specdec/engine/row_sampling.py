"""Per-row sampling: every row of a batch under its own temperature, top-k and top-p.

Rows that share a :class:`~specdec.sampling.SamplingConfig` form a *group*
(:attr:`RowSampling.groups`). The step (:func:`specdec.engine.step.run_step`) treats a
batch with one configuration as one group, with no extra op; with several:

- **building** (:func:`build_groups`): each group's trees are grown by the builder's own
  caller-driven build (:meth:`TreeBuilder.feed_build <specdec.trees.base.TreeBuilder.feed_build>`)
  under the group's configuration and from the group's rows' random sources; at every level the
  groups' requests are merged into one :class:`~specdec.draft_request.DraftRequest` over all
  ``B`` rows (a group's node ids renumbered after the others', filler slots where a group asks
  fewer nodes or has finished), answered by **one** draft call, and each group gets its rows
  back. The groups' tree batches are stacked (:meth:`TreeBatch.scatter_rows
  <specdec.tree_batch.TreeBatch.scatter_rows>`) for **one** target forward;
- **verification**: each group by its configuration's path on its rows
  (:meth:`TreeBatch.select_rows <specdec.tree_batch.TreeBatch.select_rows>`), with its rows'
  own sources; the decisions are put back in row order (:func:`scatter_decisions`).

So a row takes exactly the draws and decisions it takes in a batch of its own configuration:
its output law is its configuration's target law, and it emits what its batch-1 run with the
same source emits wherever the models' logits agree across batch sizes (exact by enumeration
and equal token for token on toy models, ``tests/engine/test_row_sampling.py``). Cost: one
build per group on the host side (one draft call per level for all groups), one verification
per group; the fused Triton kernel serves one configuration per launch, so a batch of mixed
configurations verifies on the torch path (``kernel="triton"`` is refused by name).
"""

from __future__ import annotations

from collections.abc import Sequence
import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig, process_logits
from specdec.tree_batch import TreeBatch
from specdec.trees.base import TreeBuilder
from specdec.trees.feed import DraftSpec, config_groups, drive, group_build, group_sources
from specdec.verify.fast import TreeDecision

__all__ = ["RowSampling", "build_groups", "group_sources", "row_sources", "scatter_decisions"]


@attrs.frozen(eq=False)
class RowSampling:
    """One sampling configuration per row, with its parameters as ``[B]`` tensors.

    Attributes:
        configs: ``B`` configurations, row order.
        temperature: ``[B]`` float64.
        top_k: ``[B]`` int64 (``0``: off).
        top_p: ``[B]`` float64 (``1``: off).
        groups: the distinct configurations and their rows (``[k]`` int64 row indices on the
            device), in order of first appearance.
    """

    configs: tuple[SamplingConfig, ...]
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    groups: tuple[tuple[SamplingConfig, torch.Tensor], ...]

    @classmethod
    def of(cls, configs: "SamplingConfig | Sequence[SamplingConfig] | RowSampling", rows: int,
           device: torch.device | str = "cpu") -> "RowSampling":
        """The rows' configurations: one for every row, or one per row (a :class:`RowSampling`
        of ``rows`` rows is returned as it is: made once, it costs no host-to-device copy per step).

        Raises:
            InvalidConfigError: ``configs`` has not ``rows`` entries, or an entry is not a
                :class:`~specdec.sampling.SamplingConfig`.
        """
        if isinstance(configs, RowSampling):
            if len(configs.configs) != rows:
                raise InvalidConfigError(f"per-row sampling: {len(configs.configs)} configurations for {rows} rows")
            return configs
        if isinstance(configs, (str, bytes)) or not isinstance(configs, (SamplingConfig, Sequence)):
            raise InvalidConfigError(
                f"sampling must be a SamplingConfig or one SamplingConfig per row, got {type(configs).__name__}")
        listed = [configs] * rows if isinstance(configs, SamplingConfig) else list(configs)
        if len(listed) != rows:
            raise InvalidConfigError(f"per-row sampling: {len(listed)} configurations for {rows} rows")
        groups = tuple((c, torch.tensor(ix, dtype=torch.int64, device=device)) for c, ix in config_groups(listed))
        return cls(
            tuple(listed),
            torch.tensor([c.temperature for c in listed], dtype=torch.float64, device=device),
            torch.tensor([c.top_k for c in listed], dtype=torch.int64, device=device),
            torch.tensor([c.top_p for c in listed], dtype=torch.float64, device=device),
            groups,
        )

    @property
    def uniform(self) -> bool:
        """Every row has the same configuration."""
        return len(self.groups) == 1

    @property
    def rows(self) -> int:
        """``B``."""
        return len(self.configs)

    def keep(self, rows: Sequence[int]) -> "RowSampling":
        """The configurations of rows ``rows`` (in that order): the batch after rows left it."""
        return RowSampling.of([self.configs[int(r)] for r in rows], len(rows), self.temperature.device)

    def group_rows(self) -> list[list[int]]:
        """Each group's row indices as host ints (made from the configurations, no device read)."""
        return [rows for _, rows in config_groups(self.configs)]

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """``[B, ..., V]`` logits -> each row's ``p`` under its own configuration
        (:func:`~specdec.sampling.process_logits`, ``check=False``: bad rows are flagged by the caller).
        Rows of one configuration are processed together; every operation is row-wise, so each
        row's ``p`` has the bits it has alone."""
        if self.uniform:
            return process_logits(logits, self.configs[0], check=False)
        out = torch.empty(logits.shape, dtype=torch.float32 if logits.dtype in (torch.float16, torch.bfloat16)
                          else logits.dtype, device=logits.device)
        for config, rows in self.groups:
            rows = rows.to(logits.device)
            out.index_copy_(0, rows, process_logits(logits.index_select(0, rows), config, check=False))
        return out


def row_sources(rng: RandomSource) -> list[RandomSource]:
    """The rows' sources of a :class:`~specdec.rng.RowStreams`."""
    if not isinstance(rng, RowStreams):
        raise InvalidConfigError("per-row sampling needs one random source per row (RowStreams)")
    return list(rng.sources)


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
        parts = [(ix, builder.build_batch(roots.index_select(0, ix), None, cfg, rng))
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
