"""What a tree builder asks its drafter for: one level of draft logits (caller-driven building).

A builder grows a tree level by level. Before each level it needs the draft's logits at
some nodes: at the root (level 0: the law of the root's children, after each row's
committed context), then at the nodes it chose to expand. A :class:`DraftRequest` says
which nodes, in the *draft numbering*: the root is draft node 0 and the nodes of every
request are numbered on, in order (``node_ids``). Every builder asks in this form, whether
specdec's own drafts answer (:meth:`DraftModel.request_logits
<specdec.drafts.base.DraftModel.request_logits>`) or a serving engine's runner does
(:class:`specdec.trees.feed.TreeFeed`, docs/serving.md).

Shapes: ``B`` rows (trees), ``k`` new nodes per row in this request, ``S = first_id + k``
draft nodes so far (the root included), ``W`` logit columns (``V``, or ``Vd`` when the
builder asks over the draft's proposal vocabulary).
"""

from __future__ import annotations

import attrs
import torch

__all__ = ["DraftRequest"]


@attrs.frozen(eq=False)
class DraftRequest:
    """One level of draft logits a builder needs (module docstring).

    The builder fills the fields it has at hand; the derived forms (:attr:`node_ids`,
    :attr:`depths`, :attr:`history`, :meth:`attention`, :meth:`positions`) are made on
    demand, so a drafter that does not read them (specdec's own) costs no op for them.

    Attributes:
        level: ``0`` for the root's row, then ``1, 2, ...`` per expansion, in order: the new
            nodes of level ``d`` are at depth ``d``.
        rows: ``B``.
        width: ``W``, the logits' last dimension the builder expects.
        proposal: the logits are over the draft's proposal vocabulary (``W = Vd``), not ``V``.
        parents: ``[B, k]`` int64 draft-node id of each new node's parent (None at level 0).
        tokens: ``[B, k]`` int64 each new node's token (a target id; None at level 0).
        live: ``[B, k]`` bool: the slot holds a real node (False: a filler row carrying the
            root's token, whose logits are not used; any finite logits do). None: all live.
        first_id: the draft-node id of the first new node (the new nodes are
            ``first_id .. first_id + k - 1``; ``1`` at level 1).
        earlier: the ``parents`` of the earlier requests of this tree, in order (the draft tree).
        block: ``k > 0``: a *parallel* request (level 0 only): the laws of the next ``k`` positions
            after each row's committed context, ``[B, k, W]``, each conditioned on the context only
            (:meth:`DraftModel.block_rows_logits <specdec.drafts.base.DraftModel.block_rows_logits>`,
            docs/drafts.md "Parallel drafts"); 0: an ordinary request.
    """

    level: int
    rows: int
    width: int
    proposal: bool
    parents: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    live: torch.Tensor | None = None
    first_id: int = 1
    earlier: tuple[torch.Tensor, ...] = ()
    block: int = 0

    @property
    def new_nodes(self) -> int:
        """``k`` (``0`` at level 0: the root's row is already in the draft's context)."""
        return 0 if self.tokens is None else int(self.tokens.shape[1])

    @property
    def expected_shape(self) -> tuple[int, ...]:
        """The logits' shape: ``[B, W]`` at level 0, ``[B, k, W]`` after (a parallel request:
        ``[B, block, W]``)."""
        if self.block:
            return (self.rows, self.block, self.width)
        return (self.rows, self.width) if self.level == 0 else (self.rows, self.new_nodes, self.width)

    def _nodes(self) -> torch.Tensor:
        if self.tokens is None:
            raise ValueError("level 0 adds no node: the root's row is already in the draft's context")
        return self.tokens

    @property
    def node_ids(self) -> torch.Tensor:
        """``[B, k]`` int64 the new nodes' draft-node ids."""
        tokens = self._nodes()
        return torch.arange(self.first_id, self.first_id + tokens.shape[1], device=tokens.device).expand(tokens.shape)

    @property
    def depths(self) -> torch.Tensor:
        """``[B, k]`` int64 the new nodes' depth below the root (``level``)."""
        return torch.full(self._nodes().shape, self.level, dtype=torch.int64, device=self._nodes().device)

    @property
    def history(self) -> torch.Tensor:
        """``[B, S]`` int64 the parent draft id of every draft node so far, these included
        (``-1`` for the root, draft node 0)."""
        tokens = self._nodes()
        root = torch.full((self.rows, 1), -1, dtype=torch.int64, device=tokens.device)
        assert self.parents is not None
        parts = [p.to(tokens.device).expand(self.rows, -1) for p in (*self.earlier, self.parents)]
        return torch.cat([root, *parts], dim=1)

    def positions(self, root_positions: torch.Tensor) -> torch.Tensor:
        """``[B, k]`` int64 position ids of the new nodes: ``root_positions[b] + level``.

        Args:
            root_positions: ``[B]`` each row's root position (its last committed token's).
        """
        return root_positions.to(self._nodes().device).view(-1, 1) + self.depths

    def attention(self) -> torch.Tensor:
        """``[B, k, S]`` bool: new node ``j`` may attend draft node ``s`` (an ancestor of ``j``
        or ``j`` itself; the root, draft node 0, always). Computed on demand, on the device,
        with no host read (``level + 1`` gathers up the draft tree)."""
        history = self.history
        B, S = history.shape
        current = self.node_ids
        seen = torch.zeros(B, current.shape[1], S, dtype=torch.bool, device=history.device)
        for _ in range(self.level + 1):  # the node, then its ancestors up to the root (depth 0)
            seen |= torch.zeros_like(seen).scatter_(2, current.clamp_min(0).unsqueeze(-1), (current >= 0).unsqueeze(-1))
            current = torch.where(current >= 0, history.gather(1, current.clamp_min(0)), -1)
        return seen
