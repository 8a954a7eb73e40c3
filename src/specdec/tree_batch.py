"""The tree batch: draft trees as device tensors, the step path's one representation.

A :class:`TreeBatch` holds ``B`` draft trees of at most ``n`` nodes each as
fixed-shape tensors on the draft's device. The level-wise builders
(:mod:`specdec.trees.levelwise`) emit it directly, the target scores it and
the tensor verifiers (:mod:`specdec.verify.fast`) decide it without any
conversion or host read. :class:`~specdec.tree.DraftTree` stays the host
view of one tree (:meth:`TreeBatch.tree`), for the exact tests and for
plug-in authors; converting costs host reads and runs its full validation,
so the step path never does it.

The words (draft tree, deterministic and sampled children, proposal law
``q'``, weight, score) are those of :mod:`specdec.tree` and docs/concepts.md.

Layout (``B`` trees, ``n`` node slots, ``L`` law slots):

- node ``0`` of every tree is its root; nodes ``1 .. num_nodes[b] - 1`` are
  draft nodes, parents before children; slots ``>= num_nodes[b]`` are
  *padding* (kind :data:`PAD`, parent ``-1``, nobody's child). A padding
  slot is scored like a node that sees only the committed context, and its
  output is never read.
- the proposal law of node ``i``'s sampled children is stored at the parent,
  ``law_ids[b, i]`` / ``law_probs[b, i]`` (``-1`` / ``0`` padded), drawn
  i.i.d. or without replacement as ``law_wor[b, i]`` says.
"""

from __future__ import annotations

import attrs
import torch

from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw

__all__ = ["PAD", "TreeBatch"]

PAD = -1
""":attr:`TreeBatch.kinds` value of a padding slot."""


@attrs.frozen(eq=False)
class TreeBatch:
    """``B`` draft trees as tensors (see the module docstring for the layout).

    Attributes:
        tokens: ``[B, n]`` int64 token of each node (root: last committed token; padding: the root's).
        parents: ``[B, n]`` int64 parent slot, ``-1`` for roots and padding.
        depths: ``[B, n]`` int64 depth (root and padding 0).
        kinds: ``[B, n]`` int64 :class:`~specdec.tree.NodeKind` values, :data:`PAD` for padding.
        draw_order: ``[B, n]`` int64 rank among deterministic siblings, or draw
            position among sampled siblings (dense, from 0).
        weights: ``[B, n]`` float64 construction weights (root 1, padding 0).
        num_nodes: ``[B]`` int64 valid nodes per tree (root included).
        law_ids: ``[B, n, L]`` int64 support of the law of each node's sampled children, ``-1`` padded.
        law_probs: ``[B, n, L]`` float64 its probabilities, ``0`` padded.
        law_wor: ``[B, n]`` bool: the node's sampled children were drawn without replacement.
        ancestors: ``[B, n, n]`` bool, ``[b, i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``.
        vocab_size: ``V``.
        max_children: most children one node can have (the verifiers' child-slot count).
        max_depth: bound on every tree's depth (the verifiers' walk length).
        draft_bad: ``[B]`` bool, or None: a draft law met while building was
            not a distribution (NaN / +inf / all -inf logits), or put mass
            outside the draft's declared proposal vocabulary; the step raises on it.
        max_sampled: most sampled children one node can have (the rejection
            rules' loop length); None = :attr:`max_children`.
        host_trees: the validated host trees a batch was stacked from
            (:meth:`from_trees`), returned by :meth:`tree` instead of being rebuilt.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    kinds: torch.Tensor
    draw_order: torch.Tensor
    weights: torch.Tensor
    num_nodes: torch.Tensor
    law_ids: torch.Tensor
    law_probs: torch.Tensor
    law_wor: torch.Tensor
    ancestors: torch.Tensor
    vocab_size: int
    max_children: int
    max_depth: int
    draft_bad: torch.Tensor | None = None
    max_sampled: int | None = None
    host_trees: tuple[DraftTree, ...] | None = attrs.field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        """``B``."""
        return int(self.tokens.shape[0])

    @property
    def node_slots(self) -> int:
        """``n``: node slots per tree, padding included."""
        return int(self.tokens.shape[1])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    # ------------------------------------------------------------ host view
    def tree(self, b: int = 0) -> DraftTree:
        """Tree ``b`` as a validated :class:`~specdec.tree.DraftTree` (host reads; not for the step path)."""
        if self.host_trees is not None:
            return self.host_trees[b]
        n = int(self.num_nodes[b])
        kinds = self.kinds[b, :n].cpu()
        parents = self.parents[b, :n].cpu()
        laws: list[SparseLaw] = []
        law_of_parent: dict[int, int] = {}
        law_index = [-1] * n
        for i in (kinds == int(NodeKind.SAMPLED)).nonzero().flatten().tolist():
            parent = int(parents[i])
            lid = law_of_parent.get(parent)
            if lid is None:
                ids = self.law_ids[b, parent].cpu()
                keep = ids >= 0
                mode = SampleMode.WITHOUT_REPLACEMENT if bool(self.law_wor[b, parent]) else SampleMode.IID
                lid = law_of_parent[parent] = len(laws)
                laws.append(SparseLaw(ids[keep], self.law_probs[b, parent].cpu()[keep], mode))
            law_index[i] = lid
        return DraftTree(
            tokens=self.tokens[b, :n].cpu(),
            parents=parents,
            kinds=kinds,
            draw_order=self.draw_order[b, :n].cpu(),
            weights=self.weights[b, :n].cpu(),
            law_index=law_index,
            laws=laws,
            vocab_size=self.vocab_size,
        )

    def validate(self) -> None:
        """Check every tree's invariants (via :meth:`tree`, which validates) and
        that the tensors agree with each other; raise
        :class:`~specdec.errors.MalformedTreeError` otherwise. Validate mode only."""
        from specdec.errors import MalformedTreeError

        for b in range(self.batch_size):
            tree = self.tree(b)
            n = tree.num_nodes
            if not torch.equal(self.depths[b, :n].cpu(), tree.depths):
                raise MalformedTreeError(f"tree {b}: depths disagree with parents")
            if not torch.equal(self.ancestors[b, :n, :n].cpu(), tree.ancestor_mask()):
                raise MalformedTreeError(f"tree {b}: ancestor mask disagrees with parents")
            if self.max_sampled is not None and any(
                len(tree.sampled_children(i)) > self.max_sampled for i in range(n)
            ):
                raise MalformedTreeError(f"tree {b}: more sampled children than max_sampled={self.max_sampled}")
            if bool((self.depths[b, :n] > self.max_depth).any()):
                raise MalformedTreeError(f"tree {b}: deeper than max_depth={self.max_depth}")
            if n < self.node_slots and bool((self.kinds[b, n:] != PAD).any()):
                raise MalformedTreeError(f"tree {b}: slots past num_nodes must be padding")

    # ------------------------------------------------------------ row groups
    def select_rows(self, index: torch.Tensor) -> "TreeBatch":
        """The trees of rows ``index`` (``[k]`` int64 on the batch's device), in that order, with
        the same node slots and bounds (one ``index_select`` per field; no host read)."""
        pick = lambda t: t.index_select(0, index)  # noqa: E731
        hosts = None if self.host_trees is None else tuple(self.host_trees[int(i)] for i in index.tolist())
        return attrs.evolve(
            self, tokens=pick(self.tokens), parents=pick(self.parents), depths=pick(self.depths), kinds=pick(self.kinds),
            draw_order=pick(self.draw_order), weights=pick(self.weights), num_nodes=pick(self.num_nodes),
            law_ids=pick(self.law_ids), law_probs=pick(self.law_probs), law_wor=pick(self.law_wor),
            ancestors=pick(self.ancestors), draft_bad=None if self.draft_bad is None else pick(self.draft_bad),
            host_trees=hosts,
        )

    @classmethod
    def scatter_rows(cls, parts: "list[tuple[torch.Tensor, TreeBatch]]", rows: int) -> "TreeBatch":
        """One batch of ``rows`` trees from groups of rows (per-row sampling: one group per
        configuration): ``parts`` pairs each group's row indices (``[k]`` int64, on the groups'
        device; the groups partition ``0 .. rows - 1``) with its tree batch. Node slots and law
        slots are padded to the largest group's (padding as :meth:`from_trees` lays it out); the
        bounds are the groups' largest. No host read.

        Raises:
            ValueError: no groups, groups over different vocabularies or devices.
        """
        if not parts:
            raise ValueError("scatter_rows needs at least one group")
        first = parts[0][1]
        if any(t.vocab_size != first.vocab_size or t.device != first.device for _, t in parts):
            raise ValueError("scatter_rows: the groups' trees are over different vocabularies or devices")
        n = max(t.node_slots for _, t in parts)
        L = max(int(t.law_ids.shape[-1]) for _, t in parts)
        dev = first.device
        eye = torch.eye(n, dtype=torch.bool, device=dev)

        def slots(t: torch.Tensor, fill: float | int | bool, width: int) -> torch.Tensor:  # [k, n_g, ...] -> [k, n, ...]
            pad = width - t.shape[1]
            return t if pad == 0 else torch.cat([t, t.new_full((t.shape[0], pad, *t.shape[2:]), fill)], dim=1)

        out: dict[str, torch.Tensor] = {}
        for name, fill in (("tokens", 0), ("parents", -1), ("depths", 0), ("kinds", PAD), ("draw_order", 0),
                           ("weights", 0.0), ("law_wor", False)):
            ref = getattr(first, name)
            out[name] = ref.new_full((rows, n), fill)
        out["law_ids"] = first.law_ids.new_full((rows, n, L), -1)
        out["law_probs"] = first.law_probs.new_zeros((rows, n, L))
        out["ancestors"] = eye.expand(rows, n, n).clone()
        out["num_nodes"] = first.num_nodes.new_zeros(rows)
        bad = None if all(t.draft_bad is None for _, t in parts) else torch.zeros(rows, dtype=torch.bool, device=dev)
        for index, t in parts:
            k, m = t.batch_size, t.node_slots
            out["tokens"].index_copy_(0, index, torch.cat([t.tokens, t.tokens[:, :1].expand(k, n - m)], dim=1))
            for name, fill in (("parents", -1), ("depths", 0), ("kinds", PAD), ("draw_order", 0),
                               ("weights", 0.0), ("law_wor", False)):
                out[name].index_copy_(0, index, slots(getattr(t, name), fill, n))
            ids = t.law_ids if t.law_ids.shape[-1] == L else torch.cat(
                [t.law_ids, t.law_ids.new_full((k, m, L - t.law_ids.shape[-1]), -1)], dim=-1)
            probs = t.law_probs if t.law_probs.shape[-1] == L else torch.cat(
                [t.law_probs, t.law_probs.new_zeros((k, m, L - t.law_probs.shape[-1]))], dim=-1)
            out["law_ids"].index_copy_(0, index, slots(ids, -1, n))
            out["law_probs"].index_copy_(0, index, slots(probs, 0.0, n))
            anc = eye.expand(k, n, n).clone()
            anc[:, :m, :m] = t.ancestors
            out["ancestors"].index_copy_(0, index, anc)
            out["num_nodes"].index_copy_(0, index, t.num_nodes)
            if bad is not None and t.draft_bad is not None:
                bad.index_copy_(0, index, t.draft_bad.to(dev))
        sampled = [t.max_sampled if t.max_sampled is not None else t.max_children for _, t in parts]
        return cls(
            tokens=out["tokens"], parents=out["parents"], depths=out["depths"], kinds=out["kinds"],
            draw_order=out["draw_order"], weights=out["weights"], num_nodes=out["num_nodes"], law_ids=out["law_ids"],
            law_probs=out["law_probs"], law_wor=out["law_wor"], ancestors=out["ancestors"],
            vocab_size=first.vocab_size, max_children=max(t.max_children for _, t in parts),
            max_depth=max(t.max_depth for _, t in parts), draft_bad=bad, max_sampled=max(sampled),
        )

    # ---------------------------------------------------------- constructor
    @classmethod
    def from_trees(
        cls,
        trees: list[DraftTree],
        *,
        device: torch.device | str = "cpu",
        node_slots: int | None = None,
        max_children: int | None = None,
        max_depth: int | None = None,
    ) -> "TreeBatch":
        """Stack host trees into a batch (for per-node builders and tests; host work).

        Args:
            trees: ``B >= 1`` trees over one vocabulary.
            device: where the tensors go.
            node_slots: ``n`` (default: the largest tree).
            max_children, max_depth: bounds (default: the trees' own; at least one child slot).
        """
        if not trees:
            raise ValueError("from_trees needs at least one tree")
        vocab = trees[0].vocab_size
        n = node_slots or max(t.num_nodes for t in trees)
        widths = [len(law.indices) for t in trees for law in t.laws]
        L = max(widths, default=0)
        B = len(trees)
        tokens = torch.zeros(B, n, dtype=torch.int64)
        parents = torch.full((B, n), -1, dtype=torch.int64)
        depths = torch.zeros(B, n, dtype=torch.int64)
        kinds = torch.full((B, n), PAD, dtype=torch.int64)
        order = torch.zeros(B, n, dtype=torch.int64)
        weights = torch.zeros(B, n, dtype=torch.float64)
        law_ids = torch.full((B, n, L), -1, dtype=torch.int64)
        law_probs = torch.zeros(B, n, L, dtype=torch.float64)
        law_wor = torch.zeros(B, n, dtype=torch.bool)
        anc = torch.zeros(B, n, n, dtype=torch.bool)
        children = sampled = 0
        for b, t in enumerate(trees):
            if t.vocab_size != vocab:
                raise ValueError("from_trees: the trees have different vocabularies")
            k = t.num_nodes
            if k > n:
                raise ValueError(f"from_trees: a tree has {k} nodes, more than node_slots={n}")
            tokens[b, :k], tokens[b, k:] = t.tokens, t.tokens[0]
            parents[b, :k] = t.parents
            depths[b, :k] = t.depths
            kinds[b, :k] = t.kinds
            order[b, :k] = t.draw_order
            weights[b, :k] = t.weights
            anc[b, :k, :k] = t.ancestor_mask()
            anc[b, k:, k:] = torch.eye(n - k, dtype=torch.bool)
            for node in range(k):
                children = max(children, len(t.children(node)))
                sampled = max(sampled, len(t.sampled_children(node)))
                law = t.sampled_law_at(node)
                if law is not None:
                    w = len(law.indices)
                    law_ids[b, node, :w] = law.indices
                    law_probs[b, node, :w] = law.probs.to(torch.float64)
                    law_wor[b, node] = law.mode == SampleMode.WITHOUT_REPLACEMENT
        deepest = max(int(t.depths.max()) for t in trees)
        dev = torch.device(device)
        return cls(
            tokens=tokens.to(dev), parents=parents.to(dev), depths=depths.to(dev), kinds=kinds.to(dev),
            draw_order=order.to(dev), weights=weights.to(dev),
            num_nodes=torch.tensor([t.num_nodes for t in trees], dtype=torch.int64).to(dev),
            law_ids=law_ids.to(dev), law_probs=law_probs.to(dev), law_wor=law_wor.to(dev), ancestors=anc.to(dev),
            vocab_size=vocab, max_children=max(children, max_children or 0, 1), max_depth=max(deepest, max_depth or 0),
            max_sampled=sampled, host_trees=tuple(trees),
        )
