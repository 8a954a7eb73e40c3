"""Layer 2 of docs/concepts.md ("How losslessness is proved"): exact whole-tree losslessness of every builder +
verifier pair, and the mutants that must fail it.

Every case enumerates every draw of the real builder and verifier
(``specdec.testing.exact_law``) on second-order Markov target and draft
tables over V = 3-4, chains steps exactly (a fresh tree from each new
context), and compares the joint law of the first ``depth + 1`` emitted
tokens with the target's exact law. Dynamic-tree settings have ``N`` below
the number of created nodes and ``B < K`` where ``K > 1``, and the draft
tables contain one-hot rows and rows with ``q(top1) = 1/2`` so that exact
ties occur (checked).
"""

from __future__ import annotations

import math

import attrs
import pytest
import torch

import specdec
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw
from specdec.trees import (
    ChainTreeBuilder,
    EagleTreeBuilder,
    RheoTreeBuilder,
    SampledDynamicTreeBuilder,
    SequoiaTreeBuilder,
    StaticTreeBuilder,
)
from specdec.trees import static as static_module
from specdec.trees._common import draw_rows
from specdec.trees.dynamic import DynamicNode
from specdec.trees.rheo import calibrated_weight
from specdec.verify.base import NodeOutcome, Verifier
from specdec.verify.match import sample_and_match
from specdec.verify.rejection import recursive_rejection
from tree_exact import (
    GREEDY,
    T1,
    WARPED,
    Harness,
    random_table,
    tied_draft_table,
    whole_program_law,
)

EXACT = 1e-9
BROKEN = 1e-6


def verifier(name: str) -> Verifier:
    return specdec.get("verifier", name)()


def has_tie(tree: DraftTree) -> bool:
    """Two draft nodes with exactly equal path scores (sum of log weights)."""
    score = [0.0] * tree.num_nodes
    for i in range(1, tree.num_nodes):
        score[i] = score[int(tree.parents[i])] + math.log(float(tree.weights[i]))
    return len(set(score[1:])) < tree.num_nodes - 1


def run_case(builder, verifier_name, vocab, seeds, sampling, *, tied=True, check_ties=False, ver=None):
    target = random_table(vocab, seeds[0])
    draft = tied_draft_table(vocab, seeds[1]) if tied else random_table(vocab, seeds[1])
    ties = []
    harness = Harness(
        builder,
        ver if ver is not None else verifier(verifier_name),
        target,
        draft,
        sampling,
        on_tree=(lambda tree: ties.append(has_tie(tree))) if check_ties else None,
    )
    deviation = harness.deviation(builder.max_depth + 1)
    if check_ties:
        assert any(ties), "the setting produced no exact tie"
    return deviation


# a "calibrated" proxy table (rows: draw 0, later draws; a column per bin of CALIBRATION_EDGES); it lifts weak
# draws far above their displaced weight (bin [0.1, 0.2) -> 0.6), so the tree's shape differs from the displaced one's
CALIBRATED = ((0.05, 0.1, 0.15, 0.2, 0.3, 0.6, 0.6, 0.6, 0.75, 0.8, 0.9),
              (0.02, 0.04, 0.06, 0.08, 0.1, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6))  # flat stretches: exact ties
# a table that check_calibration refuses (a later draw may outweigh an earlier one): built past the check, it
# breaks the output law (test_unordered_calibration_breaks_the_law)
UNORDERED = ((0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.9, 0.2, 0.6, 0.4, 0.8),
             (0.02, 0.04, 0.06, 0.08, 0.1, 0.7, 0.05, 0.5, 0.1, 0.3, 0.2))

# name, builder, verifier, V, (target seed, draft seed), dynamic (check pruning/ties)
CASES = [
    ("eagle-match", EagleTreeBuilder(K=2, B=1, depth=3, N=3), "match", 3, (1, 2), True),
    ("eagle-match-V4", EagleTreeBuilder(K=3, B=2, depth=2, N=4), "match", 4, (3, 4), True),
    ("rheo-mixed", RheoTreeBuilder(K=2, m=1, B=1, depth=3, N=3, M=3), "mixed", 3, (1, 2), True),
    ("rheo-mixed-V4", RheoTreeBuilder(K=3, m=1, B=2, depth=2, N=4, M=4), "mixed", 4, (5, 6), True),
    ("rheo-mixed-sparseM", RheoTreeBuilder(K=3, m=1, B=1, depth=2, N=3, M=3), "mixed", 4, (7, 8), True),
    ("rheo-mixed-m2", RheoTreeBuilder(K=3, m=2, B=1, depth=2, N=3, M=4), "mixed", 4, (1, 2), True),
    # the other proxies (the cases above use the default, "scaled" with c = 0.25)
    ("rheo-scaled-half", RheoTreeBuilder(K=2, m=1, B=1, depth=3, N=3, M=3, proxy_scale=0.5), "mixed", 3, (3, 4), True),
    ("rheo-displaced", RheoTreeBuilder(K=2, m=1, B=1, depth=3, N=3, M=3, proxy="displaced"), "mixed", 3, (1, 2), True),
    (
        "rheo-geometric-m2",
        RheoTreeBuilder(K=3, m=2, B=1, depth=2, N=3, M=4, proxy="geometric", proxy_scale=0.5),
        "mixed",
        4,
        (1, 2),
        True,
    ),
    (
        "rheo-displaced-m2",
        RheoTreeBuilder(K=3, m=2, B=1, depth=2, N=3, M=4, proxy="displaced"),
        "mixed",
        4,
        (1, 2),
        True,
    ),
    # every slot sampled (sampled-dynamic: RheoSampling's construction with m = K, no deterministic child, S empty,
    # residual 1), with the proxies measured in docs/rheo_results.md: displaced keeps the draft's ranks, geometric a
    # fixed shape
    ("rheo-every-slot-displaced", SampledDynamicTreeBuilder(K=2, B=1, depth=3, N=3, M=3, proxy="displaced"), "mixed", 3,
     (1, 2), True),
    ("rheo-every-slot-displaced-V4", SampledDynamicTreeBuilder(K=3, B=1, depth=2, N=3, M=4, proxy="displaced"), "mixed", 4,
     (3, 4), True),
    (
        "rheo-every-slot-geometric",
        SampledDynamicTreeBuilder(K=2, B=1, depth=3, N=3, M=3, proxy="geometric", proxy_scale=0.5),
        "mixed",
        3,
        (5, 6),
        True,
    ),
    # the calibrated proxy (docs/trees.md, "Proxies"): a measured table read at the displaced weight's bin;
    # CALIBRATED is not monotone, so the tree's shape differs from the displaced one's
    ("rheo-every-slot-calibrated", SampledDynamicTreeBuilder(K=2, B=1, depth=3, N=3, M=3, proxy="calibrated",
                                                   calibration=CALIBRATED), "mixed", 3, (3, 4), True),
    ("rheo-calibrated-m2-V4", RheoTreeBuilder(K=3, m=2, B=2, depth=2, N=4, M=4, proxy="calibrated",
                                              calibration=CALIBRATED), "mixed", 4, (3, 4), True),
    ("rheo-every-slot-calibrated-V4", SampledDynamicTreeBuilder(K=3, B=1, depth=2, N=3, M=4, proxy="calibrated",
                                                      calibration=CALIBRATED), "mixed", 4, (5, 6), True),
    # the paper's settings as its summary states them (docs/trees.md, "The paper's settings"): the min(q(top1),
    # 1 - q(top1)) proxy and the sparse draft truncated before the softmax, together and apart
    ("rheo-paper", RheoTreeBuilder(K=2, m=1, B=1, depth=3, N=3, M=3, proxy="min_top1", truncate=True), "mixed", 4,
     (1, 2), True),
    ("rheo-min-top1-m2", RheoTreeBuilder(K=3, m=2, B=1, depth=2, N=3, M=4, proxy="min_top1"), "mixed", 4, (3, 4),
     True),
    ("rheo-truncated", RheoTreeBuilder(K=3, m=1, B=2, depth=2, N=4, M=3, truncate=True), "mixed", 4, (5, 6), True),
    ("every-slot-truncated", SampledDynamicTreeBuilder(K=3, B=1, depth=2, N=3, M=3, truncate=True), "mixed", 4,
     (1, 2), True),
    # more children per node than the vocabulary (K = 6 > V = 4, the defaults' M): every token drawn
    ("every-slot-K-above-V", SampledDynamicTreeBuilder(K=6, B=1, depth=2, N=3, M=1024), "mixed", 4, (3, 4), True),
    # the residual-mass proxy (the reconstruction's first choice, docs/trees.md)
    ("rheo-residual", RheoTreeBuilder(K=2, m=1, B=1, depth=3, N=3, M=3, proxy="residual"), "mixed", 3, (1, 2), True),
    ("rheo-residual-m2", RheoTreeBuilder(K=3, m=2, B=1, depth=2, N=3, M=4, proxy="residual"), "mixed", 4, (3, 4), True),
    (
        "rheo-mixed-threshold",
        RheoTreeBuilder(K=2, m=1, B=1, depth=3, N=3, M=3, threshold=0.4),
        "mixed",
        3,
        (3, 4),
        True,
    ),
    # the cases above rank by the untempered draft law (rank_law's default) and Rheo's slots draw by the processed
    # one; these rank by the processed law (rank_law="sampling"; T0.7-topk-topp tells the two apart)
    ("eagle-sampling", EagleTreeBuilder(K=3, B=2, depth=2, N=4, rank_law="sampling"), "match", 4, (3, 4), True),
    ("rheo-sampling", RheoTreeBuilder(K=3, m=1, B=2, depth=2, N=4, M=4, rank_law="sampling"), "mixed", 4, (5, 6),
     True),
    ("rheo-sampling-m2", RheoTreeBuilder(K=3, m=2, B=1, depth=2, N=3, M=4, rank_law="sampling"), "mixed", 4,
     (1, 2), True),
    ("chain-iid", ChainTreeBuilder(depth=3), "rejection-iid", 3, (1, 2), False),
    ("static-iid", StaticTreeBuilder(expansion=(2, 1), mode="iid"), "rejection-iid", 3, (1, 2), False),
    ("static-wor", StaticTreeBuilder(expansion=(2, 1), mode="wor"), "rejection-wor", 3, (3, 4), False),
    (
        "static-wor-paths",
        StaticTreeBuilder(expansion=[(0,), (1,), (2,), (0, 0)], mode="wor"),
        "rejection-wor",
        3,
        (5, 6),
        False,
    ),
    (
        "sequoia-wor",
        SequoiaTreeBuilder(num_nodes=3, max_depth=2, acceptance=(0.5, 0.2)),
        "rejection-wor",
        3,
        (1, 2),
        False,
    ),
]


@pytest.mark.parametrize("sampling", [T1, WARPED], ids=["T1", "T0.7-topk-topp"])
@pytest.mark.parametrize("name,builder,verifier_name,vocab,seeds,dynamic", CASES, ids=[c[0] for c in CASES])
def test_whole_tree_is_exact(name, builder, verifier_name, vocab, seeds, dynamic, sampling):
    if dynamic:
        assert builder.max_created > builder.N  # the global rerank prunes
        assert builder.B < builder.K or builder.K == 1  # the beam competes
    deviation = run_case(builder, verifier_name, vocab, seeds, sampling, check_ties=dynamic and sampling is T1)
    assert deviation < EXACT, f"{name}: deviation {deviation:.3e}"


def _registered_examples() -> list[tuple[str, dict]]:
    cases = []
    for name in specdec.list_registered("tree"):
        for options in specdec.get("tree", name).example_options:
            cases.append((name, dict(options)))
    return cases


REGISTERED = _registered_examples()


def test_every_registered_builder_gives_examples():
    for name in specdec.list_registered("tree"):
        cls = specdec.get("tree", name)
        assert cls.example_options, f"tree builder {name!r} gives no example_options"
        for options in cls.example_options:
            builder = cls(**options)
            assert builder.default_verifier in specdec.list_registered("verifier"), name
            assert builder.max_nodes <= 8, f"{name} example {options} is too large to enumerate"


MIN_P = SamplingConfig(temperature=0.9, min_p=0.3)  # a law transform like top-p: p and q both go through it


@pytest.mark.parametrize("sampling", [T1, GREEDY, MIN_P], ids=["T1", "T0", "T0.9-minp0.3"])
@pytest.mark.parametrize("name,options", REGISTERED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(REGISTERED)])
def test_registered_builder_is_exact(name, options, sampling):
    """Every registered builder, with each of its example options, verified by
    its default verifier: the whole-tree law is the target's (V = 4)."""
    builder = specdec.get("tree", name)(**options)
    deviation = run_case(builder, builder.default_verifier, 4, (11, 12), sampling)
    assert deviation < EXACT, f"{name} {options}: deviation {deviation:.3e}"


GREEDY_CASES = [
    ("eagle-greedy", EagleTreeBuilder(K=2, B=1, depth=3, N=3), "greedy"),
    ("rheo-greedy", RheoTreeBuilder(K=2, m=1, B=1, depth=3, N=3, M=3), "greedy"),
    ("eagle-match-T0", EagleTreeBuilder(K=3, B=2, depth=3, N=4), "match"),
    ("rheo-mixed-T0", RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=4, M=4), "mixed"),
    # at T = 0 the static and Sequoia children are drawn from the untempered draft law
    # (construction_config), and the rejection rules must still emit exactly argmax p
    ("chain-T0", ChainTreeBuilder(depth=3), "rejection-iid"),
    ("static-iid-T0", StaticTreeBuilder(expansion=(2, 1), mode="iid"), "rejection-iid"),
    ("static-wor-T0", StaticTreeBuilder(expansion=(3, 1), mode="wor"), "rejection-wor"),
    ("sequoia-T0", SequoiaTreeBuilder(num_nodes=4, max_depth=2, acceptance=(0.5, 0.2)), "rejection-wor"),
]


@pytest.mark.parametrize("name,builder,verifier_name", GREEDY_CASES, ids=[c[0] for c in GREEDY_CASES])
def test_greedy_whole_tree_is_exact(name, builder, verifier_name):
    deviation = run_case(builder, verifier_name, 4, (2, 3), GREEDY)
    assert deviation < EXACT


def test_step_composition_equals_the_single_whole_program():
    """The chained per-step laws equal one exact_law over the literal
    generate-until-enough-tokens program (the harness's shortcut is exact)."""
    builder = RheoTreeBuilder(K=2, m=1, B=1, depth=2, N=2, M=3)
    harness = Harness(builder, verifier("mixed"), random_table(3, 1), tied_draft_table(3, 2), T1)
    composed = harness.law((0, 1), 3)
    whole = whole_program_law(harness, 3)
    assert set(composed) == set(whole)
    assert max(abs(composed[k] - whole[k]) for k in whole) < 1e-12
    assert harness.deviation(3) < EXACT


SLOW_CASES = [
    ("eagle-V4-d4", EagleTreeBuilder(K=2, B=1, depth=4, N=4), "match", 4, (11, 12)),
    ("rheo-V4-d3", RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=5, M=4), "mixed", 4, (11, 12)),
    ("rheo-V4-d4", RheoTreeBuilder(K=2, m=1, B=1, depth=4, N=4, M=4), "mixed", 4, (13, 14)),
    ("rheo-V4-m2-d3", RheoTreeBuilder(K=3, m=2, B=2, depth=3, N=5, M=4), "mixed", 4, (15, 16)),
    ("rheo-V5-d2", RheoTreeBuilder(K=3, m=1, B=2, depth=2, N=4, M=5), "mixed", 5, (17, 18)),
    ("static-wor-V4", StaticTreeBuilder(expansion=(2, 1), mode="wor"), "rejection-wor", 4, (1, 2)),
    ("sequoia-V4", SequoiaTreeBuilder(num_nodes=4, max_depth=3, acceptance=(0.6, 0.2)), "rejection-wor", 4, (3, 4)),
]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [T1, WARPED], ids=["T1", "T0.7-topk-topp"])
@pytest.mark.parametrize("name,builder,verifier_name,vocab,seeds", SLOW_CASES, ids=[c[0] for c in SLOW_CASES])
def test_whole_tree_is_exact_larger(name, builder, verifier_name, vocab, seeds, sampling):
    assert run_case(builder, verifier_name, vocab, seeds, sampling) < EXACT


# =============================================================== mutants
# Each mutant changes ONE thing docs/verifiers.md forbids; each must fail the very
# test the correct builder passes on the same setting.


@attrs.frozen
class ProxyIsTrueLaw(RheoTreeBuilder):
    """Mutant: the sampled child's proxy is q'(y), which depends on the drawn token."""

    def propose(self, q, rng):
        return [
            [attrs.evolve(c, weight=c.law.prob_of(c.token)) if c.kind == NodeKind.SAMPLED else c for c in row]
            for row in super().propose(q, rng)
        ]


@attrs.frozen
class ProxyIsDraftProb(RheoTreeBuilder):
    """Mutant: the sampled child's proxy is q(y) (token dependent)."""

    def propose(self, q, rng):
        return [
            [attrs.evolve(c, weight=float(q_row[c.token])) if c.kind == NodeKind.SAMPLED else c for c in row]
            for q_row, row in zip(q, super().propose(q, rng))
        ]


@attrs.frozen
class CalibratedAtDrawnToken(SampledDynamicTreeBuilder):
    """Mutant: the calibrated proxy read at the drawn token's q(y) instead of the displaced weight."""

    def propose(self, q, rng):
        out = []
        for q_row, row in zip(q, super().propose(q, rng)):
            draws = iter(range(len(row)))
            out.append([attrs.evolve(c, weight=calibrated_weight(float(q_row[c.token]), next(draws), self.calibration))
                        if c.kind == NodeKind.SAMPLED else c for c in row])
        return out


@attrs.frozen
class RecordsQInsteadOfQPrime(RheoTreeBuilder):
    """Mutant: draws from q' but records the full q as the sampled child's law."""

    def propose(self, q, rng):
        out = []
        for q_row, row in zip(q, super().propose(q, rng)):
            law = None
            new = []
            for c in row:
                if c.kind == NodeKind.SAMPLED:
                    law = law or SparseLaw.from_dense(q_row, c.law.mode)
                    c = attrs.evolve(c, law=law)
                new.append(c)
            out.append(new)
        return out


def test_registered_builder_check_catches_a_registered_mutant():
    """The power of the registry-parametrised test: a broken builder registered
    with Rheo's example options fails it."""
    from specdec.registry import register, unregister

    register("tree", "mutant-proxy-true-law")(ProxyIsTrueLaw)
    try:
        cls = specdec.get("tree", "mutant-proxy-true-law")
        deviations = [run_case(cls(**o), cls.default_verifier, 4, (11, 12), T1) for o in cls.example_options]
    finally:
        unregister("tree", "mutant-proxy-true-law")
    assert max(deviations) > BROKEN, deviations


@attrs.frozen
class TiesByTokenId(RheoTreeBuilder):
    """Mutant: equal scores ranked by token id instead of creation index."""

    def rank_key(self, node: DynamicNode) -> tuple:
        return (-node.score, node.token, node.index)


@attrs.frozen
class DescendantOutranksAncestor(RheoTreeBuilder):
    """Mutant: equal scores ranked LATER creation first, so a weight-1 child
    outranks its parent; orphans of the cut are dropped to keep a tree."""

    def rank_key(self, node: DynamicNode) -> tuple:
        return (-node.score, -node.index)

    def keep(self, nodes, num_keep, key):
        kept = sorted(nodes, key=key)[:num_keep]
        ids = {0} | {n.index for n in kept}
        by_index = {n.index: n for n in nodes}

        def rooted(n):
            while n.parent != 0:
                if n.parent not in ids:
                    return False
                n = by_index[n.parent]
            return True

        return [n for n in kept if rooted(n)]


@attrs.frozen
class DeterministicCreatedFirst(RheoTreeBuilder):
    """NOT a mutant (shown exact below): deterministic siblings created, hence
    ranked on ties, before the sampled child. The verifier still tests the
    sampled child first."""

    def propose(self, q, rng):
        return [
            [c for c in row if c.kind != NodeKind.SAMPLED] + [c for c in row if c.kind == NodeKind.SAMPLED]
            for row in super().propose(q, rng)
        ]


class DeterministicFirstVerifier(Verifier):
    """Mutant verifier: sample-and-match over the deterministic children first,
    then recursive rejection of the sampled child(ren) on the residual."""

    supported_kinds = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        p = p_node.to(torch.float64)
        P = p / p.sum()
        determ = tree.deterministic_children(node)
        if determ:
            accepted, P = sample_and_match(P, determ, [int(tree.tokens[c]) for c in determ], rng)
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        sampled = tree.sampled_children(node)
        if sampled:
            law = tree.law_of(sampled[0])
            accepted, P = recursive_rejection(
                P,
                law.dense(tree.vocab_size, torch.float64),
                sampled,
                [int(tree.tokens[c]) for c in sampled],
                rng,
                without_replacement=law.mode == SampleMode.WITHOUT_REPLACEMENT,
            )
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))


SMALL = dict(K=2, m=1, B=1, depth=3, N=3, M=3)
EVERY_SLOT_CALIBRATED = dict(K=3, B=1, depth=2, N=3, M=4, proxy="calibrated", calibration=CALIBRATED)
# name, mutant class, verifier (None = "mixed"), kwargs, V, seeds; settings found by search
RHEO_MUTANTS = [
    ("proxy-q'(y)", ProxyIsTrueLaw, None, SMALL, 3, (3, 4)),
    ("proxy-q(y)", ProxyIsDraftProb, None, SMALL, 3, (3, 4)),
    ("law-q-not-q'", RecordsQInsteadOfQPrime, None, SMALL, 3, (1, 2)),
    ("ties-by-token-id", TiesByTokenId, None, SMALL, 3, (1, 2)),
    ("descendant-outranks-ancestor", DescendantOutranksAncestor, None, dict(SMALL, B=2, depth=2), 3, (1, 2)),
    ("ties-by-token-id-displaced", TiesByTokenId, None, dict(SMALL, N=2, proxy="displaced"), 3, (1, 2)),
    (
        "descendant-outranks-ancestor-displaced",
        DescendantOutranksAncestor,
        None,
        dict(SMALL, B=2, depth=2, proxy="displaced"),
        3,
        (1, 2),
    ),
    ("ties-by-token-id-residual", TiesByTokenId, None, dict(SMALL, proxy="residual"), 3, (5, 6)),
    (
        "descendant-outranks-ancestor-residual",
        DescendantOutranksAncestor,
        None,
        dict(SMALL, N=2, proxy="residual"),
        3,
        (4, 5),
    ),
    ("calibrated-at-drawn-token", CalibratedAtDrawnToken, None, EVERY_SLOT_CALIBRATED, 4, (5, 6)),
    (
        # found for the residual proxy; a short search found no small case for "displaced" or "scaled"
        "deterministic-first-verifier-residual",
        RheoTreeBuilder,
        DeterministicFirstVerifier,
        dict(K=3, m=1, B=2, depth=2, N=4, M=4, proxy="residual"),
        4,
        (5, 6),
    ),
]


@pytest.mark.parametrize(
    "name,mutant,mutant_verifier,kwargs,vocab,seeds", RHEO_MUTANTS, ids=[m[0] for m in RHEO_MUTANTS]
)
def test_rheo_mutant_is_caught(name, mutant, mutant_verifier, kwargs, vocab, seeds):
    base = SampledDynamicTreeBuilder if issubclass(mutant, SampledDynamicTreeBuilder) else RheoTreeBuilder
    correct = run_case(base(**kwargs), "mixed", vocab, seeds, T1)
    ver = mutant_verifier() if mutant_verifier is not None else None
    broken = run_case(mutant(**kwargs), "mixed", vocab, seeds, T1, ver=ver)
    assert correct < EXACT
    assert broken > BROKEN, f"mutant {name} was not caught (deviation {broken:.3e})"


@attrs.frozen
class SplitRecordsRankLaw(RheoTreeBuilder):
    """Mutant (``rank_law="untempered"``): draws the sampled child by the processed law
    but records the untempered law's entries on the same tokens, renormalised."""

    def propose(self, q, rng, q_draw=None):
        out = []
        for q_row, row in zip(q, super().propose(q, rng, q_draw)):
            new = []
            for c in row:
                if c.kind == NodeKind.SAMPLED:
                    p = q_row[c.law.indices]
                    c = attrs.evolve(c, law=SparseLaw(c.law.indices, p / p.sum(), c.law.mode))
                new.append(c)
            out.append(new)
        return out


@pytest.mark.parametrize("kwargs", [dict(K=2, m=1, B=1, depth=3, N=3, M=3), dict(K=3, m=2, B=1, depth=2, N=3, M=4)])
def test_rheo_split_law_mutant_is_caught(kwargs):
    """Ranking by the untempered law and drawing by the processed one is exact only
    when the law recorded is the one drawn from (at T = 0.7 with top-k and top-p)."""
    correct = run_case(RheoTreeBuilder(**kwargs, rank_law="untempered"), "mixed", 4, (5, 6), WARPED)
    broken = run_case(SplitRecordsRankLaw(**kwargs, rank_law="untempered"), "mixed", 4, (5, 6), WARPED)
    assert correct < EXACT
    assert broken > BROKEN, f"the split-law mutant was not caught (deviation {broken:.3e})"


def test_deterministic_first_verifier_is_exact_on_unpruned_trees():
    """The same mutant verifier is lossless when nothing is pruned (a static
    tree): what breaks it above is the pruning that depends on the sampled
    child's identity, exactly as docs/verifiers.md rule 5 states."""
    builder = RheoTreeBuilder(K=3, m=1, B=4, depth=2, N=100, M=4)
    assert run_case(builder, "mixed", 4, (5, 6), T1, ver=DeterministicFirstVerifier()) < EXACT


@pytest.mark.parametrize("seeds", [(1, 2), (4, 5), (5, 6)])
def test_sibling_creation_order_does_not_matter(seeds):
    """Ranking the deterministic siblings before the sampled child on ties is
    still exact (the verifier tests the sampled child first regardless, and
    the sampled child's status never depends on its own token); specdec
    creates the sampled child first, matching the verifier's test order."""
    builder = DeterministicCreatedFirst(**SMALL)
    assert run_case(builder, "mixed", 3, seeds, T1, check_ties=True) < EXACT


def _resorted_by_q(probs, count, mode, rng, active, counts=None):
    """Mutant draw: each node's siblings re-sorted by their q after drawing."""
    drawn = draw_rows(probs, count, mode, rng, active, counts=counts)  # [R, c]
    q = torch.where(drawn >= 0, probs.gather(-1, drawn.clamp_min(0)), -1.0)
    return drawn.gather(-1, torch.sort(-q, dim=-1, stable=True).indices)


def _pruned_by_q(probs, count, mode, rng, active, counts=None):
    """Mutant draw: siblings whose drawn q is below 0.2 are pruned (the rest move up)."""
    drawn = draw_rows(probs, count, mode, rng, active, counts=counts)  # [R, c]
    keep = (drawn >= 0) & (probs.gather(-1, drawn.clamp_min(0)) >= 0.2)
    return torch.where(keep, drawn, -1).gather(-1, torch.sort((~keep).long(), dim=-1, stable=True).indices)


@pytest.mark.parametrize("mode,verifier_name", [("wor", "rejection-wor"), ("iid", "rejection-iid")])
@pytest.mark.parametrize("mutant_draw", [_resorted_by_q, _pruned_by_q], ids=["resort-by-q", "prune-by-q"])
def test_static_sibling_mutants_are_caught(monkeypatch, mutant_draw, mode, verifier_name):
    builder = StaticTreeBuilder(expansion=(2, 1), mode=mode)
    assert run_case(builder, verifier_name, 3, (1, 2), T1, tied=False) < EXACT
    monkeypatch.setattr(static_module, "draw_rows", mutant_draw)
    broken = run_case(builder, verifier_name, 3, (1, 2), T1, tied=False)
    assert broken > BROKEN, f"{mutant_draw.__name__} was not caught ({broken:.3e})"


def test_unordered_calibration_is_refused_and_would_break_the_law():
    """Why check_calibration orders the table: with UNORDERED a later draw can outweigh an earlier one, the
    global top-N keeps it without the earlier draw, and rule 4 no longer gives the target's law."""
    with pytest.raises(InvalidConfigError, match="must not"):
        SampledDynamicTreeBuilder(**dict(EVERY_SLOT_CALIBRATED, calibration=UNORDERED))
    unchecked = SampledDynamicTreeBuilder(**EVERY_SLOT_CALIBRATED)
    object.__setattr__(unchecked, "calibration", UNORDERED)  # past the check
    assert run_case(SampledDynamicTreeBuilder(**EVERY_SLOT_CALIBRATED), "mixed", 4, (5, 6), T1) < EXACT
    assert run_case(unchecked, "mixed", 4, (5, 6), T1) > BROKEN
