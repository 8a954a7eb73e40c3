"""Broken variants of the verifiers (docs/verifiers.md, "Proving a verifier lossless": things that look harmless
and are NOT lossless") must FAIL the exact per-node checks that the real
verifiers pass (tests/verify/test_verify_exact_node.py).

Each mutant is a Verifier subclass from verify_mutants.py, deliberately NOT
registered, or a broken builder-side habit around a real verifier. Every test runs a fixed
list of seeded cases and asserts that the exact law of the first emitted token
deviates from ``p`` by more than 1e-6 on at least one of them (deterministic:
the enumeration is exact). Deterministic-first at a mixed node is still
lossless per node on a static tree, so that mutant is caught by the
acceptance closed form instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from specdec.registry import get
from specdec.tree import SampleMode
from specdec.verify.base import Verifier
from verify_cases import Mix, NodeCase, closed_form_acceptance, feasible, make_node_case, run_node_case
from verify_mutants import (
    ForgetsToRenormaliseQ,
    ForgetsToRenormaliseResidual,
    KSeqResidualOtherRho,
    KSeqRhoK,
    KSeqRhoOne,
    MixedDeterministicFirst,
    MixedWithFullQ,
    RatioOnTopK,
    Rule3OnWithoutReplacement,
    Rule4OnIID,
)

IID, WOR = SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT
SEEDS = range(12)
VOCABS = (3, 4, 5)


def worst_deviation(
    make_verifier: Callable[[NodeCase], Verifier],
    mixes: Iterable[Mix],
    reorder: Callable[[NodeCase], Callable[[list[int]], list[int]]] | None = None,
    seeds: Iterable[int] = SEEDS,
    keep: Callable[[NodeCase], bool] = lambda case: True,
) -> float:
    """Largest ``max_x |law(x) - p(x)|`` over the seeded cases."""
    worst = 0.0
    for mix in mixes:
        for V in VOCABS:
            if not feasible(mix, V):
                continue
            for seed in seeds:
                case = make_node_case(seed, V, mix)
                if not keep(case):
                    continue
                kwargs = {} if reorder is None else {"reorder": reorder(case)}
                law = run_node_case(make_verifier(case), case, **kwargs)
                assert torch.isfinite(law.first_token).all(), "a mutant must still produce a law"
                worst = max(worst, float((law.first_token - case.p).abs().max()))
    return worst


def _dense_draft(case: NodeCase) -> torch.Tensor:
    return case.q.clone()


# ------------------------------------------------------------------- tests
def test_ratio_on_topk_children_is_caught() -> None:
    mixes = [Mix(0, IID, 1), Mix(0, IID, 2)]
    assert worst_deviation(lambda c: RatioOnTopK(_dense_draft(c)), mixes) > 1e-6


def test_mixed_with_q_instead_of_q_prime_is_caught() -> None:
    # keep the cases where make_node_case built RheoSampling's q' = norm(q restricted minus S)
    def rheo(case: NodeCase) -> bool:
        rest = case.q.clone()
        rest[case.det] = 0
        return bool(rest.sum() > 0) and torch.allclose(case.q_prime, rest / rest.sum(), rtol=0, atol=1e-15)

    mixes = [Mix(1, IID, 1), Mix(1, IID, 2)]
    assert worst_deviation(lambda c: MixedWithFullQ(_dense_draft(c)), mixes, keep=rheo) > 1e-6


def test_mixed_deterministic_first_is_caught_by_the_acceptance_closed_form() -> None:
    """Per node on a static tree, deterministic-first is still exact (docs/verifiers.md
    rule 5) but accepts only ``p(S) + sum_{x not in S} min(p, (1 - p(S)) q')``."""
    mutant = MixedDeterministicFirst()
    gap = 0.0
    for mix in (Mix(1, IID, 1), Mix(1, IID, 2)):
        for V in VOCABS:
            for seed in SEEDS:
                case = make_node_case(seed, V, mix)
                law = run_node_case(mutant, case)
                assert float((law.first_token - case.p).abs().max()) < 1e-12
                p, qp = case.p, case.q_prime
                pS = float(p[case.det].sum())
                not_S = torch.ones(V, dtype=torch.bool)
                not_S[case.det] = False
                suboptimal = pS + float(torch.minimum(p, (1 - pS) * qp)[not_S].sum())
                assert abs(law.acceptance - suboptimal) < 1e-12
                gap = max(gap, abs(law.acceptance - closed_form_acceptance("mixed", case)))
    assert gap > 1e-6


def test_rule3_on_without_replacement_draws_is_caught() -> None:
    assert worst_deviation(lambda c: Rule3OnWithoutReplacement(), [Mix(2, WOR, 0), Mix(3, WOR, 0)]) > 1e-6


def test_rule4_on_iid_draws_is_caught() -> None:
    assert worst_deviation(lambda c: Rule4OnIID(), [Mix(2, IID, 0), Mix(3, IID, 0)]) > 1e-6


def test_unnormalised_residual_is_caught() -> None:
    assert worst_deviation(lambda c: ForgetsToRenormaliseResidual(), [Mix(2, WOR, 0), Mix(3, WOR, 0)]) > 1e-6


def test_unnormalised_q_update_is_caught() -> None:
    assert worst_deviation(lambda c: ForgetsToRenormaliseQ(), [Mix(2, WOR, 0), Mix(3, WOR, 0)]) > 1e-6


def _sort_by_q(case: NodeCase) -> Callable[[list[int]], list[int]]:
    return lambda xs: sorted(xs, key=lambda x: -float(case.q_prime[x]))


def test_resorting_sampled_siblings_by_q_is_caught() -> None:
    """A builder habit: re-sorting the drawn children by ``q`` after drawing;
    every real rejection-type verifier then loses exactness."""
    for name, mixes in (
        ("rejection-iid", [Mix(2, IID, 0), Mix(3, IID, 0)]),
        ("rejection-wor", [Mix(2, WOR, 0), Mix(3, WOR, 0)]),
        ("mixed", [Mix(2, WOR, 1), Mix(2, IID, 0)]),
        ("kseq", [Mix(2, IID, 0), Mix(3, IID, 0)]),
    ):
        cls = get("verifier", name)
        assert worst_deviation(lambda c, cls=cls: cls(), mixes, reorder=_sort_by_q) > 1e-6, name


def _prune_by_q(case: NodeCase) -> Callable[[list[int]], list[int]]:
    """Keep the first draw; keep later draws only if their q' is above the median."""
    threshold = float(case.q_prime[case.q_prime > 0].median())
    return lambda xs: xs[:1] + [x for x in xs[1:] if float(case.q_prime[x]) > threshold]


def test_pruning_sampled_siblings_by_drawn_q_is_caught() -> None:
    cls = get("verifier", "rejection-iid")
    assert worst_deviation(lambda c: cls(), [Mix(2, IID, 0), Mix(3, IID, 0)], reorder=_prune_by_q) > 1e-6


def test_kseq_without_the_rho_inequality_is_caught() -> None:
    assert worst_deviation(lambda c: KSeqRhoOne(), [Mix(2, IID, 0), Mix(3, IID, 0)]) > 1e-6


def test_kseq_residual_with_another_rho_is_caught() -> None:
    assert worst_deviation(lambda c: KSeqResidualOtherRho(), [Mix(2, IID, 0), Mix(3, IID, 0)]) > 1e-6


def test_kseq_non_minimal_rho_is_exact_but_caught_by_the_acceptance_closed_form() -> None:
    mutant = KSeqRhoK()
    gap = 0.0
    for V in VOCABS:
        for seed in SEEDS:
            case = make_node_case(seed, V, Mix(2, IID, 0))
            law = run_node_case(mutant, case)
            assert float((law.first_token - case.p).abs().max()) < 1e-12  # any valid rho is exact
            gap = max(gap, abs(law.acceptance - closed_form_acceptance("kseq", case)))
    assert gap > 1e-6
