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

``1 <= m < K``: a node keeps at least one deterministic slot. With ``m = K`` (every
slot sampled) the construction is another method, ``sampled-dynamic``
(:class:`~specdec.trees.sampled_dynamic.SampledDynamicTreeBuilder`), which ``rheo`` refuses.

A node gets no sampled slot (it becomes an EAGLE-2 node with top-``K``
deterministic children) when its residual mass is 0 or below ``threshold``,
and no node gets one at ``T = 0``: there the trees are built from the draft's
untempered law (:func:`~specdec.sampling.construction_config`) exactly as
EAGLE-2 builds them, and verified greedily (rule 1), so Rheo is EAGLE-2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch

from specdec.errors import InvalidConfigError
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind, SampleMode, SparseLaw
from specdec.trees._common import (
    draw_rows, masked_outside, min_top1_weight, residual_masses, row_mass, slot_residual, top_tokens_tensors,
)
from specdec.trees.dynamic import ChildProposal, DynamicTreeBuilder, ProposeFn, eagle_proposal
from specdec.trees.calibration import CALIBRATION_EDGES, Calibration, _need_table, calibrated_weight, check_calibration
from specdec.trees.levelwise import LevelFn, eagle_level, rheo_level
from specdec.methods import Method, register_method

__all__ = ["CALIBRATION_EDGES", "DEFAULT_POLICY", "PROXIES", "RheoTreeBuilder", "STANDING_M", "calibrated_weight",
           "check_calibration", "policy_options", "rheo_proposal", "residual_mass", "residual_masses"]  # the calibration names re-exported from specdec.trees.calibration


def residual_mass(q_row: torch.Tensor, deterministic: list[int]) -> float:
    """:func:`residual_masses` of one row ``[V]`` and a list of token ids."""
    ids = torch.tensor([deterministic], dtype=torch.int64, device=q_row.device).reshape(1, -1)
    return float(residual_masses(q_row.unsqueeze(0), ids)[0])


PROXIES = ("scaled", "residual", "displaced", "geometric", "calibrated", "min_top1")
"""Proxy weights of sampled children: ``"scaled"``, ``c (1 - q(S))`` split evenly
(specdec's default, ``c = proxy_scale``); ``"residual"``, ``1 - q(S)`` split
evenly (the reconstruction's first choice, ``c = 1``); ``"displaced"``, the ``q`` of the
token ranked where the child sits (rank ``K - m + i`` for the ``i``-th draw),
i.e. the weight of the deterministic child EAGLE-2 would have put in that slot;
``"geometric"``, ``c (1 - q(S)) (1 - c)^i`` for the ``i``-th draw (``i = 0, 1, ...``): the
first draw weighs what the one draw of ``m = 1`` weighs, each later one less (earlier draws
rank first); ``"calibrated"``, the displaced weight mapped through a measured table
(:func:`calibrated_weight`, :func:`specdec.tune.profile_calibration`): the acceptance rate of the ``i``-th
draw among nodes whose displaced weight fell in the same bin (:data:`CALIBRATION_EDGES`);
``"min_top1"``, ``min(q(top1), 1 - q(top1))`` split evenly (the paper's proxy as its summary states
it, docs/trees.md "The paper's settings"; ``q`` the ranking law, its top-1 token a deterministic slot).
All are functions of ``q`` alone, never of the drawn token."""

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
    truncate: bool = False,
) -> list[list[ChildProposal]]:
    """RheoSampling's children of ``k`` nodes (steps 1-3 of the module docstring).

    Args:
        q: ``[k, V]`` float64 processed draft laws, one row per expanded node.
        K: children per node (deterministic + sampled).
        m: sampled slots per node (``1 <= m <= K``; ``m = K``: no deterministic slot, ``S`` is empty:
            the ``sampled-dynamic`` method's tree, :class:`~specdec.trees.sampled_dynamic.SampledDynamicTreeBuilder`).
        M: size of the sparse draft (``M >= K - m + 1``).
        threshold: inject the sampled slots only where ``1 - q(S) >= threshold``.
        rng: source of the draws (one ``categorical`` per sampled child).
        proxy: the sampled children's weight, one of :data:`PROXIES`
            (:class:`RheoTreeBuilder` defaults to ``"scaled"``).
        proxy_scale: ``c`` of the ``"scaled"`` proxy (ignored by the others).
        q_draw: ``[k, V]`` float64 laws the sampled slots draw by, when they are not
            ``q`` (``rank_law="untempered"``): ``q`` then ranks (``S``, the
            deterministic weights, the displaced and ``min_top1`` proxies) and ``q'`` is the top
            ``M - (K - m)`` entries of ``q_draw`` outside ``S``, renormalised; the
            residual is ``1 - q_draw(S)``.
        calibration: the ``"calibrated"`` proxy's table (needed by it, ignored by the others).
        truncate: the construction reads each law truncated to its top ``M`` entries and
            renormalised (the paper's sparse draft, a softmax over the top-``M`` logits): the
            deterministic weights and the proxies divide ``q``'s entries by the mass of its top
            ``M``, and the residual is ``1 - q(S) / mass``; ``q'`` (already the renormalised top
            ``M`` outside ``S``) and every draw are unchanged.

    Returns:
        Per node: its sampled children (draw order, law ``q'``, proxy weight),
        then its deterministic children (rank order, weight ``q(x)``). A node
        without a sampled slot gets its top-``K`` deterministic children.
    """
    if q_draw is not None:
        return _rheo_proposal_split(q, q_draw, K, m, M, threshold, rng, proxy, proxy_scale, calibration, truncate)
    out: list[list[ChildProposal]] = []
    rows = top_tokens_tensors(q, max(K, M))
    slot_ids = torch.full((q.shape[0], K - m), -1, dtype=torch.int64, device=q.device)
    cand = torch.zeros(q.shape[0], max(M - (K - m), 0), dtype=torch.float64, device=q.device)
    for r, (ids, probs) in enumerate(rows):
        slot_ids[r, : min(K - m, ids.numel())] = ids[: K - m]
        cand[r, : max(ids[K - m : M].numel(), 0)] = probs[K - m : M]
    mass_m = _top_mass([probs for _, probs in rows], M, q) if truncate else None  # [k] mass of the top M
    if mass_m is None:
        residuals = residual_masses(q, slot_ids).tolist()
    else:
        in_s = torch.where(slot_ids >= 0, q.gather(-1, slot_ids.clamp_min(0)), 0.0) / mass_m.unsqueeze(-1)
        residuals = slot_residual(in_s).tolist()
    mass = row_mass(cand)  # [k]
    has_slot = torch.tensor(
        [rows[r][0][K - m : M].numel() > 0 and residuals[r] > 0.0 and residuals[r] >= threshold for r in range(len(rows))],
        dtype=torch.bool, device=q.device,
    )
    mode = SampleMode.WITHOUT_REPLACEMENT if m > 1 else SampleMode.IID
    law_probs = cand / torch.where(has_slot, mass, 1.0).unsqueeze(-1)  # [k, M - (K - m)]: q' of every node
    drawn_rows = draw_rows(law_probs, m, mode, rng, has_slot).tolist()
    for r, (ids, probs) in enumerate(rows):
        weigh = probs if mass_m is None else probs / mass_m[r]  # the construction's law (truncated or not)
        slots = list(zip(ids[: K - m].tolist(), weigh[: K - m].tolist()))
        cand_ids, cand_probs = ids[K - m : M], weigh[K - m : M]
        residual = residuals[r]
        if not bool(has_slot[r]):
            out.append([ChildProposal(token, NodeKind.DETERMINISTIC, prob)
                        for token, prob in zip(ids[:K].tolist(), weigh[:K].tolist())])
            continue
        law = SparseLaw(cand_ids.to(torch.int64), law_probs[r, : cand_ids.numel()], mode)
        drawn = [i for i in drawn_rows[r] if i >= 0]
        if proxy in ("displaced", "calibrated"):
            weights = [float(cand_probs[min(i, cand_probs.numel() - 1)]) for i in range(len(drawn))]
            if proxy == "calibrated":
                weights = [calibrated_weight(w, i, _need_table(calibration)) for i, w in enumerate(weights)]
        elif proxy == "min_top1":
            weights = _min_top1_weights(weigh[0], len(drawn))
        else:
            weights = _split_weights(residual, len(drawn), proxy, proxy_scale)
        children = [ChildProposal(int(law.indices[i]), NodeKind.SAMPLED, w, law) for i, w in zip(drawn, weights)]
        children += [ChildProposal(token, NodeKind.DETERMINISTIC, prob) for token, prob in slots]
        out.append(children)
    return out


def _top_mass(rows: list[torch.Tensor], M: int, like: torch.Tensor) -> torch.Tensor:
    """``[k]`` the mass of each row's top ``M`` entries (``rows``: each row's entries in rank order),
    summed left to right (:func:`~specdec.trees._common.row_mass` of the rows padded to ``M``): the
    bits the tensor builder's :func:`~specdec.trees.levelwise.rheo_level` divides by."""
    top = torch.zeros(len(rows), M, dtype=torch.float64, device=like.device)
    for r, probs in enumerate(rows):
        n = min(M, probs.numel())
        top[r, :n] = probs[:n]
    return row_mass(top)


def _min_top1_weights(top1: torch.Tensor, n: int) -> list[float]:
    """The ``"min_top1"`` weights of a node's ``n`` sampled children: ``min(q(top1), 1 - q(top1))``
    (:func:`~specdec.trees._common.min_top1_weight`) split evenly."""
    w = float(min_top1_weight(top1))
    return [min(1.0, w / n)] * n


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
    truncate: bool = False,
) -> list[list[ChildProposal]]:
    """:func:`rheo_proposal` ranking by ``q`` and drawing by ``q_draw``, node by node."""
    out: list[list[ChildProposal]] = []
    ranked = top_tokens_tensors(q, K)  # per row: the ranking law's top K
    slot_ids = torch.full((q.shape[0], K - m), -1, dtype=torch.int64, device=q.device)
    for r, (ids, _) in enumerate(ranked):
        slot_ids[r, : min(K - m, ids.numel())] = ids[: K - m]
    outside = masked_outside(q_draw, slot_ids)  # q_draw with S zeroed
    if truncate:  # each law's top-M mass: the ranking law's weights and the draw law's residual divide by it
        mass_rank = _top_mass([p for _, p in top_tokens_tensors(q, M)], M, q)
        mass_draw = _top_mass([p for _, p in top_tokens_tensors(q_draw, M)], M, q)
        in_s = torch.where(slot_ids >= 0, q_draw.gather(-1, slot_ids.clamp_min(0)), 0.0) / mass_draw.unsqueeze(-1)
        residuals = slot_residual(in_s).tolist()
    else:
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
        if truncate:
            probs = probs / mass_rank[r]
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
        elif proxy == "min_top1":
            weights = _min_top1_weights(probs[0], len(drawn))
        else:
            weights = _split_weights(residuals[r], len(drawn), proxy, proxy_scale)
        children = [ChildProposal(int(law.indices[i]), NodeKind.SAMPLED, w, law) for i, w in zip(drawn, weights)]
        children += [ChildProposal(t, NodeKind.DETERMINISTIC, p)
                     for t, p in zip(ids[: K - m].tolist(), probs[: K - m].tolist())]
        out.append(children)
    return out


STANDING_M = 1024
"""The sparse draft size of ``sampled-dynamic`` where :data:`DEFAULT_POLICY` sets none."""

DEFAULT_POLICY: dict[str, dict[float, dict[str, Any]]] = {
    "rheo": {0.6: {}, 1.0: {}},
    "sampled-dynamic": {0.6: {"M": 8192}, 1.0: {}},
}
"""The default policy (docs/trees.md, "Default policy"): per tree builder and tuned temperature, the
options its library defaults take there, fixed by the stated rule on the tuning prompts
(``benchmarks/results/rheo_policy_tune_smollm2``, ``benchmarks/rheo_policy_table.py``). ``{}``: the
standing defaults were kept; a temperature not listed is untuned and takes the standing defaults.
rheo keeps its standing defaults (``m=1``, ``proxy="scaled"``, ``proxy_scale=0.25``, ``M=1024``) at both
tuned temperatures; ``sampled-dynamic`` takes ``M = 8192`` at ``T = 0.6``."""


def policy_options(tree: str, temperature: float) -> dict[str, Any]:
    """The options :data:`DEFAULT_POLICY` gives builder ``tree`` at ``temperature`` (``{}``: none).

    Example:
        >>> policy_options("sampled-dynamic", 0.6), policy_options("sampled-dynamic", 0.7), policy_options("rheo", 1.0)
        ({'M': 8192}, {}, {})
    """
    return dict(DEFAULT_POLICY.get(tree, {}).get(float(temperature), {}))


def check_common(builder: Any) -> None:
    """Check the options :class:`RheoTreeBuilder` and
    :class:`~specdec.trees.sampled_dynamic.SampledDynamicTreeBuilder` share (``proxy``,
    ``proxy_scale``, ``truncate``); raises :class:`~specdec.errors.InvalidConfigError`."""
    if builder.proxy not in PROXIES:
        raise InvalidConfigError(f"proxy must be one of {', '.join(PROXIES)}, got {builder.proxy!r}")
    if (
        not isinstance(builder.proxy_scale, (int, float))
        or isinstance(builder.proxy_scale, bool)
        or not 0.0 < builder.proxy_scale <= 1.0
    ):
        raise InvalidConfigError(f"proxy_scale must be a number in (0, 1], got {builder.proxy_scale!r}")
    if builder.proxy == "geometric" and builder.proxy_scale >= 1.0:
        raise InvalidConfigError(
            "the geometric proxy c r (1 - c)^i needs proxy_scale < 1 (c = 1 gives later draws weight 0), "
            f"got {builder.proxy_scale!r}"
        )
    if not isinstance(builder.truncate, bool):
        raise InvalidConfigError(f"truncate must be True or False, got {builder.truncate!r}")


@register("tree", "rheo")
@attrs.frozen
class RheoTreeBuilder(DynamicTreeBuilder):
    """RheoSampling dynamic tree (reconstruction; see the module docstring): every expanded node
    keeps at least one deterministic top-``K`` child and gets ``m < K`` sampled ones.

    Args:
        K: children per expanded node, deterministic + sampled (default 10, as
            EAGLE-2's top-k; ``K >= 2``).
        m: sampled slots per node (default 1; ``1 <= m < K``: at least one deterministic
            slot, the abstract's "sampled token among the deterministic top-K slots").
            ``m = K``, every slot sampled, is another method, ``sampled-dynamic``
            (:class:`~specdec.trees.sampled_dynamic.SampledDynamicTreeBuilder`): this builder refuses it,
            naming that one.
        B: beam width (default ``K``).
        depth: levels below the root (default 6, as EAGLE-2).
        N: draft nodes kept (default 60, as EAGLE-2).
        M: sparse draft size, the top-``M`` entries of ``q`` (default 1024;
            ``M >= K - m + 1``; the reconstruction first suggested "64 or so": docs/trees.md
            gives the measurements behind the larger default).
        threshold: inject sampled slots only where the residual mass
            ``1 - q(S)`` is at least this (default 0: wherever it is positive).
        proxy: the sampled children's construction weight, ``"scaled"``
            (default), ``"residual"`` (the reconstruction's first choice), ``"displaced"``,
            ``"geometric"``, ``"calibrated"`` or ``"min_top1"`` (the paper's, as its summary
            states it) (:data:`PROXIES`).
        proxy_scale: ``c`` of the ``"scaled"`` and ``"geometric"`` proxies, in ``(0, 1]``
            (default 0.25; ``1`` makes ``"scaled"`` the ``"residual"`` proxy; ``"geometric"``
            needs ``c < 1``).
        calibration: the ``"calibrated"`` proxy's table (:data:`Calibration`, measured by
            :func:`specdec.tune.profile_calibration` for one draft, target and temperature; ``specdec bench``
            profiles it per temperature). Needed by that proxy at ``T > 0`` (building a tree
            without it raises); ``T = 0`` never uses a proxy.
        truncate: the construction reads each node's law truncated to its top ``M`` entries and
            renormalised, as the paper's sparse draft (a softmax over the top-``M`` logits): the
            deterministic weights and the proxies are read from it (default False: from the whole
            law). The sampled slot's law ``q'`` is the same either way (:func:`rheo_proposal`).

    Verified by the ``"mixed"`` verifier (rule 5); at ``T = 0`` the trees are
    EAGLE-2's and ``"greedy"`` applies.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> draft = CallableLM(lambda p: torch.log(torch.tensor([[0.5, 0.3, 0.2]] * len(p))), vocab_size=3)
        >>> from specdec.trees import build_tree
        >>> draft.begin([0])
        >>> tree = build_tree(RheoTreeBuilder(K=2, depth=1, N=2, M=3), 0, draft, SamplingConfig(), TorchRandom.seeded(0))
        >>> [NodeKind(k).name for k in tree.kinds.tolist()]
        ['ROOT', 'SAMPLED', 'DETERMINISTIC']
        >>> tree.laws[0].indices.tolist(), [round(x, 3) for x in tree.laws[0].probs.tolist()]
        ([1, 2], [0.6, 0.4])
        >>> round(float(tree.weights[1]), 3)  # the proxy: 0.25 * (1 - q(S)), whichever token was drawn
        0.125
    """

    batch_form = True

    m: int = attrs.field(default=1)
    M: int = attrs.field(default=1024)
    threshold: float = attrs.field(default=0.0)
    proxy: str = attrs.field(default="scaled")
    proxy_scale: float = attrs.field(default=0.25)
    calibration: Calibration | None = attrs.field(
        default=None, converter=lambda v: None if v is None else check_calibration(v))
    truncate: bool = attrs.field(default=False)

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
        {"K": 3, "m": 2, "B": 2, "depth": 2, "N": 4, "M": 3, "proxy": "calibrated",
         "calibration": ((0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                         (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.16, 0.18, 0.2))},
        # the paper's settings as its summary states them: one sampled slot, the min(q(top1), 1 - q(top1))
        # proxy, a sparse draft truncated before the softmax (M = 3 of a 4- or 5-token vocabulary)
        {"K": 2, "m": 1, "B": 2, "depth": 2, "N": 3, "M": 3, "proxy": "min_top1", "truncate": True},
        {"K": 3, "m": 2, "B": 1, "depth": 2, "N": 3, "M": 3, "proxy": "min_top1"},
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.K < 2:
            raise InvalidConfigError(f"RheoSampling needs K >= 2 (K - m deterministic + m sampled), got K={self.K}")
        if not isinstance(self.m, int) or isinstance(self.m, bool) or self.m < 1:
            raise InvalidConfigError(f"m (sampled slots) must be an int with 1 <= m < K={self.K}, got {self.m!r}")
        if self.m >= self.K:
            raise InvalidConfigError(
                f"rheo needs at least one deterministic slot (1 <= m < K), got m={self.m} with K={self.K}: with "
                "every slot sampled the tree is another method, 'sampled-dynamic' (a dynamic tree whose every "
                "child is sampled, verified against its true law); use method='sampled-dynamic' (tree "
                "'sampled-dynamic', options K, B, depth, N, M, proxy, proxy_scale, calibration)"
            )
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
        check_common(self)

    def propose(self, q: torch.Tensor, rng: RandomSource, q_draw: torch.Tensor | None = None) -> list[list[ChildProposal]]:
        return rheo_proposal(
            q, self.K, self.m, self.M, float(self.threshold), rng, self.proxy, float(self.proxy_scale), q_draw,
            self.calibration, self.truncate,
        )

    def _table(self) -> Calibration | None:
        """The calibration table, checked present where the proxy needs it (a tree at ``T > 0``)."""
        return _need_table(self.calibration) if self.proxy == "calibrated" else None

    def draws_per_node(self, sampling: SamplingConfig) -> int:
        return 0 if sampling.greedy else self.m

    def level_fn(self, sampling: SamplingConfig) -> LevelFn:
        """The tensor form; EAGLE-2's at ``T = 0`` (as :meth:`proposer`)."""
        K, m, M, threshold, proxy, scale = self.K, self.m, self.M, float(self.threshold), self.proxy, float(self.proxy_scale)
        truncate = self.truncate
        if sampling.greedy:
            return lambda q, rng, live: eagle_level(q, K)
        table = self._table()
        return lambda q, rng, live, draw=None: rheo_level(q, K, m, M, threshold, rng, proxy, scale, live, draw, table,
                                                          truncate)

    def proposer(self, sampling: SamplingConfig) -> ProposeFn:
        """At ``T = 0`` no node gets a sampled slot (docs/trees.md, ``rheo``): the children are EAGLE-2's top-``K``, so the tree is EAGLE-2's."""
        if sampling.greedy:
            return lambda q, rng: eagle_proposal(q, self.K)
        self._table()
        return self.propose


# the method(s) this builder serves (docs/methods.md)
register_method(Method("rheo", "rheo", "mixed", {},
                "RheoSampling: dynamic top-K tree plus a sampled slot with proxy weights, mixed rule 5"))
