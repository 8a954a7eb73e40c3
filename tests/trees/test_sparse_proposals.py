"""Sparse proposals for the shaped builders (``proposal_top_k``; issue 45, item 5).

- ``truncate_proposal``: the top ``k`` by probability, ties by the lower column, returned in
  ascending column order and renormalised; ``k >= W`` keeps every column; zeros marked ``-1``.
- A static / Sequoia / chain tree (the confidence-stopped chain too) with ``proposal_top_k = k`` records ``[n, k]`` laws (not ``[n, V]``),
  every child is among its parent's top ``k`` draft tokens, and the recorded law is the
  truncated law the child was drawn from (``[n, k]`` end to end, verifiable as it is).
- The tensor build equals the host reference draw for draw (``tests/trees/test_levelwise.py``,
  STATIC_CASES), and the option's example sets are proven exact by whole-tree enumeration with
  every registered builder (``example_options``: ``tests/trees/test_exact_trees.py``).
- Bad values are refused by name.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.sequoia import SequoiaTreeBuilder
from specdec.trees.static import StaticTreeBuilder, truncate_proposal
from specdec.trees import build_trees

F64 = torch.float64


def test_truncation_keeps_the_top_k_with_ties_by_the_lower_column():
    q = torch.tensor([[0.1, 0.3, 0.3, 0.3], [0.5, 0.0, 0.5, 0.0]], dtype=F64)
    cols, probs = truncate_proposal(q, 2)
    assert cols.tolist() == [[1, 2], [0, 2]]
    assert torch.allclose(probs, torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=F64))
    cols, probs = truncate_proposal(q, 9)  # every column; the zeros marked -1
    assert cols.tolist() == [[0, 1, 2, 3], [0, -1, 2, -1]]
    assert torch.equal(probs, q)


def _draft(vocab: int) -> CallableLM:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(vocab, vocab, generator=g, dtype=F64) * 2
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab)


@pytest.mark.parametrize("builder", [StaticTreeBuilder(expansion=(3, 2), mode="iid", proposal_top_k=4),
                                     StaticTreeBuilder(expansion=(3, 2), mode="wor", proposal_top_k=4),
                                     SequoiaTreeBuilder(num_nodes=6, max_depth=2, acceptance=(0.6, 0.3), proposal_top_k=4),
                                     ChainTreeBuilder(depth=3, proposal_top_k=4),
                                     ChainTreeBuilder(depth=3, confidence=0.05, proposal_top_k=4)])
def test_trees_record_sparse_laws_of_their_top_k(builder):
    vocab, sampling = 50, SamplingConfig(temperature=1.0)
    draft = _draft(vocab)
    for seed in range(5):
        draft.begin([seed, seed + 1])
        batch = build_trees(builder, seed + 1, draft, sampling, TorchRandom.seeded(seed))
        assert batch.law_probs.shape[-1] == 4 and batch.law_ids.shape[-1] == 4
        tree = batch.tree(0)
        for node in range(tree.num_nodes):
            children = tree.children(node)
            if not children:
                continue
            token = int(tree.tokens[node])
            q = process_logits(draft.fn([[token]])[0], sampling)  # the node's draft law (order 1)
            top = set(torch.sort(q, descending=True, stable=True).indices[:4].tolist())
            law = tree.law_of(children[0])
            assert set(law.indices.tolist()) == top
            assert abs(float(law.probs.sum()) - 1.0) < 1e-12
            assert all(int(tree.tokens[c]) in top for c in children)


def test_a_sparse_specinfer_generates_through_the_engine():
    target = _draft(30)
    gen = specdec.SpeculativeGenerator(target=target, draft=_draft(30), method="specinfer", expansion=(3, 2),
                                       proposal_top_k=5)
    out = gen.generate([1, 2], 12, SamplingConfig(temperature=1.0), seed=0)
    assert len(out.tokens) == 12


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True])
def test_bad_values_are_refused(bad):
    with pytest.raises(InvalidConfigError, match="proposal_top_k must be an int"):
        StaticTreeBuilder(proposal_top_k=bad)
    with pytest.raises(InvalidConfigError, match="proposal_top_k must be an int"):
        SequoiaTreeBuilder(proposal_top_k=bad)
    with pytest.raises(InvalidConfigError, match="proposal_top_k must be an int"):
        ChainTreeBuilder(proposal_top_k=bad)
