"""The best acceptance any lossless rule could reach at a node, from its recorded proposals.

At a node with deterministic children ``S`` and ``k`` sampled children drawn from
``q'`` (i.i.d. or without replacement, the set of drawn tokens ``T`` random), a
lossless verifier emits a first token ``z ~ p``; it accepts a child when ``z``
is among the children's tokens. The best any rule can do is the maximal
coupling of ``z ~ p`` and ``T ~ Q`` (optimal transport with cost
``1[z not in S + T]``, docs/verifiers.md, "The gap to the best lossless acceptance"):

    opt = max over couplings  P(z in S + T)
        = min(1, min over Z within U of [ p(S) + p(U - Z) + P(T meets Z) ])

with ``U`` the tokens ``q'`` can draw outside ``S`` that ``p`` can emit (max-flow =
min-cut over the bipartite graph of tokens and sets). Closed forms: no sampled child, ``p(S)``;
one sampled child, ``p(S) + sum_{x in U} min(p(x), q'(x))`` (rule 5 attains it).
Several sampled children: the min-cut by enumeration when ``U`` (and, for draws
without replacement, the support of ``q'``) has at most :data:`EXACT_SUPPORT`
tokens (exact; at T=0, with one-hot ``p``, ``U`` has one token at most), else the
smaller of two single cuts, an upper bound labelled as such (:attr:`NodeOptimum.exact` False).

Example:
    >>> import torch
    >>> p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    >>> q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    >>> node_optimum(p, det=[], q_prime=q, k=1, mode=SampleMode.IID)
    NodeOptimum(value=0.6, exact=True)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs
import torch

from specdec.tree import DraftTree, SampleMode

__all__ = ["EXACT_SUPPORT", "NodeOptimum", "node_optimum", "tree_node_optimum"]

EXACT_SUPPORT = 10
"""The largest ``|U|`` (draftable tokens outside the deterministic set) at which several
sampled children get the exact min-cut (``2^|U|`` cuts); beyond it, a labelled bound."""


@attrs.frozen
class NodeOptimum:
    """The best lossless acceptance at one node.

    Attributes:
        value: the acceptance probability (or its upper bound).
        exact: True for the optimum itself, False for an upper bound.
    """

    value: float
    exact: bool


def _miss_iid(q: torch.Tensor, k: int) -> float:
    """P(k i.i.d. draws from the sub-law ``q`` (the mass on Z) all miss Z) = (1 - q(Z))^k."""
    return float((1.0 - q.sum()).clamp_min(0.0)) ** k


def _miss_wor(q_all: list[float], zmask: list[bool], k: int) -> float:
    """P(k draws without replacement from ``q_all`` all miss the tokens flagged by ``zmask``)."""

    def rec(removed: float, left: int, taken: frozenset[int]) -> float:
        if left == 0:
            return 1.0
        total = 1.0 - removed
        if total <= 0.0:
            return 1.0
        out = 0.0
        for i, qi in enumerate(q_all):
            if i in taken or qi <= 0.0 or zmask[i]:
                continue
            out += qi / total * rec(removed + qi, left - 1, taken | {i})
        return out

    return rec(0.0, k, frozenset())


def node_optimum(p: torch.Tensor, det: Sequence[int], q_prime: torch.Tensor | None, k: int,
                 mode: SampleMode) -> NodeOptimum:
    """The best lossless acceptance at a node (module docstring).

    Args:
        p: ``[V]`` the target's processed law at the node.
        det: the deterministic children's tokens (``S``).
        q_prime: ``[V]`` the law the sampled children were drawn from, or None (no sampled child).
        k: the number of sampled children.
        mode: how they were drawn.
    """
    p = p.detach().to("cpu", torch.float64)
    S = sorted(set(int(t) for t in det))
    pS = float(p[S].sum()) if S else 0.0
    if q_prime is None or k == 0:
        return NodeOptimum(min(1.0, pS), True)
    q = q_prime.detach().to("cpu", torch.float64)
    q = q / q.sum()
    outside = torch.ones_like(q, dtype=torch.bool)
    if S:
        outside[S] = False
    # a token p never emits cannot be matched: leaving it out of every cut loses nothing
    U = torch.nonzero((q > 0) & outside & (p > 0)).flatten()
    pU, qU = p[U], q[U]
    if k == 1:
        return NodeOptimum(min(1.0, pS + float(torch.minimum(pU, qU).sum())), True)
    support = int((q > 0).sum())
    if mode == SampleMode.WITHOUT_REPLACEMENT:
        k = min(k, support)
    # exact: 2^|U| cuts; without replacement, each cut's miss probability walks the draws of q's support
    if U.numel() <= EXACT_SUPPORT and (mode == SampleMode.IID or support <= EXACT_SUPPORT):
        best = 1.0
        q_list = q.tolist()
        for bits in itertools.product((False, True), repeat=int(U.numel())):
            zU = torch.tensor(bits, dtype=torch.bool)
            if mode == SampleMode.IID:
                miss = _miss_iid(qU[zU], k)
            else:
                zmask = [False] * q.numel()
                for u, b in zip(U.tolist(), bits):
                    zmask[u] = b
                miss = _miss_wor(q_list, zmask, k)
            best = min(best, pS + float(pU[~zU].sum()) + 1.0 - miss)
        return NodeOptimum(best, True)
    # a bound: the marginal cut (each token at most its inclusion probability) and one set cut
    if mode == SampleMode.IID:
        inclusion = 1.0 - (1.0 - qU) ** k
    else:  # P(x drawn at some step) <= k q'(x) / (1 - mass of the k - 1 largest others), a union bound
        top = torch.topk(q, min(k - 1, q.numel())).values.sum()
        inclusion = (k * qU / (1.0 - top).clamp_min(1e-300)).clamp_max(1.0)
    marginal = pS + float(torch.minimum(pU, inclusion).sum())
    zU = inclusion < pU
    hit = float(inclusion[zU].sum()) if mode != SampleMode.IID else 1.0 - _miss_iid(qU[zU], k)
    single = pS + float(pU[~zU].sum()) + min(1.0, hit)
    return NodeOptimum(min(1.0, marginal, single), False)


def tree_node_optimum(tree: DraftTree, node: int, p_node: torch.Tensor) -> NodeOptimum:
    """:func:`node_optimum` of ``tree``'s ``node`` from its recorded children and proposal law."""
    det = [int(tree.tokens[c]) for c in tree.deterministic_children(node)]
    sampled = tree.sampled_children(node)
    law = tree.sampled_law_at(node)
    q_prime = None if law is None else law.dense(tree.vocab_size, torch.float64)
    return node_optimum(p_node, det, q_prime, len(sampled), SampleMode.IID if law is None else law.mode)
