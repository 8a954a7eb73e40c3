"""How SpeculativeGenerator(method=, tree=, verifier=) composes (specdec.methods.resolve_composition):
a tree alone gets its builder's own verifier, a verifier alone the method's tree, and every
mismatch lists the verifiers that fit."""

from __future__ import annotations

import inspect
from typing import ClassVar

import attrs
import pytest

import specdec
from specdec.errors import InvalidConfigError, UnknownNameError, UnsupportedTreeError
from specdec.methods import DEFAULT_METHOD, compose, fitting_verifiers, resolve_composition
from specdec.registry import register, unregister
from specdec.testing import markov_pair
from specdec.tree import NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees import ChainTreeBuilder, EagleTreeBuilder, StaticTreeBuilder, normalised_law
from specdec.trees.base import OneTreeBuilder

V = 4


def make(**options):
    target, draft = markov_pair(V)
    return specdec.SpeculativeGenerator(target=target, draft=draft, **options)


# ------------------------------------------------------------- tree= alone
@pytest.mark.parametrize(
    ("options", "verifier"),
    [({"tree": "static"}, "rejection-iid"), ({"tree": "static", "mode": "wor"}, "rejection-wor"),
     ({"tree": "eagle"}, "match"), ({"tree": "sequoia"}, "rejection-wor"), ({"tree": "chain"}, "rejection-iid"),
     ({"method": None, "tree": "static", "mode": "wor"}, "rejection-wor"), ({"tree": "rheo"}, "mixed")],
)
def test_a_tree_alone_gets_its_builders_own_verifier(options, verifier):
    """Never the default method's (rheo's ``mixed``, which also fits a static tree: it was
    taken silently before)."""
    gen = make(**options)
    assert gen.verifier.registry_name == verifier
    assert gen.verifier.registry_name == gen.builder.default_verifier
    assert gen.method_name == ("rheo" if options == {"tree": "rheo"} else f"{options['tree']}+{verifier}")


@attrs.frozen
class OneDraw(OneTreeBuilder):
    """A builder declaring no default verifier: one sampled child of the root."""

    produces: ClassVar[frozenset[NodeKind]] = frozenset({NodeKind.SAMPLED})

    @property
    def max_nodes(self) -> int:
        return 2

    @property
    def max_depth(self) -> int:
        return 1

    def build(self, root_token, draft, sampling, rng):
        law = SparseLaw.from_dense(normalised_law(draft.root_distribution(sampling)), SampleMode.IID)
        asm = TreeAssembler(root_token, draft.vocab_size)
        asm.add_sampled(0, int(law.indices[rng.categorical(law.probs)]), law, weight=1.0)
        return asm.build()


@pytest.fixture
def one_draw():
    register("tree", "test-one-draw")(OneDraw)
    yield "test-one-draw"
    unregister("tree", "test-one-draw")


def test_a_tree_without_a_default_verifier_fails_listing_the_fitting_ones(one_draw):
    with pytest.raises(InvalidConfigError, match="declares no default_verifier") as info:
        make(tree=one_draw)
    message = str(info.value)
    # one sampled child per node: every registered rule for sampled children fits (a chain is a tree)
    assert message.endswith("verifiers that fit: block, greedy (temperature 0 only), kseq, match, mixed, "
                            "rejection-iid, rejection-wor, traversal"), message
    assert make(tree=one_draw, verifier="kseq").verifier.registry_name == "kseq"  # named: composes


# --------------------------------------------------------- verifier= alone
def test_a_verifier_alone_composes_with_the_default_methods_tree_and_says_so():
    gen = make(verifier="match")
    assert (gen.builder.registry_name, gen.verifier.registry_name, gen.method_name) == ("rheo", "match", "rheo+match")
    with pytest.raises(UnsupportedTreeError) as info:
        make(verifier="rejection-iid")
    message = str(info.value)
    assert "for tree 'rheo' of the default method 'rheo' with verifier 'rejection-iid', as tree= was not given" in message
    assert "verifiers that fit: greedy (temperature 0 only), match, mixed" in message
    with pytest.raises(UnknownNameError, match=r"unknown verifier 'x'.*\(composing tree 'rheo' of the default "
                                                r"method 'rheo' with verifier 'x', as tree= was not given\)"):
        make(verifier="x")


def test_a_verifier_with_a_named_method_names_that_method():
    with pytest.raises(UnsupportedTreeError, match="for tree 'sequoia' of method 'sequoia' with verifier 'kseq'"):
        make(method="sequoia", verifier="kseq")


def test_method_none_needs_a_tree():
    with pytest.raises(InvalidConfigError, match="give a method name, or tree="):
        make(method=None, verifier="match")


def test_the_generators_default_method_is_default_method():
    default = inspect.signature(specdec.SpeculativeGenerator.__init__).parameters["method"].default
    assert default == DEFAULT_METHOD
    assert make().method_name == DEFAULT_METHOD


def test_a_methods_own_composition_keeps_its_name():
    assert make(method="sd").method_name == "sd"
    assert make(method="specinfer", tree="static").method_name == "specinfer"  # the same tree and verifier
    assert make(method="sd", verifier="rejection-wor").method_name == "chain+rejection-wor"


# -------------------------------------------------------- the fitting lists
def test_a_kind_mismatch_lists_the_fitting_verifiers():
    with pytest.raises(UnsupportedTreeError) as info:
        make(method=None, tree="eagle", verifier="kseq")
    message = str(info.value)
    assert "emits deterministic children that verifier 'kseq' cannot verify losslessly" in message, message
    assert message.endswith("verifiers that fit: greedy (temperature 0 only), match, mixed"), message


def test_a_mode_mismatch_labels_the_greedy_only_verifier():
    with pytest.raises(UnsupportedTreeError, match=r"verifiers that fit: greedy \(temperature 0 only\), match, "
                                                   r"mixed, rejection-wor, traversal$"):
        make(method="specinfer", mode="wor")


def test_fitting_verifiers_follow_kinds_modes_and_greediness():
    assert fitting_verifiers(EagleTreeBuilder(K=2, B=1, depth=2, N=3)) == ["greedy (temperature 0 only)", "match", "mixed"]
    assert fitting_verifiers(StaticTreeBuilder(expansion=(2, 1), mode="iid")) == [
        "greedy (temperature 0 only)", "kseq", "match", "mixed", "rejection-iid", "traversal"]
    assert "rejection-wor" in fitting_verifiers(ChainTreeBuilder(depth=2))  # one child per node: any mode fits
    for fit in fitting_verifiers(StaticTreeBuilder(expansion=(2, 1), mode="wor")):
        builder, verifier = compose("static", fit.split(" ")[0], {"expansion": (2, 1), "mode": "wor"})
        assert verifier.requires_greedy == fit.endswith("(temperature 0 only)")


def test_resolve_composition_is_what_the_generator_uses():
    name, builder, verifier = resolve_composition(DEFAULT_METHOD, "static", None, {"mode": "wor"})
    gen = make(tree="static", mode="wor")
    assert (name, type(builder), type(verifier)) == (gen.method_name, type(gen.builder), type(gen.verifier))


def test_docstring_examples():
    import doctest

    import specdec.methods

    failures, tried = doctest.testmod(specdec.methods, verbose=False)
    assert tried >= 3 and failures == 0
