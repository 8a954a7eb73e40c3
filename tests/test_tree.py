"""Property tests for DraftTree: random valid trees validate, random corruptions are rejected."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.errors import MalformedTreeError
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler

relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

FIELDS = ("tokens", "parents", "kinds", "draw_order", "weights", "law_index", "laws", "vocab_size")


def fields_of(tree: DraftTree) -> dict:
    return {
        "tokens": tree.tokens.tolist(),
        "parents": tree.parents.tolist(),
        "kinds": tree.kinds.tolist(),
        "draw_order": tree.draw_order.tolist(),
        "weights": tree.weights.tolist(),
        "law_index": tree.law_index.tolist(),
        "laws": list(tree.laws),
        "vocab_size": tree.vocab_size,
    }


@st.composite
def sparse_laws(draw, vocab_size: int, mode: SampleMode, dtype=torch.float64):
    size = draw(st.integers(min_value=1, max_value=vocab_size))
    indices = draw(st.permutations(range(vocab_size)))[:size]
    raw = draw(st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=size, max_size=size))
    probs = torch.tensor(raw, dtype=torch.float64)
    return SparseLaw(torch.tensor(indices, dtype=torch.int64), (probs / probs.sum()).to(dtype), mode)


@st.composite
def assembled_trees(draw, max_nodes: int = 14):
    """A random valid tree built node by node through TreeAssembler."""
    vocab = draw(st.integers(min_value=1, max_value=7))
    asm = TreeAssembler(draw(st.integers(0, vocab - 1)), vocab)
    laws: dict[int, SparseLaw] = {}
    det_tokens: dict[int, set[int]] = {}
    wor_tokens: dict[int, set[int]] = {}
    for _ in range(draw(st.integers(0, max_nodes - 1))):
        parent = draw(st.integers(0, len(asm) - 1))
        weight = draw(st.floats(min_value=0.0, max_value=1.0))
        if draw(st.booleans()):
            free = sorted(set(range(vocab)) - det_tokens.get(parent, set()))
            if not free:
                continue
            token = draw(st.sampled_from(free))
            det_tokens.setdefault(parent, set()).add(token)
            asm.add_deterministic(parent, token, weight)
        else:
            if parent not in laws:
                mode = draw(st.sampled_from(list(SampleMode)))
                laws[parent] = draw(sparse_laws(vocab, mode))
            law = laws[parent]
            support = [int(i) for i, p in zip(law.indices.tolist(), law.probs.tolist()) if p > 0]
            if law.mode == SampleMode.WITHOUT_REPLACEMENT:
                support = [t for t in support if t not in wor_tokens.get(parent, set())]
                if not support:
                    continue
            token = draw(st.sampled_from(support))
            wor_tokens.setdefault(parent, set()).add(token)
            asm.add_sampled(parent, token, law, weight)
    return asm.build()


# ------------------------------------------------------------ valid trees
@relaxed
@given(assembled_trees())
def test_assembled_trees_validate_and_round_trip(tree):
    tree.validate()
    again = DraftTree(**fields_of(tree))
    assert torch.equal(again.tokens, tree.tokens) and torch.equal(again.parents, tree.parents)
    assert tree.num_draft_nodes == tree.num_nodes - 1


@relaxed
@given(assembled_trees())
def test_derived_views_agree(tree):
    n = tree.num_nodes
    mask = tree.ancestor_mask()
    assert mask.shape == (n, n) and mask.dtype == torch.bool
    for i in range(n):
        path = tree.path_to(i)
        assert (path[-1] == i) if i else (path == [])
        assert int(tree.depths[i]) == len(path)
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == {0, *path}
        for a, b in zip([0] + path, path):
            assert int(tree.parents[b]) == a
        kids = tree.children(i)
        assert sorted(kids) == [c for c in range(n) if int(tree.parents[c]) == i]
        sampled = tree.sampled_children(i)
        assert [int(tree.draw_order[c]) for c in sampled] == list(range(len(sampled)))
        assert kids == sampled + tree.deterministic_children(i)
        if sampled:
            law = tree.sampled_law_at(i)
            assert all(tree.law_of(c) is law for c in sampled)
            assert all(law.prob_of(int(tree.tokens[c])) > 0 for c in sampled)
        else:
            assert tree.sampled_law_at(i) is None
    # attention mask convention: lower triangular (parents before children)
    assert not torch.triu(mask, diagonal=1).any()


@relaxed
@given(assembled_trees(), st.data())
def test_subtree_keeps_invariants(tree, data):
    # a random ancestor-closed set
    keep = {0}
    for i in range(1, tree.num_nodes):
        if int(tree.parents[i]) in keep and data.draw(st.booleans()):
            keep.add(i)
    prefix_ok = all(
        [int(tree.draw_order[c]) for c in tree.sampled_children(node) if c in keep]
        == list(range(sum(c in keep for c in tree.sampled_children(node))))
        for node in keep
    )
    if not prefix_ok:  # dropping an earlier draw but keeping a later one is not a valid tree
        with pytest.raises(MalformedTreeError):
            tree.subtree(sorted(keep))
        return
    sub = tree.subtree(sorted(keep))
    kept = sorted(keep)
    assert sub.num_nodes == len(kept)
    for new, old in enumerate(kept):
        assert [int(sub.tokens[j]) for j in sub.path_to(new)] == [int(tree.tokens[j]) for j in tree.path_to(old)]
        assert int(sub.kinds[new]) == int(tree.kinds[old])
        assert float(sub.weights[new]) == float(tree.weights[old])
        if int(tree.kinds[old]) == NodeKind.SAMPLED:
            assert sub.law_of(new) is tree.law_of(old)
            assert int(sub.draw_order[new]) == int(tree.draw_order[old])
    for new, old in enumerate(kept):  # deterministic ranks stay in the original order
        ranks = [int(tree.draw_order[kept[c]]) for c in sub.deterministic_children(new)]
        assert ranks == sorted(ranks)


def test_subtree_rejects_orphans_and_out_of_range():
    asm = TreeAssembler(0, 3)
    a = asm.add_deterministic(0, 1, 0.5)
    asm.add_deterministic(a, 2, 0.5)
    tree = asm.build()
    with pytest.raises(MalformedTreeError, match="without its parent"):
        tree.subtree([2])
    with pytest.raises(MalformedTreeError, match="out of range"):
        tree.subtree([5])
    assert tree.subtree([]).num_nodes == 1


def test_chain_and_sparse_law_helpers():
    q = torch.tensor([0.0, 0.25, 0.0, 0.75], dtype=torch.float64)
    law = SparseLaw.from_dense(q)
    assert law.indices.tolist() == [1, 3] and torch.equal(law.dense(4), q)
    assert law.prob_of(3) == 0.75 and law.prob_of(0) == 0.0
    tree = DraftTree.chain(2, [3, 1], [law, SparseLaw.from_dense(q)], vocab_size=4)
    assert tree.tokens.tolist() == [2, 3, 1] and tree.parents.tolist() == [-1, 0, 1]
    assert tree.depths.tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        DraftTree.chain(2, [3, 1], [law], vocab_size=4)  # one law per token


def test_assembler_refuses_two_laws_for_one_parent():
    asm = TreeAssembler(0, 3)
    law = SparseLaw.from_dense(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    asm.add_sampled(0, 0, law, 0.5)
    with pytest.raises(MalformedTreeError, match="share one proposal law"):
        asm.add_sampled(0, 1, SparseLaw.from_dense(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)), 0.5)


# ------------------------------------------------------------ corruptions
def _corruptions(tree: DraftTree) -> list[tuple[str, callable]]:
    """(name, f) pairs; f(fields, data) corrupts the field dict in place."""
    n, f0 = tree.num_nodes, fields_of(tree)
    out: list[tuple[str, callable]] = []

    def add(name):
        def deco(fn):
            out.append((name, fn))
            return fn
        return deco

    @add("shape mismatch")
    def _(f, d):
        name = d.draw(st.sampled_from(FIELDS[:6]))
        f[name] = f[name][:-1] if n > 1 and d.draw(st.booleans()) else f[name] + [f[name][-1]]

    @add("2-D tensor")
    def _(f, d):
        f["tokens"] = [f["tokens"]]

    @add("float tokens")
    def _(f, d):
        f["tokens"] = [float(t) + 0.5 for t in f["tokens"]]

    @add("bad vocab size")
    def _(f, d):
        f["vocab_size"] = d.draw(st.sampled_from([0, -3, 2.0, "7", None]))

    @add("token out of vocabulary")
    def _(f, d):
        i = d.draw(st.integers(0, n - 1))
        f["tokens"][i] = d.draw(st.sampled_from([-1, tree.vocab_size, tree.vocab_size + 5]))

    @add("weight out of range")
    def _(f, d):
        i = d.draw(st.integers(0, n - 1))
        f["weights"][i] = d.draw(st.sampled_from([-0.1, 1.5, math.nan, math.inf]))

    @add("root weight not 1")
    def _(f, d):
        f["weights"][0] = 0.5

    @add("root not a root")
    def _(f, d):
        choice = d.draw(st.integers(0, 2))
        if choice == 0:
            f["parents"][0] = 0
        elif choice == 1:
            f["kinds"][0] = int(NodeKind.DETERMINISTIC)
        else:
            f["law_index"][0] = 0

    if n == 1:
        @add("empty tree")
        def _(f, d):
            for name in FIELDS[:6]:
                f[name] = []
        return out

    @add("bad parent (self, later node, second root or out of range)")
    def _(f, d):
        i = d.draw(st.integers(1, n - 1))
        f["parents"][i] = d.draw(st.sampled_from([i, -1, n, n + 3] + list(range(i + 1, n))))

    @add("cycle")
    def _(f, d):
        i = d.draw(st.integers(1, n - 1))
        # make i's parent one of its own descendants (or itself): a cycle
        desc = [j for j in range(n) if i in tree.path_to(j)]
        f["parents"][i] = d.draw(st.sampled_from(desc))

    @add("bad kind")
    def _(f, d):
        i = d.draw(st.integers(1, n - 1))
        f["kinds"][i] = d.draw(st.sampled_from([int(NodeKind.ROOT), 3, -1]))

    sampled = [i for i in range(1, n) if f0["kinds"][i] == NodeKind.SAMPLED]
    determ = [i for i in range(1, n) if f0["kinds"][i] == NodeKind.DETERMINISTIC]

    if determ:
        @add("deterministic node with a law")
        def _(f, d):
            f["law_index"][d.draw(st.sampled_from(determ))] = 0 if f["laws"] else 5

        @add("deterministic rank gap or duplicate")
        def _(f, d):
            i = d.draw(st.sampled_from(determ))
            f["draw_order"][i] = d.draw(st.sampled_from([-1, f["draw_order"][i] + 100]))

        @add("deterministic node turned sampled without a law")
        def _(f, d):
            i = d.draw(st.sampled_from(determ))
            f["kinds"][i] = int(NodeKind.SAMPLED)
            f["law_index"][i] = d.draw(st.sampled_from([-1, len(f["laws"])]))

    dup_det = [(a, b) for a in determ for b in determ if a < b and f0["parents"][a] == f0["parents"][b]]
    if dup_det:
        @add("deterministic siblings repeat a token")
        def _(f, d):
            a, b = d.draw(st.sampled_from(dup_det))
            f["tokens"][b] = f["tokens"][a]

    if sampled:
        @add("sampled node without a valid law index")
        def _(f, d):
            f["law_index"][d.draw(st.sampled_from(sampled))] = d.draw(st.sampled_from([-1, len(f["laws"]), 99]))

        @add("sampled draw order not a prefix")
        def _(f, d):
            i = d.draw(st.sampled_from(sampled))
            f["draw_order"][i] = d.draw(st.sampled_from([-1, f["draw_order"][i] + 1 + len(sampled)]))

        @add("sampled token outside its law's support")
        def _(f, d):
            i = d.draw(st.sampled_from(sampled))
            law = f["laws"][f["law_index"][i]]
            outside = sorted(set(range(tree.vocab_size)) - set(law.indices.tolist()))
            if outside:
                f["tokens"][i] = d.draw(st.sampled_from(outside))
            else:  # full support: give the token zero probability instead
                probs = law.probs.clone()
                probs[int(torch.nonzero(law.indices == f["tokens"][i])[0])] = 0.0
                if probs.sum() > 0:  # (a one-token law becomes all zeros: not normalised either)
                    probs = probs / probs.sum()
                f["laws"][f["law_index"][i]] = SparseLaw(law.indices, probs, law.mode)

        @add("law not normalised or negative")
        def _(f, d):
            lid = f["law_index"][d.draw(st.sampled_from(sampled))]
            law = f["laws"][lid]
            kind = d.draw(st.integers(0, 3))
            if kind == 0:
                probs = law.probs * 1.5
            elif kind == 1:
                probs = law.probs.clone()
                probs[0] = -probs[0] - 0.1
            elif kind == 2:
                probs = law.probs.clone()
                probs[0] = math.nan
            else:
                probs = law.probs * (1 - 1e-6)  # float64 tolerance is 1e-9
            f["laws"][lid] = SparseLaw(law.indices, probs, law.mode)

        @add("law with bad indices")
        def _(f, d):
            lid = f["law_index"][d.draw(st.sampled_from(sampled))]
            law = f["laws"][lid]
            kind = d.draw(st.integers(0, 4))
            if kind == 0:
                idx = law.indices.clone()
                idx[0] = tree.vocab_size
                f["laws"][lid] = SparseLaw(idx, law.probs, law.mode)
            elif kind == 1:
                f["laws"][lid] = SparseLaw(torch.cat([law.indices, law.indices[:1]]),
                                           torch.cat([law.probs, torch.zeros(1, dtype=law.probs.dtype)]), law.mode)
            elif kind == 2:
                f["laws"][lid] = SparseLaw(law.indices.to(torch.int32), law.probs, law.mode)
            elif kind == 3:
                f["laws"][lid] = SparseLaw(law.indices[:0], law.probs[:0], law.mode)
            else:
                f["laws"][lid] = SparseLaw(law.indices, law.probs, "iid")  # not a SampleMode

        @add("law that is not a SparseLaw")
        def _(f, d):
            f["laws"][f["law_index"][sampled[0]]] = f["laws"][f["law_index"][sampled[0]]].dense(tree.vocab_size)

        @add("unused law")
        def _(f, d):
            f["laws"] = f["laws"] + [f["laws"][0]]

    groups: dict[int, list[int]] = {}
    for i in sampled:
        groups.setdefault(f0["parents"][i], []).append(i)
    siblings = [g for g in groups.values() if len(g) >= 2]
    if siblings:
        @add("sampled siblings with different laws")
        def _(f, d):
            g = d.draw(st.sampled_from(siblings))
            old = f["laws"][f["law_index"][g[1]]]
            f["laws"] = f["laws"] + [SparseLaw(old.indices, old.probs, old.mode)]
            for c in g[1:]:
                f["law_index"][c] = len(f["laws"]) - 1

        @add("duplicate draw order")
        def _(f, d):
            g = d.draw(st.sampled_from(siblings))
            f["draw_order"][g[1]] = f["draw_order"][g[0]]

    wor_pairs = [
        (g[0], g[1]) for g in siblings if f0["laws"][f0["law_index"][g[0]]].mode == SampleMode.WITHOUT_REPLACEMENT
    ]
    if wor_pairs:
        @add("children drawn without replacement repeat a token")
        def _(f, d):
            a, b = d.draw(st.sampled_from(wor_pairs))
            f["tokens"][b] = f["tokens"][a]

    if len(groups) >= 2:
        @add("one law shared by two parents")
        def _(f, d):
            (ga, gb) = list(groups.values())[:2]
            la, lb = f["law_index"][ga[0]], f["law_index"][gb[0]]
            law = f["laws"][la]
            support = [t for t, p in zip(law.indices.tolist(), law.probs.tolist()) if p > 0]
            # b's children become draws from a's law (their tokens in its support), b's law is dropped:
            # the only defect left is one law object slot serving two parents
            for k, c in enumerate(gb):
                f["tokens"][c] = support[k % len(support)]
                f["law_index"][c] = la
            del f["laws"][lb]
            f["law_index"] = [x - 1 if x > lb else x for x in f["law_index"]]
    return out


@relaxed
@given(assembled_trees(), st.data())
def test_corruptions_raise_malformed_tree_error(tree, data):
    corruptions = _corruptions(tree)
    name, corrupt = data.draw(st.sampled_from(corruptions), label="corruption")
    fields = fields_of(tree)
    corrupt(fields, data)
    with pytest.raises(MalformedTreeError):
        DraftTree(**fields)


def rich_tree() -> DraftTree:
    """A tree on which every corruption kind applies: mixed kinds, iid and wor laws, two levels."""
    law_wor = SparseLaw(torch.tensor([0, 1, 2]), torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64),
                        SampleMode.WITHOUT_REPLACEMENT)
    law_iid = SparseLaw(torch.tensor([1, 3]), torch.tensor([0.5, 0.5], dtype=torch.float64), SampleMode.IID)
    asm = TreeAssembler(0, 5)
    a = asm.add_sampled(0, 1, law_wor, 0.3)
    asm.add_sampled(0, 2, law_wor, 0.5)
    asm.add_deterministic(0, 4, 0.1)
    asm.add_deterministic(0, 3, 0.1)
    asm.add_sampled(a, 3, law_iid, 0.5)
    asm.add_sampled(a, 3, law_iid, 0.5)
    return asm.build()


CORRUPTION_NAMES = sorted(name for name, _ in _corruptions(rich_tree()))


def test_every_corruption_kind_is_reachable():
    assert len(CORRUPTION_NAMES) == 26, CORRUPTION_NAMES


@pytest.mark.parametrize("name", CORRUPTION_NAMES)
@settings(deadline=None, max_examples=15)
@given(data=st.data())
def test_each_corruption_of_a_rich_tree_raises(name, data):
    tree = rich_tree()
    corrupt = dict(_corruptions(tree))[name]
    fields = fields_of(tree)
    corrupt(fields, data)
    with pytest.raises(MalformedTreeError):
        DraftTree(**fields)


@pytest.mark.parametrize("make, message", [
    (lambda f: f.update(parents=[-1, 1]), "parent"),
    (lambda f: f.update(weights=[1.0, 2.0]), "weight"),
    (lambda f: f.update(tokens=[0, 9]), "outside"),
    (lambda f: f.update(kinds=[0, 0]), "kind"),
])
def test_errors_name_the_problem(make, message):
    asm = TreeAssembler(0, 3)
    asm.add_deterministic(0, 1, 0.5)
    fields = fields_of(asm.build())
    make(fields)
    with pytest.raises(MalformedTreeError, match=message):
        DraftTree(**fields)
