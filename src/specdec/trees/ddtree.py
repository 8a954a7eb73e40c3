"""DDTree: a best-first tree over a parallel draft's per-position laws (arXiv 2604.12989).

A parallel draft (docs/drafts.md, "Parallel drafts") gives, in one call, the laws
``q_1 .. q_D`` of the next ``D`` positions, each conditioned on the committed context only. DDTree
grows a tree over them best-first under a node budget: a node's score is the product of the
marginals along its path, ``prod_d q_d(x_d)``, and the ``budget`` best-scored nodes (a set closed
under parents, since a child never outscores its parent) form the tree. This is specdec's
reconstruction from the paper's description, proved lossless here by exact enumeration
(tests/trees/test_ddtree.py and the registry-parametrised exact suites); it is not the authors' code.

The law at depth ``d`` does not depend on the drafted path: every node at depth ``d - 1`` has the
SAME children's law ``q_d``. So:

- ranking: the best-first order reads the construction law
  (:func:`~specdec.sampling.construction_config`: the untempered draft at ``T = 0``, ``q_d`` itself at
  ``T > 0``); every best-first child is *deterministic* (top-k of ``q_d`` at its parent, in rank order);
- ``sampled = m > 0`` at ``T > 0`` (as Rheo's mixed construction): each *expanded* node ``u`` (one
  with deterministic children ``S_u``) also gets ``m`` children drawn i.i.d. from
  ``q' = norm(q_d restricted to outside S_u)``, recorded with exactly that law (what was drawn
  from), so rule 5 (verifier ``"mixed"``: sampled children by recursive rejection against ``q'``,
  then sample-and-match over ``S_u``) is exact. An expanded node costs ``1 + m`` of the budget
  (its first deterministic child and its sampled slots): a candidate whose parent is not yet expanded
  and that does not fit is passed over. Which children a node has depends on the ``q_d`` only,
  never on a draw; the sampled children are leaves. None at ``T = 0`` (the trees are then DDTree's
  own, verified greedily).
- ``sampled = 0``: DDTree's own trees at every temperature (only deterministic children),
  verified by sample-and-match: method ``ddtree-match`` (rule 2), the paper's walk, kept as the
  baseline.

Where the laws come from: a draft that declares the parallel form
(:attr:`~specdec.drafts.base.DraftModel.parallel_form`) answers ONE parallel request
(``DraftRequest.block = depth``); a draft whose ``block_size`` is below ``depth`` is refused
(:class:`~specdec.errors.InvalidConfigError`, naming both). An autoregressive draft (no parallel
form) is run position-parallel along its own greedy path: ``q_1`` after the context, ``q_d`` after
the context and the construction law's argmax tokens of positions ``1 .. d - 1`` (``depth`` draft
calls of one node each) -- a function of the context only, so the same rules stay exact.

One build serves the ``B`` rows of a batch (:attr:`batch_form`: one draft call for all of them,
each row drawing from its own random source, so a row's tree is the tree it gets alone), but each
row's tree is assembled on the host (:class:`~specdec.tree.TreeAssembler`, host reads of the
``[B, D, V]`` laws): a tensor form of the best-first selection is not written yet.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import laws_and_flags
from specdec.errors import InvalidConfigError
from specdec.methods import Method, register_method
from specdec.registry import register
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig, construction_config
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.tree_batch import TreeBatch
from specdec.trees._common import check_int, draw_children, normalised_law
from specdec.trees.base import TreeBuilder
from specdec.trees.feed import Build, DraftSpec

__all__ = ["DDTreeBuilder", "best_first", "ddtree_tree"]


def best_first(rank: torch.Tensor, budget: int, slot_cost: int = 0) -> list[tuple[int, int, int]]:
    """The best-first selection over per-position laws: ``[(parent, depth, token)]`` in the order
    chosen (``parent``: the index of the parent in this list, ``-1`` for the root).

    A node at depth ``d`` (``1 .. D``) with token ``x`` scores its parent's score times
    ``rank[d - 1, x]``; candidates are each chosen node's first-ranked child and its next-ranked
    sibling (ranks: descending ``rank``, ties by token id; tokens of zero rank are never children),
    popped by ``(-score, creation order)``. A node costs 1, plus ``slot_cost`` when it is its
    parent's first child (the parent's sampled slots); a candidate that does not fit in what is left
    of ``budget`` is passed over.

    Args:
        rank: ``[D, V]`` float64 the ranking laws ``q_1 .. q_D``.
        budget: the nodes (root excluded) the tree may have.
        slot_cost: the budget an expanded node's sampled slots take.
    """
    D = int(rank.shape[0])
    order: list[list[int]] = []
    for d in range(D):
        row = rank[d]
        ids = torch.argsort(-row, stable=True)  # descending, ties by token id
        order.append([int(t) for t in ids[row[ids] > 0].tolist()])
    chosen: list[tuple[int, int, int]] = []
    scores: list[float] = []
    expanded: set[int] = set()
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, creation, parent, depth, rank)
    created = 0
    if order and order[0]:
        heap.append((-float(rank[0, order[0][0]]), created, -1, 1, 0))
    used = 0
    while heap and used < budget:
        neg, _, parent, d, r = heapq.heappop(heap)
        cost = 1 + (slot_cost if parent not in expanded else 0)
        if used + cost > budget:
            continue  # passed over (its siblings after it are not offered: they rank below it)
        used += cost
        expanded.add(parent)
        index = len(chosen)
        chosen.append((parent, d, order[d - 1][r]))
        scores.append(-neg)
        base = 1.0 if parent < 0 else scores[parent]
        if r + 1 < len(order[d - 1]):
            created += 1
            heapq.heappush(heap, (-base * float(rank[d - 1, order[d - 1][r + 1]]), created, parent, d, r + 1))
        if d < D and order[d]:
            created += 1
            heapq.heappush(heap, (neg * float(rank[d, order[d][0]]), created, index, d + 1, 0))
    return chosen


def ddtree_tree(root_token: int, rank: torch.Tensor, q: torch.Tensor, budget: int, sampled: int,
                rng: RandomSource) -> DraftTree:
    """One DDTree (module docstring) from ``[D, V]`` float64 laws: ``rank`` (the best-first order)
    and ``q`` (the laws sampled children are drawn from; ``sampled = 0``: not read).

    Nodes are added level by level (parents first); at each expanded node its sampled children
    first (``m`` i.i.d. draws from ``q' = norm(q_d outside S_u)``, none when ``q'`` has no mass), then
    its deterministic children in rank order, each weighing its ``rank`` probability."""
    V = int(rank.shape[1])
    chosen = best_first(rank, budget, sampled)
    kids: dict[int, list[int]] = {}
    for i, (parent, _, _) in enumerate(chosen):
        kids.setdefault(parent, []).append(i)
    asm = TreeAssembler(root_token, V)
    slot = {-1: 0}  # chosen index -> assembler node
    frontier = [-1]
    while frontier:
        after: list[int] = []
        for u in frontier:
            children = kids.get(u, [])
            if not children:
                continue
            d = chosen[children[0]][1]  # the children's depth
            if sampled:
                outside = q[d - 1].clone()
                outside[[chosen[c][2] for c in children]] = 0.0
                if float(outside.sum()) > 0:
                    law = SparseLaw.from_dense(outside / outside.sum(), SampleMode.IID)
                    for index in draw_children(law.probs, sampled, SampleMode.IID, rng):
                        asm.add_sampled(slot[u], int(law.indices[index]), law, weight=float(law.probs[index]))
            for c in children:
                slot[c] = asm.add_deterministic(slot[u], chosen[c][2], weight=float(rank[d - 1, chosen[c][2]]))
            after += children
        frontier = after
    return asm.build()


@register("tree", "ddtree")
@attrs.frozen
class DDTreeBuilder(TreeBuilder):
    """DDTree over a parallel draft's per-position laws (module docstring).

    Args:
        budget: nodes of a tree, root excluded (``>= 1``); at ``T > 0`` an expanded node's sampled
            slots count in it.
        depth: ``D``, the positions drafted (``>= 1``; at most the parallel draft's ``block_size``).
        sampled: ``m``, sampled children per expanded node at ``T > 0`` (``0``: DDTree's own
            deterministic trees, verified by sample-and-match).

    Raises:
        InvalidConfigError: an option out of range (naming it).
    """

    budget: int = 60
    depth: int = 6
    sampled: int = 1

    batch_form = True  # one build over the B rows (module docstring: host assembly per row)
    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    default_verifier: ClassVar[str] = "mixed"
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"budget": 4, "depth": 2, "sampled": 1},
        {"budget": 4, "depth": 3, "sampled": 0},
        {"budget": 6, "depth": 3, "sampled": 2},
    )

    def __attrs_post_init__(self) -> None:
        check_int("budget", self.budget, 1)
        check_int("depth", self.depth, 1)
        check_int("sampled", self.sampled, 0)

    @property
    def sibling_modes(self) -> frozenset[SampleMode]:
        return frozenset({SampleMode.IID}) if self.sampled > 1 else frozenset()

    @property
    def max_nodes(self) -> int:
        return 1 + self.budget

    @property
    def max_depth(self) -> int:
        return self.depth

    def feed_build(self, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig, rng: RandomSource, *,
                   compiler: Any = None) -> Build:
        """The build: the ``[B, D, V]`` laws (one parallel request, or the greedy path of an
        autoregressive draft: module docstring), then each row's tree on the host
        (:func:`ddtree_tree`; ``compiler`` is not used).

        Raises:
            InvalidConfigError: the draft's parallel block is shorter than :attr:`depth`.
        """
        roots = torch.as_tensor(roots, dtype=torch.int64).reshape(-1)
        B, V, D = int(roots.numel()), spec.vocab_size, self.depth
        if 0 < spec.block_size < D:
            raise InvalidConfigError(f"ddtree depth={D} needs the laws of {D} positions; the parallel draft's "
                                     f"block_size is {spec.block_size} (a block shorter than the requested depth)")
        greedy = sampling.greedy
        configs = (sampling,) if construction_config(sampling) == sampling else (sampling, construction_config(sampling))
        if spec.block_size:
            logits = yield DraftRequest(0, B, V, False, block=D)  # [B, D, V]
            laws, bad = laws_and_flags(logits, configs)  # [B, D, V] each, bad [B, D]
        else:  # an autoregressive draft, position-parallel along its greedy path
            per_depth: list[list[torch.Tensor]] = [[] for _ in configs]
            flags: list[torch.Tensor] = []
            earlier: list[torch.Tensor] = []
            nxt = roots  # [B] the greedy path's token at the last position drafted
            step = yield DraftRequest(0, B, V, False)  # [B, V]
            for d in range(D):
                if d > 0:
                    parents = torch.full((B, 1), d - 1, dtype=torch.int64, device=roots.device)
                    step = (yield DraftRequest(d, B, V, False, parents, nxt.unsqueeze(1), None, d,
                                               tuple(earlier)))[:, 0]  # [B, V]
                    earlier.append(parents)
                level_laws, level_bad = laws_and_flags(step, configs)
                for store, law in zip(per_depth, level_laws):
                    store.append(law)
                flags.append(level_bad)
                nxt = torch.where(level_bad, 0, normalised_law(level_laws[-1], on_device=True).argmax(-1))  # [B]
            laws = [torch.stack(store, dim=1) for store in per_depth]  # [B, D, V]
            bad = torch.stack(flags, dim=1)  # [B, D]
        draft_bad = bad.any(dim=1)  # [B]
        q = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(laws[0], on_device=True)).cpu()  # [B, D, V]
        rank = torch.where(bad.unsqueeze(-1), 0.0, normalised_law(laws[-1], on_device=True)).cpu()
        sources = rng.sources if isinstance(rng, RowStreams) else [rng]
        trees = [ddtree_tree(int(roots[b]), rank[b], q[b], self.budget, 0 if greedy else self.sampled, sources[b])
                 for b in range(B)]
        batch = TreeBatch.from_trees(trees, device=roots.device, node_slots=self.max_nodes,
                                     max_children=V + self.sampled, max_depth=D)
        return attrs.evolve(batch, draft_bad=draft_bad.to(roots.device))


_DDTREE_DEFAULTS: Mapping[str, Any] = {"budget": 60, "depth": 6, "sampled": 1}
register_method(Method("ddtree", "ddtree", "mixed", _DDTREE_DEFAULTS,
                       "DDTree: best-first over a parallel draft's per-position laws, sampled slots, rule 5"))
_MATCH_DEFAULTS: Mapping[str, Any] = {"budget": 60, "depth": 6, "sampled": 0}
register_method(Method("ddtree-match", "ddtree", "match", _MATCH_DEFAULTS,
                       "DDTree's own trees (top-k only), sample-and-match (rule 2): the baseline"))
