"""Traversal verification's tensor form (specdec.verify.traversal_tensor) against its walk (TraversalVerifier).

- Draw for draw: with a source that replays the uniform table (``TableRandom``: node ``i``'s
  ``t``-th draw is ``u[i, t]``), the tensor form and the walk give the same accepted paths,
  tokens, bonus, attempted depths and stop node on trees drawn by the ``static`` (i.i.d. and
  without replacement), ``sequoia`` and ``chain`` builders from random drafts, alone and as
  ragged batches (float64 rows: a uniform within rounding of a threshold is a 1e-16 event);
  with zeros in ``p`` at drafted tokens (nodes of weight 0, whose subtrees the walk skips).
- On chains it is block verification's tensor form, field for field.
- Power: the comparison fails when the block update loses its normaliser, and when the
  siblings' order is ignored.
- Bad rows: flagged where the walk reads them (a node it enters that has children, or the stop
  node), not at a node of weight 0 (a token a grammar refuses: its row all ``-inf``).
- The engine: ``traversal`` is dispatched to its tensor form, and a step reads the host at
  most ``BUDGET`` times (the walk read about 95 times per step on the same toy trees).
Exactness: the walk is exact by enumeration (``test_traversal.py``, and below on trees with
zero-weight nodes); with i.i.d. uniforms the walk on ``TableRandom`` draws each test and each
bonus from its own uniform, so equal decisions for every table give the tensor form the
walk's law.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import specdec
import specdec.verify.traversal_tensor as traversal_tensor
from specdec.engine.dispatch import choose_verification
from specdec.errors import InvalidConfigError
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import MarkovLM, exact_law
from specdec.testing.counter import StepCounter
from specdec.tree import DraftTree, SampleMode, SparseLaw, TreeAssembler
from specdec.tree_batch import TreeBatch
from specdec.trees import ChainTreeBuilder, SequoiaTreeBuilder, StaticTreeBuilder
from specdec.verify.fast_block import decide_block_batch
from specdec.verify.traversal import TraversalVerifier
from specdec.verify.traversal_tensor import decide_traversal_batch, decide_traversal_from_logits

from test_verify_fast import TableRandom, random_draft
from specdec.trees import build_tree

F64 = torch.float64
BUDGET = 4
V = 6
BUILDERS = {
    "static-iid": lambda: StaticTreeBuilder(expansion=(3, 2), mode="iid"),
    "static-wor": lambda: StaticTreeBuilder(expansion=(3, 2, 1), mode="wor"),
    "sequoia": lambda: SequoiaTreeBuilder(num_nodes=9, max_depth=3, acceptance=(0.5, 0.25, 0.1)),
    "chain": lambda: ChainTreeBuilder(depth=3),
}


def _trees(kind: str, seed: int, rows: int):
    trees = []
    for j in range(rows):
        draft = random_draft(V, (seed + j) % 7)
        draft.begin([(seed + j) % V])
        trees.append(build_tree(BUILDERS[kind](), (seed + j) % V, draft, SamplingConfig(), TorchRandom.seeded(100 * seed + j)))
    return trees, TreeBatch.from_trees(trees)


def _inputs(batch: TreeBatch, seed: int, zeros: float = 0.2):
    """``p`` near each node's proposal law on half the rows (paths accepted, weights near 1),
    random elsewhere; a fraction ``zeros`` of the rows with one drafted child's token at 0."""
    g = torch.Generator().manual_seed(1000 + seed)
    B, n = batch.batch_size, batch.node_slots
    p = torch.softmax(torch.randn(B, n, V, generator=g, dtype=F64) * 2, -1)
    q = torch.zeros(B, n, V, dtype=F64).scatter_add_(2, batch.law_ids.clamp_min(0),
                                                     batch.law_probs * (batch.law_ids >= 0))
    near = (torch.rand(B, n, 1, generator=g) < 0.5) & (q.sum(-1, keepdim=True) > 0)
    p = torch.where(near, 0.8 * q + 0.2 * p, p)
    for b in range(B):  # a drafted token the target refuses: its node gets weight 0
        for i in range(1, int(batch.num_nodes[b])):
            if torch.rand((), generator=g) < zeros:
                p[b, int(batch.parents[b, i]), int(batch.tokens[b, i])] = 0.0
    p = p / p.sum(-1, keepdim=True)
    u = torch.rand(B, n, batch.max_children + 1, generator=g, dtype=F64)
    return p, u


def _same(got, b: int, want) -> bool:
    k = int(got.num_accepted[b])
    return (tuple(got.accepted[b, :k].tolist()) == want.accepted_nodes
            and (got.accepted[b, k:] == -1).all().item()
            and tuple(got.tokens[b, : k + 1].tolist()) == want.tokens
            and int(got.attempted[b]) == want.attempted_depths
            and int(got.bonus[b]) == want.tokens[-1]
            and int(got.stop[b]) == (want.accepted_nodes[-1] if want.accepted_nodes else 0))


def _compare(kind: str, seeds, rows: int, decide=decide_traversal_batch, zeros: float = 0.2) -> tuple[int, int, int]:
    """(rows that differ from the walk, rows that accepted something, rows that accepted 2+)."""
    walk = get("verifier", "traversal")()
    differ = accepted = deep = 0
    for seed in seeds:
        trees, batch = _trees(kind, seed, rows)
        p, u = _inputs(batch, seed, zeros)
        got = decide(batch, p, u)
        for b, tree in enumerate(trees):
            want = walk.verify(tree, p[b, : tree.num_nodes], TableRandom(u[b]))
            differ += not _same(got, b, want)
            accepted += want.num_accepted > 0
            deep += want.num_accepted > 1
    return differ, accepted, deep


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_tensor_form_equals_the_walk_draw_for_draw(kind):
    differ, accepted, deep = _compare(kind, range(40), 1)
    assert differ == 0
    assert accepted > 10 and deep > 3


@pytest.mark.parametrize("kind", ["static-wor", "sequoia", "static-iid"])
def test_tensor_form_equals_the_walk_on_ragged_batches(kind):
    differ, accepted, _ = _compare(kind, range(12), 4)
    assert differ == 0
    assert accepted > 10


def test_on_chains_it_is_block_verification():
    for seed in range(30):
        _, batch = _trees("chain", seed, 3)
        p, u = _inputs(batch, seed)
        a, b = decide_traversal_batch(batch, p, u), decide_block_batch(batch, p, u)
        for field in ("accepted", "num_accepted", "tokens", "bonus", "attempted", "stop"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (seed, field)


def test_a_missing_normaliser_is_caught_by_the_comparison(monkeypatch):
    """Power: the block update's weight ``rho`` instead of ``rho / (rho + 1 - w)`` departs from the walk."""
    monkeypatch.setattr(traversal_tensor, "stop_probabilities", lambda rho, w: rho.clamp_max(1.0))
    differ, _, _ = _compare("static-wor", range(20), 1)
    assert differ > 0


def test_ignoring_the_siblings_order_is_caught_by_the_comparison():
    """Power: a subtree accepted whenever it holds a passing node, earlier siblings ignored."""
    def unordered(tree, p, u, bad_rows=None):
        return decide_traversal_batch(attrs_evolve_order(tree), p, u, bad_rows)

    differ, _, _ = _compare("static-iid", range(30), 1, decide=unordered)
    assert differ > 0


def attrs_evolve_order(tree: TreeBatch) -> TreeBatch:
    """The tree with its sampled siblings' draw order reversed (what an order-blind rule sees alike)."""
    reversed_order = torch.where(tree.parents >= 0, tree.max_children - 1 - tree.draw_order, tree.draw_order)
    return attrs.evolve(tree, draw_order=reversed_order)


# ------------------------------------------------------------------ sparse laws, large vocabularies, sampling
def _assembled(vocab: int, expansion, top_k: int, mode: SampleMode, seed: int) -> DraftTree:
    """A static tree whose laws are random (their top ``top_k`` renormalised, or dense at 0:
    ``top_k`` below ``vocab`` leaves mass off every support), children drawn from them."""
    g = torch.Generator().manual_seed(seed)
    asm = TreeAssembler(int(torch.randint(vocab, (), generator=g)), vocab)
    frontier = [0]
    for k in expansion:
        new = []
        for node in frontier:
            q = torch.softmax(torch.randn(vocab, generator=g, dtype=F64) * 2, -1)
            if top_k:
                top = torch.topk(q, top_k)
                law = SparseLaw(top.indices, top.values / top.values.sum(), mode)
            else:
                law = SparseLaw.from_dense(q, mode)
            draws = torch.multinomial(law.probs, k, replacement=mode == SampleMode.IID, generator=g)
            new += [asm.add_sampled(node, int(law.indices[i]), law, 1.0) for i in draws.tolist()]
        frontier = new
    return asm.build()


def _logits_near(batch: TreeBatch, seed: int, equal: float = 0.0) -> torch.Tensor:
    """float32 logits whose law is near each node's proposal law on half the rows (a fraction
    ``equal`` of the rows: exactly that law, off its support nothing), random elsewhere."""
    g = torch.Generator().manual_seed(2000 + seed)
    B, n, V = batch.batch_size, batch.node_slots, batch.vocab_size
    q = torch.zeros(B, n, V, dtype=F64).scatter_add_(2, batch.law_ids.clamp_min(0),
                                                     batch.law_probs * (batch.law_ids >= 0))
    has_law = q.sum(-1, keepdim=True) > 0
    p = torch.softmax(torch.randn(B, n, V, generator=g, dtype=F64) * 2, -1)
    roll = torch.rand(B, n, 1, generator=g)
    p = torch.where(has_law & (roll < 0.5), 0.8 * q + 0.2 * p, p)
    p = torch.where(has_law & (roll < equal), q, p)
    return p.log().float()


def _compare_logits(trees, logits: torch.Tensor, u: torch.Tensor, sampling: SamplingConfig) -> tuple[int, int]:
    """(rows whose tensor-form decision differs from the walk's on process_logits' rows, rows that accepted)."""
    walk = get("verifier", "traversal")()
    got = decide_traversal_from_logits(TreeBatch.from_trees(trees), logits, u, sampling)
    differ = accepted = 0
    for b, tree in enumerate(trees):
        p = process_logits(logits[b, : tree.num_nodes], sampling, check=False)
        want = walk.verify(tree, p, TableRandom(u[b]))
        differ += not _same(got, b, want)
        accepted += want.num_accepted > 0
    assert not bool(got.bad_visited.any())
    return differ, accepted


@pytest.mark.parametrize("mode", [SampleMode.WITHOUT_REPLACEMENT, SampleMode.IID])
def test_sparse_laws_with_mass_off_their_supports_equal_the_walk(mode):
    """Supports of different widths (padded law slots, mass off every support), ragged batches,
    rows equal to the proposal law (a block update of mass 0) among them."""
    differ = accepted = 0
    for seed in range(12):
        trees = [_assembled(16, (3, 2, 2), 3 + (seed + j) % 9, mode, 10 * seed + j) for j in range(3)]
        batch = TreeBatch.from_trees(trees)
        logits = _logits_near(batch, seed, equal=0.25)
        u = torch.rand(3, batch.node_slots, batch.max_children + 1, generator=torch.Generator().manual_seed(seed), dtype=F64)
        d, a = _compare_logits(trees, logits, u, SamplingConfig(temperature=1.0))
        differ, accepted = differ + d, accepted + a
    assert differ == 0
    assert accepted > 8


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.7), SamplingConfig(temperature=1.3, top_k=5),
                                      SamplingConfig(temperature=0.9, top_p=0.8), SamplingConfig(temperature=0.0)],
                         ids=["T0.7", "top-k", "top-p", "greedy"])
def test_from_logits_equals_the_walk_on_the_processed_rows(sampling):
    """The rows processed as process_logits does (temperature, top-k, top-p; one-hot at T = 0)."""
    differ = 0
    for seed in range(8):
        trees = [_assembled(12, (3, 2), 0, SampleMode.WITHOUT_REPLACEMENT, 50 * seed + j) for j in range(2)]
        batch = TreeBatch.from_trees(trees)
        logits = _logits_near(batch, seed)
        u = torch.rand(2, batch.node_slots, batch.max_children + 1, generator=torch.Generator().manual_seed(seed), dtype=F64)
        differ += _compare_logits(trees, logits, u, sampling)[0]
    assert differ == 0


def test_large_vocabularies_in_the_reused_buffers_equal_the_walk():
    """Rows large enough for this thread's reused CPU buffers (specdec.verify.fast._WORKSPACE), dense and
    top-64 laws, shapes alternating between calls (a buffer from an earlier call never leaks into a later one)."""
    vocab = 1 << 16
    differ = accepted = 0
    for seed, (top_k, expansion) in enumerate([(0, (3, 2)), (64, (4, 2)), (0, (2, 2, 1)), (64, (3, 2)), (0, (3, 2))]):
        tree = _assembled(vocab, expansion, top_k, SampleMode.WITHOUT_REPLACEMENT, seed)
        logits = _logits_near(TreeBatch.from_trees([tree]), seed)
        u = torch.rand(1, tree.num_nodes, 5, generator=torch.Generator().manual_seed(seed), dtype=F64)
        d, a = _compare_logits([tree], logits, u[..., : TreeBatch.from_trees([tree]).max_children + 1],
                               SamplingConfig(temperature=1.0))
        differ, accepted = differ + d, accepted + a
    assert differ == 0
    assert accepted > 0


def test_a_residual_mass_without_its_clamp_is_caught_by_the_comparison(monkeypatch):
    """Power: the residual's mass summed without ``[.]+`` departs from the walk on sparse laws."""
    monkeypatch.setattr(traversal_tensor, "_residual_mass",
                        lambda S, Q, c, scratch: torch.addcmul(S, Q, c.unsqueeze(-1), value=-1.0).sum(dim=-1))
    with pytest.raises(AssertionError):
        test_sparse_laws_with_mass_off_their_supports_equal_the_walk(SampleMode.WITHOUT_REPLACEMENT)


# ------------------------------------------------------------------ bad rows
def test_bad_rows_are_flagged_where_the_walk_reads_them_only():
    """A row at a node of weight 0 (all ``-inf``: a grammar refused its token) is not read; the
    same row at the root, or at a node the walk enters that has children, is."""
    _, batch = _trees("static-wor", 3, 1)
    p, u = _inputs(batch, 3, zeros=0.0)
    logits = torch.log(p)
    refused = 1  # a child of the root with children of its own
    assert bool((batch.parents[0] == refused).any())
    logits[0, 0, int(batch.tokens[0, refused])] = float("-inf")  # the root's law refuses its token
    logits[0, refused] = float("-inf")  # and its own row has no allowed token
    sampling = SamplingConfig(temperature=1.0)
    walk = get("verifier", "traversal")()
    for seed in range(20):
        u = torch.rand(u.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
        got = decide_traversal_from_logits(batch, logits, u, sampling)
        assert not bool(got.bad_visited[0])
        assert refused not in got.accepted[0].tolist()
        want = walk.verify(batch.tree(0), torch.softmax(logits[0], -1), TableRandom(u[0]))
        assert _same(got, 0, want)
    for node in (0, refused):  # bad rows the walk does read: flagged
        bad = torch.log(p)
        bad[0, node] = float("nan")
        assert bool(decide_traversal_from_logits(batch, bad, u, sampling).bad_visited[0]), node


SMALL = {  # trees small enough to enumerate every draft draw and every verifier draw (V = 3)
    "static-wor": lambda: StaticTreeBuilder(expansion=(2, 1), mode="wor"),
    "static-iid": lambda: StaticTreeBuilder(expansion=(2, 1), mode="iid"),
    "sequoia": lambda: SequoiaTreeBuilder(num_nodes=4, max_depth=2, acceptance=(0.5, 0.25)),
}


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_exact_with_zero_weight_nodes_whose_rows_are_not_laws(kind):
    """The walk's law (exact enumeration, the tree drafted inside it) is the target's when drafted
    tokens have ``p = 0`` and those nodes' rows are NaN (never read): an order-1 target ``T[a]``
    after token ``a`` with zeros, the first two emitted tokens."""
    walk = get("verifier", "traversal")()
    v = 3
    g = torch.Generator().manual_seed(5)
    T = torch.softmax(torch.randn(v, v, generator=g, dtype=F64), -1)
    T[0, 2] = T[1, 0] = T[2, 1] = 0.0
    T = T / T.sum(-1, keepdim=True)
    root = 0

    def program(rng):
        draft = random_draft(v, 3)
        draft.begin([root])
        tree = build_tree(SMALL[kind](), root, draft, SamplingConfig(), rng)
        p = T[tree.tokens].clone()
        for i in range(1, tree.num_nodes):
            if float(T[int(tree.tokens[int(tree.parents[i])]), int(tree.tokens[i])]) == 0.0:
                p[i] = float("nan")  # a refused token: its row is no law
        return walk.verify(tree, p, rng).tokens[:2]

    law = exact_law(program)
    first: dict[int, float] = {}
    for seq, prob in law.items():
        first[seq[0]] = first.get(seq[0], 0.0) + prob
    assert max(abs(first.get(x, 0.0) - float(T[root, x])) for x in range(v)) < 1e-12
    for (a, b), prob in ((k, pr) for k, pr in law.items() if len(k) == 2):  # given the first, the second follows T
        both = sum(pr for k, pr in law.items() if len(k) == 2 and k[0] == a)
        assert abs(prob / both - float(T[a, b])) < 1e-9, (a, b)


# ------------------------------------------------------------------ the engine
def _models(vocab: int = 5):
    g = torch.Generator().manual_seed(7)
    target = torch.randn(vocab, vocab, generator=g, dtype=F64) * 1.5
    draft = target + torch.randn(vocab, vocab, generator=g, dtype=F64)
    return MarkovLM(target), MarkovLM(draft)


def test_the_engine_dispatches_traversal_to_its_tensor_form():
    traversal = get("verifier", "traversal")()
    t1 = SamplingConfig(temperature=1.0)
    chosen = choose_verification(traversal, t1, "auto", torch.device("cpu"))
    assert chosen.path == "tensor" and chosen.path_rule is not None and chosen.path_rule.form == "traversal"
    assert choose_verification(traversal, t1, "auto", torch.device("cpu"), draws_tables=False).path == "walk"
    with pytest.raises(InvalidConfigError, match="path-level rule .*traversal.* no fused kernel"):
        choose_verification(traversal, t1, "triton", torch.device("cpu"))


def _syncs_per_step(method: str, **options) -> float:
    target, draft = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, verifier="traversal", **options)
    sampling = specdec.SamplingConfig(temperature=1.0)
    gen.generate([1, 2], 6, sampling, seed=0)  # warm-up: per-shape constants are made once
    with StepCounter() as counter:
        out = gen.generate([1, 2], 24, sampling, seed=1)
    return counter.syncs / out.stats.steps


SEQUOIA = {"num_nodes": 12, "max_depth": 4, "acceptance": (0.5, 0.25, 0.1)}


@pytest.mark.parametrize("method,options", [("sequoia", SEQUOIA), ("specinfer", {"expansion": (3, 2, 1), "mode": "wor"})])
def test_a_traversal_step_reads_the_host_within_the_budget(method, options):
    assert _syncs_per_step(method, **options) <= BUDGET


def test_a_mixed_sampling_batch_reads_the_host_within_the_budget():
    """``generate_batch`` with one configuration per row: each group verified by traversal's tensor form
    (the rows' parameter tensors, made once per call, spread over the call's steps)."""
    target, draft = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sequoia", verifier="traversal", **SEQUOIA)
    mixed = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=3),
             SamplingConfig(temperature=1.0, top_p=0.9), SamplingConfig(temperature=0.5)]
    prompts = [[1, 2], [3], [0, 4, 1], [2, 2]]
    gen.generate_batch(prompts, 4, mixed, seeds=[0, 1, 2, 3])  # warm-up
    with StepCounter() as counter:
        out = gen.generate_batch(prompts, 64, mixed, seeds=[4, 5, 6, 7])
    assert counter.syncs / out.steps <= BUDGET, counter.report()


def test_the_counter_sees_the_walks_host_reads(monkeypatch):
    """Power: the same steps by the walk (no tensor form declared) read the host far more often."""
    monkeypatch.setattr(TraversalVerifier, "path_rule", None)
    assert _syncs_per_step("sequoia", **SEQUOIA) > 5 * BUDGET
