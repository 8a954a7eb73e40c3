"""Issue 57, items 9 to 12: bad input enters nowhere unchecked.

Each case is refused where the value enters, by a library error naming the argument:
EOS ids outside the target's vocabulary; a ``CallableLM`` returning non-floating logits;
layout inputs (prefix lengths, ``max_prefix``, ``num_accepted``); ``TreeFeed`` roots and
``DraftSpec``; proposal vocabularies (``HFDraft(proposal_ids=...)``, ``proposal_ids.json``).
"""

from __future__ import annotations

import json

import pytest
import torch

import specdec
from specdec import SamplingConfig
from specdec.batch import autoregressive_generate_batch
from specdec.drafts.eagle.checkpoint_config import CheckpointError
from specdec.drafts.eagle.checkpoint_draft_lm import PROPOSAL_IDS_FILE, draft_lm_proposal_ids
from specdec.drafts.hf import HFDraft
from specdec.engine.layouts import kv_compaction, sdpa_mask, tree_positions
from specdec.errors import InvalidConfigError, InvalidDistributionError
from specdec.inputs import as_eos_ids
from specdec.models import CallableLM
from specdec.rng import TorchRandom
from specdec.tree_batch import TreeBatch
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.feed import DraftSpec, TreeFeed
from specdec.trees.static import StaticTreeBuilder
from specdec.trees import build_tree

V = 32
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(57))


def table_lm() -> CallableLM:
    return CallableLM(lambda prefixes: TABLE[[p[-1] for p in prefixes]], vocab_size=V)


# ------------------------------------------------------------------ item 9: EOS ids
@pytest.mark.parametrize("eos", [-1, 99, V, [3, 99], torch.tensor([1, -2])])
def test_eos_ids_outside_the_vocabulary_are_refused(eos):
    lm = table_lm()
    gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method="sd")
    with pytest.raises(InvalidConfigError, match=rf"eos_token_id .*outside the target's vocabulary \[0, {V}\)"):
        gen.generate([1, 2], 4, SamplingConfig(temperature=1.0), seed=0, eos_token_id=eos)
    with pytest.raises(InvalidConfigError, match="eos_token_id"):
        list(gen.stream([1, 2], 4, SamplingConfig(temperature=1.0), seed=0, eos_token_id=eos))
    with pytest.raises(InvalidConfigError, match="eos_token_id"):
        specdec.autoregressive_generate(lm, [1, 2], 4, SamplingConfig(temperature=1.0), seed=0, eos_token_id=eos)
    with pytest.raises(InvalidConfigError, match="eos_token_id"):
        gen.generate_batch([[1, 2], [3]], 4, SamplingConfig(temperature=1.0), seeds=[0, 1], eos_token_id=eos)
    with pytest.raises(InvalidConfigError, match="eos_token_id"):
        autoregressive_generate_batch(lm, [[1, 2], [3]], 4, SamplingConfig(temperature=1.0), eos_token_id=eos)


def test_eos_ids_inside_the_vocabulary_still_stop():
    lm = table_lm()
    free = specdec.autoregressive_generate(lm, [1], 12, SamplingConfig(temperature=1.0), seed=3)
    eos = free.tokens[4]
    out = specdec.autoregressive_generate(lm, [1], 12, SamplingConfig(temperature=1.0), seed=3, eos_token_id=[eos, V - 1])
    assert out.stop_reason == "eos" and out.tokens[-1] == eos
    assert as_eos_ids([0, V - 1], vocab_size=V) == {0, V - 1}
    with pytest.raises(InvalidConfigError, match=r"eos_token_id -1 .*\[0, 8\)"):
        as_eos_ids([2, -1], vocab_size=8)


# ------------------------------------------------------------------ item 10: CallableLM dtypes
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_callable_lm_refuses_non_floating_logits(dtype):
    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 4, dtype=dtype), vocab_size=4)
    lm.begin([0])
    with pytest.raises(InvalidDistributionError, match=rf"CallableLM fn returned {dtype} .*floating"):
        lm.root_logits()
    with pytest.raises(InvalidDistributionError, match="CallableLM fn"):
        specdec.autoregressive_generate(lm, [0], 2, SamplingConfig(temperature=1.0), seed=0)


def test_callable_lm_float_logits_pass():
    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 4, dtype=torch.float16), vocab_size=4)
    lm.begin([0])
    assert lm.root_logits().dtype == torch.float16


# ------------------------------------------------------------------ item 11: layouts, TreeFeed
def two_row_tree() -> TreeBatch:
    draft = table_lm()
    builder = StaticTreeBuilder(expansion=(2, 1))
    trees = []
    for b, root in enumerate([3, 5]):
        draft.begin([root])
        trees.append(build_tree(builder, root, draft, SamplingConfig(temperature=1.0), TorchRandom.seeded(b)))
    return TreeBatch.from_trees(trees, max_children=builder.max_nodes, max_depth=builder.max_depth)


def test_sdpa_mask_refuses_a_max_prefix_below_a_prefix():
    tree = two_row_tree()
    with pytest.raises(InvalidConfigError, match=r"max_prefix 4 .*prefix_lens\[0\] = 10"):
        sdpa_mask(tree, [10, 3], max_prefix=4)
    with pytest.raises(InvalidConfigError, match=r"max_prefix 4 .*prefix_lens\[0\] = 10"):
        sdpa_mask(tree, torch.tensor([10, 3]), max_prefix=4)
    for bad in (-1, 2.5, True):
        with pytest.raises(InvalidConfigError, match="max_prefix"):
            sdpa_mask(tree, [1, 0], max_prefix=bad)
    assert sdpa_mask(tree, [10, 3], max_prefix=10).shape == (2, 1, tree.node_slots, 10 + tree.node_slots)


@pytest.mark.parametrize("prefix", [[4, -1], torch.tensor([4, -1]), [1.5, 2], torch.tensor([1.0, 2.0]), [True, 2]])
def test_layouts_refuse_bad_prefix_lengths(prefix):
    tree = two_row_tree()
    for call in (lambda: tree_positions(tree, prefix), lambda: sdpa_mask(tree, prefix, max_prefix=8),
                 lambda: kv_compaction(torch.zeros(2, 2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), prefix)):
        with pytest.raises(InvalidConfigError, match="prefix_lens"):
            call()


def test_kv_compaction_refuses_num_accepted_outside_the_depth():
    accepted = torch.tensor([[1, 3], [2, -1]])
    for num in ([3, 1], [1, -1]):
        with pytest.raises(InvalidConfigError, match=r"num_accepted\[\d\] = (3|-1) .*\[0, 2\]"):
            kv_compaction(accepted, torch.tensor(num), [5, 7])
    with pytest.raises(InvalidConfigError, match="num_accepted"):
        kv_compaction(accepted, torch.tensor([1.0, 1.0]), [5, 7])
    with pytest.raises(InvalidConfigError, match="num_accepted"):
        kv_compaction(accepted, torch.tensor([1, 1, 1]), [5, 7])
    moves = kv_compaction(accepted, torch.tensor([2, 1]), [5, 7])
    assert moves.kv_lens.tolist() == [8, 9] and moves.src.tolist() == [[6, 8], [9, -1]]


@pytest.mark.parametrize("roots", [torch.tensor([3, V]), torch.tensor([-1, 2])])
def test_tree_feed_refuses_roots_outside_the_vocabulary(roots):
    with pytest.raises(InvalidConfigError, match=rf"roots\[\d\] = (-1|{V}) outside the vocabulary \[0, {V}\)"):
        TreeFeed(ChainTreeBuilder(depth=2), roots, SamplingConfig(temperature=1.0), TorchRandom.seeded(0), DraftSpec(V))


@pytest.mark.parametrize("size", [0, -3, 2.0, True, "32"])
def test_draft_spec_refuses_a_vocabulary_that_is_not_a_positive_int(size):
    with pytest.raises(InvalidConfigError, match="DraftSpec vocab_size"):
        DraftSpec(size)


@pytest.mark.parametrize("ids", [torch.tensor([1.0, 2.0]), torch.tensor([[1, 2]]), torch.tensor([], dtype=torch.int64),
                                 torch.arange(V + 1), [1, 2]])
def test_draft_spec_refuses_proposal_ids_that_are_not_a_1d_int_tensor(ids):
    with pytest.raises(InvalidConfigError, match="DraftSpec proposal_ids"):
        DraftSpec(V, proposal_ids=ids)


@pytest.mark.parametrize("ids", [torch.tensor([2, 1]), torch.tensor([1, 1]), torch.tensor([0, V]), torch.tensor([-1, 3])])
def test_tree_feed_refuses_proposal_ids_out_of_order_or_range(ids):
    with pytest.raises(InvalidConfigError, match=rf"DraftSpec proposal_ids must be distinct ascending ids in \[0, {V}\)"):
        TreeFeed(ChainTreeBuilder(depth=2), torch.tensor([3]), SamplingConfig(temperature=1.0), TorchRandom.seeded(0),
                 DraftSpec(V, proposal_ids=ids))


def test_draft_spec_of_a_draft_still_works():
    spec = DraftSpec(V, proposal_ids=torch.tensor([0, 4, 9]))
    assert spec.proposal_ids is not None and spec.proposal_ids.tolist() == [0, 4, 9]
    assert DraftSpec.of(table_lm()).vocab_size == V


# ------------------------------------------------------------------ item 12: proposal ids
@pytest.mark.parametrize("ids", [[1.7, 2.2, 5.9], [[1, 2], [3, 4]], [1, True], "123", {"ids": [1]}])
def test_proposal_ids_json_is_read_strictly(tmp_path, ids):
    (tmp_path / PROPOSAL_IDS_FILE).write_text(json.dumps({"ids": ids}))
    with pytest.raises(CheckpointError, match=rf"{PROPOSAL_IDS_FILE}.*ids"):
        draft_lm_proposal_ids(tmp_path)


def test_proposal_ids_json_with_ints_loads(tmp_path):
    (tmp_path / PROPOSAL_IDS_FILE).write_text(json.dumps({"ids": [1, 2, 5]}))
    ids = draft_lm_proposal_ids(tmp_path)
    assert ids is not None and ids.dtype == torch.int64 and ids.tolist() == [1, 2, 5]


@pytest.fixture(scope="module")
def tiny_lm():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("ids", [[[1, 2], [3, 4]], torch.tensor([[1, 2], [3, 4]]), [1.7, 2.2, 5.9],
                                 torch.tensor([1.0, 2.0]), [0, True, 5]])
def test_hf_draft_refuses_proposal_ids_that_are_not_a_flat_int_list(tiny_lm, ids):
    with pytest.raises(InvalidConfigError, match="proposal_ids"):
        HFDraft(tiny_lm, proposal_ids=ids, cpu_linear=False)


def test_hf_draft_takes_a_flat_int_list_or_tensor(tiny_lm):
    for ids in ([1, 2, 5], torch.tensor([1, 2, 5], dtype=torch.int32)):
        spec = HFDraft(tiny_lm, proposal_ids=ids, cpu_linear=False).proposal_ids
        assert spec is not None and spec.dtype == torch.int64 and spec.tolist() == [1, 2, 5]
