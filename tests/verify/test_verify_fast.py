"""The tensor verification (specdec.verify.fast) against the verifiers' walks.

A source that replays a table of uniforms keyed by (node, draw) makes the
sequential walk (:meth:`Verifier.verify`) and the parallel tensor form use the
same uniforms, so they must emit the same tokens (float64 rows: a uniform
within rounding of a threshold is a 1e-16 event).
"""

from __future__ import annotations

import pytest
import torch

from specdec.rng import inverse_cdf
from specdec.models import CallableLM
from specdec.registry import get
from specdec.rng import RandomSource, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.dynamic import EagleTreeBuilder
from specdec.trees.rheo import RheoTreeBuilder
from specdec.trees.static import StaticTreeBuilder
from specdec.sampling import row_is_bad
from specdec.verify.fast import verify_tree_batch
from specdec.trees import build_tree


class TableRandom(RandomSource):
    """Draw ``t`` at node ``i`` uses ``u[i, t]`` (bernoulli: ``u < p``; categorical: inverse CDF)."""

    def __init__(self, u: torch.Tensor) -> None:
        self.u, self.node, self.draw = u, 0, 0

    def begin_node(self, node: int) -> None:
        self.node, self.draw = node, 0

    def _next(self) -> float:
        value = float(self.u[self.node, self.draw])
        self.draw += 1
        return value

    def bernoulli(self, prob) -> bool:
        return self._next() < float(prob)

    def categorical(self, probs) -> int:
        return inverse_cdf(probs, self._next())


def random_draft(vocab: int, seed: int) -> CallableLM:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * 1.5
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab)


CASES = [
    ("eagle", EagleTreeBuilder(K=3, B=2, depth=3, N=8), "match"),
    ("rheo", RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=8, M=6), "mixed"),
    ("rheo-m2", RheoTreeBuilder(K=4, m=2, B=2, depth=3, N=9, M=7), "mixed"),
    ("rheo-match", RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=8, M=6), "match"),
    ("chain", ChainTreeBuilder(depth=4), "rejection-iid"),
    ("static-iid", StaticTreeBuilder(expansion=(3, 2), mode="iid"), "rejection-iid"),
    ("static-wor", StaticTreeBuilder(expansion=(3, 2), mode="wor"), "rejection-wor"),
    ("static-wor-mixed", StaticTreeBuilder(expansion=(3, 2), mode="wor"), "mixed"),
]


@pytest.mark.parametrize("name,builder,verifier_name", CASES, ids=[c[0] for c in CASES])
def test_tensor_verification_equals_the_walk(name, builder, verifier_name):
    verifier = get("verifier", verifier_name)()
    vocab = 6
    accepted_some = 0
    for seed in range(60):
        draft = random_draft(vocab, seed % 7)
        draft.begin([seed % vocab])
        tree = build_tree(builder, seed % vocab, draft, SamplingConfig(), TorchRandom.seeded(seed))
        batch = TreeBatch.from_trees([tree], max_children=builder.max_nodes, max_depth=builder.max_depth)
        g = torch.Generator().manual_seed(1000 + seed)
        # p close to q on some rows so that children are accepted often
        p = torch.softmax(torch.randn(tree.num_nodes, vocab, generator=g, dtype=torch.float64) * 2, -1)
        p[torch.rand(tree.num_nodes, generator=g) < 0.2, 0] = 0.0
        p = p / p.sum(-1, keepdim=True)
        u = torch.rand(tree.num_nodes, batch.max_children + 1, generator=g, dtype=torch.float64)
        want = verifier.verify(tree, p, TableRandom(u))
        got = verify_tree_batch(verifier.fused, batch, p[None], u[None])
        k = int(got.num_accepted[0])
        assert tuple(got.accepted[0, :k].tolist()) == want.accepted_nodes, f"seed {seed}"
        assert tuple(got.tokens[0, : k + 1].tolist()) == want.tokens, f"seed {seed}"
        assert int(got.attempted[0]) == want.attempted_depths
        accepted_some += k > 0
    assert accepted_some > 10


def test_a_broken_residual_is_caught_by_the_comparison():
    """Power: the same comparison fails when rule 5's residual skips the rejection update."""
    import specdec.verify.fast as fast

    builder, verifier = RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=8, M=6), get("verifier", "mixed")()
    broken = attrs_evolve_rule(verifier.fused)
    differs = 0
    for seed in range(60):
        draft = random_draft(6, seed % 7)
        draft.begin([0])
        tree = build_tree(builder, 0, draft, SamplingConfig(), TorchRandom.seeded(seed))
        batch = TreeBatch.from_trees([tree], max_children=builder.max_nodes, max_depth=builder.max_depth)
        g = torch.Generator().manual_seed(seed)
        p = torch.softmax(torch.randn(tree.num_nodes, 6, generator=g, dtype=torch.float64) * 2, -1)
        u = torch.rand(tree.num_nodes, batch.max_children + 1, generator=g, dtype=torch.float64)
        want = verifier.verify(tree, p, TableRandom(u))
        got = fast.verify_tree_batch(broken, batch, p[None], u[None])
        k = int(got.num_accepted[0])
        differs += tuple(got.tokens[0, : k + 1].tolist()) != want.tokens
    assert differs > 0


def attrs_evolve_rule(rule):
    import attrs

    return attrs.evolve(rule, rejection=False)  # sampled children matched like deterministic ones


def test_bad_rows_are_flagged_only_where_visited():
    logits = torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [float("-inf"), float("-inf")], [float("inf"), 0.0]])
    assert row_is_bad(logits).tolist() == [False, True, True, True]


@pytest.mark.parametrize("verifier_name", ["greedy", "match", "mixed", "rejection-iid", "rejection-wor", "kseq"])
def test_batch_support_check_agrees_with_the_host_check(verifier_name):
    from specdec.errors import UnsupportedTreeError
    from specdec.registry import list_registered

    assert verifier_name in list_registered("verifier")
    verifier = get("verifier", verifier_name)()
    builders = [b for _, b, _ in CASES] + [RheoTreeBuilder(K=4, m=3, B=2, depth=2, N=8, M=7)]
    for builder in builders:
        draft = random_draft(6, 0)
        draft.begin([0])
        tree = build_tree(builder, 0, draft, SamplingConfig(), TorchRandom.seeded(0))
        outcomes = []
        for check in (verifier.check_tree, verifier.check_batch):
            try:
                check(tree if check == verifier.check_tree else TreeBatch.from_trees([tree]))
                outcomes.append(None)
            except UnsupportedTreeError as e:
                outcomes.append(type(e))
        assert outcomes[0] == outcomes[1], (verifier_name, builder)
