"""The empty draft: plain autoregressive decoding as a speculative step with a root-only tree."""

from __future__ import annotations

from typing import Any

import torch

from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind
from specdec.tree_batch import TreeBatch
from specdec.trees.base import TreeBuilder
from specdec.trees.feed import Build, DraftSpec

__all__ = ["RootOnlyBuilder"]


class RootOnlyBuilder(TreeBuilder):
    """The empty draft: a tree holding only the root (plain autoregressive decoding).
    Its batch is made on the roots' device, with no host work and no draft call
    (:func:`~specdec.trees.base.build_trees` takes ``draft=None`` for it)."""

    batch_form = True

    registry_name = "root-only"
    produces = frozenset()

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size

    @property
    def max_nodes(self) -> int:
        return 1

    @property
    def max_depth(self) -> int:
        return 0

    def feed_build(self, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """``B`` root-only trees (``roots [B]``), asking for nothing: the batch ``TreeBatch.from_trees``
        of single roots gives (``max_children`` 1, ``max_depth`` 0)."""
        roots = torch.as_tensor(roots, dtype=torch.int64).reshape(-1)
        B, dev = roots.shape[0], roots.device
        zeros = torch.zeros(B, 1, dtype=torch.int64, device=dev)  # [B, 1]
        return TreeBatch(
            tokens=roots.reshape(B, 1), parents=zeros - 1, depths=zeros, kinds=torch.full_like(zeros, int(NodeKind.ROOT)),
            draw_order=zeros, weights=torch.ones(B, 1, dtype=torch.float64, device=dev),
            num_nodes=torch.ones(B, dtype=torch.int64, device=dev),
            law_ids=torch.empty(B, 1, 0, dtype=torch.int64, device=dev),
            law_probs=torch.empty(B, 1, 0, dtype=torch.float64, device=dev),
            law_wor=torch.zeros(B, 1, dtype=torch.bool, device=dev), ancestors=torch.ones(B, 1, 1, dtype=torch.bool, device=dev),
            vocab_size=self._vocab_size, max_children=1, max_depth=0, max_sampled=0,
        )
        yield  # a build (a generator) that asks for no draft call
