"""The tensor (level-wise) builders against their per-node references.

For the same draws (a source whose batched draw is the row-by-row default),
``build_tree`` (tensor ops, :mod:`specdec.trees.levelwise`) and ``dynamic_reference``
(per-node objects, :func:`specdec.trees.dynamic.grow_dynamic_tree`) must give
the identical tree: tokens, parents, kinds, draw order, weights and laws, for
random draft laws with exact ties and with pruning and beam competition that
bite, over every option of every dynamic builder.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec.models import CallableLM
from specdec.registry import get, list_registered
from specdec.rng import RandomSource, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch
import specdec.trees._common as common
from specdec.trees._common import draft_law, normalised_law, top_tokens_fixed, top_tokens_tensors
from specdec.trees.dynamic import DynamicTreeBuilder, EagleTreeBuilder
from specdec.trees.levelwise import eagle_level, rheo_level
from specdec.trees.rheo import RheoTreeBuilder
from specdec.trees.sampled_dynamic import SampledDynamicTreeBuilder
from specdec.trees import build_tree, build_trees
from specdec.trees.chain import chain_reference
from specdec.trees.dynamic import dynamic_reference
from specdec.trees.static import static_reference


class RowByRow(TorchRandom):
    """TorchRandom whose batched draw is the row-by-row default, so the tensor
    and the per-node builders consume the stream identically."""

    categorical_rows = RandomSource.categorical_rows


def tied_draft(vocab: int, seed: int) -> CallableLM:
    """A second-order draft with exact ties: one-hot rows, q(top1) = 1/2 rows,
    rows of equal entries, rows with zeros, and random rows."""
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(vocab, vocab, vocab, generator=g, dtype=torch.float64)
    kinds = torch.randint(0, 5, (vocab, vocab), generator=g)
    for a, b in itertools.product(range(vocab), range(vocab)):
        row = table[a, b]
        kind = int(kinds[a, b])
        if kind == 0:
            row.zero_()
            row[(a + b) % vocab] = 1.0
        elif kind == 1:
            row.fill_(0.5 / (vocab - 1))
            row[(a * b) % vocab] = 0.5
        elif kind == 2:
            row.fill_(1.0)
        elif kind == 3:
            row[torch.rand(vocab, generator=g) < 0.4] = 0.0
            row[(a + 2 * b) % vocab] += 0.1
    table = table / table.sum(-1, keepdim=True)
    logits = torch.where(table > 0, table.log(), torch.full_like(table, float("-inf")))

    def fn(prefixes):
        return torch.stack([logits[p[-2], p[-1]] for p in prefixes])

    return CallableLM(fn, vocab_size=vocab)


def assert_same_tree(fast, ref):
    for name in ("tokens", "parents", "kinds", "draw_order", "weights", "law_index"):
        a, b = getattr(fast, name), getattr(ref, name)
        assert torch.equal(a, b), f"{name}: tensor builder {a.tolist()} != reference {b.tolist()}"
    assert len(fast.laws) == len(ref.laws)
    for la, lb in zip(fast.laws, ref.laws):
        assert torch.equal(la.indices, lb.indices) and torch.equal(la.probs, lb.probs) and la.mode == lb.mode


SAMPLINGS = [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=4), SamplingConfig(temperature=0.0)]

EAGLE_OPTIONS = [dict(K=k, B=b, depth=d, N=n) for k, b, d, n in [(1, 1, 3, 2), (2, 1, 3, 3), (3, 2, 3, 5), (4, 4, 2, 20), (3, 3, 4, 7)]]
EAGLE_OPTIONS.append(dict(K=3, B=2, depth=3, N=5, rank_law="sampling"))
RHEO_OPTIONS = [
    dict(K=2, m=1, B=1, depth=3, N=3, M=3),
    dict(K=3, m=1, B=2, depth=3, N=5, M=4),
    dict(K=3, m=2, B=2, depth=3, N=6, M=5),
    dict(K=4, m=3, B=3, depth=2, N=9, M=6),
    dict(K=3, m=1, B=2, depth=3, N=5, M=3, threshold=0.3),
    dict(K=3, m=1, B=2, depth=3, N=5, M=6, proxy="residual"),
    dict(K=3, m=2, B=2, depth=3, N=6, M=6, proxy="displaced"),
    dict(K=3, m=1, B=3, depth=3, N=30, M=6, proxy_scale=1.0),
    dict(K=3, m=1, B=2, depth=3, N=5, M=4, rank_law="sampling"),
    dict(K=3, m=2, B=2, depth=3, N=6, M=6, proxy="displaced", rank_law="sampling"),
    dict(K=4, m=3, B=2, depth=3, N=7, M=6, proxy="geometric", proxy_scale=0.5),
    dict(K=3, m=2, B=2, depth=3, N=6, M=6, proxy="geometric", rank_law="sampling"),
    # the paper's settings as its summary states them (docs/trees.md, "The paper's settings"), and each alone
    dict(K=3, m=1, B=2, depth=3, N=5, M=3, proxy="min_top1", truncate=True),
    dict(K=3, m=1, B=2, depth=3, N=5, M=4, proxy="min_top1", truncate=True, rank_law="sampling"),
    dict(K=4, m=2, B=2, depth=3, N=7, M=4, proxy="min_top1"),
    dict(K=3, m=2, B=2, depth=3, N=6, M=4, truncate=True),
    dict(K=3, m=2, B=2, depth=3, N=6, M=5, proxy="displaced", truncate=True),
    dict(K=3, m=1, B=2, depth=3, N=5, M=4, proxy="residual", threshold=0.3, truncate=True, rank_law="sampling"),
    # more children than the vocabulary (V = 5, 6): fewer candidates outside S than sampled slots
    dict(K=7, m=3, B=2, depth=2, N=6, M=7),
    dict(K=7, m=3, B=2, depth=2, N=6, M=7, proxy="displaced", rank_law="sampling"),
]
# every slot sampled (S empty): the sampled-dynamic builder, RheoSampling's construction with m = K
SAMPLED_OPTIONS = [
    dict(K=3, B=2, depth=3, N=6, M=5, proxy="scaled"),
    dict(K=2, B=2, depth=3, N=5, M=3),
    dict(K=3, B=2, depth=2, N=6, M=4, proxy="geometric", proxy_scale=0.5, rank_law="sampling"),
    dict(K=3, B=2, depth=3, N=6, M=4, truncate=True),
    dict(K=10, B=2, depth=2, N=6, M=1024),  # the defaults' K and M over a vocabulary of 5 or 6
    dict(K=8, B=2, depth=2, N=6, M=8, rank_law="sampling"),
]


@pytest.mark.parametrize("cls,options", [(EagleTreeBuilder, o) for o in EAGLE_OPTIONS]
                         + [(RheoTreeBuilder, o) for o in RHEO_OPTIONS]
                         + [(SampledDynamicTreeBuilder, o) for o in SAMPLED_OPTIONS],
                         ids=lambda o: o.__name__[:-11] if isinstance(o, type) else ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T1", "T0.7-topk4", "T0"])
def test_tensor_builder_equals_reference(cls, options, sampling):
    builder = cls(**options)
    pruned = 0
    for vocab, seed in itertools.product((5, 6), range(6)):
        draft = tied_draft(vocab, seed)
        prompt = [seed % vocab, (seed * 3 + 1) % vocab]
        draft.begin(prompt)
        fast = build_tree(builder, prompt[-1], draft, sampling, RowByRow(torch.Generator().manual_seed(seed)))
        draft.begin(prompt)
        ref = dynamic_reference(builder, prompt[-1], draft, sampling, RowByRow(torch.Generator().manual_seed(seed)))
        assert_same_tree(fast, ref)
        pruned += fast.num_draft_nodes == builder.N
    if builder.max_created > builder.N:
        assert pruned > 0  # the global rerank cut something in some case


def test_builder_hooks_overridden_fall_back_to_the_per_node_form():
    class Mutant(EagleTreeBuilder):
        def rank_key(self, node):
            return (-node.score, node.token, node.index)

    draft = tied_draft(5, 0)
    assert not Mutant.batch_form and not Mutant(K=2, depth=2, N=3).grows_batches(SamplingConfig())
    assert EagleTreeBuilder(K=2, depth=2, N=3).grows_batches(SamplingConfig())
    draft.begin([0, 1])
    batch = build_trees(Mutant(K=2, depth=2, N=3), 1, draft, SamplingConfig(), TorchRandom.seeded(0))
    assert isinstance(batch, TreeBatch)


@pytest.mark.parametrize("vocab,counts", [(12, (1, 3, 5, 12, 20)), (300, (7, 64, 299))])
@pytest.mark.parametrize("seed", range(10))
def test_top_tokens_fixed_equals_top_tokens_tensors(seed, vocab, counts):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(6, vocab, generator=g, dtype=torch.float64)
    q = (q * 4).round() / 4  # many exact ties, more tied tokens than places at the cut
    q[0] = 0.0
    q[0, 3] = 1.0
    q[1] = 1.0 / vocab  # a flat row
    for count in counts:
        ids, probs = top_tokens_fixed(q, count)
        for r, (ri, rp) in enumerate(top_tokens_tensors(q, count)):
            k = ri.numel()
            assert ids[r, :k].tolist() == ri.tolist() and probs[r, :k].tolist() == rp.tolist()
            assert (ids[r, k:] == -1).all() and (probs[r, k:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seed", range(5))
def test_packed_key_ranking_equals_the_tie_search_ranking(seed, dtype):
    """Float32 / float16 / bfloat16 rows are ranked by one ``topk`` on (value bits, column) keys;
    float64 rows by ``topk`` and the tie search. Same columns in the same order, exact ties at
    every cut included (values ``k / 8``, exact in every dtype), zero rows and a flat row."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(6, 300, generator=g, dtype=torch.float64) * 8).floor() / 8
    q[0] = 0.0
    q[0, 7] = 0.5
    q[1] = 0.125
    q[2, 100:] = 0.0
    assert common._order_keys(q) is None and common._order_keys(q.to(dtype)) is not None
    for count in (1, 4, 37, 299, 300):
        want_values, want_ids = common._ranked(q, count)
        got_values, got_ids = common._ranked(q.to(dtype), count)
        assert torch.equal(got_ids, want_ids), count
        assert torch.equal(got_values.double(), want_values)



def _long_rows(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[7, vocab]`` float32 processed draft laws with the cases the grouped ranking must get
    right (exact ties across groups, mass in the short last group, few positive entries, a bad
    row of NaN), and their bad flags."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(7, vocab, generator=g) * 3, dim=-1)
    q[0] = (q[0] * 4096).round() / 4096  # coarse: many exact ties at every cut, across groups
    q[1] = 1.0 / vocab  # flat: every entry tied
    q[2] = 0.0
    q[2, -3:] = 0.25  # all mass in the last (short) group
    q[2, 5] = 0.25
    q[3, 40:] = 0.0  # fewer positive entries than places
    q[3, 41::2] = -0.0  # (a -0.0 reads below +0.0 as integer bits)
    q[4] = float("nan")  # a bad row
    q[5] = (q[5] * 64).round() / 64  # very coarse: ties of zeros at the cut
    bad = torch.zeros(7, dtype=torch.bool)
    bad[4] = True
    return q, bad


@pytest.mark.parametrize("vocab", [16384 + 37, 40000, 131072])
@pytest.mark.parametrize("seed", range(3))
def test_grouped_ranking_of_a_draft_law_equals_the_full_ranking_of_its_float64_law(seed, vocab, monkeypatch):
    """``top_tokens_fixed`` of a ``DraftLaw`` (float32 ``probs`` ranked, in two stages on long
    CPU rows; the ranked entries divided after the gather) gives the bits of the one-stage ranking
    of the float64 law ``normalised_law`` makes (bad rows zeroed), ties included."""
    q, bad = _long_rows(vocab, seed)
    dense = normalised_law(q).masked_fill(bad.unsqueeze(-1), 0.0)
    for count in (1, 10, 50, 1024):
        assert common._group_size(vocab, count) or count == 1024 and vocab < 65536
        got = top_tokens_fixed(draft_law(q, bad), count)
        grouped64 = top_tokens_fixed(dense, count)
        with monkeypatch.context() as m:
            m.setattr(common, "_GROUP_MIN_VOCAB", 1 << 40)  # the one-stage ranking
            want = top_tokens_fixed(dense, count)
        for a, b in ((got, want), (grouped64, want)):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[1].dtype == torch.float64


@pytest.mark.parametrize("m", [1, 2])
def test_level_functions_on_a_draft_law_equal_them_on_its_float64_law(m):
    """RheoSampling's residual is summed in the law's own float64 copy; the children are the
    float64 law's, bit for bit (the same draws: a replayed stream)."""
    q, bad = _long_rows(40000, 7)
    dense = normalised_law(q).masked_fill(bad.unsqueeze(-1), 0.0)
    live = torch.ones(7, dtype=torch.bool)
    for proxy in ("scaled", "displaced", "geometric"):
        got = rheo_level(draft_law(q, bad), 5, m, 64, 0.0, TorchRandom.seeded(3), proxy, 0.25, live)
        want = rheo_level(dense, 5, m, 64, 0.0, TorchRandom.seeded(3), proxy, 0.25, live)
        for a, b in zip(got, want):
            assert torch.equal(a, b) and a.dtype == b.dtype
    for a, b in zip(eagle_level(draft_law(q, bad), 10), eagle_level(dense, 10)):
        assert torch.equal(a, b) and a.dtype == b.dtype


def _follows_the_law(draw) -> bool:
    probs = torch.tensor([[0.2, 0.0, 0.8], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    active = torch.tensor([True, True, False])
    draws = torch.stack([draw(probs, active) for _ in range(4000)])
    freq = (draws[:, 0] == 2).double().mean().item()  # 4000 draws: sd of the frequency 0.006
    return bool((draws[:, 2] == -1).all() and (draws[:, 1] == 1).all() and abs(freq - 0.8) < 0.03
                and not (draws[:, 0] == 1).any())


def test_torch_random_batched_draw_follows_the_law():
    assert _follows_the_law(TorchRandom.seeded(0).categorical_rows)


def test_the_law_check_catches_a_draw_that_ignores_the_weights():
    """Power: a draw uniform over each row's support fails the same check."""
    g = torch.Generator().manual_seed(0)

    def uniform_on_support(probs, active):
        u = torch.rand(probs.shape[0], generator=g, dtype=torch.float64)
        from specdec.rng import inverse_cdf_rows

        return inverse_cdf_rows((probs > 0).double(), u, active)

    assert not _follows_the_law(uniform_on_support)


def test_every_registered_dynamic_builder_has_a_tensor_form():
    for name in list_registered("tree"):
        cls = get("tree", name)
        if isinstance(cls, type) and issubclass(cls, DynamicTreeBuilder):
            assert "level_fn" in {k for c in cls.__mro__ if c is not DynamicTreeBuilder for k in c.__dict__}, name


STATIC_CASES = [
    ("chain", dict(depth=1)),
    ("chain", dict(depth=4)),
    ("static", dict(expansion=(2, 1), mode="iid")),
    ("static", dict(expansion=(3, 2, 2), mode="iid")),
    ("static", dict(expansion=(3, 2, 2), mode="wor")),
    ("static", dict(expansion=[(0,), (1,), (2,), (0, 0), (0, 1), (2, 0), (0, 0, 0)], mode="wor")),
    ("sequoia", dict(num_nodes=8, max_depth=3, acceptance=(0.6, 0.2, 0.1))),
    # sparse proposals (proposal_top_k): the law truncated to its top k, ties by the lower id, on both paths
    ("static", dict(expansion=(3, 2, 2), mode="iid", proposal_top_k=2)),
    ("static", dict(expansion=(3, 2, 2), mode="wor", proposal_top_k=3)),
    ("sequoia", dict(num_nodes=8, max_depth=3, acceptance=(0.6, 0.2, 0.1), proposal_top_k=2)),
    ("chain", dict(depth=3, proposal_top_k=2)),
    ("chain", dict(depth=3, confidence=0.3, proposal_top_k=2)),
]


@pytest.mark.parametrize("name,options", STATIC_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(STATIC_CASES)])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T1", "T0.7-topk4", "T0"])
def test_static_tensor_builder_equals_reference(name, options, sampling):
    """Chain, static and Sequoia shapes grown as index tensors (grow_static)
    give the reference's tree; without replacement, nodes whose law runs out of
    tokens lose their missing children and those children's subtrees."""
    builder = get("tree", name)(**options)
    shrunk = 0
    for vocab, seed in itertools.product((3, 5), range(6)):
        draft = tied_draft(vocab, seed)
        prompt = [seed % vocab, (seed * 3 + 1) % vocab]
        draft.begin(prompt)
        batch = build_trees(builder, prompt[-1], draft, sampling, RowByRow(torch.Generator().manual_seed(seed)))
        assert batch.host_trees is None  # grown as tensors, not stacked from a host tree
        fast = batch.tree(0)
        draft.begin(prompt)
        reference = chain_reference if name == "chain" else static_reference
        ref = reference(builder, prompt[-1], draft, sampling, RowByRow(torch.Generator().manual_seed(seed)))
        assert_same_tree(fast, ref)
        batch.validate()
        shrunk += fast.num_nodes < builder.max_nodes
    if name != "chain" and (options.get("mode") == "wor" or name == "sequoia") and sampling.temperature > 0:
        assert shrunk > 0  # some law ran out of tokens, and the tree lost slots


@pytest.mark.parametrize("options", [dict(K=3, B=2, depth=3, N=5), dict(K=4, B=2, depth=2, N=6)])
def test_eagle_rank_law_untempered_builds_by_the_untempered_law(options):
    """EAGLE with ``rank_law="untempered"`` at T = 0.7 with top-k builds exactly the
    tree of the untempered law, on both paths, and a tree other than the default's
    in some case (so the option is not ignored); the default is the untempered law."""
    warped, untempered = SamplingConfig(temperature=0.7, top_k=4), SamplingConfig()
    builder, default = EagleTreeBuilder(**options, rank_law="untempered"), EagleTreeBuilder(**options, rank_law="sampling")
    differs = 0
    for vocab, seed in itertools.product((5, 6), range(6)):
        draft = tied_draft(vocab, seed)
        prompt = [seed % vocab, (seed * 3 + 1) % vocab]
        trees = []
        for b, sampling, fast in [(builder, warped, True), (builder, warped, False), (default, untempered, True),
                                  (default, warped, True)]:
            draft.begin(prompt)
            rng = RowByRow(torch.Generator().manual_seed(seed))
            trees.append(build_tree(b, prompt[-1], draft, sampling, rng) if fast
                         else dynamic_reference(b, prompt[-1], draft, sampling, rng))
        assert_same_tree(trees[0], trees[2])
        assert_same_tree(trees[1], trees[2])
        differs += not (torch.equal(trees[0].tokens, trees[3].tokens) and torch.equal(trees[0].weights, trees[3].weights))
    assert differs > 0
    assert EagleTreeBuilder().rank_law == "untempered" and RheoTreeBuilder().rank_law == "untempered"


@pytest.mark.parametrize("proxy", ["scaled", "displaced"])
def test_rheo_rank_law_untempered_ranks_by_the_untempered_law_and_draws_by_the_sampling_law(proxy):
    """Rheo's root children with ``rank_law="untempered"`` at T = 0.7 with top-k: the
    deterministic children are the untempered law's top K - m with its weights, the
    sampled child's recorded law is the processed law's top M - (K - m) outside S, renormalised, and
    its proxy is ``c (1 - q_processed(S))`` (``"displaced"``: the untempered q at rank K - m)."""
    warped, untempered = SamplingConfig(temperature=0.7, top_k=4), SamplingConfig()
    K, m, M = 3, 1, 5
    builder = RheoTreeBuilder(K=K, m=m, B=1, depth=1, N=K, M=M, rank_law="untempered", proxy=proxy)
    checked = 0
    for vocab, seed in itertools.product((5, 6), range(6)):
        draft = tied_draft(vocab, seed)
        prompt = [seed % vocab, (seed * 3 + 1) % vocab]
        draft.begin(prompt)
        q_rank = normalised_law(draft.root_distribution(untempered))
        q_draw = normalised_law(draft.root_distribution(warped))
        (ranked,) = top_tokens_tensors(q_rank.unsqueeze(0), K)
        S = ranked[0][: K - m]
        rest = q_draw.clone()
        rest[S] = 0.0
        for fast in (True, False):
            draft.begin(prompt)
            rng = RowByRow(torch.Generator().manual_seed(seed))
            tree = (build_tree if fast else dynamic_reference)(builder, prompt[-1], draft, warped, rng)
            det = list(tree.deterministic_children(0))
            sampled = list(tree.sampled_children(0))
            if float(rest.sum()) == 0.0:
                assert not sampled and tree.tokens[det].tolist() == ranked[0].tolist()
                continue
            assert tree.tokens[det].tolist() == S.tolist()
            assert tree.weights[det].tolist() == ranked[1][: K - m].tolist()
            (child,) = sampled
            law = tree.law_of(child)
            (cand_ids, cand_probs), = top_tokens_tensors(rest.unsqueeze(0), M - (K - m))  # the sparse draft
            assert law.indices.tolist() == cand_ids.tolist()
            assert torch.allclose(law.probs, cand_probs / cand_probs.sum(), rtol=0, atol=1e-15)
            want = 0.25 * float(rest.sum()) if proxy == "scaled" else float(ranked[1][min(K - m, ranked[1].numel() - 1)])
            assert float(tree.weights[child]) == pytest.approx(want, rel=1e-12)
            checked += 1
    assert checked >= 12


def test_rank_law_is_checked():
    from specdec.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="rank_law must be one of untempered, sampling"):
        RheoTreeBuilder(rank_law="tempered")
