"""``sampled-dynamic``: a context-aware dynamic tree whose every child is sampled (docs/trees.md).

RheoSampling's construction (:mod:`specdec.trees.rheo`) with no deterministic slot (``m = K``): every
expanded node gets ``K`` children drawn without replacement from ``q' = norm(topM(q))``, recorded with
that true law and ranked for EAGLE-2's expansion and pruning by a proxy weight that depends on ``q``
alone. It is not RheoSampling (no top-K slot is left to inject a sampled token among), so it is a
method of its own, which ``rheo`` names when it refuses ``m = K``; it builds, draw for draw, the trees
``rheo[m=K]`` built before issue 47. Verified by the mixed rule 5 (rule 4 with no deterministic child).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch

from specdec.errors import InvalidConfigError
from specdec.methods import Method, register_method
from specdec.registry import register
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind, SampleMode
from specdec.trees.calibration import Calibration, _need_table, check_calibration
from specdec.trees.dynamic import ChildProposal, DynamicTreeBuilder, ProposeFn, eagle_proposal
from specdec.trees.levelwise import LevelFn, eagle_level, rheo_level
from specdec.trees.rheo import STANDING_M, check_common, policy_options, rheo_proposal

__all__ = ["SampledDynamicTreeBuilder"]


@register("tree", "sampled-dynamic")
@attrs.frozen
class SampledDynamicTreeBuilder(DynamicTreeBuilder):
    """A context-aware dynamic tree whose every child is sampled (docs/trees.md, ``sampled-dynamic``).

    Each expanded node gets ``K`` children drawn without replacement from its sparse draft
    ``q' = norm(topM(q))``, recorded with that true law; they are ranked during EAGLE-2's expansion
    and pruning (the same routine) by a proxy weight that depends on ``q`` alone, by default the
    ``q`` of the token ranked where the child sits (``proxy="displaced"``: the weight EAGLE-2's
    deterministic child in that slot would have), so the tree's shape follows the draft's
    confidence context by context. It is RheoSampling's construction with no deterministic slot
    (``m = K``), which ``rheo`` refuses: there is no top-``K`` slot left to inject a sampled token
    into, so it is not the abstract's method and is reported under its own name. Verified by the
    ``"mixed"`` verifier, which with no deterministic child is rule 4 against ``q'`` (recursive
    rejection without replacement); at ``T = 0`` the tree is EAGLE-2's (greedy verification).

    Args:
        K: children per expanded node, all sampled (default 10; ``K >= 2``).
        B, depth, N, rank_law: as EAGLE-2 (:class:`~specdec.trees.dynamic.DynamicTreeBuilder`).
        M: sparse draft size (``M >= K``); None (default): the default policy's at the sampling's
            temperature (:data:`~specdec.trees.rheo.DEFAULT_POLICY`: 8,192 at ``T = 0.6``), else 1024
            (:data:`~specdec.trees.rheo.STANDING_M`; :meth:`sparse_size`).
        proxy: the children's construction weight (:data:`~specdec.trees.rheo.PROXIES`; default ``"displaced"``).
            ``"displaced"`` and ``"calibrated"`` read ``q``'s ranks; with every slot sampled the
            ``"scaled"``, ``"residual"`` and ``"geometric"`` weights no longer depend on ``q`` (the
            residual is 1 at every node), so under them the tree has the same shape in every context.
        proxy_scale: ``c`` of the ``"scaled"`` and ``"geometric"`` proxies (default 0.25).
        calibration: the ``"calibrated"`` proxy's table (needed by it at ``T > 0``).
        truncate: read the weights from the top-``M`` law renormalised (as :class:`RheoTreeBuilder`).

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> from specdec.rng import TorchRandom
        >>> from specdec.sampling import SamplingConfig
        >>> draft = CallableLM(lambda p: torch.log(torch.tensor([[0.5, 0.3, 0.2]] * len(p))), vocab_size=3)
        >>> from specdec.trees import build_tree
        >>> draft.begin([0])
        >>> tree = build_tree(SampledDynamicTreeBuilder(K=2, depth=1, N=2, M=3), 0, draft, SamplingConfig(),
        ...                   TorchRandom.seeded(0))
        >>> [NodeKind(k).name for k in tree.kinds.tolist()]
        ['ROOT', 'SAMPLED', 'SAMPLED']
        >>> [round(float(w), 3) for w in tree.weights[1:]]  # displaced: q at ranks 0 and 1, whichever tokens
        [0.5, 0.3]
    """

    batch_form = True

    M: int | None = attrs.field(default=None)
    proxy: str = attrs.field(default="displaced")
    proxy_scale: float = attrs.field(default=0.25)
    calibration: Calibration | None = attrs.field(
        default=None, converter=lambda v: None if v is None else check_calibration(v))
    truncate: bool = attrs.field(default=False)

    # sampled children at T > 0; at T = 0 the tree is EAGLE-2's (deterministic top-K): both kinds, so only
    # the rules that verify both ("mixed", "greedy" at T = 0) fit, as for rheo
    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    default_verifier: ClassVar[str] = "mixed"

    @property
    def sibling_modes(self) -> frozenset[SampleMode]:
        """Every child of a node is drawn without replacement."""
        return frozenset({SampleMode.WITHOUT_REPLACEMENT})
    example_options: ClassVar[tuple[Mapping[str, Any], ...]] = (
        {"K": 2, "B": 1, "depth": 3, "N": 3, "M": 3},
        {"K": 3, "B": 1, "depth": 2, "N": 3, "M": 4},
        {"K": 2, "B": 2, "depth": 2, "N": 4, "M": 3, "proxy": "geometric", "proxy_scale": 0.5},
        {"K": 3, "B": 2, "depth": 2, "N": 4, "M": 4, "proxy": "calibrated",
         "calibration": ((0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
                         (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.16, 0.18, 0.2))},
        {"K": 2, "B": 2, "depth": 2, "N": 3, "M": 3, "truncate": True},
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.K < 2:
            raise InvalidConfigError(f"sampled-dynamic needs K >= 2 sampled children per node, got K={self.K}")
        if self.M is not None and (not isinstance(self.M, int) or isinstance(self.M, bool) or self.M < self.K):
            raise InvalidConfigError(f"M (sparse draft size) must be an int >= K = {self.K} (or None: the default "
                                     f"policy's), got {self.M!r}")
        check_common(self)

    def sparse_size(self, sampling: SamplingConfig) -> int:
        """``M`` under ``sampling``: the builder's own, else the default policy's at its temperature
        (:func:`~specdec.trees.rheo.policy_options`), else :data:`~specdec.trees.rheo.STANDING_M` (never below ``K``)."""
        if self.M is not None:
            return self.M
        return max(self.K, int(policy_options("sampled-dynamic", sampling.temperature).get("M", STANDING_M)))

    def propose(self, q: torch.Tensor, rng: RandomSource, q_draw: torch.Tensor | None = None, *,
                M: int | None = None) -> list[list[ChildProposal]]:
        """The children of ``k`` nodes (``M``: the sparse draft size, default the builder's own or
        :data:`STANDING_M`; :meth:`proposer` passes the one of the sampling's temperature)."""
        size = M if M is not None else (self.M if self.M is not None else STANDING_M)
        return rheo_proposal(q, self.K, self.K, size, 0.0, rng, self.proxy, float(self.proxy_scale), q_draw,
                             self.calibration, self.truncate)

    def _table(self) -> Calibration | None:
        return _need_table(self.calibration) if self.proxy == "calibrated" else None

    def draws_per_node(self, sampling: SamplingConfig) -> int:
        return 0 if sampling.greedy else self.K

    def level_fn(self, sampling: SamplingConfig) -> LevelFn:
        """The tensor form (:func:`~specdec.trees.levelwise.rheo_level` with ``m = K``); EAGLE-2's at ``T = 0``."""
        K, M, proxy, scale, truncate = self.K, self.sparse_size(sampling), self.proxy, float(self.proxy_scale), self.truncate
        if sampling.greedy:
            return lambda q, rng, live: eagle_level(q, K)
        table = self._table()
        return lambda q, rng, live, draw=None: rheo_level(q, K, K, M, 0.0, rng, proxy, scale, live, draw, table,
                                                          truncate)

    def proposer(self, sampling: SamplingConfig) -> ProposeFn:
        """At ``T = 0`` the children are EAGLE-2's top-``K`` (nothing is sampled at ``T = 0``); else
        :meth:`propose` with the sparse draft size of the sampling's temperature (:meth:`sparse_size`)."""
        if sampling.greedy:
            return lambda q, rng: eagle_proposal(q, self.K)
        self._table()
        if self.M is not None:  # the builder's own M: propose as it is (a subclass's override included)
            return self.propose
        return functools.partial(self.propose, M=self.sparse_size(sampling))


# the method this builder serves (docs/methods.md)
register_method(Method("sampled-dynamic", "sampled-dynamic", "mixed", {},
                "dynamic tree with every child sampled (wor) and ranked by a proxy, verified against its true law"))
