"""Graph-capture readiness: the per-level draft step and the verification step
each compile as one graph (``fullgraph=True``: any graph break fails), and the
compiled functions give the eager results. The ``aot_eager`` backend traces
the same graph a GPU backend would compile, without a C++ toolchain."""

from __future__ import annotations

import pytest
import torch

from specdec.models import CallableLM
from specdec.rng import TorchRandom, UniformTable
from specdec.sampling import SamplingConfig
from specdec.engine import StepCompiler
from specdec.trees.levelwise import eagle_level, rheo_level
from specdec.trees.rheo import RheoTreeBuilder
from specdec.verify.fast import decide_tree_batch, decide_tree_walk
from specdec.verify.match import MatchVerifier
from specdec.verify.mixed import MixedVerifier
from specdec.trees import build_trees


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def laws(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 3, -1)


@pytest.mark.parametrize("m", [1, 2])
def test_rheo_level_compiles_in_one_graph(m):
    q, live = laws(4, 200, 0), torch.tensor([True, True, False, True])
    u = torch.rand(4, m, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def level(q, u, live):
        out = rheo_level(q, 5, m, 20, 0.0, UniformTable(u), "scaled", 0.25, live)
        return out.tokens, out.weights, out.kinds, out.law_ids, out.law_probs, out.law_wor

    for got, want in zip(compiled(level)(q, u, live), level(q, u, live)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("proxy", ["scaled", "displaced"])
def test_rheo_split_level_compiles_in_one_graph(proxy):
    """The level that ranks by one law and draws by another (``rank_law="untempered"``)."""
    q, draw, live = laws(4, 200, 0), laws(4, 200, 7), torch.tensor([True, False, True, True])
    u = torch.rand(4, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def level(q, u, live, draw):
        out = rheo_level(q, 5, 2, 20, 0.0, UniformTable(u), proxy, 0.25, live, draw)
        return out.tokens, out.weights, out.kinds, out.law_ids, out.law_probs, out.law_wor

    for got, want in zip(compiled(level)(q, u, live, draw), level(q, u, live, draw)):
        assert torch.equal(got, want)


def test_generator_compiles_a_split_law_rheo():
    """``SpeculativeGenerator(compile=...)`` with ``rank_law="untempered"`` at T = 0.6 runs
    its compiled split level (both laws handed to the compiled function)."""
    import specdec

    vocab = 40
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 2
    lm = CallableLM(lambda ps: table[[p[-1] for p in ps]].float(), vocab_size=vocab)
    torch._dynamo.reset()
    gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method="rheo", compile="aot_eager", K=3, depth=3, N=8,
                                       M=8, rank_law="untempered")
    out = gen.generate([1, 2], 16, specdec.SamplingConfig(temperature=0.6), seed=0)
    assert len(out.tokens) == 16 and gen.compiler is not None and gen.compiler._levels


def test_eagle_level_compiles_in_one_graph():
    q = laws(3, 300, 2)

    def level(q):
        out = eagle_level(q, 10)
        return out.tokens, out.weights, out.kinds

    for got, want in zip(compiled(level)(q), level(q)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("verifier", [MixedVerifier(), MatchVerifier()], ids=["mixed", "match"])
def test_verification_step_compiles_in_one_graph(verifier):
    vocab = 50
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    draft = CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab)
    draft.begin([0])
    tree = build_trees(RheoTreeBuilder(K=3, depth=3, N=8, M=10), 0, draft, SamplingConfig(), TorchRandom.seeded(0))
    p = torch.softmax(torch.randn(1, tree.node_slots, vocab, generator=torch.Generator().manual_seed(4)), -1)
    u = torch.rand(1, tree.node_slots, tree.max_children + 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    rule = verifier.fused
    got = compiled(decide_tree_batch)(rule, tree, p, u)
    for a, b in zip(got, decide_tree_batch(rule, tree, p, u)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.8),
                                      SamplingConfig(temperature=1.1, top_p=0.8)], ids=["T0", "T0.8", "top-p"])
def test_verification_walk_compiles_in_one_graph(sampling):
    """The CPU's verification (decide_tree_walk: one decision per depth) compiles with fullgraph and decides as
    eagerly."""
    vocab = 50
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    draft = CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab)
    draft.begin([0])
    tree = build_trees(RheoTreeBuilder(K=3, depth=3, N=8, M=10), 0, draft, SamplingConfig(), TorchRandom.seeded(0))
    logits = torch.randn(1, tree.node_slots, vocab, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    u = torch.rand(1, tree.node_slots, tree.max_children + 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    rule = MixedVerifier().fused
    torch._dynamo.reset()
    got = compiled(decide_tree_walk)(rule, tree, logits, u, sampling)
    for a, b in zip(got, decide_tree_walk(rule, tree, logits, u, sampling)):
        assert torch.equal(a, b)


def test_a_graph_break_fails_the_test():
    """Power: branching on a tensor's value (a host read) is a graph break, and fullgraph refuses it."""

    def reads(q):
        return q * 2 if q.sum() > 0 else q

    with pytest.raises(Exception):
        compiled(reads)(laws(2, 5, 0))


def test_generator_compile_option_gives_the_eager_tokens():
    """EAGLE trees draw nothing while building, so with the same seed the compiled
    step (aot_eager: the same numerics) emits exactly the eager step's tokens;
    Rheo at T = 0 equals plain greedy decoding compiled too."""
    import specdec

    vocab = 40
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 2
    lm = CallableLM(lambda ps: table[[p[-1] for p in ps]].float(), vocab_size=vocab)
    kw = dict(K=3, depth=3, N=8)
    torch._dynamo.reset()
    eager = specdec.SpeculativeGenerator(target=lm, draft=lm, method="eagle2", **kw)
    comp = specdec.SpeculativeGenerator(target=lm, draft=lm, method="eagle2", compile="aot_eager", **kw)
    t1 = specdec.SamplingConfig(temperature=1.0)
    assert comp.generate([1, 2], 16, t1, seed=3).tokens == eager.generate([1, 2], 16, t1, seed=3).tokens
    greedy = specdec.SamplingConfig(temperature=0.0)
    rheo = specdec.SpeculativeGenerator(target=lm, draft=lm, method="rheo", compile="aot_eager", M=8, **kw)
    plain = specdec.autoregressive_generate(lm, [1, 2], 16, greedy)
    assert rheo.generate([1, 2], 16, greedy, seed=0).tokens == plain.tokens
    rheo_t1 = rheo.generate([1, 2], 16, t1, seed=0)
    assert len(rheo_t1.tokens) == 16


def test_bad_compile_option_raises():
    import specdec
    from specdec.errors import InvalidConfigError

    lm = CallableLM(lambda ps: torch.zeros(len(ps), 4), vocab_size=4)
    with pytest.raises(InvalidConfigError, match="compile"):
        specdec.SpeculativeGenerator(target=lm, draft=lm, method="eagle2", compile=3)


class _Uncompiled(StepCompiler):
    """The compiler's functions run as plain Python: the compiled graphs' reference."""

    def _compile(self, fn):
        return fn


def _tree_fields(tree):
    return {k: getattr(tree, k) for k in ("tokens", "parents", "depths", "kinds", "draw_order", "weights",
                                          "num_nodes", "law_ids", "law_probs", "law_wor", "ancestors", "draft_bad")}


@pytest.mark.parametrize(
    "method, proposal",
    [("eagle2", False), ("rheo", False), ("rheo-m2", False), ("rheo-untempered", False), ("eagle2", True),
     ("rheo", True)],
    ids=["eagle2", "rheo", "rheo-m2", "rheo-untempered", "eagle2-proposal-ids", "rheo-proposal-ids"],
)
def test_compiled_levels_and_layout_build_the_uncompiled_tree(method, proposal):
    """Each level (level function + scoring + beam, ``level_step``, with a draft vocabulary's id
    map too) and the final rerank and layout (``finish_levels``) compile as whole graphs and
    build, from the same uniform tables, the tree their uncompiled functions build, field by field."""
    from specdec import registry
    from specdec.testing import ProposalLM

    vocab = 60
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 2
    if proposal:  # a draft vocabulary of the odd ids: -inf elsewhere
        keep = list(range(1, vocab, 2))
        table[:, [i for i in range(vocab) if i % 2 == 0]] = float("-inf")
        draft = ProposalLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab, keep=keep)
    else:
        draft = CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab)
    options = {"eagle2": ("eagle", {}), "rheo": ("rheo", {"M": 12}), "rheo-m2": ("rheo", {"M": 12, "m": 2}),
               "rheo-untempered": ("rheo", {"M": 12, "rank_law": "untempered"})}[method]
    builder = registry.get("tree", options[0])(K=4, depth=3, N=9, **options[1])
    torch._dynamo.reset()
    for sampling in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7)):
        trees = []
        for compiler in (StepCompiler("aot_eager"), _Uncompiled()):
            draft.begin([1, 2])
            trees.append(build_trees(builder, 2, draft, sampling, TorchRandom.seeded(5), compiler=compiler))
        for name, value in _tree_fields(trees[0]).items():
            assert torch.equal(value, _tree_fields(trees[1])[name]), name
        assert trees[0].tree(0).num_nodes == 10
        assert not proposal or bool((trees[0].tokens[0, 1:] % 2 == 1).all())  # target ids of the draft vocabulary
