"""Unit tests of the tree builders: shapes, kinds, laws, order, pruning, params."""

from __future__ import annotations

import math

import attrs

import pytest
import torch

import specdec
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.tree import NodeKind, SampleMode
from specdec.trees import (
    ChainTreeBuilder,
    EagleTreeBuilder,
    RheoTreeBuilder,
    SequoiaTreeBuilder,
    StaticTreeBuilder,
)
from specdec.trees._common import check_paths, draw_children, top_tokens
from specdec.trees.static import expansion_to_paths
from specdec.trees import build_tree, build_trees
from specdec.trees.dynamic import dynamic_reference

T1 = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig(temperature=0.0)


class RecordingLM(CallableLM):
    """A CallableLM draft that records every ``tree_logits`` call."""

    def __init__(self, fn, vocab_size):
        super().__init__(fn, vocab_size)
        self.expand_calls: list[tuple[list[int], list[int]]] = []

    def tree_logits(self, parents, tokens):
        self.expand_calls.append((list(parents), list(tokens)))
        return super().tree_logits(parents, tokens)


def table_draft(rows: dict[tuple[int, ...], list[float]], vocab: int, default: list[float] | None = None):
    """A draft whose law after the draft path (tokens after the 1-token prompt) is ``rows[path]``."""

    def fn(prefixes):
        out = []
        for prefix in prefixes:
            probs = rows.get(tuple(prefix[1:]), default)
            if probs is None:
                raise KeyError(f"no row for path {tuple(prefix[1:])}")
            t = torch.tensor(probs, dtype=torch.float64)
            out.append(torch.where(t > 0, t.log(), torch.full_like(t, float("-inf"))))
        return torch.stack(out)

    return RecordingLM(fn, vocab)


def random_draft(vocab: int, seed: int, scale: float = 2.0) -> RecordingLM:
    """Deterministic pseudo-random logits per prefix (float64)."""

    def fn(prefixes):
        rows = []
        for prefix in prefixes:
            g = torch.Generator().manual_seed(hash((seed, *prefix)) % (2**31))
            rows.append(torch.randn(vocab, generator=g, dtype=torch.float64) * scale)
        return torch.stack(rows)

    return RecordingLM(fn, vocab)


def build(builder, draft, sampling=T1, seed=0, prompt=(0,)):
    draft.begin(list(prompt))
    return build_tree(builder, prompt[-1], draft, sampling, TorchRandom.seeded(seed))


def path_tokens(tree, node):
    return tuple(int(tree.tokens[i]) for i in tree.path_to(node))


# ------------------------------------------------------------------ helpers
def test_top_tokens_is_tie_safe_and_skips_zeros():
    q = torch.tensor([[0.2, 0.3, 0.2, 0.3, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    assert top_tokens(q, 3) == [[(1, 0.3), (3, 0.3), (0, 0.2)], [(2, 1.0)]]
    assert top_tokens(q, 10)[0] == [(1, 0.3), (3, 0.3), (0, 0.2), (2, 0.2)]


def test_draw_children_without_replacement_exhausts_support():
    probs = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)
    drawn = draw_children(probs, 5, SampleMode.WITHOUT_REPLACEMENT, TorchRandom.seeded(1))
    assert sorted(drawn) == [0, 2]
    assert len(draw_children(probs, 5, SampleMode.IID, TorchRandom.seeded(1))) == 5


@pytest.mark.parametrize(
    "paths",
    [[], [(1,)], [(0,), (0,)], [(0, 0)], [(0,), (2,), (1,)][:2], [(0,), (-1,)], "abc", [()]],
)
def test_bad_paths_raise(paths):
    with pytest.raises(InvalidConfigError):
        check_paths(paths)


def test_expansion_to_paths():
    assert expansion_to_paths((3, 2, 1)) == expansion_to_paths(
        [p for p in expansion_to_paths((3, 2, 1))][::-1]
    )
    assert len(expansion_to_paths((3, 2, 1))) == 3 + 6 + 6
    assert expansion_to_paths([(0,), (1,), (0, 0)]) == ((0,), (1,), (0, 0))


# -------------------------------------------------------------------- chain
def test_chain_shape_laws_and_one_draft_call_per_level():
    draft = random_draft(6, seed=3)
    tree = build(ChainTreeBuilder(depth=4), draft)
    assert tree.num_nodes == 5
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3]
    assert all(k == NodeKind.SAMPLED for k in tree.kinds[1:].tolist())
    # one root call + one expand call per further level, each with a single node
    assert draft.calls == 4
    assert [len(p) for p, _ in draft.expand_calls] == [1, 1, 1]
    assert [p for p, _ in draft.expand_calls] == [[0], [1], [2]]
    for node in range(1, 5):
        law = tree.law_of(node)
        assert law.mode == SampleMode.IID
        prefix = [0] + list(path_tokens(tree, int(tree.parents[node])))
        q = process_logits(draft.fn([prefix])[0], T1)
        assert torch.allclose(law.dense(6), q, atol=1e-12)
        assert float(tree.weights[node]) == pytest.approx(float(q[int(tree.tokens[node])]))


def test_chain_is_greedy_at_temperature_zero():
    draft = random_draft(7, seed=5)
    tree = build(ChainTreeBuilder(depth=5), draft, GREEDY)
    prefix = [0]
    for node in range(1, 6):
        expected = int(draft.fn([prefix])[0].argmax())
        assert int(tree.tokens[node]) == expected
        prefix.append(expected)


# ------------------------------------------- T = 0: the construction law
def _untempered(draft, prefix):
    return torch.softmax(draft.fn([list(prefix)])[0], dim=-1)


@pytest.mark.parametrize("builder_cls", [EagleTreeBuilder, RheoTreeBuilder])
def test_dynamic_trees_branch_at_temperature_zero(builder_cls):
    """At T = 0 the dynamic trees rank by the draft's untempered law: the root's
    children are its top-K (not the single greedy token a one-hot q would give)."""
    draft = random_draft(9, seed=2, scale=1.0)
    tree = build(builder_cls(K=3, depth=2, N=8), draft, GREEDY)
    q = _untempered(draft, [0])
    kids = tree.children(0)
    assert [int(tree.tokens[c]) for c in kids] == torch.argsort(q, descending=True, stable=True)[:3].tolist()
    assert [float(tree.weights[c]) for c in kids] == pytest.approx(sorted(q.tolist(), reverse=True)[:3])
    assert all(int(tree.kinds[c]) == NodeKind.DETERMINISTIC for c in range(1, tree.num_nodes))
    assert tree.num_nodes == 9


@pytest.mark.parametrize("mode", ["iid", "wor"])
def test_static_children_at_temperature_zero_come_from_the_untempered_law(mode):
    draft = random_draft(6, seed=7, scale=1.0)
    tree = build(StaticTreeBuilder(expansion=(3, 1), mode=mode), draft, GREEDY, seed=3)
    law = tree.law_of(tree.children(0)[0])
    assert torch.allclose(law.dense(6), _untempered(draft, [0]), atol=1e-12)
    if mode == "wor":
        assert len({int(tree.tokens[c]) for c in tree.children(0)}) == 3


# ------------------------------------------------------------------- static
def test_static_children_per_depth_shape_and_batched_levels():
    draft = random_draft(8, seed=1)
    builder = StaticTreeBuilder(expansion=(3, 2, 1), mode="wor")
    tree = build(builder, draft)
    assert tree.num_nodes == builder.max_nodes == 16
    assert builder.max_depth == 3 and int(tree.depths.max()) == 3
    assert [len(tree.children(0))] + [len(tree.children(c)) for c in tree.children(0)] == [3, 2, 2, 2]
    # one expand call per level, batching the level's nodes
    assert [len(p) for p, _ in draft.expand_calls] == [3, 6]
    for node in range(tree.num_nodes):
        kids = tree.sampled_children(node)
        if kids:
            assert len({int(tree.tokens[c]) for c in kids}) == len(kids)  # without replacement
            assert tree.law_of(kids[0]).mode == SampleMode.WITHOUT_REPLACEMENT
            assert [int(tree.draw_order[c]) for c in kids] == list(range(len(kids)))


def test_static_explicit_paths_and_iid_mode():
    draft = random_draft(5, seed=2)
    builder = StaticTreeBuilder(expansion=[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)], mode="iid")
    tree = build(builder, draft)
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 3]
    assert tree.law_of(1).mode == SampleMode.IID
    assert builder.default_verifier == "rejection-iid"
    # the recorded law is the node's full processed q
    q_root = process_logits(draft.fn([[0]])[0], T1)
    assert torch.allclose(tree.law_of(1).dense(5), q_root, atol=1e-12)


def test_static_wor_draws_what_exists_when_support_is_small():
    # root law has 2 tokens; 3 slots requested: slot 2 and its subtree are absent
    draft = table_draft({(): [0.5, 0.5, 0.0, 0.0]}, 4, default=[0.25, 0.25, 0.25, 0.25])
    builder = StaticTreeBuilder(expansion=[(0,), (1,), (2,), (2, 0), (0, 0)], mode="wor")
    tree = build(builder, draft)
    assert sorted(int(tree.tokens[c]) for c in tree.children(0)) == [0, 1]
    assert tree.num_nodes == 4  # root, two children, (0, 0)


# -------------------------------------------------------------------- eagle
def test_eagle_top_k_children_order_and_weights():
    draft = table_draft({(): [0.1, 0.4, 0.2, 0.3]}, 4)
    tree = build(EagleTreeBuilder(K=3, depth=1, N=10), draft)
    kids = tree.deterministic_children(0)
    assert [int(tree.tokens[c]) for c in kids] == [1, 3, 2]
    assert [float(tree.weights[c]) for c in kids] == pytest.approx([0.4, 0.3, 0.2])
    assert all(tree.kinds[c] == NodeKind.DETERMINISTIC for c in kids)
    assert tree.laws == ()


def test_eagle_never_proposes_zero_probability_tokens():
    draft = table_draft({(): [0.0, 1.0, 0.0], (1,): [0.5, 0.0, 0.5]}, 3, default=[1 / 3] * 3)
    tree = build(EagleTreeBuilder(K=3, depth=2, N=10), draft)
    assert tree.tokens.tolist() == [0, 1, 0, 2]
    assert bool((tree.weights > 0).all())


def test_eagle_beam_is_over_the_level_not_per_parent():
    # level 1: a=0 (0.6), b=1 (0.4).  Level 2 scores: a->2 .30, a->3 .30, b->2 .24, b->3 .16.
    # The level-wide beam of B=2 expands a->2 and a->3 (both children of a; the tie
    # goes to a->2, created first); a per-parent beam would expand a->2 and b->2.
    V = 4
    rows = {
        (): [0.6, 0.4, 0.0, 0.0],
        (0,): [0.0, 0.0, 0.5, 0.5],
        (1,): [0.0, 0.0, 0.6, 0.4],
    }
    draft = table_draft(rows, V, default=[0.25] * 4)
    tree = build(EagleTreeBuilder(K=2, B=2, depth=3, N=100), draft)
    # draft ids: root 0; level 1 expanded as ids 1 (token 0) and 2 (token 1)
    assert draft.expand_calls[0] == ([0, 0], [0, 1])
    assert draft.expand_calls[1] == ([1, 1], [2, 3])
    assert tree.num_nodes == 1 + 2 + 4 + 4
    expanded = {path_tokens(tree, int(tree.parents[i])) for i in range(1, tree.num_nodes) if tree.depths[i] == 3}
    assert expanded == {(0, 2), (0, 3)}


def test_eagle_pruning_keeps_best_n_under_the_total_order_with_ties():
    # Root: tokens 0 and 1 at q = 1/2 each (tie); every deeper row is (1/2, 1/2) or one-hot.
    V = 3
    rows = {
        (): [0.5, 0.5, 0.0],
        (0,): [0.0, 0.0, 1.0],  # weight-1 child ties its parent
        (1,): [0.5, 0.0, 0.5],
    }
    draft = table_draft(rows, V, default=[1 / 3] * 3)
    full = build(EagleTreeBuilder(K=2, B=2, depth=2, N=100), draft)
    # creation order: 1:(0) .5, 2:(1) .5, 3:(0,2) .5, 4:(1,0) .25, 5:(1,2) .25
    assert [path_tokens(full, i) for i in range(1, 6)] == [(0,), (1,), (0, 2), (1, 0), (1, 2)]
    for n, expected in [(1, [(0,)]), (2, [(0,), (1,)]), (3, [(0,), (1,), (0, 2)]), (4, [(0,), (1,), (0, 2), (1, 0)])]:
        tree = build(EagleTreeBuilder(K=2, B=2, depth=2, N=n), draft)
        assert [path_tokens(tree, i) for i in range(1, tree.num_nodes)] == expected


def _reference_prune(full, n):
    """The best n nodes of a fully grown tree (node index = creation index) under (-score, index)."""
    score = [0.0] * full.num_nodes
    for i in range(1, full.num_nodes):
        score[i] = score[int(full.parents[i])] + math.log(float(full.weights[i]))
    order = sorted(range(1, full.num_nodes), key=lambda i: (-score[i], i))
    return sorted(order[:n])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cls", ["eagle", "rheo"])
def test_pruning_matches_reference_total_order(seed, cls):
    V = 5
    # coarse logits produce many exact ties; the same seed gives the same draws
    def fn(prefixes):
        rows = []
        for prefix in prefixes:
            g = torch.Generator().manual_seed(hash((seed, *prefix)) % (2**31))
            levels = torch.randint(0, 3, (V,), generator=g).to(torch.float64)
            if levels.max() == 0:
                levels[len(prefix) % V] = 1.0
            rows.append(torch.where(levels > 0, levels.log(), torch.full((V,), float("-inf"), dtype=torch.float64)))
        return torch.stack(rows)

    make = (lambda n: EagleTreeBuilder(K=3, B=2, depth=3, N=n)) if cls == "eagle" else (
        lambda n: RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=n, M=4)
    )
    full = build(make(1000), CallableLM(fn, V), seed=seed)
    for n in (1, 3, 5, 8, full.num_nodes - 2):
        if n < 1:
            continue
        tree = build(make(n), CallableLM(fn, V), seed=seed)
        expected = full.subtree(_reference_prune(full, n))
        assert tree.tokens.tolist() == expected.tokens.tolist()
        assert tree.parents.tolist() == expected.parents.tolist()
        assert tree.kinds.tolist() == expected.kinds.tolist()


def test_eagle_max_nodes_and_depth_bound_built_trees():
    for K, B, depth, N in [(3, 2, 3, 7), (4, 4, 2, 100), (1, 1, 5, 3)]:
        builder = EagleTreeBuilder(K=K, B=B, depth=depth, N=N)
        tree = build(builder, random_draft(6, seed=K + depth))
        assert tree.num_nodes <= builder.max_nodes
        assert int(tree.depths.max()) <= builder.max_depth
    assert EagleTreeBuilder(K=2, B=1, depth=3, N=100).max_nodes == 1 + 2 + 2 * 2


def test_eagle_defaults_are_eagle2s():
    b = EagleTreeBuilder()
    assert (b.K, b.B, b.depth, b.N) == (10, 10, 6, 60)
    assert b.max_nodes == 61


# --------------------------------------------------------------------- rheo
def test_rheo_node_has_sampled_slot_with_true_law_and_proxy():
    q = [0.4, 0.3, 0.2, 0.1, 0.0]
    draft = table_draft({(): q}, 5)
    builder = RheoTreeBuilder(K=3, m=1, depth=1, N=10, M=4)
    for seed in range(8):
        tree = build(builder, draft, seed=seed)
        (s,) = tree.sampled_children(0)
        det = tree.deterministic_children(0)
        assert [int(tree.tokens[c]) for c in det] == [0, 1]  # S = top-(K-m)
        law = tree.law_of(s)
        assert law.mode == SampleMode.IID
        assert law.indices.tolist() == [2, 3]
        assert law.probs.tolist() == pytest.approx([2 / 3, 1 / 3])  # q' = norm(q on topM minus S)
        assert int(tree.tokens[s]) in (2, 3)
        # default proxy "scaled": 0.25 * (1 - q(S)), token independent
        assert float(tree.weights[s]) == pytest.approx(0.25 * 0.3)
        assert s < det[0]  # created (and ranked) before its deterministic siblings
        residual = build(attrs.evolve(builder, proxy="residual"), draft, seed=seed)
        assert float(residual.weights[residual.sampled_children(0)[0]]) == pytest.approx(0.3)  # 1 - q(S)
        scaled = build(attrs.evolve(builder, proxy_scale=0.5), draft, seed=seed)
        assert float(scaled.weights[scaled.sampled_children(0)[0]]) == pytest.approx(0.15)
        # "displaced": q of the 3rd-ranked token (the slot's rank)
        displaced = build(attrs.evolve(builder, proxy="displaced"), draft, seed=seed)
        assert float(displaced.weights[displaced.sampled_children(0)[0]]) == pytest.approx(0.2)
        # the proxy never changes what is drawn or recorded
        for other in (residual, scaled, displaced):
            assert other.tokens.tolist() == tree.tokens.tolist()
            assert other.law_of(other.sampled_children(0)[0]).probs.tolist() == law.probs.tolist()


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, True, "0.25", float("nan")])
def test_rheo_rejects_bad_proxy_scale(bad):
    with pytest.raises(InvalidConfigError, match="proxy_scale"):
        RheoTreeBuilder(proxy_scale=bad)


def test_rheo_default_sparse_draft_is_1024():
    assert RheoTreeBuilder().M == 1024 and RheoTreeBuilder().proxy == "scaled"


def test_rheo_displaced_proxy_with_two_sampled_slots():
    draft = table_draft({(): [0.35, 0.25, 0.2, 0.15, 0.05]}, 5)
    tree = build(RheoTreeBuilder(K=4, m=2, depth=1, N=10, M=5, proxy="displaced"), draft, seed=1)
    sampled = tree.sampled_children(0)
    assert [float(tree.weights[c]) for c in sampled] == pytest.approx([0.2, 0.15])  # ranks 3 and 4
    with pytest.raises(InvalidConfigError, match="proxy"):
        RheoTreeBuilder(proxy="q")


def test_rheo_sparse_draft_limits_the_sampled_law():
    draft = table_draft({(): [0.4, 0.3, 0.2, 0.1]}, 4)
    tree = build(RheoTreeBuilder(K=2, m=1, depth=1, N=10, M=3, proxy="residual"), draft)
    (s,) = tree.sampled_children(0)
    assert tree.law_of(s).indices.tolist() == [1, 2]  # top-3 minus S = {0}
    assert tree.law_of(s).probs.tolist() == pytest.approx([0.6, 0.4])
    assert float(tree.weights[s]) == pytest.approx(0.6)  # residual mass counts all of q outside S


def test_rheo_two_sampled_slots_are_drawn_without_replacement_with_split_proxy():
    draft = table_draft({(): [0.4, 0.3, 0.2, 0.1]}, 4)
    for seed in range(6):
        tree = build(RheoTreeBuilder(K=3, m=2, depth=1, N=10, M=4, proxy="residual"), draft, seed=seed)
        kids = tree.sampled_children(0)
        assert len(kids) == 2 and len({int(tree.tokens[c]) for c in kids}) == 2
        assert tree.law_of(kids[0]).mode == SampleMode.WITHOUT_REPLACEMENT
        assert [float(tree.weights[c]) for c in kids] == pytest.approx([0.3, 0.3])
        assert [int(tree.tokens[c]) for c in tree.deterministic_children(0)] == [0]


def test_rheo_geometric_proxy_weighs_the_ith_draw_c_r_times_one_minus_c_to_the_i():
    """``"geometric"``: the first draw weighs what ``m = 1``'s one draw weighs, each later one (1 - c) of the
    previous, whichever tokens were drawn; the reference and the tensor builder agree."""
    draft = table_draft({(): [0.4, 0.3, 0.2, 0.1]}, 4)
    for seed in range(6):
        for m, expected in ((2, [0.15, 0.075]), (3, [0.3, 0.15, 0.075])):  # r = 1 - q(top K - m): 0.3, 0.6
            builder = RheoTreeBuilder(K=4, m=m, depth=1, N=10, M=4, proxy="geometric", proxy_scale=0.5)
            tree = build(builder, draft, seed=seed)
            kids = tree.sampled_children(0)
            assert [float(tree.weights[c]) for c in kids] == pytest.approx(expected)
            draft.begin([0])
            fast = build_trees(builder, 0, draft, SamplingConfig(), TorchRandom.seeded(seed)).tree(0)
            assert fast.tokens.tolist() == tree.tokens.tolist() and fast.weights.tolist() == tree.weights.tolist()
    single = build(RheoTreeBuilder(K=3, m=1, depth=1, N=10, M=4, proxy="geometric"), draft, seed=0)
    scaled = build(RheoTreeBuilder(K=3, m=1, depth=1, N=10, M=4), draft, seed=0)
    assert single.weights.tolist() == scaled.weights.tolist()  # one draw: the scaled proxy, bit for bit
    with pytest.raises(InvalidConfigError, match="geometric proxy"):
        RheoTreeBuilder(m=2, proxy="geometric", proxy_scale=1.0)


def test_rheo_without_residual_mass_or_below_threshold_is_an_eagle_node():
    one_hot = table_draft({(): [0.0, 1.0, 0.0]}, 3)
    tree = build(RheoTreeBuilder(K=2, depth=1, N=5, M=3), one_hot)
    assert tree.kinds.tolist() == [NodeKind.ROOT, NodeKind.DETERMINISTIC]
    peaked = table_draft({(): [0.9, 0.06, 0.04]}, 3)
    tree = build(RheoTreeBuilder(K=2, depth=1, N=5, M=3, threshold=0.2), peaked)
    assert tree.tokens.tolist() == [0, 0, 1] and tree.laws == ()
    tree = build(RheoTreeBuilder(K=2, depth=1, N=5, M=3, threshold=0.05), peaked)
    assert len(tree.sampled_children(0)) == 1


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("K,m,B,depth,N", [(3, 1, 2, 3, 6), (4, 2, 4, 2, 10), (2, 1, 1, 4, 3)])
def test_rheo_equals_eagle_at_temperature_zero(seed, K, m, B, depth, N):
    rheo = build(RheoTreeBuilder(K=K, m=m, B=B, depth=depth, N=N, M=K + 2), random_draft(7, seed), GREEDY, seed)
    eagle = build(EagleTreeBuilder(K=K, B=B, depth=depth, N=N), random_draft(7, seed), GREEDY, seed)
    for field in ("tokens", "parents", "kinds", "draw_order", "weights"):
        assert getattr(rheo, field).tolist() == getattr(eagle, field).tolist()
    assert rheo.laws == eagle.laws == ()


def test_rheo_draft_calls_are_batched_by_level():
    draft = random_draft(9, seed=4)
    builder = RheoTreeBuilder(K=3, m=1, B=2, depth=4, N=20, M=6)
    tree = build(builder, draft)
    assert draft.calls == 4  # root + one expand per further level
    assert [len(p) for p, _ in draft.expand_calls] == [2, 2, 2]
    assert tree.num_nodes <= builder.max_nodes and int(tree.depths.max()) <= 4


# ------------------------------------------------------------ validation
@pytest.mark.parametrize(
    "factory",
    [
        lambda: ChainTreeBuilder(depth=0),
        lambda: ChainTreeBuilder(depth=2.5),
        lambda: StaticTreeBuilder(expansion=()),
        lambda: StaticTreeBuilder(expansion=(2, 0)),
        lambda: StaticTreeBuilder(expansion=(2,), mode="sometimes"),
        lambda: StaticTreeBuilder(expansion=[(1,)]),
        lambda: StaticTreeBuilder(expansion=(64, 64, 64)),
        lambda: EagleTreeBuilder(K=0),
        lambda: EagleTreeBuilder(B=0),
        lambda: EagleTreeBuilder(depth=0),
        lambda: EagleTreeBuilder(N=0),
        lambda: EagleTreeBuilder(K=True),
        lambda: RheoTreeBuilder(K=1),
        lambda: RheoTreeBuilder(K=4, m=0),
        lambda: RheoTreeBuilder(K=4, m=5),
        lambda: RheoTreeBuilder(K=4, m=1, M=3),
        lambda: RheoTreeBuilder(threshold=1.5),
        lambda: RheoTreeBuilder(threshold=-0.1),
        lambda: SequoiaTreeBuilder(num_nodes=0),
        lambda: SequoiaTreeBuilder(max_depth=0),
        lambda: SequoiaTreeBuilder(acceptance=(0.7, 0.5)),
        lambda: SequoiaTreeBuilder(acceptance=(1.2,)),
        lambda: SequoiaTreeBuilder(acceptance=()),
        lambda: SequoiaTreeBuilder(paths=[(0,), (0, 0)], num_nodes=4),
        lambda: SequoiaTreeBuilder(paths=[(1,)]),
    ],
)
def test_bad_parameters_raise_invalid_config(factory):
    with pytest.raises(InvalidConfigError):
        factory()


def test_builders_are_registered_with_their_kinds():
    assert {"chain", "static", "sequoia", "eagle", "rheo"} <= set(specdec.list_registered("tree"))
    assert specdec.get("tree", "rheo") is RheoTreeBuilder
    assert RheoTreeBuilder.produces == {NodeKind.DETERMINISTIC, NodeKind.SAMPLED}
    assert EagleTreeBuilder.produces == {NodeKind.DETERMINISTIC}
    for name in ("chain", "static", "sequoia"):
        assert specdec.get("tree", name).produces == {NodeKind.SAMPLED}


# ------------------------------------------------------------ the calibrated proxy (docs/trees.md, "Proxies")
CAL = ((0.05, 0.1, 0.15, 0.2, 0.3, 0.6, 0.6, 0.6, 0.75, 0.8, 0.9),
       (0.02, 0.04, 0.06, 0.08, 0.1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5))


def test_rheo_calibrated_proxy_reads_the_table_at_the_displaced_weight_and_agrees_with_the_tensor_builder():
    draft = table_draft({(): [0.35, 0.25, 0.2, 0.15, 0.05]}, 5)
    builder = RheoTreeBuilder(K=4, m=3, depth=1, N=10, M=5, proxy="calibrated", calibration=CAL)
    for seed in range(4):
        tree = build(builder, draft, seed=seed)
        kids = tree.sampled_children(0)
        # displaced: q at ranks 1, 2, 3 = 0.25 (bin [0.2, 0.35)), 0.2 (same bin), 0.15 (bin [0.1, 0.2));
        # rows 0, 1, then the last row again
        assert [float(tree.weights[c]) for c in kids] == pytest.approx([0.6, 0.5, 0.5])
        draft.begin([0])
        fast = build_trees(builder, 0, draft, SamplingConfig(), TorchRandom.seeded(seed)).tree(0)
        assert fast.tokens.tolist() == tree.tokens.tolist()
        assert fast.weights.tolist() == pytest.approx(tree.weights.tolist())


@pytest.mark.parametrize("bad, message", [
    (((0.5,) * 3,), "11 weights"),
    (((1.5,) * 11,), r"\[0, 1\]"),
    (((0.5, 0.4) + (0.5,) * 9,), "must not decrease"),
    (((0.3,) * 11, (0.4,) * 11), "must not exceed row 0"),
    ((), "non-empty"),
    ("0.5", "non-empty"),
])
def test_rheo_calibration_table_is_checked(bad, message):
    with pytest.raises(InvalidConfigError, match=message):
        RheoTreeBuilder(m=2, proxy="calibrated", calibration=bad)


def test_rheo_calibrated_proxy_without_a_table_fails_at_t_above_0_only():
    draft = table_draft({(): [0.5, 0.3, 0.2]}, 3, default=[0.5, 0.3, 0.2])
    builder = RheoTreeBuilder(K=3, m=2, depth=1, N=3, M=3, proxy="calibrated")
    with pytest.raises(InvalidConfigError, match="calibration table"):
        build(builder, draft)
    with pytest.raises(InvalidConfigError, match="calibration table"):
        build_trees(builder, 0, draft, SamplingConfig(), TorchRandom.seeded(0))
    greedy = build(builder, draft, sampling=SamplingConfig(temperature=0.0))  # T = 0: EAGLE-2's tree, no proxy
    assert greedy.num_nodes == 4


def test_profile_calibration_measures_acceptance_per_draw_and_bin():
    from specdec.trees.rheo import CALIBRATION_EDGES, check_calibration
    from specdec.tune import profile_calibration

    same = CallableLM(lambda p: torch.log(torch.tensor([[0.72, 0.22, 0.06]] * len(p))), vocab_size=3)
    table = profile_calibration(same, CallableLM(same.fn, 3), [[0], [1, 2]], T1, draws=3, M=3, steps_per_prompt=8)
    assert check_calibration(table) == table and len(table) == 3
    # p = q: the first draw is always accepted (16 of 16 in its bin [0.7, 0.9), 2 pseudo-draws at 0.8),
    # the later ones never (bins [0.2, 0.35) and [0.05, 0.1), far below the midpoints 0.275 and 0.075 they
    # start from); the isotonic fit pools the first row's bins 9 and 10 (0.95 unseen)
    assert table[0][9] == pytest.approx((16 + 2 * 0.8 + 2 * 0.95) / 20)
    assert table[1][6] < 0.06 and table[2][4] < 0.02
    flip = CallableLM(lambda p: torch.log(torch.tensor([[0.06, 0.22, 0.72]] * len(p))), vocab_size=3)
    low = profile_calibration(same, flip, [[0]], T1, draws=1, M=3, steps_per_prompt=16)
    assert low[0][9] < 0.5 < table[0][9]  # a draft unlike the target: its top draws are rarely accepted
    assert len(CALIBRATION_EDGES) == len(table[0])
    for bad in (dict(draws=0), dict(steps_per_prompt=0), dict(prior=0)):
        with pytest.raises(InvalidConfigError):
            profile_calibration(same, same, [[0]], T1, **bad)
    with pytest.raises(InvalidConfigError, match="T > 0"):
        profile_calibration(same, same, [[0]], SamplingConfig(temperature=0.0))
    with pytest.raises(InvalidConfigError, match="prompt"):
        profile_calibration(same, same, [], T1)


# ------------------------------------------------------------------ issue 47: names and the paper's settings
def test_rheo_refuses_every_slot_sampled_naming_the_method_that_is():
    with pytest.raises(InvalidConfigError, match="at least one deterministic slot .* 'sampled-dynamic'"):
        specdec.trees.RheoTreeBuilder(K=10, m=10)
    with pytest.raises(InvalidConfigError, match="'sampled-dynamic'"):
        specdec.SpeculativeGenerator(target=CallableLM(lambda p: torch.zeros(len(p), 3), 3),
                                     draft=CallableLM(lambda p: torch.zeros(len(p), 3), 3), method="rheo", K=3, m=3)
    assert specdec.get("method", "sampled-dynamic").tree == "sampled-dynamic"


@pytest.mark.parametrize("proxy", ["displaced", "calibrated", "geometric"])
@pytest.mark.parametrize("sampling", [T1, SamplingConfig(temperature=0.7, top_k=3)], ids=["T1", "T0.7-topk3"])
def test_sampled_dynamic_is_rheo_s_construction_with_every_slot_sampled(proxy, sampling):
    """The sampled-dynamic tree is the tree that rheo[m=K] built before issue 47 (rheo_proposal with m = K), draw for
    draw: results logged as rheo[m=10,...] are sampled-dynamic[...]'s."""
    from specdec.trees.rheo import RheoTreeBuilder
    from specdec.trees.sampled_dynamic import SampledDynamicTreeBuilder

    table = ((0.05, 0.1, 0.15, 0.2, 0.3, 0.6, 0.6, 0.6, 0.75, 0.8, 0.9),)
    options = dict(K=3, B=2, depth=3, N=6, M=4, proxy=proxy, proxy_scale=0.5, calibration=table)
    new = SampledDynamicTreeBuilder(**options)
    old = RheoTreeBuilder(**dict(options, K=4, m=1))
    object.__setattr__(old, "K", 3)  # rheo with m = K = 3, past today's check
    object.__setattr__(old, "B", 2)
    object.__setattr__(old, "m", 3)
    draft = table_draft({}, 5, default=[0.4, 0.25, 0.2, 0.1, 0.05])
    for seed in range(4):
        a, b = build(new, draft, sampling, seed), build(old, draft, sampling, seed)
        for name in ("tokens", "parents", "kinds", "draw_order", "weights"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert all(k == int(NodeKind.SAMPLED) for k in a.kinds.tolist()[1:])


def test_min_top1_proxy_and_truncation_read_the_law_as_stated():
    """proxy="min_top1" weighs the sampled child min(q(top1), 1 - q(top1)); truncate=True reads every weight
    from the top-M law renormalised (here M = 3 of q = (0.5, 0.2, 0.15, 0.1, 0.05): mass 0.85)."""
    from specdec.trees.rheo import RheoTreeBuilder

    q = [0.5, 0.2, 0.15, 0.1, 0.05]
    draft = table_draft({}, 5, default=q)
    plain = build(RheoTreeBuilder(K=3, m=1, depth=1, N=3, M=3, proxy="min_top1"), draft)
    trunc = build(RheoTreeBuilder(K=3, m=1, depth=1, N=3, M=3, proxy="min_top1", truncate=True), draft)
    for tree, mass in ((plain, 1.0), (trunc, 0.85)):
        kinds = tree.kinds.tolist()
        sampled = kinds.index(int(NodeKind.SAMPLED))
        top1 = 0.5 / mass
        assert float(tree.weights[sampled]) == pytest.approx(min(top1, 1 - top1))
        det = [float(tree.weights[i]) for i, k in enumerate(kinds) if k == int(NodeKind.DETERMINISTIC)]
        assert det == pytest.approx([0.5 / mass, 0.2 / mass])
        law = tree.law_of(sampled)  # q' is the same either way: the top M outside S, renormalised
        assert law.indices.tolist() == [2] and law.probs.tolist() == [1.0]
    # the residual of the scaled proxy is read from the truncated law too: 1 - (0.5 + 0.2) / 0.85
    scaled = build(RheoTreeBuilder(K=3, m=1, depth=1, N=3, M=3, truncate=True), draft)
    sampled = scaled.kinds.tolist().index(int(NodeKind.SAMPLED))
    assert float(scaled.weights[sampled]) == pytest.approx(0.25 * (1 - 0.7 / 0.85))
    with pytest.raises(InvalidConfigError, match="truncate must be True or False"):
        RheoTreeBuilder(truncate="yes")


def test_sampled_dynamic_takes_the_default_policy_s_sparse_draft_per_temperature():
    """M = None: 8192 at T = 0.6 (the policy, docs/trees.md "Default policy"), 1024 elsewhere; the tree is the one
    of the explicit M, on both the tensor and the per-node path."""
    from specdec.trees.rheo import DEFAULT_POLICY, STANDING_M
    from specdec.trees.sampled_dynamic import SampledDynamicTreeBuilder

    assert DEFAULT_POLICY["sampled-dynamic"][0.6] == {"M": 8192} and DEFAULT_POLICY["rheo"] == {0.6: {}, 1.0: {}}
    policy = SampledDynamicTreeBuilder(K=3, depth=2, N=5)
    t06, t1 = SamplingConfig(temperature=0.6), SamplingConfig(temperature=1.0)
    assert (policy.sparse_size(t06), policy.sparse_size(t1), STANDING_M) == (8192, 1024, 1024)
    assert SampledDynamicTreeBuilder(K=3, M=64).sparse_size(t06) == 64
    V = 3000  # a law spread over more than 1024 tokens, so that M changes q'
    logits = torch.linspace(0.0, -3.0, V, dtype=torch.float64)
    draft = CallableLM(lambda p: logits.expand(len(p), V).clone(), vocab_size=V)

    def trees(builder, sampling, seed):
        draft.begin([0])
        fast = build_tree(builder, 0, draft, sampling, TorchRandom.seeded(seed))
        draft.begin([0])
        return fast, dynamic_reference(builder, 0, draft, sampling, TorchRandom.seeded(seed))

    differ = 0
    for seed in range(3):
        for sampling, size in ((t06, 8192), (t1, 1024)):
            got = trees(policy, sampling, seed)
            want = trees(SampledDynamicTreeBuilder(K=3, depth=2, N=5, M=size), sampling, seed)
            for a, b in zip(got, want):
                assert torch.equal(a.tokens, b.tokens) and len(a.laws) == len(b.laws)
                assert all(torch.equal(x.indices, y.indices) for x, y in zip(a.laws, b.laws))
        other = trees(SampledDynamicTreeBuilder(K=3, depth=2, N=5, M=1024), t06, seed)[0]
        differ += other.laws[0].indices.numel() != trees(policy, t06, seed)[0].laws[0].indices.numel()
    assert differ  # at T = 0.6 the policy's M is not the standing one
