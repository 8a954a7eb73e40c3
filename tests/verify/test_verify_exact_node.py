"""Layer 1 of docs/concepts.md, "How losslessness is proved": exact, per node.

For every registered verifier and every child-kind mix it declares support
for, on vocabularies of 2..6 tokens with many seeded random target rows ``p``
and draft laws (with zeros, one-hot laws and ``q(top1) = 1/2`` ties), the
test enumerates exactly every draw of the sampled children (drawn through the
same enumerating random source as the verifier) and every accept/reject
branch of the verifier, and checks

- the law of the first emitted token equals ``p`` to 1e-12;
- the probability that a root child is accepted equals docs/verifiers.md's closed
  form where one is stated (rule 2: ``p(S)``; rule 5 with one sampled child:
  ``p(S) + sum_{x not in S} min(p(x), q'(x))``; rules 3/4 with one child:
  ``sum min(p, q)``; K-SEQ: ``1 - (1 - beta(rho))^k``; greedy: 1 when
  ``argmax p`` is a deterministic child).

Mixes a verifier does not support must raise UnsupportedTreeError instead.
The suite is parametrised over the registry, so a newly registered verifier
is tested the moment it is imported.
"""

from __future__ import annotations

import pytest
import torch

from specdec.errors import UnsupportedTreeError
from specdec.registry import get, list_registered
from specdec.rng import TorchRandom
from verify_cases import (
    ALL_MIXES,
    build_root_tree,
    closed_form_acceptance,
    feasible,
    has_closed_form,
    leaf_rows,
    make_node_case,
    run_node_case,
    supports,
)

VERIFIERS = list_registered("verifier")
VOCABS = (2, 3, 4, 5, 6)
SEEDS = 20  # per (verifier, mix, V); cycles through every pair of p / q styles
SEEDS_LARGE = 8  # for the 216-draw cases (3 sampled children, V >= 5)


def _supported_cases() -> list:
    cases = []
    for name in VERIFIERS:
        cls = get("verifier", name)
        for mix in ALL_MIXES:
            if not supports(cls, mix):
                continue
            for V in VOCABS:
                if feasible(mix, V):
                    cases.append(pytest.param(name, mix, V, id=f"{name}-{mix.label}-V{V}"))
    return cases


@pytest.mark.parametrize("name, mix, V", _supported_cases())
def test_first_token_law_is_p(name: str, mix, V: int) -> None:
    cls = get("verifier", name)
    verifier = cls()
    seeds = SEEDS_LARGE if mix.k >= 3 and V >= 5 else SEEDS
    checked_closed_form = 0
    for seed in range(seeds):
        case = make_node_case(seed, V, mix, greedy=cls.requires_greedy)
        law = run_node_case(verifier, case)
        err = float((law.first_token - case.p).abs().max())
        assert err < 1e-12, f"seed {seed}: first-token law off p by {err:.3g}\np={case.p}\nq'={case.q_prime}"
        expected = closed_form_acceptance(name, case)
        if expected is not None:
            checked_closed_form += 1
            assert law.acceptance == pytest.approx(expected, abs=1e-12), f"seed {seed}: acceptance"
    if has_closed_form(name, mix):
        assert checked_closed_form == seeds  # the closed forms really were exercised


@pytest.mark.parametrize(
    "name, mix",
    [
        pytest.param(name, mix, id=f"{name}-{mix.label}")
        for name in VERIFIERS
        for mix in ALL_MIXES
        if not supports(get("verifier", name), mix)
    ],
)
def test_unsupported_mix_raises(name: str, mix) -> None:
    cls = get("verifier", name)
    V = 4
    case = make_node_case(0, V, mix, greedy=cls.requires_greedy)
    sampled = [int(i) for i in torch.nonzero(case.q_prime > 0).flatten()[: mix.k]]
    if mix.mode.value == "iid" and mix.k > 1:
        sampled = [sampled[0]] * mix.k  # an i.i.d. draw may repeat
    tree = build_root_tree(V, sampled, case.q_prime, mix.mode, case.det)
    with pytest.raises(UnsupportedTreeError):
        cls().verify(tree, leaf_rows(tree.num_nodes, V, case.p), TorchRandom.seeded(0))


def test_every_verifier_supports_something() -> None:
    for name in VERIFIERS:
        cls = get("verifier", name)
        assert any(supports(cls, mix) for mix in ALL_MIXES), name
        assert cls.lossless, f"{name} is registered as lossless=False"
