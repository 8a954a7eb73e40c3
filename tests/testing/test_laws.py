"""specdec.testing.laws and shapes: exact laws that scale, proven equal to the literal program."""

from __future__ import annotations

import pytest

import specdec
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.sampling import process_logits
from specdec.testing import SHAPES, ExactLaws, Mix, ShapeBuilder, compare_laws, exact_law, markov_pair, sparse_markov_pair
from specdec.tree import SampleMode

from .mutants import DeepBonusFromP
from specdec.trees import build_tree

T1 = specdec.SamplingConfig(temperature=1.0)
WARPED = specdec.SamplingConfig(temperature=0.8, top_k=2, top_p=0.9)
IID = SampleMode.IID


def literal_law(builder, verifier, target, draft, sampling, context, num_tokens):
    """The literal program: generate until num_tokens inside ONE exact_law (steps, accept, commit)."""

    def program(rng: RandomSource):
        ctx, out = list(context), []
        while len(out) < num_tokens:
            target.prefill(ctx)
            draft.begin(ctx)
            tree = build_tree(builder, ctx[-1], draft, sampling, rng)
            result = verifier.verify(tree, process_logits(target.score_tree(tree), sampling), rng)
            out += result.tokens
            ctx += result.tokens
        return tuple(out[:num_tokens])

    return exact_law(program)


# (the literal program's branches multiply over chained steps: 3 tokens through iid-2x1 take a minute)
@pytest.mark.parametrize("label, num_tokens", [("iid-2x1", 2), ("rheo-1s1d", 3), ("chain-3", 2)])
def test_composed_law_equals_the_literal_program(label: str, num_tokens: int) -> None:
    shape = next(s for s in SHAPES if s.label == label)
    target, draft = sparse_markov_pair(3, 1, ties=True)
    verifier = specdec.get("verifier", "mixed")()
    laws = ExactLaws(shape.builder(), verifier, target, draft, T1)
    composed = laws.token_law([0, 1], num_tokens)
    literal = literal_law(shape.builder(), verifier, target, draft, T1, [0, 1], num_tokens)
    assert set(composed) == set(literal)
    assert max(abs(composed[k] - literal[k]) for k in literal) < 1e-12
    assert laws.check([0, 1], num_tokens).error < 1e-12
    assert laws.check([0, 1], len(shape.levels) + 1, chained=False).error < 1e-12


def test_completed_and_chained_laws_catch_a_deep_bonus_from_p_at_token_two() -> None:
    target, draft = sparse_markov_pair(4, 0)
    builder = ShapeBuilder((Mix(2, IID, 0), Mix(1, IID, 0)))
    for chained in (False, True):
        gap = ExactLaws(builder, DeepBonusFromP(), target, draft, T1).check([0, 1], 3, chained=chained)
        assert gap.error > 1e-3
        assert gap.position == 1, gap  # the root is right: the first token's law is p; the second is not
        assert len(gap.prefix) == 1 and len(gap.expected) == len(gap.measured) == 4
        assert abs(sum(gap.expected) - 1) < 1e-12 and abs(sum(gap.measured) - 1) < 1e-12
        assert "token 2 after context [0, 1, " in gap.describe([0, 1])


def test_compare_laws_localises_and_reports_mass() -> None:
    want = {(0, 0): 0.25, (0, 1): 0.25, (1, 0): 0.5}
    assert compare_laws(want, want, 2).position == -1
    got = {(0, 0): 0.25, (0, 1): 0.25, (1, 0): 0.25, (1, 1): 0.25}
    gap = compare_laws(got, want, 2)
    assert (gap.position, gap.prefix, gap.expected, gap.measured) == (1, (1,), (1.0, 0.0), (0.5, 0.5))
    first = compare_laws({(1, 0): 1.0}, want, 2)
    assert first.position == 0 and first.expected == (0.5, 0.5) and first.measured == (0.0, 1.0)
    short = compare_laws({(0, 0): 0.5}, want, 2)
    assert short.mass == 0.5 and "total mass 0.500000" in short.describe()


def test_step_laws_are_memoised_per_context() -> None:
    target, draft = markov_pair(3, seed=0, order=2)
    laws = ExactLaws(specdec.get("tree", "chain")(depth=2), specdec.get("verifier", "rejection-iid")(),
                     target, draft, T1)
    laws.token_law([0, 1], 3)
    runs = laws.branches
    laws.token_law([2, 0, 1], 3)  # the same last two tokens: nothing enumerated again
    assert laws.branches == runs
    assert laws.step_law([1, 0, 1]) is laws.step_law([0, 1])


def test_bad_inputs_are_refused() -> None:
    target, _ = markov_pair(3, seed=0, order=2)
    _, other = markov_pair(4, seed=0, order=2)
    chain, rule3 = specdec.get("tree", "chain")(depth=1), specdec.get("verifier", "rejection-iid")()
    with pytest.raises(InvalidConfigError, match="vocabulary"):
        ExactLaws(chain, rule3, target, other, T1)
    laws = ExactLaws(chain, rule3, target, markov_pair(3, seed=1, order=2)[1], T1)
    with pytest.raises(InvalidConfigError, match="at least 2 tokens"):
        laws.step_law([0])
    with pytest.raises(specdec.InvalidDistributionError):
        ExactLaws(chain, specdec.get("verifier", "greedy")(), target, target, T1)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label)
def test_shape_builder_builds_its_shape(shape) -> None:
    """Every node of depth d has levels[d]'s children: top-K deterministic (S, by (-q, token)),
    sampled ones recording q' = norm(q restricted to the complement of S)."""
    target, draft = sparse_markov_pair(shape.vocab_size, 3)
    builder = shape.builder()
    assert builder.max_depth == len(shape.levels)
    trees = []
    laws = ExactLaws(builder, specdec.get("verifier", "match")(), target, draft, WARPED,
                     on_tree=trees.append)
    laws.tree_law([0, 1])
    assert trees
    for tree in trees[:20]:
        assert tree.num_nodes <= builder.max_nodes
        depths = tree.depths.tolist()
        for node in range(tree.num_nodes):
            if depths[node] >= len(shape.levels):
                assert not tree.children(node)
                continue
            mix = shape.levels[depths[node]]
            det, sampled = tree.deterministic_children(node), tree.sampled_children(node)
            assert len(det) == mix.K and len(sampled) <= mix.k
            if sampled:
                law = tree.law_of(sampled[0])
                assert law.mode == mix.mode
                assert not set(law.indices.tolist()) & {int(tree.tokens[d]) for d in det}
                assert abs(float(law.probs.sum()) - 1) < 1e-12
            if det and sampled:  # the order of the node ids (children() lists sampled ones first)
                assert (min(det) < min(sampled)) == shape.det_first

