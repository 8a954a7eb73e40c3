"""DDTree over parallel drafts (docs/trees.md, "DDTree over parallel drafters"): exact by enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec.errors import InvalidConfigError
from specdec.generate import SpeculativeGenerator, autoregressive_generate
from specdec.registry import get
from specdec.rng import RandomSource, RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing import ExactLaws, sparse_markov_pair
from specdec.testing.parallel import MarginalMarkovDraft
from specdec.tree import NodeKind
from specdec.trees import build_tree, build_trees
from specdec.trees import ddtree as ddtree_module
from specdec.trees.ddtree import DDTreeBuilder, best_first
from specdec.trees.feed import DraftSpec, TreeFeed

SAMPLINGS = {
    "T0": SamplingConfig(temperature=0.0),
    "T1": SamplingConfig(temperature=1.0),
    "T0.7-topk2": SamplingConfig(temperature=0.7, top_k=2),
}
OPTIONS = [{"budget": 4, "depth": 2, "sampled": 1}, {"budget": 5, "depth": 3, "sampled": 2},
           {"budget": 4, "depth": 3, "sampled": 0}]


def _pair(seed: int, block: int = 3) -> tuple[object, MarginalMarkovDraft]:
    target, markov = sparse_markov_pair(3, seed, ties=seed % 2 == 1)
    return target, MarginalMarkovDraft(markov.table, block_size=block)


@pytest.mark.parametrize("sid", sorted(SAMPLINGS))
@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("verifier", ["mixed", "match"])
def test_ddtree_over_a_parallel_draft_is_exact(sid: str, options: dict[str, int], verifier: str) -> None:
    for seed in (0, 1):
        target, draft = _pair(seed)
        gap = ExactLaws(DDTreeBuilder(**options), get("verifier", verifier)(), target, draft,  # type: ignore[arg-type]
                        SAMPLINGS[sid]).check([0, 1], 3, chained=True)
        assert gap.error < 1e-12 and abs(gap.mass - 1.0) < 1e-12, gap.describe([0, 1])


def test_the_exact_check_has_power_a_draw_from_another_law_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant draws its sampled children uniformly over q' 's support while recording q'."""
    def uniform(probs: torch.Tensor, count: int, mode: object, rng: RandomSource) -> list[int]:
        return [rng.categorical(torch.full_like(probs, 1.0 / probs.numel())) for _ in range(count)]

    monkeypatch.setattr(ddtree_module, "draw_children", uniform)
    errors = []
    for seed in (0, 1, 2):
        target, draft = _pair(seed)
        gap = ExactLaws(DDTreeBuilder(budget=4, depth=2, sampled=1), get("verifier", "mixed")(), target, draft,  # type: ignore[arg-type]
                        SAMPLINGS["T1"]).check([0, 1], 3, chained=True)
        errors.append(gap.error)
    assert max(errors) > 1e-3


def test_best_first_is_the_top_budget_paths_by_product_of_marginals() -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        rank = torch.softmax(torch.randn(3, 4, generator=g, dtype=torch.float64) * 2, dim=-1)  # [D, V], no ties
        chosen = best_first(rank, 9)
        paths: list[tuple[int, ...]] = []
        for parent, depth, token in chosen:
            paths.append((paths[parent] if parent >= 0 else ()) + (token,))
            assert len(paths[-1]) == depth
        everything = [p for n in (1, 2, 3) for p in itertools.product(range(4), repeat=n)]
        score = {p: float(torch.prod(rank[torch.arange(len(p)), torch.tensor(p)])) for p in everything}
        best = sorted(everything, key=lambda p: -score[p])[:9]
        assert set(paths) == set(best)
        assert [score[p] for p in paths] == sorted((score[p] for p in paths), reverse=True)  # best-first order


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_trees_stay_within_the_budget_and_sampled_laws_exclude_the_deterministic_children(options: dict[str, int]) -> None:
    _, draft = _pair(0)
    draft.begin([0, 1])
    builder = DDTreeBuilder(**options)
    for seed in range(5):
        tree = build_tree(builder, 1, draft, SAMPLINGS["T1"], TorchRandom.seeded(seed))
        assert tree.num_nodes <= builder.max_nodes
        for i in range(tree.num_nodes):
            kids = [j for j in range(tree.num_nodes) if int(tree.parents[j]) == i]
            det = {int(tree.tokens[j]) for j in kids if int(tree.kinds[j]) == int(NodeKind.DETERMINISTIC)}
            for j in kids:
                if int(tree.kinds[j]) == int(NodeKind.SAMPLED):
                    law = tree.laws[int(tree.law_index[j])]
                    assert not det & set(law.indices.tolist())
    greedy = build_tree(builder, 1, draft, SAMPLINGS["T0"], TorchRandom.seeded(0))
    assert all(int(k) != int(NodeKind.SAMPLED) for k in greedy.kinds)  # none at T = 0


def test_batch_rows_equal_rows_alone() -> None:
    _, draft = _pair(1)
    prompts = [[0, 1], [2, 2, 0], [1, 0]]
    draft.begin_rows(prompts)
    builder = DDTreeBuilder(budget=5, depth=3, sampled=1)
    batch = build_trees(builder, torch.tensor([1, 0, 0]), draft, SAMPLINGS["T1"],
                        RowStreams([TorchRandom.seeded(s) for s in (4, 5, 6)]))
    for b, prompt in enumerate(prompts):
        one = _pair(1)[1]
        one.begin(prompt)
        alone = build_tree(builder, prompt[-1], one, SAMPLINGS["T1"], TorchRandom.seeded(4 + b))
        assert batch.tree(b).tokens.tolist() == alone.tokens.tolist()
        assert batch.tree(b).kinds.tolist() == alone.kinds.tolist()


def test_one_parallel_request_through_a_serving_feed() -> None:
    _, draft = _pair(0)
    draft.begin([0, 1])
    feed = TreeFeed(DDTreeBuilder(budget=4, depth=2), torch.tensor([1]), SAMPLINGS["T1"], TorchRandom.seeded(0),
                    DraftSpec(3, block_size=3))
    request = feed.request
    assert request is not None and request.block == 2 and request.expected_shape == (1, 2, 3)
    feed.give(0, draft.block_rows_logits(2))
    assert feed.request is None and 2 <= int(feed.tree.num_nodes[0]) <= 5


def test_bad_input_is_refused_naming_the_argument() -> None:
    with pytest.raises(InvalidConfigError, match="budget must be an int >= 1"):
        DDTreeBuilder(budget=0)
    with pytest.raises(InvalidConfigError, match="sampled must be an int >= 0"):
        DDTreeBuilder(sampled=-1)
    _, draft = _pair(0, block=2)
    draft.begin([0, 1])
    with pytest.raises(InvalidConfigError, match=r"depth=3.*block_size is 2"):
        build_tree(DDTreeBuilder(depth=3), 1, draft, SAMPLINGS["T1"], TorchRandom.seeded(0))


def test_draft_laws_that_are_not_distributions_are_flagged() -> None:
    _, draft = _pair(0)

    class Nan(MarginalMarkovDraft):
        def block_rows_logits(self, depth: int, proposal: bool = False) -> torch.Tensor:
            out = super().block_rows_logits(depth, proposal)
            out[:, -1] = float("nan")
            return out

    bad = Nan(draft.table, block_size=3)
    bad.begin([0, 1])
    batch = build_trees(DDTreeBuilder(budget=3, depth=2), 1, bad, SAMPLINGS["T1"], TorchRandom.seeded(0))
    assert batch.draft_bad is not None and bool(batch.draft_bad[0])


def test_per_row_sampling_groups_share_one_parallel_request() -> None:
    """Rows under their own sampling (group_build): ONE block request over every row, each row's tree
    the one it gets alone under its configuration and random source."""
    _, draft = _pair(1)
    prompts = [[0, 1], [2, 2, 0], [1, 0]]
    draft.begin_rows(prompts)
    configs = [SAMPLINGS["T1"], SAMPLINGS["T0.7-topk2"], SAMPLINGS["T1"]]
    builder = DDTreeBuilder(budget=5, depth=3, sampled=1)
    feed = TreeFeed(builder, torch.tensor([1, 0, 0]), configs, RowStreams([TorchRandom.seeded(s) for s in (4, 5, 6)]),
                    DraftSpec(3, block_size=3))
    requests = 0
    while feed.request is not None:
        assert feed.request.block == 3
        feed.give(feed.request.level, draft.block_rows_logits(3))
        requests += 1
    assert requests == 1
    for b, prompt in enumerate(prompts):
        one = _pair(1)[1]
        one.begin(prompt)
        alone = build_tree(builder, prompt[-1], one, configs[b], TorchRandom.seeded(4 + b))
        assert feed.tree.tree(b).tokens.tolist() == alone.tokens.tolist()
        assert feed.tree.tree(b).kinds.tolist() == alone.kinds.tolist()


def test_a_serving_runner_s_block_of_the_wrong_shape_is_named() -> None:
    _, draft = _pair(0)
    draft.begin([0, 1])
    feed = TreeFeed(DDTreeBuilder(budget=4, depth=2), torch.tensor([1]), SAMPLINGS["T1"], TorchRandom.seeded(0),
                    DraftSpec(3, block_size=3))
    with pytest.raises(InvalidConfigError, match=r"shape \[1, 2, 3\] \(\[B, block, W\]: a parallel request"):
        feed.give(0, draft.block_rows_logits(3))


def test_generation_with_a_parallel_draft_greedy_and_in_batches() -> None:
    """The loop end to end: ``ddtree`` over the parallel draft is greedy decoding at T = 0, and each
    ``generate_batch`` row equals its prompt and seed alone at T = 1."""
    target, markov = _pair(2)

    class Counting(MarginalMarkovDraft):
        calls = 0

        def block_rows_logits(self, depth: int, proposal: bool = False) -> torch.Tensor:
            Counting.calls += 1
            return super().block_rows_logits(depth, proposal)

        def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
            raise AssertionError("ddtree over a parallel draft asks for no tree node's logits")

        def tree_logits(self, parents: object, tokens: object) -> torch.Tensor:  # type: ignore[override]
            raise AssertionError("ddtree over a parallel draft asks for no tree node's logits")

    draft = Counting(markov.table, block_size=3)
    gen = SpeculativeGenerator(target=target, draft=draft, method="ddtree", budget=5, depth=3)  # type: ignore[arg-type]
    for prompt in ([0, 1], [2, 2, 1]):
        got = gen.generate(prompt, 10, sampling=SAMPLINGS["T0"], seed=0).tokens
        assert list(got) == list(autoregressive_generate(target, prompt, 10, sampling=SAMPLINGS["T0"], seed=0).tokens)  # type: ignore[arg-type]
    prompts, seeds = [[0, 1], [2, 2, 1], [1, 0, 0]], [3, 4, 5]
    batch = gen.generate_batch(prompts, 8, sampling=SAMPLINGS["T1"], seeds=seeds)
    for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
        assert list(batch.tokens[row]) == list(gen.generate(prompt, 8, sampling=SAMPLINGS["T1"], seed=seed).tokens)
    assert Counting.calls > 0
