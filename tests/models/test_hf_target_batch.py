"""HFTarget in batch mode: ragged rows in one slab, one forward per step, per-row compaction (issue 15)."""

from __future__ import annotations

import random

import pytest
import torch
from hf_model_helpers import VOCAB, make_tiny_llama, plain_hidden, plain_logits, random_tree, tolerance
from test_hf_target import random_path

from specdec.targets.hf import HFTarget
from specdec.tree import DraftTree
from specdec.tree_batch import TreeBatch


def _accepted(paths: list[list[int]], depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    acc = torch.full((len(paths), depth), -1, dtype=torch.int64)
    for b, path in enumerate(paths):
        acc[b, : len(path)] = torch.tensor(path, dtype=torch.int64)
    return acc, torch.tensor([len(p) for p in paths], dtype=torch.int64)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_ragged_rows_score_like_one_row_each_and_stay_exact_after_many_steps(impl):
    """Rows of different lengths scored together: every row's tree logits equal
    a batch-1 target's on the same tree, and after many ragged acceptances (and
    a row leaving the batch) every row's next logits equal a fresh forward of
    its committed text; hidden states too."""
    torch.manual_seed(0)
    model = make_tiny_llama(impl, torch.float64, layers=2)
    tol = tolerance(torch.float64)
    rng = random.Random(0)
    prompts = [[3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18]]
    batch = HFTarget(model, capture_layers=(1, 2))
    batch.prefill_batch(prompts)
    singles = []
    for p in prompts:
        t = HFTarget(model)
        t.prefill(p)
        singles.append(t)
    rows = list(range(len(prompts)))  # which original row each batch row is
    for step in range(8):
        if step == 5:  # row 1 finishes and leaves the batch
            batch.keep_rows([0, 2])
            rows = [0, 2]
        trees = [random_tree(rng, batch.committed_rows[b][-1], rng.randint(0, 9)) for b in range(len(rows))]
        tb = TreeBatch.from_trees(trees, max_depth=max(1, *(int(t.depths.max()) for t in trees)))
        logits = batch.score_batch(tb)  # [B, n, V]
        assert logits.shape == (len(rows), tb.node_slots, VOCAB)
        hidden = batch.hidden_states()
        paths = []
        for b, r in enumerate(rows):
            n = trees[b].num_nodes
            want = singles[r].score_tree(trees[b])
            assert float((logits[b, :n].double() - want.double()).abs().max()) < tol
            context = list(batch.committed_rows[b])
            path = random_path(rng, trees[b])
            node = path[-1] if path else 0
            seq = context + [int(trees[b].tokens[i]) for i in path]
            assert float((hidden[b, node, 1] - plain_hidden(model, seq)[2][-1]).abs().max()) < tol
            paths.append(path)
        acc, num = _accepted(paths, tb.max_depth)
        emitted = []
        for b, r in enumerate(rows):
            bonus = rng.randrange(VOCAB)
            tokens = [int(trees[b].tokens[i]) for i in paths[b]] + [bonus]
            singles[r].accept(paths[b], bonus)
            emitted.append(tokens)
        batch.accept_rows(acc, num, emitted)
        for b, r in enumerate(rows):
            assert batch.committed_rows[b] == singles[r].committed_tokens
    roots = [DraftTree.chain(batch.committed_rows[b][-1], [], [], vocab_size=VOCAB) for b in range(len(rows))]
    last = batch.score_batch(TreeBatch.from_trees(roots, max_depth=1))
    for b in range(len(rows)):
        want = plain_logits(model, list(batch.committed_rows[b]))
        assert float((last[b, 0].double() - want).abs().max()) < tol


def test_batch_mode_bad_input():
    model = make_tiny_llama("sdpa", torch.float64)
    t = HFTarget(model)
    with pytest.raises(ValueError, match="at least one prompt"):
        t.prefill_batch([])
    with pytest.raises(ValueError, match="outside"):
        t.prefill_batch([[1, 2], [VOCAB]])
    t.prefill_batch([[1, 2], [3]])
    assert t.batch_size == 2
    one = TreeBatch.from_trees([DraftTree.chain(2, [], [], vocab_size=VOCAB)], max_depth=1)
    with pytest.raises(ValueError, match="a batch of 1 trees for 2 rows"):
        t.score_batch(one)
    with pytest.raises(RuntimeError, match="before a batch of trees"):
        t.accept_rows(torch.full((2, 1), -1), torch.zeros(2, dtype=torch.int64), [[1], [2]])
    with pytest.raises(ValueError, match="keep_rows"):
        t.keep_rows([0, 0])
    t.prefill([1, 2, 3])  # back to one row
    assert t.batch_size == 1
    with pytest.raises(ValueError, match="prefill_batch"):
        t.score_batch(TreeBatch.from_trees([DraftTree.chain(3, [], [], vocab_size=VOCAB)] * 2, max_depth=1))
