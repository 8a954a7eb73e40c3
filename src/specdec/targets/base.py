"""The target model interface.

The target scores a whole draft tree in one forward. Its KV cache holds the
committed context *except its last token*: that token is the root of the next
tree, and is forwarded together with the tree's nodes, so prefill, tree steps
and plain autoregressive steps (a tree of one node) share one code path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

import torch

from specdec.errors import InvalidConfigError
from specdec.tree import DraftTree
from specdec.tree_batch import TreeBatch

__all__ = ["TargetModel"]


class TargetModel(ABC):
    """A target model: the law ``p`` that speculative decoding must reproduce exactly.

    Lifecycle: :meth:`prefill` with the prompt; per step :meth:`score_tree` on
    the step's tree, then :meth:`accept` with the accepted nodes of that tree.
    The method names differ from :class:`~specdec.drafts.base.DraftModel`'s so
    that one object (e.g. :class:`~specdec.models.CallableLM`) can serve as
    both, with separate state for each role.
    """

    registry_name: ClassVar[str] = "?"
    capture_layers: tuple[int, ...] = ()
    """The hidden-state layers the target captures at every scored node (:meth:`hidden_states`),
    for feature-level drafts; none by default."""
    supports_batch: ClassVar[bool] = False
    """Declared: the target has a batch mode (:meth:`prefill_batch`, :meth:`accept_rows` and
    :meth:`keep_rows` serve several rows); the loop refuses several rows otherwise, before
    any forward."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Size ``V`` of the logits this model returns."""

    @property
    def max_length(self) -> int | None:
        """Longest sequence (committed tokens + tree) the model can attend over; None = unbounded."""
        return None

    def reserve(self, positions: int) -> None:
        """A hint before :meth:`prefill`: the coming sequence needs at most
        ``positions`` cached positions (prompt, new tokens and the deepest
        tree). A model with a preallocated cache sizes it once from this;
        the default does nothing."""

    @abstractmethod
    def prefill(self, prompt_ids: Sequence[int]) -> None:
        """Start a new sequence (non-empty prompt); the prompt's last token becomes the first root."""

    @abstractmethod
    def score_tree(self, tree: DraftTree) -> torch.Tensor:
        """``[n, V]`` raw logits of the token after each node of ``tree``
        (row 0: after the committed context, i.e. after the root)."""

    def score_batch(self, tree: TreeBatch) -> torch.Tensor:
        """``[B, n, V]`` raw logits after every node slot of a one-tree batch.

        The default scores the host view (:meth:`TreeBatch.tree`, host reads)
        with :meth:`score_tree` and pads the padding slots with a copy of row
        0; :class:`~specdec.targets.hf.HFTarget` scores the tensors directly.
        """
        if tree.batch_size != 1:
            raise NotImplementedError(f"{type(self).__name__} scores one tree per step, got a batch of {tree.batch_size}")
        logits = self.score_tree(tree.tree(0))  # [k, V]
        pad = tree.node_slots - logits.shape[0]
        if pad:
            logits = torch.cat([logits, logits[:1].expand(pad, -1)])
        return logits.unsqueeze(0)

    @abstractmethod
    def accept(self, accepted_nodes: Sequence[int], bonus_token: int) -> None:
        """Keep the root and ``accepted_nodes`` of the last tree in the cache
        (dropping the other nodes); ``bonus_token`` becomes the next root."""

    def hidden_states(self) -> torch.Tensor | None:
        """Hidden features captured at the last tree's nodes, if the model was
        asked to capture any (feature-level drafts); else None."""
        return None

    @property
    def device(self) -> torch.device:
        """Where the target's logits live, and where the loop keeps its per-row tensors
        (roots, contexts); the CPU by default."""
        return torch.device("cpu")

    # ------------------------------------------------ rows: what the loop calls
    # The generation loop (specdec.engine.loop) drives every target through these,
    # for B rows; B = 1 is a batch of one. The defaults serve one row with the
    # one-row methods above; a target with a batch mode overrides all three.
    def prefill_batch(self, prompts: Sequence[Sequence[int]]) -> None:
        """Start ``B`` rows, row ``b`` with the non-empty ``prompts[b]``.

        The default serves one row (:meth:`prefill`).

        Raises:
            InvalidConfigError: several rows for a target without a batch mode.
        """
        if len(prompts) != 1:
            raise InvalidConfigError(
                f"{type(self).__name__} has no batch mode (prefill_batch / accept_rows / keep_rows): it decodes one "
                f"row at a time, got {len(prompts)} prompts; use HFTarget or CallableLM for batches"
            )
        self.prefill(prompts[0])

    def accept_rows(
        self,
        accepted: torch.Tensor,
        num_accepted: torch.Tensor,
        emitted: Sequence[Sequence[int]],
        *,
        nodes: Sequence[Sequence[int]],
    ) -> None:
        """After a step: row ``b`` keeps its root and accepted path in its cache and appends
        ``emitted[b]`` (its accepted tokens, then the bonus) to its context.

        Args:
            accepted: ``[B, D]`` int64 accepted node slots, top-down, ``-1`` padded (device).
            num_accepted: ``[B]`` int64 path lengths (device).
            emitted: per row, ``num_accepted[b] + 1`` tokens (host).
            nodes: per row, the accepted node slots (host, from the step's read).

        The default serves one row (:meth:`accept`).
        """
        if len(emitted) != 1:
            raise InvalidConfigError(f"{type(self).__name__} has no batch mode: accept_rows got {len(emitted)} rows")
        self.accept(nodes[0], emitted[0][-1])

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only the rows ``rows`` (rows that stopped leave the batch), renumbered in order.
        The loop calls it only with several rows; the default has none to keep."""
        raise InvalidConfigError(f"{type(self).__name__} has no batch mode: keep_rows({list(rows)})")

    def hidden_rows(self) -> torch.Tensor | None:
        """``[B, n, L, H]`` :meth:`hidden_states` per row (feature-level drafts); the default
        gives the one row's ``[n, L, H]`` a batch dimension."""
        hidden = self.hidden_states()
        return None if hidden is None else hidden.unsqueeze(0)
