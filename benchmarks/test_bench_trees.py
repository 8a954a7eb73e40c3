"""Tree-builder overhead outside the model (pytest-benchmark).

The draft is a :class:`~specdec.models.CallableLM` returning precomputed
random logits at a real vocabulary size (V = 49152, SmolLM2's), so the time
measured is the builder's own work plus the draft-side
:func:`~specdec.sampling.process_logits` of each level (which every draft
pays), not a network forward. Budgets are EAGLE-2's defaults: K = 10, depth 6,
N = 60 (B = K), and Rheo's sparse draft M = 64.

Measured single-threaded (``torch.set_num_threads(1)``): the builder's work is
Python bookkeeping plus small torch ops, for which intra-op threads only add
synchronisation (on a shared 2-core machine they make it several times slower).

Run: ``pytest benchmarks/test_bench_trees.py --benchmark-only``.
"""

from __future__ import annotations

import pytest
import torch

from specdec.models import CallableLM
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.trees import (
    ChainTreeBuilder,
    EagleTreeBuilder,
    RheoTreeBuilder,
    SequoiaTreeBuilder,
    StaticTreeBuilder,
)
from specdec.trees import build_tree

VOCAB = 49152
POOL = torch.randn(128, VOCAB, generator=torch.Generator().manual_seed(0)) * 3.0


def fake_draft() -> CallableLM:
    """A draft whose logits cost nothing to produce (rows of a fixed random pool)."""
    state = {"offset": 0}

    def fn(prefixes):
        n = len(prefixes)
        start = state["offset"] % (POOL.shape[0] - n)
        state["offset"] += 7
        return POOL[start : start + n]

    return CallableLM(fn, VOCAB)


BUILDERS = {
    "eagle-K10-d6-N60": EagleTreeBuilder(K=10, depth=6, N=60),
    "rheo-K10-m1-d6-N60-M64": RheoTreeBuilder(K=10, m=1, depth=6, N=60, M=64),
    "rheo-K10-m2-d6-N60-M64": RheoTreeBuilder(K=10, m=2, depth=6, N=60, M=64),
    "chain-d6": ChainTreeBuilder(depth=6),
    "static-(4,2,2,1)-iid": StaticTreeBuilder(expansion=(4, 2, 2, 1), mode="iid"),
    "sequoia-n60-d6": SequoiaTreeBuilder(num_nodes=60, max_depth=6),
}

SAMPLINGS = {
    "T1": SamplingConfig(temperature=1.0),
    "T0.6-topk50-topp0.9": SamplingConfig(temperature=0.6, top_k=50, top_p=0.9),
}


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("builder_name", list(BUILDERS))
def test_build_tree(benchmark, builder_name, sampling_name):
    builder = BUILDERS[builder_name]
    sampling = SAMPLINGS[sampling_name]
    draft = fake_draft()
    rng = TorchRandom.seeded(0)

    def run():
        draft.begin([0, 1])
        return build_tree(builder, 1, draft, sampling, rng)

    tree = benchmark(run)
    assert 1 < tree.num_nodes <= builder.max_nodes
    assert int(tree.depths.max()) <= builder.max_depth
