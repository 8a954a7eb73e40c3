"""Engine layouts (specdec.engine.layouts) against a plain per-path reference built from each row's host tree.

Trees of every kind the builders make (EAGLE dynamic, RheoSampling mixed, SpecInfer static
i.i.d. and without replacement, chains), batched ragged (different node counts and
prefix lengths), padding slots included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.engine.layouts import (
    flashinfer_mask,
    kv_compaction,
    pack_bits,
    retrieve_arrays,
    sdpa_mask,
    tree_positions,
)
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.dynamic import EagleTreeBuilder
from specdec.trees.rheo import RheoTreeBuilder
from specdec.trees.static import StaticTreeBuilder
from specdec.trees import build_tree

VOCAB = 7
BUILDERS = {
    "eagle": EagleTreeBuilder(K=3, B=2, depth=3, N=8),
    "rheo": RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=8, M=6),
    "static-iid": StaticTreeBuilder(expansion=(3, 2), mode="iid"),
    "static-wor": StaticTreeBuilder(expansion=(3, 2), mode="wor"),
    "chain": ChainTreeBuilder(depth=4),
}
KINDS = sorted(BUILDERS) + ["ragged"]


def _draft(seed: int) -> CallableLM:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(VOCAB, VOCAB, generator=g, dtype=torch.float64) * 1.5
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=VOCAB)


def _batch(name: str, rows: int = 3):
    """Three rows of one builder's trees, or ("ragged") of three builders: 9, 5 and 10 nodes."""
    names = ["eagle", "chain", "static-iid"] if name == "ragged" else [name] * rows
    trees = []
    for b, row_name in enumerate(names):
        draft = _draft(b)
        draft.begin([b % VOCAB])
        trees.append(build_tree(BUILDERS[row_name], b % VOCAB, draft, SamplingConfig(temperature=1.0), TorchRandom.seeded(10 + b)))
    builders = [BUILDERS[x] for x in names]
    batch = TreeBatch.from_trees(trees, max_children=max(x.max_nodes for x in builders),
                                 max_depth=max(x.max_depth for x in builders))
    return trees, batch


def _path(tree, i: int) -> list[int]:
    path = [i]
    while int(tree.parents[path[-1]]) >= 0:
        path.append(int(tree.parents[path[-1]]))
    return path


PREFIXES = [5, 0, 9]


@pytest.mark.parametrize("name", KINDS)
def test_positions_and_sdpa_mask_equal_the_per_path_reference(name):
    trees, batch = _batch(name)
    positions = tree_positions(batch, PREFIXES)
    mask = sdpa_mask(batch, torch.tensor(PREFIXES))
    P, n = max(PREFIXES), batch.node_slots
    assert mask.shape == (3, 1, n, P + n)
    for b, tree in enumerate(trees):
        for i in range(n):
            if i < tree.num_nodes:
                path = _path(tree, i)
                assert int(positions[b, i]) == PREFIXES[b] + len(path) - 1
                want = [c < PREFIXES[b] for c in range(P)] + [j in path for j in range(n)]
            else:  # padding: itself only
                want = [False] * P + [j == i for j in range(n)]
            got = (mask[b, 0, i] == 0).tolist()
            assert got == want, (name, b, i)
            assert not bool(torch.isnan(mask[b, 0, i]).any())


def test_sdpa_mask_gives_the_attention_of_each_path_alone():
    """The mask in scaled_dot_product_attention: each node's output equals attention over
    exactly its prefix and path, computed one node at a time."""
    trees, batch = _batch("ragged")
    assert sorted({t.num_nodes for t in trees}) == sorted(t.num_nodes for t in trees)  # three sizes
    g = torch.Generator().manual_seed(0)
    P, n, H, E = max(PREFIXES), batch.node_slots, 2, 4
    q = torch.randn(3, H, n, E, generator=g, dtype=torch.float64)
    k = torch.randn(3, H, P + n, E, generator=g, dtype=torch.float64)
    v = torch.randn(3, H, P + n, E, generator=g, dtype=torch.float64)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask(batch, PREFIXES, dtype=torch.float64))
    for b, tree in enumerate(trees):
        for i in range(tree.num_nodes):
            cols = list(range(PREFIXES[b])) + [P + j for j in sorted(_path(tree, i))]
            ref = torch.nn.functional.scaled_dot_product_attention(q[b, :, i:i + 1], k[b][:, cols], v[b][:, cols])
            torch.testing.assert_close(out[b, :, i:i + 1], ref)


@pytest.mark.parametrize("name", KINDS)
def test_flashinfer_mask_equals_the_per_path_reference(name):
    trees, batch = _batch(name)
    fm = flashinfer_mask(batch, PREFIXES)
    qo, offsets, bits, queries = [0], [0], [], []
    for b, tree in enumerate(trees):
        kv = PREFIXES[b] + tree.num_nodes
        qo.append(qo[-1] + tree.num_nodes)
        row = []
        for i in range(tree.num_nodes):
            path = _path(tree, i)
            row += [c < PREFIXES[b] or (c - PREFIXES[b]) in path for c in range(kv)]
            queries.append(i)
        bits += row
        packed = np.packbits(np.array(row, dtype=bool), bitorder="little")
        offsets.append(offsets[-1] + packed.size)
        assert fm.packed[offsets[-2]: offsets[-1]].tolist() == packed.tolist()
        assert int(fm.kv_lens[b]) == kv
    assert fm.qo_indptr.tolist() == qo
    assert fm.mask.tolist() == bits
    assert fm.mask_indptr.tolist() == offsets
    assert fm.query_slots.tolist() == queries


def test_pack_bits_is_numpys_little_bit_order():
    g = torch.Generator().manual_seed(3)
    for size in (0, 1, 7, 8, 9, 61):
        bits = torch.rand(size, generator=g) < 0.5
        assert pack_bits(bits).tolist() == np.packbits(bits.numpy(), bitorder="little").tolist()


@pytest.mark.parametrize("name", KINDS)
def test_retrieve_arrays_equal_the_per_node_reference(name):
    trees, batch = _batch(name)
    ra = retrieve_arrays(batch)
    n = batch.node_slots
    for b, tree in enumerate(trees):
        for i in range(n):
            if i >= tree.num_nodes:
                assert (int(ra.retrieve_index[b, i]), int(ra.next_token[b, i]), int(ra.next_sibling[b, i])) == (-1, -1, -1)
                continue
            kids = sorted(j for j in range(tree.num_nodes) if int(tree.parents[j]) == i)
            assert int(ra.retrieve_index[b, i]) == b * n + i
            assert int(ra.next_token[b, i]) == (kids[0] if kids else -1)
            parent = int(tree.parents[i])
            later = sorted(j for j in range(tree.num_nodes) if parent >= 0 and int(tree.parents[j]) == parent and j > i)
            assert int(ra.next_sibling[b, i]) == (later[0] if later else -1)


def test_a_walk_over_the_retrieve_arrays_visits_every_node_once():
    trees, batch = _batch("rheo")
    ra = retrieve_arrays(batch)
    for b, tree in enumerate(trees):
        seen, stack = [], [0]
        while stack:
            node = stack.pop()
            seen.append(node)
            child = int(ra.next_token[b, node])
            while child >= 0:
                stack.append(child)
                child = int(ra.next_sibling[b, child])
        assert sorted(seen) == list(range(tree.num_nodes))


def test_kv_compaction_keeps_the_accepted_path():
    accepted = torch.tensor([[2, 5, -1], [-1, -1, -1], [1, 3, 4]])
    num = torch.tensor([2, 0, 3])
    kv = kv_compaction(accepted, num, PREFIXES)
    assert kv.src.tolist() == [[7, 10, -1], [-1, -1, -1], [10, 12, 13]]
    assert kv.dst.tolist() == [[6, 7, -1], [-1, -1, -1], [10, 11, 12]]
    assert kv.kv_lens.tolist() == [8, 1, 13]
    src, dst, cu = kv.flat()
    assert src.tolist() == [7, 10, 10, 12, 13] and dst.tolist() == [6, 7, 10, 11, 12] and cu.tolist() == [0, 2, 2, 5]


def test_bad_prefix_lengths_are_refused():
    _, batch = _batch("chain")
    with pytest.raises(InvalidConfigError, match="prefix_lens has 2 entries for a tree batch of 3 rows"):
        tree_positions(batch, [1, 2])
    with pytest.raises(InvalidConfigError, match="2 entries for 3 verified rows"):
        kv_compaction(torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), [1, 2])
