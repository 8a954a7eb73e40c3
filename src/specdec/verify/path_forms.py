"""The path-level rules' tensor forms, by :attr:`PathRule.form <specdec.verify.base.PathRule.form>`.

The engine's step (and the serving call, through the step's decision) runs a whole-tree
rule's declared tensor form through these two functions, every row at once, no host read:

- ``"block"``: rule 8 on chains, :mod:`specdec.verify.fast_block`;
- ``"traversal"``: rule 7 on trees of sampled children, :mod:`specdec.verify.traversal_tensor`.

On a chain the two are the same rule and make the same decisions from the same uniform table.
"""

from __future__ import annotations

import torch

from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch
from specdec.verify.base import PathRule
from specdec.verify.decision import TreeDecision
from specdec.verify.fast_block import decide_block_batch, decide_block_from_logits
from specdec.verify.traversal_tensor import decide_traversal_batch, decide_traversal_from_logits

__all__ = ["decide_path_batch", "decide_path_from_logits"]


def decide_path_batch(rule: PathRule, tree: TreeBatch, p: torch.Tensor, u: torch.Tensor,
                      bad_rows: torch.Tensor | None = None) -> TreeDecision:
    """``rule``'s tensor form on the processed laws ``p`` ``[B, n, V]`` (:func:`decide_block_batch`,
    :func:`decide_traversal_batch`)."""
    if rule.form == "traversal":
        return decide_traversal_batch(tree, p, u, bad_rows)
    return decide_block_batch(tree, p, u, bad_rows)


def decide_path_from_logits(rule: PathRule, tree: TreeBatch, logits: torch.Tensor, u: torch.Tensor,
                            sampling: SamplingConfig) -> TreeDecision:
    """``rule``'s tensor form on the target's logits ``[B, n, V]``, processed by ``sampling``
    (bad rows flagged, never raised here)."""
    if rule.form == "traversal":
        return decide_traversal_from_logits(tree, logits, u, sampling)
    return decide_block_from_logits(tree, logits, u, sampling)
