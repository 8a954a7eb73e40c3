"""Caller-driven tree building (specdec.trees.feed): every registered builder, fed by an outside runner.

- For every registered builder with a caller-driven form (each option set it declares for
  the exact tests), at T = 1 and T = 0, two rows: the tree a runner builds by answering the
  builder's :class:`~specdec.draft_request.DraftRequest` from its own bookkeeping (draft ids
  -> token paths; logits from each new node's whole path) is identical, field for field,
  to the tree ``build_batch`` grows from a :class:`~specdec.models.CallableLM` draft with
  the same seeds. A runner that gets the parents wrong (off by one) builds other trees.
- Each request's :meth:`~specdec.draft_request.DraftRequest.attention` is the runner's
  own ancestor set; positions are ``root + level``.
- Bad input (wrong shape, dtype, device-less roots, a level fed twice or out of order,
  feeding after the tree is built, reading the tree early, a builder without a feed form)
  is refused naming the level, and the build is unchanged after a refusal.
"""

from __future__ import annotations

import pytest
import torch

from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.registry import get, list_registered
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.dynamic import EagleTreeBuilder
from specdec.trees.feed import DraftSpec, TreeFeed
from specdec.trees.static import StaticTreeBuilder
from specdec.trees import OneTreeBuilder, build_tree, build_trees

V = 7
_g = torch.Generator().manual_seed(5)
T1 = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5
T2 = torch.randn(V, V, generator=_g, dtype=torch.float64)


def path_logits(path: list[int]) -> torch.Tensor:
    """Logits after a token path (the last two tokens matter, so parents must be right)."""
    return T1[path[-1]] + T2[path[-2]]


def lm() -> CallableLM:
    return CallableLM(lambda prefixes: torch.stack([path_logits(p) for p in prefixes]), vocab_size=V)


PROMPTS = [[1, 2, 3], [4, 5]]
CASES = [(name, i) for name in list_registered("tree") for i in range(len(get("tree", name).example_options))]


class Runner:
    """An outside draft runner: keeps, per row, the token path of every draft node id."""

    def __init__(self, prompts, off_by_one: bool = False) -> None:
        self.paths = [{0: list(p)} for p in prompts]
        self.off_by_one = off_by_one

    def answer(self, request) -> torch.Tensor:
        if request.level == 0:
            return torch.stack([path_logits(p[0]) for p in self.paths])
        out = []
        ids, attention = request.node_ids.tolist(), request.attention()
        for b, paths in enumerate(self.paths):
            rows = []
            for j, (parent, token) in enumerate(zip(request.parents[b].tolist(), request.tokens[b].tolist())):
                parent = max(parent - 1, 0) if self.off_by_one else parent
                path = paths[parent] + [token]
                paths[ids[b][j]] = path
                rows.append(path_logits(path))
                ancestors = self._ancestors(b, ids[b][j], request)
                assert attention[b, j].nonzero().view(-1).tolist() == ancestors
            out.append(torch.stack(rows))
        return torch.stack(out)

    @staticmethod
    def _ancestors(b: int, node: int, request) -> list[int]:
        parent_of = request.history[b].tolist()
        chain = [node]
        while parent_of[chain[-1]] >= 0:
            chain.append(parent_of[chain[-1]])
        return sorted(chain)


def _fields(batch):
    return {k: getattr(batch, k) for k in ("tokens", "parents", "depths", "kinds", "draw_order", "weights", "num_nodes",
                                           "law_ids", "law_probs", "law_wor", "ancestors")}


def _both(name: str, i: int, sampling: SamplingConfig, off_by_one: bool = False, builder=None):
    builder = builder or get("tree", name)(**get("tree", name).example_options[i])
    roots = torch.tensor([p[-1] for p in PROMPTS])
    draft = lm()
    draft.begin_rows(PROMPTS)
    want = build_trees(builder, roots, draft, sampling, RowStreams([TorchRandom.seeded(3), TorchRandom.seeded(4)]))
    feed = TreeFeed(builder, roots, sampling, RowStreams([TorchRandom.seeded(3), TorchRandom.seeded(4)]), DraftSpec(V))
    runner = Runner(PROMPTS, off_by_one)
    levels = []
    while feed.request is not None:
        request = feed.request
        levels.append(request.level)
        if request.level:
            assert request.positions(torch.tensor([10, 20])).tolist() == [[10 + request.level] * request.new_nodes,
                                                                            [20 + request.level] * request.new_nodes]
        feed.give(request.level, runner.answer(request))
    assert levels == list(range(len(levels)))
    return want, feed.tree


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_a_fed_build_equals_the_draft_models_build(name, i, temperature):
    want, got = _both(name, i, SamplingConfig(temperature=temperature))
    for key, value in _fields(want).items():
        assert torch.equal(value, _fields(got)[key]), key


def test_a_runner_with_wrong_parents_builds_other_trees():
    """Power: the comparison sees a runner that answers for the wrong parent."""
    differs = 0
    for builder in [EagleTreeBuilder(K=2, B=2, depth=3, N=6), StaticTreeBuilder(expansion=(2, 1, 1)),
                    ChainTreeBuilder(depth=3)]:
        want, got = _both("", 0, SamplingConfig(temperature=1.0), off_by_one=True, builder=builder)
        differs += any(not torch.equal(v, _fields(got)[k]) for k, v in _fields(want).items())
    assert differs == 3


def _feed(builder=None):
    builder = builder or EagleTreeBuilder(K=2, B=2, depth=2, N=4)
    return TreeFeed(builder, torch.tensor([1]), SamplingConfig(temperature=1.0), TorchRandom.seeded(0), DraftSpec(V))


def test_bad_input_is_refused_naming_the_level_and_changes_nothing():
    feed = _feed()
    with pytest.raises(InvalidConfigError, match="level 0 is still to be fed"):
        _ = feed.tree
    with pytest.raises(InvalidConfigError, match=r"level 0: logits must have shape \[1, 7\]"):
        feed.give(0, torch.zeros(1, 6))
    with pytest.raises(InvalidConfigError, match="level 0: logits must be floating point"):
        feed.give(0, torch.zeros(1, V, dtype=torch.int64))
    with pytest.raises(InvalidConfigError, match="level 1 fed out of order: the builder waits for level 0"):
        feed.give(1, torch.zeros(1, 2, V))
    assert feed.request is not None and feed.request.level == 0  # unchanged
    nxt = feed.give(0, T1[1:2])
    assert nxt is not None and nxt.level == 1
    with pytest.raises(InvalidConfigError, match="level 0 fed twice: the builder waits for level 1"):
        feed.give(0, T1[1:2])
    with pytest.raises(InvalidConfigError, match=r"level 1: logits must have shape \[1, 2, 7\]"):
        feed.give(1, torch.zeros(1, 3, V))
    assert feed.give(1, torch.zeros(1, 2, V)) is None
    assert int(feed.tree.num_nodes[0]) == 5
    with pytest.raises(InvalidConfigError, match="fed after the tree was built"):
        feed.give(2, torch.zeros(1, 2, V))
    with pytest.raises(InvalidConfigError, match=r"roots must be a \[B\] int64 tensor"):
        TreeFeed(ChainTreeBuilder(depth=2), [1], SamplingConfig(), TorchRandom.seeded(0), DraftSpec(V))


def test_a_builder_with_only_a_host_build_is_fed_row_by_row():
    """A builder that redefines build() (per-tree authoring) runs through the feed (specdec.adapters):
    the same tree as its build() with the same draws, one request per draft call."""
    class HostChain(OneTreeBuilder, ChainTreeBuilder):
        def build(self, root_token, draft, sampling, rng):
            return build_tree(ChainTreeBuilder(depth=self.depth), root_token, draft, sampling, rng)

    draft = CallableLM(lambda prefixes: torch.stack([T1[p[-1]] for p in prefixes]), V)
    draft.begin([1])
    expected = build_tree(HostChain(depth=2), 1, draft, SamplingConfig(temperature=1.0), TorchRandom.seeded(0))
    feed, levels = _feed(HostChain(depth=2)), []
    while feed.request is not None:
        r = feed.request
        levels.append(r.level)
        feed.give(r.level, T1[torch.tensor([1])] if r.level == 0 else T1[r.tokens])
    assert levels == [0, 1]  # the root, then the first draft's node (the chain's second draft needs its law)
    got = feed.tree.tree(0)
    assert got.tokens.tolist() == expected.tokens.tolist() and got.parents.tolist() == expected.parents.tolist()


def test_feed_bad_batches_are_refused_by_name():
    """Issue 57 items 16 and 18 on the feed: too few sources and an empty batch name the argument."""
    with pytest.raises(InvalidConfigError, match=r"rng: 2 random source\(s\) for 3 rows"):
        TreeFeed(EagleTreeBuilder(K=2, B=2, depth=2, N=4), torch.tensor([1, 2, 3]), SamplingConfig(temperature=1.0),
                 RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)]), DraftSpec(V))
    with pytest.raises(InvalidConfigError, match=r"rng: 1 random source\(s\) for 2 rows"):
        TreeFeed(ChainTreeBuilder(depth=2), torch.tensor([1, 2]), [SamplingConfig(), SamplingConfig(temperature=1.0)],
                 TorchRandom.seeded(0), DraftSpec(V))
    with pytest.raises(InvalidConfigError, match="an empty batch"):
        TreeFeed(ChainTreeBuilder(depth=2), torch.zeros(0, dtype=torch.int64), SamplingConfig(),
                 RowStreams([TorchRandom.seeded(0)]), DraftSpec(V))


def test_feed_reads_logits_that_require_grad_as_values():
    """Issue 57 item 15 on the feed: top-p alone over V > 1024 with logits that require grad."""
    big = 2048
    feed = TreeFeed(ChainTreeBuilder(depth=2), torch.tensor([1]), SamplingConfig(temperature=1.0, top_p=0.9),
                    TorchRandom.seeded(0), DraftSpec(big))
    logits = torch.randn(1, big, generator=torch.Generator().manual_seed(0), requires_grad=True)
    while feed.request is not None:
        r = feed.request
        feed.give(r.level, logits if r.level == 0 else logits.unsqueeze(1).expand(1, r.new_nodes, big))
    assert feed.tree.num_nodes.tolist() == [3]
