"""Path-level verification: block verification (chains) and traversal verification (trees of sampled children).

Per-node rules (rules 3-5) decide a tree top-down: once a child is rejected its
whole subtree is lost, and a child is accepted on its own ratio ``p(x)/q(x)``
even when the path through it, taken as a whole, is far more likely under the
target than under the draft. The two rules here decide at the level of paths
(docs/verifiers.md, rules 7 and 8):

- ``block`` (Sun et al., "Block verification accelerates speculative decoding",
  arXiv 2403.10444): chains only (every node has at most one sampled child);
  by Sun et al.'s theorem the best expected accepted length any lossless rule
  reaches on a chain from its per-token laws, so never below rule 3.
- ``traversal`` (Weng et al., "Traversal Verification for Speculative Tree
  Decoding", arXiv 2505.12398): trees of sampled children, leaf to root; on a
  chain it is block verification, draw for draw.

Words, in the project's notation (``p`` the target's law at a node, ``q`` the
recorded proposal law the node's sampled children were drawn from, ``[v]+ =
max(v, 0)``, ``norm(v) = v / sum(v)``):

- *sequence weight* ``w(u)``: how much of the path from the root to ``u`` the
  target backs. ``w(root) = 1``; a sampled child ``c`` of ``u`` with token ``x``
  gets ``w(c) = min(1, w(u) P_u(x) / q_u(x))`` (:func:`sequence_weight`), with
  ``P_u`` the current residual at ``u`` (``p_u`` until a child of ``u`` is rejected).
- *block update*: when a child of ``u`` (its whole subtree already tried) is
  rejected, with ``R = [w(u) P_u - q_u]+`` and ``rho = sum(R)``:
  ``P_u = norm(R)`` and ``w(u) = rho / (rho + 1 - w(u))`` (:func:`block_update`);
  for children drawn without replacement also ``q_u(x) = 0; q_u = norm(q_u)``
  (rule 4's update) before the next child.
- A node whose children are all rejected (a leaf at once) is accepted with
  probability ``w(u)`` (the root always: its weight stays 1), and the bonus is
  drawn from ``P_u``; otherwise it is rejected and its parent is updated.

Why it is lossless (the induction, per node): given everything drafted before a
node ``u`` and its token, the procedure on ``u``'s subtree accepts ``u`` with
probability exactly ``w(u)`` and, when it does, the tokens it emits after ``u``
follow the target. A leaf does so by construction. For a child ``c`` drawn from
``q``, token ``x``: ``c`` is accepted with probability ``q(x) min(1, w P(x)/q(x))
= min(w P(x), q(x))``, so ``x`` is emitted through ``c`` with mass
``min(w P(x), q(x))`` and ``c`` is rejected with total probability
``1 - w + rho``; the rest of the node (later siblings, then ``u`` itself) is the
same procedure with ``w' = rho / (rho + 1 - w)`` and ``P' = norm([w P - q]+)``,
which by induction accepts with probability ``w'`` and emits ``P'``: mass
``(1 - w + rho) w' P'(x) = [w P(x) - q(x)]+``. In total ``u`` emits ``x`` with
``min(w P(x), q(x)) + [w P(x) - q(x)]+ = w P(x)`` and is accepted with
probability ``w``. ``w'`` and ``P'`` do not depend on which token ``c`` had, so
the later siblings may depend on it (draws without replacement, with their own
law ``q'``), and the induction holds for any number of children. At the root
``w = 1``: every step emits a target sample.

Numerics: rows are normalised in float64 (float32 rows of a real model at
``V = 49152`` included). A rejection whose exact probability is 0 (``rho = 0``
with ``w = 1``: ``P = q`` at the node) can still be drawn through rounding; there
the undefined residual is replaced by the current one and the weight kept, as
:func:`specdec.verify.residual.normalise` does.

Zero weights: a child of weight 0 (the target gives its token probability 0, e.g. a token
a grammar refuses, whose own row is then all ``-inf``) is rejected with probability 1 and
nothing below it can be accepted, so neither walk enters it: its row and the rows below it
are never read.

Cost: both rules declare a tensor form (:attr:`Verifier.path_rule
<specdec.verify.base.Verifier.path_rule>`), which the engine's step runs on every row at
once: ``block``'s (:mod:`specdec.verify.fast_block`) with no host read, ``traversal``'s
(:mod:`specdec.verify.traversal_tensor`) with one host read per step. The walks here are
their references. ``traversal``'s visits, in the worst case, every node once (post-order),
with a few scalar reads of ``p`` per visited node and one ``[V]`` residual per rejection,
each a host read; ``block``'s reads the chain's rows once, computes every weight and
residual mass in one batched operation and then draws from the deepest node up.
"""

from __future__ import annotations

import torch

from specdec.errors import InvalidDistributionError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import check_distribution
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.verify.base import PathRule, VerifyResult, WholeTreeVerifier
from specdec.verify.residual import without_replacement_update

__all__ = ["BlockVerifier", "TraversalVerifier", "block_update", "sequence_weight"]

F64 = torch.float64


def sequence_weight(w: float, P: torch.Tensor, q: torch.Tensor, x: int) -> float:
    """The sequence weight of a child with token ``x`` drawn from ``q``, under a node of weight ``w``:
    ``min(1, w P(x) / q(x))``.

    Args:
        w: the parent's sequence weight, in ``[0, 1]``.
        P: ``[V]`` the parent's current residual (normalised).
        q: ``[V]`` the law the child was drawn from; ``q(x) > 0``.
        x: the child's token.

    Returns:
        The child's weight, a Python float in ``[0, 1]``.

    Example (the traversal paper's toy case: the parent is accepted with 0.5, the child's ratio is 4/3):
        >>> import torch
        >>> P = torch.tensor([0.6, 0.4], dtype=torch.float64)
        >>> q = torch.tensor([0.7, 0.3], dtype=torch.float64)
        >>> round(sequence_weight(0.5, P, q, 1), 4)  # min(1, 0.5 * 4/3)
        0.6667
    """
    ratio = float(P[x]) / float(q[x])
    return min(1.0, w * ratio)


def block_update(w: float, P: torch.Tensor, q: torch.Tensor) -> tuple[float, torch.Tensor]:
    """A node's weight and residual after one of its children, drawn from ``q``, is rejected.

    ``R = [w P - q]+``, ``rho = sum(R)``; the new weight is ``rho / (rho + 1 - w)``
    (the probability that the rest of the node is accepted, given the rejection) and
    the new residual ``norm(R)``. If ``rho`` is 0 the residual is undefined: ``P`` is
    kept (with ``w = 1`` that rejection has probability 0; with ``w < 1`` the new
    weight is 0 and ``P'`` is never drawn from).

    Args:
        w: the node's sequence weight, in ``[0, 1]``.
        P: ``[V]`` float64 the node's current residual (normalised).
        q: ``[V]`` float64 the law the rejected child was drawn from.

    Returns:
        ``(w', P')``.

    Example (block verification at the root of a chain: ``w = 1`` stays 1):
        >>> import torch
        >>> P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
        >>> q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
        >>> w, R = block_update(1.0, P, q)
        >>> w, R.tolist()
        (1.0, [1.0, 0.0, 0.0])
        >>> w, R = block_update(0.5, P, q)  # R = [0.05, 0, 0], rho = 0.05: w' = 0.05 / 0.55
        >>> round(w, 6), R.tolist()
        (0.090909, [1.0, 0.0, 0.0])
    """
    R = (P * w).sub_(q).clamp_(min=0)  # one new [V] tensor, updated in place
    rho = float(R.sum())
    denominator = rho + (1.0 - w)
    w_next = min(1.0, rho / denominator) if denominator > 0 else w
    return w_next, (R.div_(rho) if rho > 0 else P)


def _row(p: torch.Tensor, node: int) -> torch.Tensor:
    """Row ``node`` of ``p``, checked, in float64 and normalised."""
    check_distribution(p[node], f"p[{node}]")
    row = p[node].to(F64)
    return row / row.sum()


def _attempted(tree: DraftTree, path: list[int]) -> int:
    """How many nodes of ``[root] + path`` have children (VerifyResult.attempted_depths)."""
    return sum(1 for node in [0] + path if tree.children(node))


class _Draws:
    """``rng.begin_node`` bookkeeping for a leaf-to-root walk: the root's node starts the
    step's walk (:class:`~specdec.rng.CounterRandom` keys uniforms by walk and node), so it is
    begun first; the root's own draws come last and begin it again if another node drew since
    (a fresh walk: every uniform of the step stays distinct)."""

    def __init__(self, rng: RandomSource) -> None:
        self.rng = rng
        rng.begin_node(0)
        self.current = 0

    def begin(self, node: int) -> RandomSource:
        if node != self.current:
            self.rng.begin_node(node)
            self.current = node
        return self.rng


@register("verifier", "traversal")
class TraversalVerifier(WholeTreeVerifier):
    """Traversal verification (rule 7): leaf to root over a tree of sampled children.

    Children are tried in draw order, each child's subtree before the child itself
    (post-order); a child ``c`` of ``u`` with token ``x`` has weight
    ``w(c) = min(1, w(u) P_u(x) / q_u(x))``; a node whose children were all rejected
    is accepted with probability ``w`` (the root always) and the bonus drawn from its
    residual ``P``; a rejection updates the parent by :func:`block_update` (and, for
    draws without replacement, removes the token from ``q``). On a chain this is
    block verification (:class:`BlockVerifier`), draw for draw.

    Example (the traversal paper's toy case: the first child alone would be accepted
    with 0.5, its child has ratio 4/3, so the path is accepted with 2/3):
        >>> import torch
        >>> from specdec.tree import SparseLaw, TreeAssembler
        >>> from specdec.testing import exact_law
        >>> def law(*probs):
        ...     return SparseLaw(torch.tensor([0, 1]), torch.tensor(probs, dtype=torch.float64))
        >>> asm = TreeAssembler(root_token=0, vocab_size=2)
        >>> a = asm.add_sampled(0, token=0, law=law(0.5, 0.5), weight=1.0)
        >>> b = asm.add_sampled(a, token=1, law=law(0.7, 0.3), weight=1.0)
        >>> p = torch.tensor([[0.25, 0.75], [0.6, 0.4], [0.5, 0.5]], dtype=torch.float64)
        >>> law = exact_law(lambda rng: TraversalVerifier().verify(asm.build(), p, rng).accepted_nodes)
        >>> round(law[(a, b)], 6)
        0.666667
    """

    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})
    path_rule = PathRule("traversal", "traversal")  # the engine's tensor form: specdec.verify.traversal_tensor

    def verify(self, tree: DraftTree, p: torch.Tensor, rng: RandomSource) -> VerifyResult:
        self.check_inputs(tree, p)
        draws = _Draws(rng)
        found = self._visit(tree, p, draws, 0, 1.0)
        assert found is not None  # the root's weight stays 1: it is always accepted
        path, bonus = found
        tokens = tuple(int(tree.tokens[i]) for i in path) + (bonus,)
        return VerifyResult(tuple(path), tokens, _attempted(tree, path))

    def _visit(self, tree: DraftTree, p: torch.Tensor, draws: _Draws, node: int,
               w: float) -> tuple[list[int], int] | None:
        """Try ``node``'s subtree, then ``node``: ``(accepted path below the root, bonus)`` or
        None when ``node`` is rejected (never for the root)."""
        P: torch.Tensor | None = None
        children = tree.sampled_children(node)
        if children:
            P = _row(p, node)
            law = tree.law_of(children[0])
            q = law.dense(tree.vocab_size, dtype=F64).to(P.device)
            without_replacement = law.mode == SampleMode.WITHOUT_REPLACEMENT
            last = len(children) - 1
            for i, child in enumerate(children):
                x = int(tree.tokens[child])
                w_child = self.child_weight(w, P, q, x)
                # weight 0 (p(x) = 0, e.g. a token a grammar refuses): the child and its subtree are
                # rejected with probability 1; the walk does not enter them (nor read their rows)
                found = self._visit(tree, p, draws, child, w_child) if w_child > 0 else None
                if found is not None:
                    return [child] + found[0], found[1]
                w, P = self.update(w, P, q)
                if without_replacement and i < last:
                    q = without_replacement_update(q, x)
        rng = draws.begin(node)
        if node != 0 and not rng.bernoulli(w):
            return None
        if P is None:
            P = _row(p, node)
        return [], rng.categorical(P)

    # the two formulas, as methods so that the tests' broken variants can change one of them
    def child_weight(self, w: float, P: torch.Tensor, q: torch.Tensor, x: int) -> float:
        """:func:`sequence_weight`."""
        return sequence_weight(w, P, q, x)

    def update(self, w: float, P: torch.Tensor, q: torch.Tensor) -> tuple[float, torch.Tensor]:
        """:func:`block_update`."""
        return block_update(w, P, q)


@register("verifier", "block")
class BlockVerifier(WholeTreeVerifier):
    """Block verification (rule 8, Sun et al.): the best lossless rule for a chain given its per-token laws.

    For the chain ``root = v_0, v_1, ..., v_g`` (token ``x_i`` of ``v_i`` drawn from
    ``q_{i-1}``, the law recorded at ``v_{i-1}``): weights ``w_0 = 1``,
    ``w_i = min(1, w_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i))``; residual masses
    ``rho_i = sum([w_i p_i - q_i]+)`` and acceptance probabilities
    ``h_i = rho_i / (rho_i + 1 - w_i)`` (``i < g``), ``h_g = w_g``. From the deepest
    node up, ``v_i`` is accepted (with ``v_1 .. v_{i-1}``) with probability ``h_i``;
    the bonus is drawn from ``p_g`` if ``i = g``, else from ``norm([w_i p_i - q_i]+)``
    (the root, ``i = 0``, needs no draw: ``h_0 = 1``). The weights and residual masses
    of the whole chain are computed in one batched operation.

    Chains only: a node with several sampled children raises
    :class:`~specdec.errors.UnsupportedTreeError` (``traversal`` verifies trees). It
    makes the same draws as ``traversal`` on the same chain, so the two emit the same
    tokens from the same seed.

    Example (Sun et al.'s binary example: target ``(1/3, 2/3)``, draft ``(2/3, 1/3)`` over
    ``{a, b}``; on the chain ``a, b`` the block rule accepts both tokens with probability 1,
    token by token only with 1/2):
        >>> import torch
        >>> from specdec.tree import DraftTree, SparseLaw
        >>> from specdec.testing import exact_law
        >>> q = SparseLaw(torch.tensor([0, 1]), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
        >>> tree = DraftTree.chain(1, [0, 1], [q, q], vocab_size=2)
        >>> p = torch.tensor([[1 / 3, 2 / 3]] * 3, dtype=torch.float64)
        >>> exact_law(lambda rng: BlockVerifier().verify(tree, p, rng).num_accepted)
        {2: 1.0}
    """

    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset[SampleMode]()  # no node with several sampled children: chains
    path_rule = PathRule("block", "block")  # the engine's tensor form: specdec.verify.fast_block

    def verify(self, tree: DraftTree, p: torch.Tensor, rng: RandomSource) -> VerifyResult:
        self.check_inputs(tree, p)
        chain = [0]
        while tree.children(chain[-1]):
            chain.append(tree.children(chain[-1])[0])
        g = len(chain) - 1
        draws = _Draws(rng)
        if g == 0:
            return VerifyResult((), (draws.begin(0).categorical(_row(p, 0)),), 0)
        index = torch.tensor(chain, device=p.device)
        rows = p.index_select(0, index)
        try:  # one check for the chain's rows; on failure, check only the rows the rule reads
            check_distribution(rows, "p")
            checked = True
        except InvalidDistributionError:
            checked = False
        P = rows.to(F64)
        P = P / P.sum(dim=-1, keepdim=True)  # [g + 1, V]
        Q = torch.stack([tree.law_of(c).dense(tree.vocab_size, dtype=F64) for c in chain[1:]]).to(P.device)  # [g, V]
        x = torch.tensor([int(tree.tokens[c]) for c in chain[1:]], device=P.device)
        steps = torch.arange(g, device=P.device)
        ratios: list[float] = (P[steps, x] / Q[steps, x]).tolist() if checked else self._read_rows(p, chain, P, Q, x)
        w = [1.0]
        for ratio in ratios:
            w.append(min(1.0, w[-1] * ratio) if w[-1] > 0 else 0.0)
        if len(ratios) < g:  # a node of weight 0 ends what the rule reads: the rows below are never used
            w += [0.0] * (g - len(ratios))
            P = torch.where(torch.tensor(w, device=P.device).unsqueeze(1) > 0, P, 0.0)
        W = torch.tensor(w[:g], dtype=F64, device=P.device).unsqueeze(1)
        R = torch.clamp_min(W * P[:g] - Q, 0)  # [g, V]
        rho = R.sum(dim=1).tolist()
        h = [self.stop_probability(rho[i], w[i]) for i in range(g)] + [w[g]]
        tau = 0
        for i in range(g, 0, -1):
            if draws.begin(chain[i]).bernoulli(min(1.0, h[i])):
                tau = i
                break
        if tau == g:
            law = P[g]
        else:
            law = R[tau] / rho[tau] if rho[tau] > 0 else P[tau]
        bonus = draws.begin(chain[tau]).categorical(law)
        path = chain[1 : tau + 1]
        return VerifyResult(tuple(path), tuple(int(tree.tokens[i]) for i in path) + (bonus,), min(tau + 1, g))

    @staticmethod
    def _read_rows(p: torch.Tensor, chain: list[int], P: torch.Tensor, Q: torch.Tensor, x: torch.Tensor) -> list[float]:
        """The chain's ratios ``p_i(x_{i+1}) / q_i(x_{i+1})`` down to the first node of weight 0, each
        row checked before it is read (a node of weight 0 is never accepted, nor anything below it:
        its row, e.g. all ``-inf`` under a grammar that refuses its token, is never read)."""
        ratios: list[float] = []
        for i, node in enumerate(chain[:-1]):
            check_distribution(p[node], f"p[{node}]")
            ratios.append(float(P[i, x[i]]) / float(Q[i, x[i]]))
            if ratios[-1] <= 0:
                return ratios
        check_distribution(p[chain[-1]], f"p[{chain[-1]}]")
        return ratios

    def stop_probability(self, rho: float, w: float) -> float:
        """``h = rho / (rho + 1 - w)``: the probability that the chain stops at a node of weight ``w``
        whose residual mass is ``rho``, given that every deeper node was rejected (the weight
        :func:`block_update` gives; ``w`` itself when ``rho + 1 - w`` is 0, a branch of probability 0)."""
        denominator = rho + (1.0 - w)
        return min(1.0, rho / denominator) if denominator > 0 else w
