"""The empty draft: plain autoregressive decoding as a speculative step with a root-only tree."""

from __future__ import annotations

from typing import Any

import torch

from specdec.drafts.base import DraftModel
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree, NodeKind
from specdec.tree_batch import TreeBatch
from specdec.trees.base import TreeBuilder

__all__ = ["RootOnlyBuilder"]


class RootOnlyBuilder(TreeBuilder):
    """The empty draft: a tree holding only the root (plain autoregressive decoding).
    Its batch is made on the roots' device, with no host work."""

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

    def build(self, root_token: int, draft: DraftModel | None, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        return DraftTree(
            tokens=[root_token], parents=[-1], kinds=[int(NodeKind.ROOT)], draw_order=[0],
            weights=[1.0], law_index=[-1], laws=(), vocab_size=self._vocab_size,
        )

    def build_batch(
        self, root_token: int | torch.Tensor, draft: DraftModel | None, sampling: SamplingConfig, rng: RandomSource,
        *, compiler: Any = None,
    ) -> TreeBatch:
        """``B`` root-only trees (``roots [B]``): the batch ``TreeBatch.from_trees`` of :meth:`build`'s
        trees gives (``max_children`` 1, ``max_depth`` 0)."""
        roots = torch.as_tensor(root_token, dtype=torch.int64).reshape(-1)
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
