"""One build entry per builder (issue 56): ``TreeBuilder`` is the batch contract (``feed_build``);
the per-tree form is ``OneTreeBuilder``; 0.1.0's builders (a ``TreeBuilder`` subclass writing
``build``, and ``build`` / ``build_batch`` called on a built-in) still work, with a
``DeprecationWarning`` (docs/api/public.md, "Deprecation policy")."""

from __future__ import annotations

import warnings

import attrs
import pytest
import torch

import specdec
from specdec.registry import register, unregister
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing.markov import markov_pair
from specdec.tree import NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees import ChainTreeBuilder, EagleTreeBuilder, OneTreeBuilder, TreeBuilder, build_tree, build_trees
from specdec.trees import normalised_law
from specdec.trees.chain import chain_reference

V = 16
PROMPTS = [[3, 4], [5, 6, 7, 8, 9, 10, 11], [12]]  # ragged


def nucleus(q, top_p):
    """q restricted to its top-p nucleus (most likely tokens first, ties by token id), renormalised."""
    q = normalised_law(q)  # float64, sums to 1
    probs, order = torch.sort(q, descending=True, stable=True)  # stable: equal q, lower token id first
    above = torch.cumsum(probs, 0) - probs  # the mass of the tokens ranked above each token
    keep = order[(above < top_p) & (probs > 0)].sort().values  # a SparseLaw's support: sorted token ids
    return SparseLaw(keep, q[keep] / q[keep].sum(), SampleMode.IID)


def _legacy_tutorial_builder():
    """docs/tutorial.md's builder as 0.1.0 wrote it: a TreeBuilder subclass with a per-tree build."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        @attrs.frozen
        class NucleusBuilder(TreeBuilder):
            """k children at the root, a chain below each: every child drawn from its parent's top-p nucleus."""

            k: int = 2
            depth: int = 3
            top_p: float = 0.9

            produces = frozenset({NodeKind.SAMPLED})
            default_verifier = "rejection-iid"  # recursive rejection for children drawn i.i.d.
            example_options = ({"k": 2, "depth": 2, "top_p": 0.8}, {"k": 1, "depth": 3, "top_p": 0.6})

            @property
            def sibling_modes(self):
                return frozenset({SampleMode.IID})  # several children of one node are i.i.d. draws

            @property
            def max_nodes(self):
                return 1 + self.k * self.depth

            @property
            def max_depth(self):
                return self.depth

            def build(self, root_token, draft, sampling, rng):
                asm = TreeAssembler(root_token, draft.vocab_size)
                frontier = [(0, draft.root_distribution(sampling))]  # (node, the draft's law after it)
                for level in range(self.depth):
                    added = []  # (parent, new node, its token)
                    for parent, q in frontier:
                        law = nucleus(q, self.top_p)  # the law the children are drawn from ...
                        for _ in range(self.k if level == 0 else 1):
                            i = rng.categorical(law.probs)
                            token = int(law.indices[i])
                            node = asm.add_sampled(parent, token, law, weight=float(law.probs[i]))  # ... is recorded
                            added.append((parent, node, token))
                    if level + 1 < self.depth:
                        rows = draft.expand([p for p, _, _ in added], [t for _, _, t in added], sampling)
                        frontier = [(node, rows[i]) for i, (_, node, _) in enumerate(added)]
                return asm.build()

    return NucleusBuilder, caught


@pytest.fixture
def legacy():
    cls, caught = _legacy_tutorial_builder()
    register("tree", "test-legacy-nucleus")(cls)
    yield cls, caught
    unregister("tree", "test-legacy-nucleus")


def test_the_builder_contract_has_one_build_entry():
    assert getattr(TreeBuilder.feed_build, "__isabstractmethod__", False)
    assert "build" not in vars(TreeBuilder) and "build_batch" not in vars(TreeBuilder)
    assert getattr(OneTreeBuilder.build, "__isabstractmethod__", False) and "feed_build" in vars(OneTreeBuilder)


@pytest.mark.parametrize("name", ["chain", "static", "sequoia", "eagle", "rheo", "sampled-dynamic"])
def test_no_built_in_builder_writes_a_second_build_entry(name):
    cls = specdec.get("tree", name)
    for klass in cls.__mro__:
        if klass.__module__.startswith("specdec."):
            assert not {"build", "build_batch", "build_reference"} & set(vars(klass)), klass


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_0_1_0_tutorial_builder_warns_and_runs_in_batches_row_equals_batch_one(legacy, temperature):
    cls, caught = legacy
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("NucleusBuilder subclasses TreeBuilder" in m and "OneTreeBuilder" in m and "0.2.0" in m
               for m in messages), messages
    assert cls._one_tree_form and not cls.batch_form

    def gen():
        target, draft = markov_pair(V, seed=5)
        return specdec.SpeculativeGenerator(target, draft, None, tree="test-legacy-nucleus", k=2, depth=2, top_p=0.9)

    sampling, seeds = SamplingConfig(temperature=temperature), [11, 12, 13]
    out = gen().generate_batch(PROMPTS, 10, sampling, seeds)
    for b, prompt in enumerate(PROMPTS):
        assert list(out.tokens[b]) == gen().generate(prompt, 10, sampling, seed=seeds[b]).tokens, f"row {b}"


def test_a_one_tree_builder_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Fine(OneTreeBuilder):
            max_nodes = max_depth = 1

            def build(self, root_token, draft, sampling, rng):
                return TreeAssembler(root_token, draft.vocab_size).build()

    assert Fine._one_tree_form and not Fine.batch_form


def test_a_built_in_subclass_writing_build_is_served_by_its_build():
    """0.1.0's mutant pattern (a built-in subclass that redefines build) runs its own build, not the
    built-in's tensor build, and warns."""
    with pytest.warns(DeprecationWarning, match="subclasses TreeBuilder"):
        class Empty(ChainTreeBuilder):
            def build(self, root_token, draft, sampling, rng):
                return TreeAssembler(root_token, draft.vocab_size).build()

    target, draft = markov_pair(V, seed=1)
    draft.begin_rows([[1], [2]])
    batch = build_trees(Empty(depth=3), torch.tensor([1, 2]), draft, SamplingConfig(temperature=1.0),
                        RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)]))
    assert batch.num_nodes.tolist() == [1, 1] and not Empty.batch_form


def test_0_1_0_build_entries_on_a_built_in_warn_and_give_the_same_trees():
    target, draft = markov_pair(V, seed=2)
    builder, sampling = EagleTreeBuilder(K=2, depth=2, N=3), SamplingConfig(temperature=1.0)
    draft.begin([4, 5])
    want = build_tree(builder, 5, draft, sampling, TorchRandom.seeded(0))
    with pytest.warns(DeprecationWarning, match=r"EagleTreeBuilder.build is deprecated .*build_tree"):
        got = builder.build(5, draft, sampling, TorchRandom.seeded(0))
    assert got.tokens.tolist() == want.tokens.tolist() and got.parents.tolist() == want.parents.tolist()
    with pytest.warns(DeprecationWarning, match=r"build_batch is deprecated .*build_trees"):
        batch = builder.build_batch(torch.tensor([5]), draft, sampling, TorchRandom.seeded(0))
    assert batch.tree(0).tokens.tolist() == want.tokens.tolist()
    with pytest.raises(AttributeError, match="no attribute 'build_reference'"):
        builder.build_reference  # noqa: B018


def test_build_trees_refuses_no_draft_for_a_builder_that_drafts():
    with pytest.raises(specdec.InvalidConfigError, match="ChainTreeBuilder needs a draft model, got None"):
        build_trees(ChainTreeBuilder(depth=2), torch.tensor([1]), None, SamplingConfig(), TorchRandom.seeded(0))


@pytest.mark.parametrize("options", [dict(depth=3), dict(depth=4, confidence=0.3), dict(depth=3, proposal_top_k=2),
                                     dict(depth=3, confidence=0.3, proposal_top_k=2)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_chain_equals_its_reference(options, temperature):
    """The chain's tensor build (static_build / chain_build) against chain_reference, same draws."""
    builder, sampling = ChainTreeBuilder(**options), SamplingConfig(temperature=temperature)
    for seed in range(6):
        target, draft = markov_pair(5, seed=seed)
        draft.begin([seed % 5, (seed + 2) % 5])
        fast = build_tree(builder, (seed + 2) % 5, draft, sampling, TorchRandom.seeded(seed))
        draft.begin([seed % 5, (seed + 2) % 5])
        ref = chain_reference(builder, (seed + 2) % 5, draft, sampling, TorchRandom.seeded(seed))
        assert fast.tokens.tolist() == ref.tokens.tolist() and fast.parents.tolist() == ref.parents.tolist()
        assert torch.allclose(fast.weights, ref.weights)
        assert [law.indices.tolist() for law in fast.laws] == [law.indices.tolist() for law in ref.laws]
        assert all(torch.allclose(a.probs, b.probs) for a, b in zip(fast.laws, ref.laws))
