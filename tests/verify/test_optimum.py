"""specdec.verify.optimum: the best lossless acceptance at a node (docs/verifiers.md, "The gap to the
best lossless acceptance"), against a plain max-flow reference, every registered rule, and the engine."""

from __future__ import annotations

import itertools

import pytest
import torch

import specdec
from specdec.engine.options import StepOptions
from specdec.errors import InvalidConfigError
from specdec.registry import get, list_registered
from specdec.testing import markov_pair
from specdec.tree import SampleMode
from specdec.verify import optimum as optimum_module
from specdec.verify.optimum import node_optimum
from verify_cases import ALL_MIXES, feasible, make_node_case, run_node_case, supports

IID, WOR = SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT


def set_law(q: torch.Tensor, k: int, mode: SampleMode) -> dict[frozenset, float]:
    """The law of the set of distinct tokens among k draws from q (by enumerating ordered draws)."""
    law: dict[frozenset, float] = {}
    V = q.numel()
    for seq in itertools.product(range(V), repeat=k):
        prob, left = 1.0, q.clone()
        for x in seq:
            mass = float(left.sum())
            if mass <= 0 or float(left[x]) <= 0:
                prob = 0.0
                break
            prob *= float(left[x]) / mass
            if mode == WOR:
                left[x] = 0
        if prob > 0:
            law[frozenset(seq)] = law.get(frozenset(seq), 0.0) + prob
    return law


def max_flow_reference(p: torch.Tensor, det: list[int], q: torch.Tensor, k: int, mode: SampleMode) -> float:
    """The maximal coupling of z ~ p and the drawn set T, by augmenting paths (Edmonds-Karp)
    on source -> token (p) -> set (if z in det + T) -> sink (P(T)): the plain reference."""
    V = p.numel()
    sets = list(set_law(q / q.sum(), k, mode).items())
    n = 2 + V + len(sets)
    cap = [[0.0] * n for _ in range(n)]
    for z in range(V):
        cap[0][2 + z] = float(p[z])
        for j, (T, prob) in enumerate(sets):
            if z in T or z in det:
                cap[2 + z][2 + V + j] = 2.0
    for j, (_, prob) in enumerate(sets):
        cap[2 + V + j][1] = prob
    flow = 0.0
    while True:
        parent = [-1] * n
        parent[0] = 0
        queue = [0]
        while queue and parent[1] < 0:
            u = queue.pop(0)
            for v in range(n):
                if parent[v] < 0 and cap[u][v] > 1e-15:
                    parent[v] = u
                    queue.append(v)
        if parent[1] < 0:
            return flow
        push, v = float("inf"), 1
        while v != 0:
            push = min(push, cap[parent[v]][v])
            v = parent[v]
        v = 1
        while v != 0:
            cap[parent[v]][v] -= push
            cap[v][parent[v]] += push
            v = parent[v]
        flow += push


@pytest.mark.parametrize("mix", [m for m in ALL_MIXES if m.k >= 1], ids=lambda m: m.label)
def test_min_cut_equals_the_max_flow_reference(mix) -> None:
    for V in (3, 4):
        if not feasible(mix, V):
            continue
        for seed in range(6):
            case = make_node_case(seed, V, mix)
            got = node_optimum(case.p, case.det, case.q_prime, mix.k, mix.mode)
            want = max_flow_reference(case.p, case.det, case.q_prime, mix.k, mix.mode)
            assert got.exact and got.value == pytest.approx(want, abs=1e-12), (seed, V)


def _supported() -> list:
    out = []
    for name in list_registered("verifier"):
        for mix in ALL_MIXES:
            if supports(get("verifier", name), mix):
                out.append(pytest.param(name, mix, id=f"{name}-{mix.label}"))
    return out


@pytest.mark.parametrize("name, mix", _supported())
def test_no_registered_rule_beats_the_optimum(name: str, mix) -> None:
    """Every rule's exact acceptance at the node (enumerated) is at most the optimum; rule 5 with
    one sampled child and rule 2 on deterministic children attain it."""
    cls = get("verifier", name)
    attained = (name == "mixed" and mix.k <= 1) or (name in ("match", "mixed") and mix.k == 0) or (
        name in ("rejection-iid", "rejection-wor", "kseq") and mix.k == 1 and mix.K == 0)
    for V in (3, 4):
        if not feasible(mix, V):
            continue
        for seed in range(5):
            case = make_node_case(seed, V, mix, greedy=cls.requires_greedy)
            law = run_node_case(cls(), case)
            best = node_optimum(case.p, case.det, case.q_prime if mix.k else None, mix.k, mix.mode)
            assert law.acceptance <= best.value + 1e-12, (seed, V, law.acceptance, best)
            if attained:
                assert law.acceptance == pytest.approx(best.value, abs=1e-12), (seed, V)


def test_the_bound_is_labelled_and_never_below_the_optimum(monkeypatch) -> None:
    cases = [(make_node_case(seed, V, mix), mix) for mix in ALL_MIXES if mix.k >= 2
             for V in (3, 4, 5) if feasible(mix, V) for seed in range(4)]
    exact = [node_optimum(c.p, c.det, c.q_prime, m.k, m.mode) for c, m in cases]
    monkeypatch.setattr(optimum_module, "EXACT_SUPPORT", -1)  # every node takes the bound
    for (case, mix), want in zip(cases, exact):
        bound = node_optimum(case.p, case.det, case.q_prime, mix.k, mix.mode)
        assert not bound.exact and want.exact
        assert bound.value >= want.value - 1e-12


def test_a_broken_optimum_is_caught() -> None:
    """Power: a version that forgets that sampled draws repeat (k i.i.d. draws counted as k distinct
    tokens: inclusion k q'(x)) overstates the optimum and fails the max-flow comparison."""
    mix = next(m for m in ALL_MIXES if m.k == 2 and m.mode == IID and m.K == 0)
    worst = 0.0
    for seed in range(6):
        case = make_node_case(seed, 3, mix)
        wrong = min(1.0, float(torch.minimum(case.p, (2 * case.q_prime).clamp_max(1.0)).sum()))
        worst = max(worst, abs(wrong - max_flow_reference(case.p, case.det, case.q_prime, 2, IID)))
    assert worst > 1e-3


def test_the_engine_reports_the_optimum_and_the_gap_per_depth() -> None:
    target, draft = markov_pair(5, seed=0, order=2)
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", K=2, m=1, depth=3, N=5, M=4,
                                       options=StepOptions(optimum=True))
    stats = gen.generate([0, 1], 60, sampling=specdec.SamplingConfig(temperature=1.0), seed=0).stats
    assert len(stats.optimum_by_depth) == len(stats.acceptance_by_depth) > 0
    assert all(0 <= o <= 1 for o in stats.optimum_by_depth)
    assert stats.gap_by_depth == tuple(o - a for o, a in zip(stats.optimum_by_depth, stats.acceptance_by_depth))
    assert not stats.optimum_bound  # V = 5: every node exact
    assert "gap_by_depth" in stats.as_dict()
    plain = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", K=2, m=1, depth=3, N=5, M=4)
    off = plain.generate([0, 1], 60, sampling=specdec.SamplingConfig(temperature=1.0), seed=0)
    assert off.stats.depth_optimum == () and off.stats.optimum_by_depth == ()
    assert off.tokens == gen.generate([0, 1], 60, sampling=specdec.SamplingConfig(temperature=1.0), seed=0).tokens
    with pytest.raises(InvalidConfigError):
        StepOptions(optimum=1)
