"""Shared helpers of the verifier tests: the per-node cases (public, in
:mod:`specdec.testing.cases`) and docs/verifiers.md's closed-form acceptances.

Lives beside the tests (not in conftest.py) so that test modules can import
it by name; pytest's default import mode puts this folder on ``sys.path``.
"""

from __future__ import annotations

import torch

from specdec.testing.cases import (  # noqa: F401 - re-exported for the test modules
    ALL_MIXES,
    STYLES,
    Mix,
    NodeCase,
    NodeLaw,
    build_root_tree,
    draw_children,
    exact_node_law,
    feasible,
    leaf_rows,
    make_node_case,
    node_program,
    random_law,
    run_node_case,
    supports,
    top_tokens,
)
from specdec.verify.residual import kseq_beta, kseq_rho

F64 = torch.float64


def closed_form_acceptance(name: str, case: NodeCase) -> float | None:
    """docs/verifiers.md's closed-form acceptance at the node, where one is stated."""
    p, qp, det, mix = case.p, case.q_prime, case.det, case.mix
    pS = float(p[det].sum()) if det else 0.0
    if name == "greedy":
        if mix.k:
            return None
        return 1.0 if int(p.argmax()) in det else 0.0  # rule 1
    if mix.k == 0 and name in ("match", "mixed"):
        return pS  # rule 2
    if mix.k == 1 and name == "match":  # rule 2 with S plus one child y ~ q': E[p(S + {y})]
        not_S = torch.ones_like(p, dtype=torch.bool)
        not_S[det] = False
        return pS + float((qp * p)[not_S].sum())
    if mix.k == 1:
        not_S = torch.ones_like(p, dtype=torch.bool)
        not_S[det] = False
        mins = torch.minimum(p, qp)
        if name == "mixed":  # rule 5, one sampled child
            return pS + float(mins[not_S].sum())
        if mix.K == 0 and name in ("rejection-iid", "rejection-wor", "kseq", "traversal", "block"):
            return float(mins.sum())  # rule 3/4, single child (rules 7/8: one child of the root is rule 3)
    if name == "kseq" and mix.K == 0:
        support = torch.nonzero(qp > 0).flatten()
        rho = kseq_rho(p[support], qp[support], mix.k)
        beta = kseq_beta(p[support], qp[support], rho)
        return 1.0 - (1.0 - beta) ** mix.k
    return None


CLOSED_FORMS = {
    "greedy": lambda mix: mix.k == 0,
    "match": lambda mix: mix.k <= 1,
    "mixed": lambda mix: mix.k <= 1,
    "rejection-iid": lambda mix: mix.k == 1,
    "rejection-wor": lambda mix: mix.k == 1,
    "kseq": lambda mix: True,
    "traversal": lambda mix: mix.k == 1,
    "block": lambda mix: mix.k == 1,
}


def has_closed_form(name: str, mix: Mix) -> bool:
    """Whether :func:`closed_form_acceptance` covers ``name`` on ``mix`` (when supported)."""
    rule = CLOSED_FORMS.get(name)
    return bool(rule and rule(mix))
