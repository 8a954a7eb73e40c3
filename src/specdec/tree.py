"""The draft tree: the one data structure every builder produces and every
verifier consumes.

Words (used throughout specdec; see also ``docs/concepts.md``):

- *draft tree*: node 0 is the *root*, the last committed token; every other
  node is a proposed token. Node ``i``'s parent has a smaller index.
- *deterministic* child: chosen by rank (top-K of the draft law ``q``); no
  randomness. Its ``draw_order`` is its rank among deterministic siblings.
- *sampled* child: drawn from a recorded *proposal law* ``q'`` (a
  :class:`SparseLaw`), i.i.d. or without replacement; its ``draw_order`` is its
  position in the draw sequence. A node's sampled children always share one
  law and are a prefix of the draws (draw orders ``0..k-1``).
- *weight*: the construction weight of a node (``q(x)`` for deterministic
  children, a *proxy* for sampled ones in RheoSampling). Only builders use it;
  verifiers use the recorded laws. Path *score* = sum of log weights.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from functools import cached_property

import attrs
import torch

from specdec.errors import MalformedTreeError

__all__ = ["NodeKind", "SampleMode", "SparseLaw", "DraftTree", "TreeAssembler"]


class NodeKind(enum.IntEnum):
    """What a tree node is. Stored in :attr:`DraftTree.kinds`."""

    ROOT = 0
    DETERMINISTIC = 1
    SAMPLED = 2


class SampleMode(str, enum.Enum):
    """How the sampled children of one node were drawn from their law."""

    IID = "iid"
    WITHOUT_REPLACEMENT = "wor"


def _law_tolerance(dtype: torch.dtype) -> float:
    return 1e-9 if dtype == torch.float64 else 1e-4


@attrs.frozen(eq=False)
class SparseLaw:
    """A proposal law ``q'`` stored sparsely, and how it was sampled.

    Attributes:
        indices: ``[M]`` int64 distinct token ids of the support.
        probs: ``[M]`` float probabilities (sum to 1) of those ids.
        mode: :class:`SampleMode` used to draw the node's sampled children.

    Example:
        >>> import torch
        >>> law = SparseLaw(torch.tensor([3, 1]), torch.tensor([0.75, 0.25]), SampleMode.IID)
        >>> law.dense(4).tolist()
        [0.0, 0.25, 0.0, 0.75]
    """

    indices: torch.Tensor
    probs: torch.Tensor
    mode: SampleMode = SampleMode.IID

    @classmethod
    def from_dense(cls, q: torch.Tensor, mode: SampleMode = SampleMode.IID) -> "SparseLaw":
        """The law of a dense ``[V]`` distribution, restricted to its support."""
        support = torch.nonzero(q > 0).flatten()
        return cls(support, q[support], mode)

    def dense(self, vocab_size: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``[V]`` dense copy of the law."""
        out = torch.zeros(vocab_size, dtype=dtype or self.probs.dtype, device=self.probs.device)
        return out.scatter_(0, self.indices, self.probs.to(out.dtype))

    def prob_of(self, token: int) -> float:
        """``q'(token)`` (0 outside the support)."""
        hit = torch.nonzero(self.indices == token).flatten()
        return float(self.probs[hit[0]]) if hit.numel() else 0.0

    def validate(self, vocab_size: int) -> None:
        """Raise :class:`MalformedTreeError` unless the law is a normalised
        distribution over distinct ids in ``[0, vocab_size)``."""
        if self.indices.dim() != 1 or self.probs.dim() != 1 or self.indices.shape != self.probs.shape:
            raise MalformedTreeError("a SparseLaw needs 1-D indices and probs of equal length")
        if self.indices.numel() == 0:
            raise MalformedTreeError("a SparseLaw has an empty support")
        if self.indices.dtype != torch.int64 or not torch.is_floating_point(self.probs):
            raise MalformedTreeError("SparseLaw indices must be int64 and probs floating point")
        if int(self.indices.min()) < 0 or int(self.indices.max()) >= vocab_size:
            raise MalformedTreeError(f"SparseLaw indices must lie in [0, {vocab_size})")
        strictly_sorted = self.indices.numel() < 2 or bool((self.indices[1:] > self.indices[:-1]).all())
        if not strictly_sorted and torch.unique(self.indices).numel() != self.indices.numel():
            raise MalformedTreeError("SparseLaw indices must be distinct")
        if not torch.isfinite(self.probs).all() or bool((self.probs < 0).any()):
            raise MalformedTreeError("SparseLaw probs must be finite and non-negative")
        total = float(self.probs.sum())
        if abs(total - 1.0) > _law_tolerance(self.probs.dtype):
            raise MalformedTreeError(f"SparseLaw probs must sum to 1, got {total!r}")
        if not isinstance(self.mode, SampleMode):
            raise MalformedTreeError(f"SparseLaw mode must be a SampleMode, got {self.mode!r}")


def _as_long(x: Sequence[int] | torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 1:
        raise MalformedTreeError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.numel() and (torch.is_floating_point(t) or t.dtype == torch.bool):
        raise MalformedTreeError(f"{name} must hold integers, got {t.dtype}")
    return t.to(torch.int64)


def _as_laws(x: Iterable[SparseLaw]) -> tuple[SparseLaw, ...]:
    return tuple(x)


@attrs.frozen(eq=False)
class DraftTree:
    """A draft tree of ``n = N + 1`` nodes (node 0 is the root).

    All per-node tensors have shape ``[n]`` and live on the CPU (they are tiny
    bookkeeping; models move what they need).

    Attributes:
        tokens: ``[n]`` int64 token of each node (root: last committed token).
        parents: ``[n]`` int64 parent index; ``-1`` for the root; ``parents[i] < i``.
        kinds: ``[n]`` int64 :class:`NodeKind` values.
        draw_order: ``[n]`` int64 draw position (sampled) or rank
            (deterministic) among siblings of the same kind; 0 for the root.
        weights: ``[n]`` float64 construction weights in ``[0, 1]`` (root 1).
        law_index: ``[n]`` int64 index into ``laws`` for sampled nodes, else -1.
        laws: proposal laws of the sampled children, one per node that has any.
        vocab_size: size ``V`` of the vocabulary.

    The constructor checks every invariant (see :meth:`validate`) and raises
    :class:`~specdec.errors.MalformedTreeError` on the first violation.
    Build trees with :class:`TreeAssembler` or :meth:`chain`.
    """

    tokens: torch.Tensor = attrs.field(converter=lambda x: _as_long(x, "tokens"))
    parents: torch.Tensor = attrs.field(converter=lambda x: _as_long(x, "parents"))
    kinds: torch.Tensor = attrs.field(converter=lambda x: _as_long(x, "kinds"))
    draw_order: torch.Tensor = attrs.field(converter=lambda x: _as_long(x, "draw_order"))
    weights: torch.Tensor = attrs.field(converter=lambda x: torch.as_tensor(x, dtype=torch.float64))
    law_index: torch.Tensor = attrs.field(converter=lambda x: _as_long(x, "law_index"))
    laws: tuple[SparseLaw, ...] = attrs.field(converter=_as_laws)
    vocab_size: int = attrs.field()

    def __attrs_post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ size
    @property
    def num_nodes(self) -> int:
        """``n``: number of nodes, root included."""
        return int(self.tokens.numel())

    @property
    def num_draft_nodes(self) -> int:
        """``N = n - 1``: number of proposed tokens."""
        return self.num_nodes - 1

    # --------------------------------------------------------- derived views
    @cached_property
    def depths(self) -> torch.Tensor:
        """``[n]`` int64 depth of each node (root 0)."""
        parents = self.parents.tolist()
        depth = [0] * len(parents)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        return torch.tensor(depth, dtype=torch.int64)

    @cached_property
    def _children(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        sampled: list[list[tuple[int, int]]] = [[] for _ in range(self.num_nodes)]
        determ: list[list[tuple[int, int]]] = [[] for _ in range(self.num_nodes)]
        parents, kinds, order = self.parents.tolist(), self.kinds.tolist(), self.draw_order.tolist()
        for i in range(1, self.num_nodes):
            target = sampled if kinds[i] == NodeKind.SAMPLED else determ
            target[parents[i]].append((order[i], i))
        return tuple(
            (tuple(i for _, i in sorted(s)), tuple(i for _, i in sorted(d)))
            for s, d in zip(sampled, determ)
        )

    def sampled_children(self, node: int) -> tuple[int, ...]:
        """Sampled children of ``node``, in draw order."""
        return self._children[node][0]

    def deterministic_children(self, node: int) -> tuple[int, ...]:
        """Deterministic children of ``node``, in rank order."""
        return self._children[node][1]

    def children(self, node: int) -> tuple[int, ...]:
        """All children of ``node``: sampled (draw order) then deterministic (rank)."""
        s, d = self._children[node]
        return s + d

    def law_of(self, node: int) -> SparseLaw:
        """The proposal law a sampled ``node`` was drawn from."""
        index = int(self.law_index[node])
        if index < 0:
            raise MalformedTreeError(f"node {node} is not a sampled node")
        return self.laws[index]

    def sampled_law_at(self, node: int) -> SparseLaw | None:
        """The law ``node``'s sampled children were drawn from (None if none)."""
        kids = self.sampled_children(node)
        return self.law_of(kids[0]) if kids else None

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to ``node`` (root excluded)."""
        path = []
        parents = self.parents.tolist()
        while node > 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """``[n, n]`` bool: ``mask[i, j]`` is True iff ``j`` is ``i`` or an ancestor of ``i``
        (the tree-attention pattern over the tree's tokens)."""
        n = self.num_nodes
        mask = torch.eye(n, dtype=torch.bool)
        for i, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                mask[i] |= mask[parent]
        return mask

    # ------------------------------------------------------------ invariants
    def validate(self) -> None:
        """Check every invariant; raise :class:`MalformedTreeError` naming the first one broken.

        Invariants: equal ``[n]`` shapes, ``n >= 1``; node 0 is the only root
        (parent -1, kind ROOT, weight 1); ``0 <= parents[i] < i`` (parents before
        children, hence ancestor closure); tokens in ``[0, V)``; weights in
        ``[0, 1]``; deterministic siblings have distinct tokens and ranks; the
        sampled children of a node share one law, have draw orders ``0..k-1``,
        have tokens in the law's support, and are distinct when drawn without
        replacement; every law is normalised; every law is used.
        """
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise MalformedTreeError(f"vocab_size must be a positive int, got {self.vocab_size!r}")
        n = self.tokens.numel()
        if n < 1:
            raise MalformedTreeError("a tree needs at least the root node")
        for name in ("parents", "kinds", "draw_order", "weights", "law_index"):
            t = getattr(self, name)
            if t.shape != (n,):
                raise MalformedTreeError(f"{name} has shape {tuple(t.shape)}, expected ({n},)")
        tokens, parents, kinds = self.tokens.tolist(), self.parents.tolist(), self.kinds.tolist()
        order, law_index = self.draw_order.tolist(), self.law_index.tolist()
        weights = self.weights.tolist()
        if parents[0] != -1 or kinds[0] != NodeKind.ROOT:
            raise MalformedTreeError("node 0 must be the root (parent -1, kind ROOT)")
        if weights[0] != 1.0:
            raise MalformedTreeError("the root's weight must be 1")
        for i in range(n):
            if not 0 <= tokens[i] < self.vocab_size:
                raise MalformedTreeError(f"node {i}: token {tokens[i]} outside [0, {self.vocab_size})")
            if not 0.0 <= weights[i] <= 1.0:  # also rejects NaN
                raise MalformedTreeError(f"node {i}: weight {weights[i]!r} outside [0, 1]")
            if i == 0:
                continue
            if not 0 <= parents[i] < i:
                raise MalformedTreeError(f"node {i}: parent {parents[i]} must satisfy 0 <= parent < {i}")
            if kinds[i] not in (NodeKind.DETERMINISTIC, NodeKind.SAMPLED):
                raise MalformedTreeError(f"node {i}: kind {kinds[i]} must be DETERMINISTIC or SAMPLED")
            if kinds[i] == NodeKind.SAMPLED:
                if not 0 <= law_index[i] < len(self.laws):
                    raise MalformedTreeError(f"sampled node {i}: law_index {law_index[i]} out of range")
            elif law_index[i] != -1:
                raise MalformedTreeError(f"deterministic node {i}: law_index must be -1")
        if law_index[0] != -1:
            raise MalformedTreeError("the root's law_index must be -1")
        for law in self.laws:
            if not isinstance(law, SparseLaw):
                raise MalformedTreeError(f"laws must be SparseLaw objects, got {type(law).__name__}")
            law.validate(self.vocab_size)
        used: set[int] = set()
        for node in range(n):
            s, d = self._children[node]
            if sorted(order[c] for c in d) != list(range(len(d))):
                raise MalformedTreeError(f"node {node}: deterministic ranks must be 0..{len(d) - 1}")
            if len({tokens[c] for c in d}) != len(d):
                raise MalformedTreeError(f"node {node}: deterministic children repeat a token")
            if not s:
                continue
            if [order[c] for c in s] != list(range(len(s))):
                raise MalformedTreeError(f"node {node}: sampled draw orders must be 0..{len(s) - 1}")
            ids = {law_index[c] for c in s}
            if len(ids) != 1:
                raise MalformedTreeError(f"node {node}: sampled children must share one proposal law")
            (lid,) = ids
            if lid in used:
                raise MalformedTreeError(f"law {lid} is shared by the sampled children of two nodes")
            used.add(lid)
            law = self.laws[lid]
            drawn = torch.tensor([tokens[c] for c in s], dtype=law.indices.dtype, device=law.indices.device)
            hit = (law.indices.unsqueeze(0) == drawn.unsqueeze(1)) & (law.probs > 0).unsqueeze(0)
            missing = (~hit.any(dim=1)).nonzero().flatten().tolist()
            if missing:
                c = s[missing[0]]
                raise MalformedTreeError(f"sampled node {c}: token {tokens[c]} has zero probability under its law")
            if law.mode == SampleMode.WITHOUT_REPLACEMENT and len({tokens[c] for c in s}) != len(s):
                raise MalformedTreeError(f"node {node}: children drawn without replacement repeat a token")
        if len(used) != len(self.laws):
            raise MalformedTreeError("every law must be used by some sampled node")

    # ---------------------------------------------------------- constructors
    @classmethod
    def chain(
        cls,
        root_token: int,
        tokens: Sequence[int],
        laws: Sequence[SparseLaw],
        vocab_size: int,
        weights: Sequence[float] | None = None,
    ) -> "DraftTree":
        """A chain: each node has one sampled child drawn from ``laws[i]``."""
        asm = TreeAssembler(root_token, vocab_size)
        node = 0
        for i, (tok, law) in enumerate(zip(tokens, laws, strict=True)):
            node = asm.add_sampled(node, tok, law, weight=1.0 if weights is None else weights[i])
        return asm.build()

    def subtree(self, keep: Sequence[int] | torch.Tensor) -> "DraftTree":
        """The tree restricted to the nodes in ``keep`` (root added if absent).

        ``keep`` must be closed under taking parents. Sampled siblings must stay
        a prefix of their draws and deterministic ranks are re-numbered densely
        in rank order (the invariant checker enforces both).
        """
        keep_set = {0} | {int(k) for k in torch.as_tensor(keep).flatten().tolist()}
        kept = sorted(keep_set)
        parents = self.parents.tolist()
        for k in kept:
            if k < 0 or k >= self.num_nodes:
                raise MalformedTreeError(f"subtree: node {k} out of range")
            if k and parents[k] not in keep_set:
                raise MalformedTreeError(f"subtree: node {k} kept without its parent {parents[k]}")
        remap = {old: new for new, old in enumerate(kept)}
        kinds = self.kinds.tolist()
        order = self.draw_order.tolist()
        new_order = [0] * len(kept)
        for node in kept:  # re-rank deterministic children densely
            d = [c for c in self.deterministic_children(node) if c in keep_set]
            for rank, c in enumerate(d):
                new_order[remap[c]] = rank
            for c in self.sampled_children(node):
                if c in keep_set:
                    new_order[remap[c]] = order[c]
        law_map: dict[int, int] = {}
        law_index = []
        for k in kept:
            lid = int(self.law_index[k])
            if lid >= 0:
                law_map.setdefault(lid, len(law_map))
                law_index.append(law_map[lid])
            else:
                law_index.append(-1)
        # law_map numbers the kept laws 0, 1, ... in insertion order
        laws = [self.laws[old] for old in law_map]
        idx = torch.tensor(kept)
        return DraftTree(
            tokens=self.tokens[idx],
            parents=[-1] + [remap[parents[k]] for k in kept[1:]],
            kinds=[kinds[k] for k in kept],
            draw_order=new_order,
            weights=self.weights[idx],
            law_index=law_index,
            laws=laws,
            vocab_size=self.vocab_size,
        )


class TreeAssembler:
    """Mutable helper that builds a :class:`DraftTree` node by node.

    Example:
        >>> import torch
        >>> asm = TreeAssembler(root_token=0, vocab_size=4)
        >>> a = asm.add_deterministic(0, token=2, weight=0.6)
        >>> law = SparseLaw(torch.tensor([1, 3]), torch.tensor([0.5, 0.5]), SampleMode.IID)
        >>> b = asm.add_sampled(0, token=3, law=law, weight=0.4)
        >>> tree = asm.build()
        >>> tree.children(0)
        (2, 1)
    """

    def __init__(self, root_token: int, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.tokens = [int(root_token)]
        self.parents = [-1]
        self.kinds = [int(NodeKind.ROOT)]
        self.order = [0]
        self.weights = [1.0]
        self.law_index = [-1]
        self.laws: list[SparseLaw] = []
        self._law_of_parent: dict[int, int] = {}
        self._n_sampled: dict[int, int] = {}
        self._n_determ: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def _append(self, parent: int, token: int, kind: NodeKind, order: int, weight: float, lid: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.kinds.append(int(kind))
        self.order.append(order)
        self.weights.append(float(weight))
        self.law_index.append(lid)
        return len(self.tokens) - 1

    def add_deterministic(self, parent: int, token: int, weight: float) -> int:
        """Add the next-ranked deterministic child of ``parent``; returns its index."""
        rank = self._n_determ.get(parent, 0)
        self._n_determ[parent] = rank + 1
        return self._append(parent, token, NodeKind.DETERMINISTIC, rank, weight, -1)

    def add_sampled(self, parent: int, token: int, law: SparseLaw, weight: float) -> int:
        """Add the next draw from ``law`` as a sampled child of ``parent``.

        All sampled children of one parent must pass the same ``law`` object.
        """
        lid = self._law_of_parent.get(parent)
        if lid is None:
            lid = len(self.laws)
            self.laws.append(law)
            self._law_of_parent[parent] = lid
        elif self.laws[lid] is not law:
            raise MalformedTreeError(f"node {parent}: sampled children must share one proposal law")
        draw = self._n_sampled.get(parent, 0)
        self._n_sampled[parent] = draw + 1
        return self._append(parent, token, NodeKind.SAMPLED, draw, weight, lid)

    def build(self) -> DraftTree:
        """Freeze into a validated :class:`DraftTree`."""
        return DraftTree(
            tokens=self.tokens,
            parents=self.parents,
            kinds=self.kinds,
            draw_order=self.order,
            weights=self.weights,
            law_index=self.law_index,
            laws=self.laws,
            vocab_size=self.vocab_size,
        )
