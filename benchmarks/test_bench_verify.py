"""Benchmark: verifying one 64-node draft tree at vocabulary 49152 (issue 2, item 9).

Goal: under 5 ms per tree on the reference CPU for every registered verifier
(a benchmark, not a test). Run with::

    pytest benchmarks/test_bench_verify.py --benchmark-only

The tree is realistic: 63 draft nodes, depth 7, branching (2, 2, 2, 2, 1, 1, 1)
breadth first; the target row ``p`` of every node is the float32 softmax (T=1)
of random Zipf-like logits (``-1.2 log rank``, randomly permuted), and the
draft row ``q`` is the softmax of the same logits plus noise, so draft tokens
are often accepted and the walk goes deep. Sampled
children are drawn from the sparse top-64 law of ``q`` (renormalised), as the
tree builders record it. Each verifier gets the shape it supports: sampled
children (i.i.d. or without replacement), top-K deterministic children, or a
RheoSampling-style mix (one sampled child from ``q'`` = top-64 of ``q`` minus
the deterministic set, plus top-(b-1) deterministic children). The greedy
verifier gets one-hot rows (temperature 0).

Torch runs single-threaded here (``torch.set_num_threads(1)``, restored after
each benchmark): verification is a chain of small ``[V]`` vector operations,
where intra-op threading only adds synchronisation, and on a small shared
machine it makes the timings meaningless (a 2-thread run on a loaded 2-core
box is 5-10x slower and erratic). Set ``SPECDEC_BENCH_THREADS`` to override.
"""

from __future__ import annotations

import os

import pytest
import torch

from specdec.registry import get, list_registered
from specdec.rng import TorchRandom
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler

V = 49152
NUM_NODES = 64
BRANCHING = (2, 2, 2, 2, 1, 1, 1)
TOP_M = 64
ZIPF = 1.2
DRAFT_NOISE = 0.2


def _shape_for(cls: type) -> str:
    """The tree shape a verifier class supports (first match)."""
    kinds = cls.supported_kinds
    if NodeKind.DETERMINISTIC in kinds and NodeKind.SAMPLED in kinds:
        return "mixed"
    if NodeKind.DETERMINISTIC in kinds:
        return "deterministic"
    if SampleMode.IID in cls.supported_modes:
        return "sampled-iid"
    return "sampled-wor"


def _add_top(asm: TreeAssembler, node: int, top, count: int) -> list[int]:
    """Add the ``count`` best tokens of ``top`` (a ``torch.topk`` result) as deterministic children."""
    pairs = zip(top.indices[:count].tolist(), top.values[:count].tolist())
    return [asm.add_deterministic(node, token, weight=weight) for token, weight in pairs]


def build_case(shape: str, greedy: bool, seed: int = 0) -> tuple[DraftTree, torch.Tensor]:
    """A 64-node tree of ``shape`` and its ``[64, V]`` float32 target rows."""
    gen = torch.Generator().manual_seed(seed)
    # Zipf-like rows (token of rank r has logit -ZIPF * log r), randomly permuted:
    # peaked like a language model's next-token law, with a long tail.
    ranks = torch.stack([torch.randperm(V, generator=gen) for _ in range(NUM_NODES)]) + 1
    logits = -ZIPF * torch.log(ranks.float())
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(logits + DRAFT_NOISE * torch.randn(NUM_NODES, V, generator=gen), dim=-1)
    if greedy:
        p = torch.zeros_like(p).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)
    asm = TreeAssembler(root_token=0, vocab_size=V)
    depth = {0: 0}
    frontier = [0]
    while frontier and len(asm) < NUM_NODES:
        node = frontier.pop(0)
        d = depth[node]
        if d >= len(BRANCHING):
            continue
        b = min(BRANCHING[d], NUM_NODES - len(asm))
        # the draft row of `node` is q[node]
        top = torch.topk(q[node], TOP_M)
        kids: list[int] = []
        if shape in ("sampled-iid", "sampled-wor"):
            mode = SampleMode.IID if shape == "sampled-iid" else SampleMode.WITHOUT_REPLACEMENT
            top_probs = top.values.double()
            law = SparseLaw(top.indices, top_probs / top_probs.sum(), mode)
            draws = torch.multinomial(law.probs, b, replacement=mode == SampleMode.IID, generator=gen)
            kids = [asm.add_sampled(node, int(law.indices[i]), law, weight=1.0) for i in draws.tolist()]
        elif shape == "deterministic":
            kids = _add_top(asm, node, top, b)
        else:  # mixed: one sampled child from q' = top-M minus S, then b - 1 deterministic
            n_det = b - 1
            rest_idx, rest_p = top.indices[n_det:], top.values[n_det:].double()
            law = SparseLaw(rest_idx, rest_p / rest_p.sum(), SampleMode.IID)
            y = int(rest_idx[torch.multinomial(law.probs, 1, generator=gen)])
            kids.append(asm.add_sampled(node, y, law, weight=float(1 - top.values[:n_det].sum())))
            kids += _add_top(asm, node, top, n_det)
        for k in kids:
            depth[k] = d + 1
        frontier += kids
    tree = asm.build()
    assert tree.num_nodes == NUM_NODES
    return tree, p


@pytest.fixture(autouse=True)
def _torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SPECDEC_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", list_registered("verifier"))
def test_bench_verify(benchmark, name: str) -> None:
    cls = get("verifier", name)
    tree, p = build_case(_shape_for(cls), greedy=cls.requires_greedy)
    verifier = cls()
    rng = TorchRandom.seeded(0)
    result = benchmark(verifier.verify, tree, p, rng)
    benchmark.extra_info["shape"] = _shape_for(cls)
    benchmark.extra_info["accepted_last_run"] = result.num_accepted
    assert len(result.tokens) == result.num_accepted + 1
