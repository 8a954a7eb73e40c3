"""Block verification's tensor form (specdec.verify.fast_block) against its walk (BlockVerifier).

- With a source that replays the uniform table (``TableRandom``: node ``i``'s ``t``-th draw
  is ``u[i, t]``), the tensor form and the walk make the same decisions on chains drawn
  by ``ChainTreeBuilder`` from random drafts, alone and as ragged batches of chains of
  different depths (float64 rows: a uniform within rounding of a threshold is a 1e-16 event).
- Power: the same comparison fails when the stop probability loses its normaliser.
- Bad rows: flagged where the chain reads them, not elsewhere.
- The engine: ``block`` is dispatched to its tensor form (``kernel="torch"`` / ``"auto"``),
  ``kernel="triton"`` is refused by name, and a step reads the host at most
  ``BUDGET`` times (counted; ``traversal``'s walk on the same chains reads more).
  Its law through the engine is the conformance suites' (``test_traversal.py``:
  ``statistical`` and ``greedy`` run ``generate_batch``, which now takes this path).
"""

from __future__ import annotations

import pytest
import torch

import specdec
import specdec.verify.fast_block as fast_block
from specdec.engine.dispatch import choose_verification
from specdec.errors import InvalidConfigError
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, row_is_bad
from specdec.testing import MarkovLM
from specdec.testing.counter import StepCounter
from specdec.tree_batch import TreeBatch
from specdec.trees.chain import ChainTreeBuilder
from specdec.verify.fast_block import chain_slots, decide_block_batch
from specdec.verify.traversal import TraversalVerifier

from test_verify_fast import TableRandom, random_draft
from specdec.trees import build_tree

F64 = torch.float64
BUDGET = 4


def _chains(seed: int, depths: list[int], vocab: int = 6):
    trees = []
    for j, depth in enumerate(depths):
        draft = random_draft(vocab, (seed + j) % 7)
        draft.begin([(seed + j) % vocab])
        trees.append(build_tree(ChainTreeBuilder(depth=depth), (seed + j) % vocab, draft, SamplingConfig(),
                                                         TorchRandom.seeded(100 * seed + j)))
    batch = TreeBatch.from_trees(trees, max_children=1, max_depth=max(depths))
    return trees, batch


def _inputs(batch: TreeBatch, seed: int, vocab: int = 6):
    """``p`` near each node's proposal law on half the rows (so that paths are accepted and
    weights stay at 1), random elsewhere; some zeros."""
    g = torch.Generator().manual_seed(1000 + seed)
    B, n = batch.batch_size, batch.node_slots
    p = torch.softmax(torch.randn(B, n, vocab, generator=g, dtype=F64) * 2, -1)
    q = torch.zeros(B, n, vocab, dtype=F64).scatter_add_(2, batch.law_ids.clamp_min(0),
                                                        batch.law_probs * (batch.law_ids >= 0))
    near = (torch.rand(B, n, 1, generator=g) < 0.5) & (q.sum(-1, keepdim=True) > 0)
    p = torch.where(near, 0.8 * q + 0.2 * p, p)
    p[torch.rand(B, n, generator=g) < 0.2, 0] = 0.0
    p = p / p.sum(-1, keepdim=True)
    u = torch.rand(B, n, batch.max_children + 1, generator=g, dtype=F64)
    return p, u


def _compare(seeds, depths_of, decide=decide_block_batch) -> tuple[int, int]:
    """(rows that differ from the walk, rows that accepted something)."""
    verifier = get("verifier", "block")()
    differ = accepted = 0
    for seed in seeds:
        depths = depths_of(seed)
        trees, batch = _chains(seed, depths)
        p, u = _inputs(batch, seed)
        got = decide(batch, p, u)
        for b, tree in enumerate(trees):
            want = verifier.verify(tree, p[b, : tree.num_nodes], TableRandom(u[b]))
            k = int(got.num_accepted[b])
            same = (tuple(got.accepted[b, :k].tolist()) == want.accepted_nodes
                    and tuple(got.tokens[b, : k + 1].tolist()) == want.tokens
                    and int(got.attempted[b]) == want.attempted_depths
                    and int(got.bonus[b]) == want.tokens[-1]
                    and int(got.stop[b]) == (want.accepted_nodes[-1] if want.accepted_nodes else 0))
            differ += not same
            accepted += k > 0
    return differ, accepted


def test_tensor_form_equals_the_walk_on_single_chains():
    differ, accepted = _compare(range(80), lambda seed: [1 + seed % 5])
    assert differ == 0
    assert accepted > 20


def test_tensor_form_equals_the_walk_on_ragged_batches():
    differ, accepted = _compare(range(30), lambda seed: [1 + (seed + j) % 5 for j in range(4)])
    assert differ == 0
    assert accepted > 30


def test_a_missing_normaliser_is_caught_by_the_comparison(monkeypatch):
    """Power: ``h = rho`` instead of ``rho / (rho + 1 - w)`` departs from the walk."""
    monkeypatch.setattr(fast_block, "stop_probabilities", lambda rho, w: rho.clamp_max(1.0))
    differ, _ = _compare(range(40), lambda seed: [2 + seed % 4])
    assert differ > 0


def test_chain_slots_follow_depths():
    trees, batch = _chains(3, [3, 1])
    slots, g = chain_slots(batch)
    assert g.tolist() == [3, 1]
    for b, tree in enumerate(trees):
        node, path = 0, [0]
        while tree.children(node):
            node = tree.children(node)[0]
            path.append(node)
        assert slots[b, : len(path)].tolist() == path
        assert (slots[b, len(path):] == -1).all()


def test_bad_rows_are_flagged_only_on_the_chain():
    trees, batch = _chains(5, [2, 3])
    p, u = _inputs(batch, 5)
    logits = torch.log(p)
    logits[0, 1] = float("nan")  # row 0's chain reads node 1
    logits[1, batch.node_slots - 1] = float("nan") if int(batch.num_nodes[1]) < batch.node_slots else logits[1, -1]
    decision = decide_block_batch(batch, p, u, row_is_bad(logits))
    assert decision.bad_visited.tolist() == [True, False]


# ------------------------------------------------------------------ the engine
def _models(vocab: int = 5):
    g = torch.Generator().manual_seed(7)
    target = torch.randn(vocab, vocab, generator=g, dtype=F64) * 1.5
    draft = target + torch.randn(vocab, vocab, generator=g, dtype=F64)
    return MarkovLM(target), MarkovLM(draft)


def test_the_engine_dispatches_block_to_its_tensor_form():
    block, traversal = get("verifier", "block")(), get("verifier", "traversal")()
    t1 = SamplingConfig(temperature=1.0)
    chosen = choose_verification(block, t1, "auto", torch.device("cpu"))
    assert chosen.path == "tensor" and chosen.path_rule is not None and chosen.path_rule.form == "block"
    assert choose_verification(block, t1, "torch", torch.device("cpu")).path == "tensor"
    assert choose_verification(traversal, t1, "auto", torch.device("cpu")).path_rule.form == "traversal"
    assert choose_verification(block, t1, "auto", torch.device("cpu"), draws_tables=False).path == "walk"
    with pytest.raises(InvalidConfigError, match="path-level rule .*block.* no fused kernel"):
        choose_verification(block, t1, "triton", torch.device("cpu"))


def test_a_subclass_that_changes_the_rule_runs_its_walk():
    class Changed(get("verifier", "block")):
        pass

    assert Changed.path_rule is None
    assert choose_verification(Changed(), SamplingConfig(temperature=1.0), "auto", torch.device("cpu")).path == "walk"


def _syncs_per_step(verifier: str) -> float:
    target, draft = _models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd", verifier=verifier, depth=4)
    sampling = specdec.SamplingConfig(temperature=1.0)
    gen.generate([1, 2], 6, sampling, seed=0)  # warm-up: per-shape constants are made once
    with StepCounter() as counter:
        out = gen.generate([1, 2], 24, sampling, seed=1)
    return counter.syncs / out.stats.steps


def test_a_block_step_reads_the_host_within_the_budget_and_less_than_the_walk(monkeypatch):
    block = _syncs_per_step("block")
    monkeypatch.setattr(TraversalVerifier, "path_rule", None)  # traversal's walk on the same chains
    walk = _syncs_per_step("traversal")
    assert block <= BUDGET, block
    assert walk > block, (walk, block)
