"""Losslessness with the counter-based stream, statistically (docs/concepts.md, "How losslessness is proved", layer 3).

Exact enumeration (``specdec.testing.exact_law``) proves the rules with an
enumerating source; it cannot enumerate a Philox stream. So: for each fused
rule (2-5) a small per-node program -- children drawn by the builder's
TorchRandom from the proposal law, the root's target row ``p``, leaf rows of
their own -- is run many times with the verification draws from a
CounterRandom (one walk per run, as in generation), and the empirical law of
the emitted tokens is compared with the program's exact law (computed by
enumerating the very same program) by a seeded chi-square test. The first
token's exact law is ``p`` itself (asserted).

Power: the same harness rejects (a) a CounterRandom that does not advance its
draw counter inside a node (every draw at a node reuses one uniform) and (b) a
builder that records the draft's ``q`` where the sampled child was drawn from
``q'`` (a pitfall docs/verifiers.md names), whose exact first-token law is 0.33 away
from ``p`` in total variation.

The kernel path (Triton interpreter) runs the same programs' root decisions
through :func:`~specdec.kernels.verify_fused.node_decisions` and passes the
same test, and rejects mutant (b).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specdec.rng import CounterRandom, counter_uniform
from specdec.registry import get
from specdec.rng import RandomSource, TorchRandom
from specdec.testing import chi_square_test, exact_law
from specdec.tree import DraftTree, SampleMode, SparseLaw, TreeAssembler
from specdec.trees._common import draw_children

F64 = torch.float64
V = 5
ALPHA = 1e-3
P_ROOT = torch.tensor([0.05, 0.15, 0.30, 0.10, 0.40], dtype=F64)
Q_DRAFT = torch.tensor([0.45, 0.05, 0.30, 0.20, 0.0], dtype=F64)
LEAF_ROWS = torch.tensor(
    [[0.1, 0.2, 0.3, 0.4, 0.0], [0.5, 0.0, 0.0, 0.25, 0.25], [0.2, 0.2, 0.2, 0.2, 0.2], [0.0, 0.0, 0.6, 0.0, 0.4]],
    dtype=F64,
)
RULES = ("match", "rejection-iid", "rejection-wor", "mixed")


def q_prime(S: list[int]) -> torch.Tensor:
    """RheoSampling's sampled-slot law: q restricted to the complement of S, renormalised."""
    rest = Q_DRAFT.clone()
    rest[S] = 0
    return rest / rest.sum()


def build_tree(rule: str, rng: RandomSource, record_q: bool = False) -> DraftTree:
    """The root's children for ``rule``, drawn through ``rng`` (the builder's source).

    ``record_q`` (mutant b): record the draft's ``q`` although the sampled
    child was drawn from ``q'``.
    """
    asm = TreeAssembler(root_token=0, vocab_size=V)
    if rule in ("match", "mixed"):
        S = [0, 2] if rule == "match" else [0]
        law = SparseLaw.from_dense(q_prime(S), SampleMode.IID)
        recorded = SparseLaw.from_dense(Q_DRAFT, SampleMode.IID) if record_q else law
        for i in draw_children(law.probs, 1, SampleMode.IID, rng):
            asm.add_sampled(0, int(law.indices[i]), recorded, weight=0.5)
        for token in S:
            asm.add_deterministic(0, token, weight=0.5)
    else:
        mode = SampleMode.IID if rule == "rejection-iid" else SampleMode.WITHOUT_REPLACEMENT
        law = SparseLaw.from_dense(Q_DRAFT, mode)
        for i in draw_children(law.probs, 3 if mode == SampleMode.IID else 2, mode, rng):
            asm.add_sampled(0, int(law.indices[i]), law, weight=0.5)
    return asm.build()


def rows_for(tree: DraftTree) -> torch.Tensor:
    return torch.cat([P_ROOT[None], LEAF_ROWS[: tree.num_nodes - 1]])


def program(rule: str, record_q: bool = False) -> Callable[[RandomSource, RandomSource], tuple[int, ...]]:
    """``(builder source, verifier source) -> emitted tokens`` of one step."""

    def run(build_rng: RandomSource, verify_rng: RandomSource) -> tuple[int, ...]:
        tree = build_tree(rule, build_rng, record_q)
        return get("verifier", rule)().verify(tree, rows_for(tree), verify_rng).tokens

    return run


def exact_tokens_law(rule: str, record_q: bool = False) -> dict[tuple[int, ...], float]:
    run = program(rule, record_q)
    return exact_law(lambda rng: run(rng, rng))


def first_token_law(law: dict[tuple[int, ...], float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for tokens, prob in law.items():
        out[tokens[0]] = out.get(tokens[0], 0.0) + prob
    return out


class StuckCounterRandom(CounterRandom):
    """Mutant (a): the draw counter never advances inside a node."""

    def uniform(self) -> float:
        return counter_uniform(self.seed, self.walk, self.node, self.draw)


def sample(rule: str, n: int, verify_rng: CounterRandom, record_q: bool = False) -> list[tuple[int, ...]]:
    run = program(rule, record_q)
    build_rng = TorchRandom.seeded(1234)
    return [run(build_rng, verify_rng) for _ in range(n)]


@pytest.mark.parametrize("rule", RULES)
def test_exact_law_of_the_program_is_lossless(rule: str) -> None:
    """Sanity of the harness: the first emitted token follows p exactly."""
    first = first_token_law(exact_tokens_law(rule))
    assert max(abs(first.get(t, 0.0) - float(P_ROOT[t])) for t in range(V)) < 1e-12


@pytest.mark.parametrize("rule", RULES)
def test_reference_verifiers_are_lossless_on_the_counter_stream(rule: str) -> None:
    law = exact_tokens_law(rule)
    result = chi_square_test(sample(rule, 2500, CounterRandom(2024)), law)
    assert result.unexpected == 0
    assert result.p_value > ALPHA, f"{rule}: chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"


@pytest.mark.parametrize("rule", ["match", "mixed"])
def test_harness_catches_a_stuck_counter(rule: str) -> None:
    result = chi_square_test(sample(rule, 2500, StuckCounterRandom(2024)), exact_tokens_law(rule))
    assert result.p_value < ALPHA


def test_harness_catches_q_recorded_for_q_prime() -> None:
    mutant_first = first_token_law(exact_tokens_law("mixed", record_q=True))
    tv = 0.5 * sum(abs(mutant_first.get(t, 0.0) - float(P_ROOT[t])) for t in range(V))
    assert tv > 0.3
    result = chi_square_test(sample("mixed", 2500, CounterRandom(2024), record_q=True), exact_tokens_law("mixed"))
    assert result.p_value < ALPHA


# ------------------------------------------------------------ kernel path
def kernel_first_tokens(rule: str, n: int, seed: int, record_q: bool = False) -> list[int]:
    """First emitted token of ``n`` steps, decided by the Triton kernel (root rows only)."""
    from specdec.kernels.verify_fused import node_decisions

    build_rng = TorchRandom.seeded(99)
    trees = [build_tree(rule, build_rng, record_q) for _ in range(n)]
    x = torch.cat([rows_for(t) for t in trees])
    decisions = node_decisions(get("verifier", rule)(), trees, x, seed=seed, walks=list(range(1, n + 1)),
                               nodes=[[0]] * n, block=16)
    out = []
    for tree, decided in zip(trees, decisions):
        d = decided[0]
        out.append(int(tree.tokens[d.accepted_child]) if d.accepted_child is not None else d.bonus_token)
    return out


@pytest.mark.parametrize("rule", ["rejection-wor", "mixed"])
def test_kernel_decisions_are_lossless(rule: str) -> None:
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    law = {t: float(P_ROOT[t]) for t in range(V)}
    result = chi_square_test(kernel_first_tokens(rule, 300, seed=77), law)
    assert result.unexpected == 0
    assert result.p_value > ALPHA, f"{rule}: chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"


def test_kernel_harness_catches_q_recorded_for_q_prime() -> None:
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    law = {t: float(P_ROOT[t]) for t in range(V)}
    assert chi_square_test(kernel_first_tokens("mixed", 300, seed=77, record_q=True), law).p_value < ALPHA
