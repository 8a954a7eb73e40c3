"""RheoSampling: a dynamic (EAGLE-2) tree with sampled slots and proxy weights.

This is specdec's *reconstruction* of RheoSampling from the paper's abstract
(arXiv:2609.21827), stated in docs/trees.md (``rheo``) and proved lossless here by exact whole-tree enumeration
(``tests/trees/test_exact_trees.py``); it is not the authors' code.

Problem: EAGLE-2's top-K children are verified by sample-and-match, which
accepts only ``p(S)``; at ``T > 0`` that collapses ("one-hot dilemma"). At
every expanded node ``u`` with processed draft law ``q_u``:

1. *deterministic slots*: ``S_u`` = the top-(K - m) tokens of ``q_u``;
2. *sparse draft*: the top-``M`` entries of ``q_u``; the *sampled slot law*
   is ``q'_u = norm(q_u restricted to topM(q_u) minus S_u)``; ``m`` children
   are drawn from ``q'_u`` (without replacement when ``m > 1``, in draw
   order) and recorded with their TRUE law ``q'_u``;
3. *proxy weight* of a sampled child: a function of ``q_u`` alone, never of
   the drawn token. The reconstruction's first choice (``proxy="residual"``): the *residual
   mass* ``1 - q_u(S_u)`` (what the slot stands for), split evenly,
   ``(1 - q_u(S_u)) / k``, between the ``k`` sampled children when ``k > 1``
   (``k = min(m, |support of q'_u|)``). specdec's default (``proxy="scaled"``)
   discounts it by the draft's tail calibration ``c`` (``proxy_scale``,
   default 0.25): ``c (1 - q_u(S_u)) / k``, an estimate of the slot's
   acceptance ``sum_y min(p(y), q'_u(y))``, which equals the residual mass
   only when ``p = q``. ``proxy="displaced"``: the ``q_u`` of the token
   ranked where the child sits (rank ``K - m + i`` for the ``i``-th draw).
   docs/trees.md says why the default differs. Deterministic children weigh
   ``q_u(x)``;
4. expand and prune exactly as EAGLE-2 with these weights
   (:func:`~specdec.trees.dynamic.grow_dynamic_tree`, total order
   ``(-score, creation index)``); a node's sampled children are created
   before its deterministic ones, in draw order, so they rank first among
   equal scores (the verifier tests them first);
5. verify with rule 5 (verifier ``"mixed"``): sampled children first against
   ``q'_u``, then sample-and-match of the residual over the kept deterministic
   children.

A node gets no sampled slot (it becomes an EAGLE-2 node with top-``K``
deterministic children) when its residual mass is 0 or below ``threshold``,
and no node gets one at ``T = 0``: there the trees are built from the draft's
untempered law (:func:`~specdec.sampling.construction_config`) exactly as
EAGLE-2 builds them, and verified greedily (rule 1), so Rheo is EAGLE-2.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch

from specdec.errors import InvalidConfigError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind, SampleMode, SparseLaw
from specdec.trees._common import draw_rows, masked_outside, residual_masses, row_mass, top_tokens_tensors
from specdec.trees.dynamic import ChildProposal, DynamicTreeBuilder, ProposeFn, eagle_proposal
from specdec.trees.levelwise import LevelFn, eagle_level, rheo_level
from specdec.methods import Method, register_method

__all__ = ["CALIBRATION_EDGES", "PROXIES", "RheoTreeBuilder", "calibrated_weight", "profile_calibration",
           "rheo_proposal", "residual_mass", "residual_masses"]


def residual_mass(q_row: torch.Tensor, deterministic: list[int]) -> float:
    """:func:`residual_masses` of one row ``[V]`` and a list of token ids."""
    ids = torch.tensor([deterministic], dtype=torch.int64, device=q_row.device).reshape(1, -1)
    return float(residual_masses(q_row.unsqueeze(0), ids)[0])


PROXIES = ("scaled", "residual", "displaced", "geometric", "calibrated")
"""Proxy weights of sampled children: ``"scaled"``, ``c (1 - q(S))`` split evenly
(specdec's default, ``c = proxy_scale``); ``"residual"``, ``1 - q(S)`` split
evenly (the reconstruction's first choice, ``c = 1``); ``"displaced"``, the ``q`` of the
token ranked where the child sits (rank ``K - m + i`` for the ``i``-th draw),
i.e. the weight of the deterministic child EAGLE-2 would have put in that slot;
``"geometric"``, ``c (1 - q(S)) (1 - c)^i`` for the ``i``-th draw (``i = 0, 1, ...``): the
first draw weighs what the one draw of ``m = 1`` weighs, each later one less (earlier draws
rank first); ``"calibrated"``, the displaced weight mapped through a measured table
(:func:`calibrated_weight`, :func:`profile_calibration`): the acceptance rate of the ``i``-th
draw among nodes whose displaced weight fell in the same bin (:data:`CALIBRATION_EDGES`).
All are functions of ``q`` alone, never of the drawn token."""

CALIBRATION_EDGES = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
"""Lower edges of the bins of the ``"calibrated"`` proxy: a displaced weight ``w`` falls in
bin ``b``, the last ``b`` with ``CALIBRATION_EDGES[b] <= w`` (the last bin is ``[0.9, 1]``)."""

Calibration = tuple[tuple[float, ...], ...]
"""A ``"calibrated"`` proxy's table: row ``i`` (draws past the last row use it) holds one
weight per bin of :data:`CALIBRATION_EDGES`."""


def check_calibration(value: object) -> Calibration:
    """``value`` as a :data:`Calibration`: rows of ``len(CALIBRATION_EDGES)`` numbers in ``[0, 1]``,
    each row non-decreasing from bin to bin and no row above the one before it in any bin. The
    draws of a node have non-increasing displaced weights, so under these two orders their
    calibrated weights are non-increasing too, and the global top-``N`` (ties broken by creation,
    i.e. draw, order) keeps a prefix of every node's draws, as rule 4 needs: with a table
    violating them a later draw could be kept without an earlier one, and the output law breaks
    (``tests/trees/test_exact_trees.py`` shows it).

    Raises:
        InvalidConfigError: anything else.
    """
    bins = len(CALIBRATION_EDGES)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise InvalidConfigError(f"calibration must be a non-empty sequence of rows of {bins} weights, got {value!r}")
    rows = []
    for i, row in enumerate(value):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != bins:
            raise InvalidConfigError(f"calibration row {i} must hold {bins} weights (one per bin of "
                                     f"CALIBRATION_EDGES), got {row!r}")
        for w in row:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= float(w) <= 1.0:
                raise InvalidConfigError(f"calibration weights must be numbers in [0, 1], row {i} has {w!r}")
        rows.append(tuple(float(w) for w in row))
    for i, row in enumerate(rows):
        if any(a > b for a, b in zip(row, row[1:])):
            raise InvalidConfigError(
                f"calibration row {i} must not decrease from bin to bin, got {row}: the draws of a node have "
                "non-increasing displaced weights, and their calibrated weights must not increase either, or a "
                "later draw could be kept without an earlier one (docs/trees.md, \"Proxies\")")
        if i and any(a > b for a, b in zip(row, rows[i - 1])):
            raise InvalidConfigError(
                f"calibration row {i} must not exceed row {i - 1} in any bin, got {row} after {rows[i - 1]}: a later "
                "draw must never outweigh an earlier one (docs/trees.md, \"Proxies\")")
    return tuple(rows)


def calibrated_weight(displaced: float, draw: int, table: Calibration) -> float:
    """The ``"calibrated"`` proxy of the ``draw``-th sampled child (from 0) whose displaced
    weight (the ranking law's ``q`` at the child's rank) is ``displaced``: ``table``'s entry
    at row ``min(draw, rows - 1)`` and ``displaced``'s bin of :data:`CALIBRATION_EDGES`.

    Example:
        >>> table = (tuple(0.5 for _ in CALIBRATION_EDGES), tuple(0.1 * (b % 2) for b in range(11)))
        >>> calibrated_weight(0.3, 0, table), calibrated_weight(0.001, 1, table), calibrated_weight(0.007, 5, table)
        (0.5, 0.0, 0.1)
    """
    return table[min(draw, len(table) - 1)][_bin(displaced)]


def _bin(weight: float) -> int:
    """The bin of ``weight`` among :data:`CALIBRATION_EDGES` (the last edge ``<= weight``)."""
    return max(0, bisect.bisect_right(CALIBRATION_EDGES, weight) - 1)


def rheo_proposal(
    q: torch.Tensor,
    K: int,
    m: int,
    M: int,
    threshold: float,
    rng: RandomSource,
    proxy: str = "residual",
    proxy_scale: float = 0.25,
    q_draw: torch.Tensor | None = None,
    calibration: Calibration | None = None,
) -> list[list[ChildProposal]]:
    """RheoSampling's children of ``k`` nodes (steps 1-3 of the module docstring).

    Args:
        q: ``[k, V]`` float64 processed draft laws, one row per expanded node.
        K: children per node (deterministic + sampled).
        m: sampled slots per node (``1 <= m <= K``; ``m = K``: no deterministic slot, ``S`` is empty).
        M: size of the sparse draft (``M >= K - m + 1``).
        threshold: inject the sampled slots only where ``1 - q(S) >= threshold``.
        rng: source of the draws (one ``categorical`` per sampled child).
        proxy: the sampled children's weight, one of :data:`PROXIES`
            (:class:`RheoTreeBuilder` defaults to ``"scaled"``).
        proxy_scale: ``c`` of the ``"scaled"`` proxy (ignored by the others).
        q_draw: ``[k, V]`` float64 laws the sampled slots draw by, when they are not
            ``q`` (``rank_law="untempered"``): ``q`` then ranks (``S``, the
            deterministic weights, the displaced proxy) and ``q'`` is the top
            ``M - (K - m)`` entries of ``q_draw`` outside ``S``, renormalised; the
            residual is ``1 - q_draw(S)``.
        calibration: the ``"calibrated"`` proxy's table (needed by it, ignored by the others).

    Returns:
        Per node: its sampled children (draw order, law ``q'``, proxy weight),
        then its deterministic children (rank order, weight ``q(x)``). A node
        without a sampled slot gets its top-``K`` deterministic children.
    """
    if q_draw is not None:
        return _rheo_proposal_split(q, q_draw, K, m, M, threshold, rng, proxy, proxy_scale, calibration)
    out: list[list[ChildProposal]] = []
    rows = top_tokens_tensors(q, max(K, M))
    slot_ids = torch.full((q.shape[0], K - m), -1, dtype=torch.int64, device=q.device)
    cand = torch.zeros(q.shape[0], max(M - (K - m), 0), dtype=torch.float64, device=q.device)
    for r, (ids, probs) in enumerate(rows):
        slot_ids[r, : min(K - m, ids.numel())] = ids[: K - m]
        cand[r, : max(ids[K - m : M].numel(), 0)] = probs[K - m : M]
    residuals = residual_masses(q, slot_ids).tolist()
    mass = row_mass(cand)  # [k]
    has_slot = torch.tensor(
        [rows[r][0][K - m : M].numel() > 0 and residuals[r] > 0.0 and residuals[r] >= threshold for r in range(len(rows))],
        dtype=torch.bool, device=q.device,
    )
    mode = SampleMode.WITHOUT_REPLACEMENT if m > 1 else SampleMode.IID
    law_probs = cand / torch.where(has_slot, mass, 1.0).unsqueeze(-1)  # [k, M - (K - m)]: q' of every node
    drawn_rows = draw_rows(law_probs, m, mode, rng, has_slot).tolist()
    for r, (ids, probs) in enumerate(rows):
        slots = list(zip(ids[: K - m].tolist(), probs[: K - m].tolist()))
        cand_ids, cand_probs = ids[K - m : M], probs[K - m : M]
        residual = residuals[r]
        if not bool(has_slot[r]):
            out.append([ChildProposal(token, NodeKind.DETERMINISTIC, prob)
                        for token, prob in zip(ids[:K].tolist(), probs[:K].tolist())])
            continue
        law = SparseLaw(cand_ids.to(torch.int64), law_probs[r, : cand_ids.numel()], mode)
        drawn = [i for i in drawn_rows[r] if i >= 0]
        if proxy in ("displaced", "calibrated"):
            weights = [float(cand_probs[min(i, cand_probs.numel() - 1)]) for i in range(len(drawn))]
            if proxy == "calibrated":
                weights = [calibrated_weight(w, i, _need_table(calibration)) for i, w in enumerate(weights)]
        else:
            weights = _split_weights(residual, len(drawn), proxy, proxy_scale)
        children = [ChildProposal(int(law.indices[i]), NodeKind.SAMPLED, w, law) for i, w in zip(drawn, weights)]
        children += [ChildProposal(token, NodeKind.DETERMINISTIC, prob) for token, prob in slots]
        out.append(children)
    return out


def _need_table(calibration: Calibration | None) -> Calibration:
    if calibration is None:
        raise InvalidConfigError("proxy='calibrated' needs a calibration table (specdec.trees.rheo.profile_calibration "
                                 "measures one; specdec bench profiles it for rows with proxy=calibrated)")
    return calibration


def _split_weights(residual: float, n: int, proxy: str, proxy_scale: float) -> list[float]:
    """The weights of a node's ``n`` sampled children under the ``scaled``, ``residual`` and
    ``geometric`` proxies (:data:`PROXIES`; the per-node form of the level-wise builder's)."""
    if proxy == "geometric":  # c r (1 - c)^i for the i-th draw
        return [min(1.0, proxy_scale * residual * (1.0 - proxy_scale) ** i) for i in range(n)]
    c = proxy_scale if proxy == "scaled" else 1.0
    return [min(1.0, c * residual / n)] * n


def _rheo_proposal_split(
    q: torch.Tensor,
    q_draw: torch.Tensor,
    K: int,
    m: int,
    M: int,
    threshold: float,
    rng: RandomSource,
    proxy: str,
    proxy_scale: float,
    calibration: Calibration | None = None,
) -> list[list[ChildProposal]]:
    """:func:`rheo_proposal` ranking by ``q`` and drawing by ``q_draw``, node by node."""
    out: list[list[ChildProposal]] = []
    ranked = top_tokens_tensors(q, K)  # per row: the ranking law's top K
    slot_ids = torch.full((q.shape[0], K - m), -1, dtype=torch.int64, device=q.device)
    for r, (ids, _) in enumerate(ranked):
        slot_ids[r, : min(K - m, ids.numel())] = ids[: K - m]
    outside = masked_outside(q_draw, slot_ids)  # q_draw with S zeroed
    residuals = residual_masses(q_draw, slot_ids).tolist()  # 1 - q_draw(S)
    cand_rows = top_tokens_tensors(outside, M - (K - m))
    L = M - (K - m)
    cand = torch.zeros(q.shape[0], L, dtype=torch.float64, device=q.device)
    for r, (_, probs) in enumerate(cand_rows):
        cand[r, : probs.numel()] = probs
    mass = row_mass(cand)
    has_slot = torch.tensor(
        [cand_rows[r][0].numel() > 0 and residuals[r] > 0.0 and residuals[r] >= threshold for r in range(q.shape[0])],
        dtype=torch.bool, device=q.device,
    )
    mode = SampleMode.WITHOUT_REPLACEMENT if m > 1 else SampleMode.IID
    law_probs = cand / torch.where(has_slot, mass, 1.0).unsqueeze(-1)
    drawn_rows = draw_rows(law_probs, m, mode, rng, has_slot).tolist()
    for r, (ids, probs) in enumerate(ranked):
        if not bool(has_slot[r]):
            out.append([ChildProposal(t, NodeKind.DETERMINISTIC, p) for t, p in zip(ids.tolist(), probs.tolist())])
            continue
        cand_ids = cand_rows[r][0]
        law = SparseLaw(cand_ids.to(torch.int64), law_probs[r, : cand_ids.numel()], mode)
        drawn = [i for i in drawn_rows[r] if i >= 0]
        if proxy in ("displaced", "calibrated"):  # q at rank K - m + i, or at the last ranked token
            weights = [float(probs[min(K - m + i, probs.numel() - 1)]) for i in range(len(drawn))]
            if proxy == "calibrated":
                weights = [calibrated_weight(w, i, _need_table(calibration)) for i, w in enumerate(weights)]
        else:
            weights = _split_weights(residuals[r], len(drawn), proxy, proxy_scale)
        children = [ChildProposal(int(law.indices[i]), NodeKind.SAMPLED, w, law) for i, w in zip(drawn, weights)]
        children += [ChildProposal(t, NodeKind.DETERMINISTIC, p)
                     for t, p in zip(ids[: K - m].tolist(), probs[: K - m].tolist())]
        out.append(children)
    return out


@register("tree", "rheo")
@attrs.frozen
class RheoTreeBuilder(DynamicTreeBuilder):
    """RheoSampling dynamic tree (reconstruction; see the module docstring).

    Args:
        K: children per expanded node, deterministic + sampled (default 10, as
            EAGLE-2's top-k; ``K >= 2``).
        m: sampled slots per node (default 1; ``1 <= m <= K``; ``m = K``: every slot sampled, ``S``
            empty, residual 1).
        B: beam width (default ``K``).
        depth: levels below the root (default 6, as EAGLE-2).
        N: draft nodes kept (default 60, as EAGLE-2).
        M: sparse draft size, the top-``M`` entries of ``q`` (default 1024;
            ``M >= K - m + 1``; the reconstruction first suggested "64 or so": docs/trees.md
            gives the measurements behind the larger default).
        threshold: inject sampled slots only where the residual mass
            ``1 - q(S)`` is at least this (default 0: wherever it is positive).
        proxy: the sampled children's construction weight, ``"scaled"``
            (default), ``"residual"`` (the reconstruction's first choice), ``"displaced"``
            or ``"geometric"`` (:data:`PROXIES`).
        proxy_scale: ``c`` of the ``"scaled"`` and ``"geometric"`` proxies, in ``(0, 1]``
            (default 0.25; ``1`` makes ``"scaled"`` the ``"residual"`` proxy; ``"geometric"``
            needs ``c < 1``).
        calibration: the ``"calibrated"`` proxy's table (:data:`Calibration`, measured by
            :func:`profile_calibration` for one draft, target and temperature; ``specdec bench``
            profiles it per temperature). Needed by that proxy at ``T > 0`` (building a tree
            without it raises); ``T = 0`` never uses a proxy.

    Verified by the ``"mixed"`` verifier (rule 5); at ``T = 0`` the trees are
    EAGLE-2's and ``"greedy"`` applies.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> draft = CallableLM(lambda p: torch.log(torch.tensor([[0.5, 0.3, 0.2]] * len(p))), vocab_size=3)
        >>> draft.begin([0])
        >>> tree = RheoTreeBuilder(K=2, depth=1, N=2, M=3).build(0, draft, SamplingConfig(), TorchRandom.seeded(0))
        >>> [NodeKind(k).name for k in tree.kinds.tolist()]
        ['ROOT', 'SAMPLED', 'DETERMINISTIC']
        >>> tree.laws[0].indices.tolist(), [round(x, 3) for x in tree.laws[0].probs.tolist()]
        ([1, 2], [0.6, 0.4])
        >>> round(float(tree.weights[1]), 3)  # the proxy: 0.25 * (1 - q(S)), whichever token was drawn
        0.125
    """

    m: int = attrs.field(default=1)
    M: int = attrs.field(default=1024)
    threshold: float = attrs.field(default=0.0)
    proxy: str = attrs.field(default="scaled")
    proxy_scale: float = attrs.field(default=0.25)
    calibration: Calibration | None = attrs.field(
        default=None, converter=lambda v: None if v is None else check_calibration(v))

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    default_verifier: ClassVar[str] = "mixed"

    @property
    def sibling_modes(self) -> frozenset[SampleMode]:
        """``m > 1`` sampled slots per node are drawn without replacement; one slot is one child."""
        return frozenset({SampleMode.WITHOUT_REPLACEMENT}) if self.m > 1 else frozenset()
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"K": 2, "m": 1, "B": 1, "depth": 3, "N": 3, "M": 3},
        {"K": 3, "m": 2, "B": 1, "depth": 2, "N": 3, "M": 4, "proxy": "residual"},
        {"K": 2, "m": 1, "B": 1, "depth": 2, "N": 3, "M": 3, "threshold": 0.4, "proxy": "displaced"},
        {"K": 3, "m": 2, "B": 2, "depth": 2, "N": 4, "M": 4, "proxy": "geometric", "proxy_scale": 0.5},
        {"K": 2, "m": 2, "B": 2, "depth": 2, "N": 4, "M": 3},
        {"K": 3, "m": 3, "B": 2, "depth": 2, "N": 4, "M": 4, "proxy": "calibrated",
         "calibration": ((0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                         (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.16, 0.18, 0.2))},
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.K < 2:
            raise InvalidConfigError(f"RheoSampling needs K >= 2 (K - m deterministic + m sampled), got K={self.K}")
        if not isinstance(self.m, int) or isinstance(self.m, bool) or not 1 <= self.m <= self.K:
            raise InvalidConfigError(f"m (sampled slots) must be an int with 1 <= m <= K={self.K}, got {self.m!r}")
        if not isinstance(self.M, int) or isinstance(self.M, bool) or self.M < self.K - self.m + 1:
            raise InvalidConfigError(
                f"M (sparse draft size) must be an int >= K - m + 1 = {self.K - self.m + 1}, got {self.M!r}"
            )
        if (
            not isinstance(self.threshold, (int, float))
            or isinstance(self.threshold, bool)
            or not 0.0 <= self.threshold <= 1.0
        ):
            raise InvalidConfigError(f"threshold must be a number in [0, 1], got {self.threshold!r}")
        if self.proxy not in PROXIES:
            raise InvalidConfigError(f"proxy must be one of {', '.join(PROXIES)}, got {self.proxy!r}")
        if (
            not isinstance(self.proxy_scale, (int, float))
            or isinstance(self.proxy_scale, bool)
            or not 0.0 < self.proxy_scale <= 1.0
        ):
            raise InvalidConfigError(f"proxy_scale must be a number in (0, 1], got {self.proxy_scale!r}")
        if self.proxy == "geometric" and self.proxy_scale >= 1.0:
            raise InvalidConfigError(
                "the geometric proxy c r (1 - c)^i needs proxy_scale < 1 (c = 1 gives later draws weight 0), "
                f"got {self.proxy_scale!r}"
            )

    def propose(self, q: torch.Tensor, rng: RandomSource, q_draw: torch.Tensor | None = None) -> list[list[ChildProposal]]:
        return rheo_proposal(
            q, self.K, self.m, self.M, float(self.threshold), rng, self.proxy, float(self.proxy_scale), q_draw,
            self.calibration,
        )

    def _table(self) -> Calibration | None:
        """The calibration table, checked present where the proxy needs it (a tree at ``T > 0``)."""
        return _need_table(self.calibration) if self.proxy == "calibrated" else None

    def draws_per_node(self, sampling: SamplingConfig) -> int:
        return 0 if sampling.greedy else self.m

    def level_fn(self, sampling: SamplingConfig) -> LevelFn:
        """The tensor form; EAGLE-2's at ``T = 0`` (as :meth:`proposer`)."""
        K, m, M, threshold, proxy, scale = self.K, self.m, self.M, float(self.threshold), self.proxy, float(self.proxy_scale)
        if sampling.greedy:
            return lambda q, rng, live: eagle_level(q, K)
        table = self._table()
        return lambda q, rng, live, draw=None: rheo_level(q, K, m, M, threshold, rng, proxy, scale, live, draw, table)

    def proposer(self, sampling: SamplingConfig) -> ProposeFn:
        """At ``T = 0`` no node gets a sampled slot (docs/trees.md, ``rheo``): the children are EAGLE-2's top-``K``, so the tree is EAGLE-2's."""
        if sampling.greedy:
            return lambda q, rng: eagle_proposal(q, self.K)
        self._table()
        return self.propose


# the method(s) this builder serves (docs/methods.md)
register_method(Method("rheo", "rheo", "mixed", {},
                "RheoSampling: dynamic top-K tree plus a sampled slot with proxy weights, mixed rule 5"))


def profile_calibration(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    *,
    draws: int = 10,
    M: int = 1024,
    rank_law: str = "untempered",
    steps_per_prompt: int = 16,
    seed: int | None = 0,
    prior: float = 2.0,
) -> Calibration:
    """Measure the ``"calibrated"`` proxy's table (docs/trees.md, "Proxies") on real prompts.

    Each step drafts a one-level Rheo tree with every slot sampled (``K = m = draws``, the
    displaced proxy, ``M`` and ``rank_law`` as the tree that will use the table), the target
    scores it, rule 5 (the ``"mixed"`` verifier; rule 4 here, since every child is sampled)
    picks the accepted child or none, and the emitted tokens are committed, so later steps
    profile generated text (as Sequoia's profile does). For the ``i``-th draw, whose displaced
    weight (the ranking law's ``q`` at rank ``i``) falls in bin ``b`` of
    :data:`CALIBRATION_EDGES`, the table holds ``(a + prior * w_b) / (n + prior)``: ``n`` draws
    seen there, ``a`` of them accepted, ``w_b`` the bin's midpoint (so a bin never seen keeps
    the displaced weight, and a sparse one leans towards it), then made non-decreasing along each
    row (weighted isotonic fit) and no row above the one before it (:func:`check_calibration`
    says why the builder needs both).

    Args:
        target: the target model.
        draft: the draft model (EAGLE heads receive the target's features at commit).
        prompts: token-id prompts (non-empty).
        sampling: the sampling configuration the trees will serve (``T > 0``).
        draws: rows of the table (sampled children per profiled node).
        M: the sparse draft size of the served tree.
        rank_law: the served tree's ranking law.
        steps_per_prompt: steps per prompt.
        seed: seed of the draws (None: from entropy).
        prior: pseudo-count of the bin midpoint (``> 0``).

    Raises:
        InvalidConfigError: ``T = 0`` (no node is sampled there), no prompt, bad counts.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> lm = CallableLM(lambda p: torch.tensor([[2.0, 1.0, 0.0]] * len(p)), vocab_size=3)
        >>> table = profile_calibration(lm, CallableLM(lm.fn, 3), [[0]], SamplingConfig(), draws=2, M=3)
        >>> bin_of_top = 8  # q at rank 0 is 0.665: bin [0.5, 0.7); p = q, so the first draw is always accepted
        >>> round(table[0][bin_of_top], 3)  # 16 of 16 (+ 2 pseudo-draws at 0.6), pooled with the unseen bins above
        0.94
        >>> # rank 1 (q 0.245, bin [0.2, 0.35)) never accepted: 0.031, pooled with the unseen bins 4 and 5 below it
        >>> round(table[1][6], 3), round(table[1][4], 3), round(table[1][3], 3)  # bin 3: its midpoint 0.035
        (0.045, 0.045, 0.035)
    """
    from specdec.registry import get
    from specdec.rng import TorchRandom
    from specdec.step import profile_steps  # the generation step (import here: no cycle)

    if sampling.greedy:
        raise InvalidConfigError("profile_calibration needs T > 0: at T = 0 no node has a sampled child")
    for name, value in (("draws", draws), ("steps_per_prompt", steps_per_prompt)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidConfigError(f"{name} must be an int >= 1, got {value!r}")
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not prior > 0:
        raise InvalidConfigError(f"prior must be a number > 0, got {prior!r}")
    if not prompts:
        raise InvalidConfigError("profile_calibration needs at least one prompt")
    builder = RheoTreeBuilder(K=max(2, draws), m=max(2, draws), B=1, depth=1, N=max(2, draws), M=max(M, draws),
                              proxy="displaced", rank_law=rank_law)
    check = get("verifier", "mixed")()
    rng = TorchRandom.seeded(seed)
    bins = len(CALIBRATION_EDGES)
    seen = torch.zeros(draws, bins, dtype=torch.float64)  # [draws, bins]
    hits = torch.zeros(draws, bins, dtype=torch.float64)
    for outcome, tree in profile_steps(target, draft, prompts, builder, check, sampling, rng, steps_per_prompt,
                                       room=draws + 1, name="profile_calibration"):
        result = outcome.result
        n = int(tree.num_nodes[0])
        accepted = result.accepted_nodes[0] if result.accepted_nodes else -1
        for node, (i, w) in enumerate(zip(tree.draw_order[0, 1:n].tolist(), tree.weights[0, 1:n].tolist()), start=1):
            if i < draws:  # the i-th draw, its displaced weight's bin
                b = _bin(w)
                seen[i, b] += 1
                hits[i, b] += float(node == accepted)
    upper = list(CALIBRATION_EDGES[1:]) + [1.0]
    mid = torch.tensor([(lo + hi) / 2 for lo, hi in zip(CALIBRATION_EDGES, upper)], dtype=torch.float64)  # [bins]
    table = (hits + prior * mid) / (seen + prior)  # [draws, bins]
    weight = seen + prior  # [draws, bins]
    rows = [_isotonic(table[i].tolist(), weight[i].tolist()) for i in range(draws)]  # non-decreasing over bins
    for i in range(1, draws):  # no row above the one before it (the minimum keeps each row non-decreasing)
        rows[i] = [min(a, b) for a, b in zip(rows[i], rows[i - 1])]
    return check_calibration(rows)


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators).

    Example:
        >>> _isotonic([0.1, 0.3, 0.2, 0.4], [1, 1, 1, 1])
        [0.1, 0.25, 0.25, 0.4]
    """
    blocks: list[list[float]] = []  # [mean, weight, size]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [b[0] for b in blocks for _ in range(int(b[2]))]
