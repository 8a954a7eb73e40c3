"""The verification walk (``specdec.verify.fast.decide_tree_walk``, the step's choice for CPU
logits) against the batch form (``decide_from_logits(..., rows="all")``) and the verifiers' walks.

The walk decides only the nodes the verification visits, one depth at a time, with the same
uniforms as the batch form, so every field of the decision must be the same (float64 logits:
a uniform within rounding of a threshold is a 1e-16 event), for every rule, temperature, top-k,
top-p and greedy, several trees at once, and bad rows flagged only where visited.
"""

from __future__ import annotations

import pytest
import torch

import specdec
import specdec.verify.fast as fast
from specdec.errors import InvalidConfigError, InvalidDistributionError
from specdec.models import CallableLM
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits, row_is_bad
from specdec.engine import StepOptions
from specdec.tree_batch import TreeBatch
from specdec.verify.fast import decide_from_logits, decide_tree_walk

from test_verify_fast import CASES, TableRandom, random_draft
from specdec.trees import build_tree

CONFIGS = [
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.6),
    SamplingConfig(temperature=1.3, top_k=3),
    SamplingConfig(temperature=0.9, top_p=0.7),
]
FIELDS = ("accepted", "num_accepted", "tokens", "bonus", "attempted", "bad_visited", "stop")


def _batch(builder, seeds, vocab: int = 6, dtype=torch.float64):
    """Trees of ``builder`` for ``seeds`` in one batch, ``[B, n, V]`` logits and ``[B, n, C + 1]`` uniforms."""
    trees = []
    for seed in seeds:
        draft = random_draft(vocab, seed % 7)
        draft.begin([seed % vocab])
        trees.append(build_tree(builder, seed % vocab, draft, SamplingConfig(), TorchRandom.seeded(seed)))
    batch = TreeBatch.from_trees(trees, max_children=builder.max_nodes, max_depth=builder.max_depth)
    g = torch.Generator().manual_seed(3000 + seeds[0])
    logits = (torch.randn(len(seeds), batch.node_slots, vocab, generator=g, dtype=torch.float64) * 2).to(dtype)
    u = torch.rand(len(seeds), batch.node_slots, batch.max_children + 1, generator=g, dtype=torch.float64)
    return trees, batch, logits, u


def _fields(decision) -> dict[str, list]:
    return {f: getattr(decision, f).tolist() for f in FIELDS}


def decide(rule, batch, logits, u, config, rows):
    """The general decision by ``rows``: at ``T = 0`` too, where the step's verification takes
    the greedy decision instead (compared with these two in ``test_greedy_decision.py``), and
    the walk on chains too, which the step's verification decides every node at once."""
    if rows == "path":  # the walk itself (the step's verification decides a chain every node at once)
        return fast.TreeDecision(*decide_tree_walk(rule, batch, logits, u, config))
    if not config.greedy:
        return decide_from_logits(rule, batch, logits, u, config, rows=rows)
    p = process_logits(logits, config, check=False)  # one-hot rows
    return fast.TreeDecision(*fast.decide_tree_batch(rule, batch, p, u, row_is_bad(logits)))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"T{c.temperature}-k{c.top_k}-p{c.top_p}")
@pytest.mark.parametrize("name,builder,verifier_name", CASES, ids=[c[0] for c in CASES])
def test_the_walk_decides_as_every_node_at_once(name, builder, verifier_name, config):
    rule = get("verifier", verifier_name)().fused
    accepted = 0
    for start in range(0, 40, 4):
        _, batch, logits, u = _batch(builder, list(range(start, start + 4)))
        want = decide(rule, batch, logits, u, config, "all")
        got = decide(rule, batch, logits, u, config, "path")
        assert _fields(got) == _fields(want), f"seeds {start}..{start + 3}"
        accepted += int(want.num_accepted.sum())
    assert accepted > 10  # the walk went below the root


@pytest.mark.parametrize("name,builder,verifier_name", CASES, ids=[c[0] for c in CASES])
def test_the_walk_emits_what_the_verifier_walk_emits(name, builder, verifier_name):
    verifier = get("verifier", verifier_name)()
    config = SamplingConfig(temperature=0.8)
    for seed in range(30):
        (tree,), batch, logits, u = _batch(builder, [seed])
        n = tree.num_nodes
        want = verifier.verify(tree, process_logits(logits[0, :n], config), TableRandom(u[0]))
        got = decide_tree_walk(verifier.fused, batch, logits, u, config)
        k = int(got[1][0])
        assert tuple(got[0][0, :k].tolist()) == want.accepted_nodes, f"seed {seed}"
        assert tuple(got[2][0, : k + 1].tolist()) == want.tokens, f"seed {seed}"
        assert int(got[4][0]) == want.attempted_depths


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_walk_on_low_precision_and_strided_logits(dtype):
    """float32 / bfloat16 logits (cast per visited row) and a non-contiguous ``[B, n, V]`` view decide as the
    batch form does on the same values."""
    name, builder, verifier_name = CASES[1]
    rule = get("verifier", verifier_name)().fused
    for start in (0, 4, 8):
        _, batch, logits, u = _batch(builder, list(range(start, start + 4)), dtype=dtype)
        wide = torch.cat([logits, logits], dim=-1)[..., : logits.shape[-1]]  # the same values, strided rows
        assert not wide.is_contiguous()
        for config in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.7)):
            want = _fields(decide(rule, batch, logits, u, config, "all"))
            assert _fields(decide(rule, batch, logits, u, config, "path")) == want
            assert _fields(decide(rule, batch, wide, u, config, "path")) == want


def test_bad_rows_are_flagged_by_the_walk_only_where_visited():
    name, builder, verifier_name = CASES[1]  # rheo + mixed
    rule = get("verifier", verifier_name)().fused
    config = SamplingConfig(temperature=1.0)
    flagged_root = unvisited = 0
    for seed in range(20):
        _, batch, logits, u = _batch(builder, [seed])
        clean = decide_from_logits(rule, batch, logits, u, config, rows="path")
        visited = {0, *clean.accepted[0, : int(clean.num_accepted[0])].tolist()}
        others = [i for i in range(int(batch.num_nodes[0])) if i not in visited]
        bad = logits.clone()
        bad[0, others, :] = float("nan")  # rows never visited: the same decision, nothing flagged
        got = decide_from_logits(rule, batch, bad, u, config, rows="path")
        assert _fields(got) == _fields(clean)
        unvisited += bool(others)
        bad[0, 0, :] = float("-inf")  # the root's row: flagged
        flagged_root += bool(decide_from_logits(rule, batch, bad, u, config, rows="path").bad_visited[0])
    assert unvisited > 5 and flagged_root == 20


def test_a_walk_that_reads_the_parent_row_is_caught(monkeypatch):
    """Power: the comparison with the batch form fails for a walk that keeps deciding with the root's
    uniforms (a wrong row of ``u`` below the root)."""
    name, builder, verifier_name = CASES[1]
    rule = get("verifier", verifier_name)().fused
    config = SamplingConfig(temperature=1.0)
    real_at = fast._at
    calls = {"n": 0}

    def stale_at(x, rows):  # the uniforms table is the only [B, n, C + 1] float64 argument
        if x.dtype == torch.float64 and x.shape[-1] == builder.max_nodes + 1:
            return real_at(x, torch.zeros_like(rows))
        return real_at(x, rows)

    differs = 0
    for start in range(0, 40, 4):
        _, batch, logits, u = _batch(builder, list(range(start, start + 4)))
        want = _fields(decide_from_logits(rule, batch, logits, u, config, rows="all"))
        monkeypatch.setattr(fast, "_at", stale_at)
        got = _fields(decide_from_logits(rule, batch, logits, u, config, rows="path"))
        monkeypatch.setattr(fast, "_at", real_at)
        differs += got != want
    assert differs > 0


def test_the_step_path_generates_the_same_with_either_rows():
    """End to end on a CPU: ``StepOptions(rows="all")`` and the default walk emit the same tokens."""
    vocab = 50
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    lm = CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab)
    for method in ("eagle2", "rheo", "sequoia"):
        for config in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.9, top_p=0.9)):
            outs = {}
            for rows in ("all", "path", "auto"):
                gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method=method, options=StepOptions(rows=rows))
                outs[rows] = gen.generate([1, 2, 3], 20, config, seed=5).tokens
            assert outs["all"] == outs["path"] == outs["auto"], method


def test_bad_rows_choices_raise():
    with pytest.raises(InvalidConfigError, match="rows must be one of"):
        StepOptions(rows="some")
    name, builder, verifier_name = CASES[0]
    _, batch, logits, u = _batch(builder, [0])
    with pytest.raises(InvalidConfigError, match="rows must be one of"):
        decide_from_logits(get("verifier", verifier_name)().fused, batch, logits, u, SamplingConfig(), rows="nodes")


def test_a_visited_bad_row_still_raises_in_generation():
    vocab = 20
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    target = CallableLM(lambda ps: torch.full((len(ps), vocab), float("nan"), dtype=torch.float64), vocab_size=vocab)
    draft = CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=vocab)
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo")
    with pytest.raises(InvalidDistributionError, match="verifier visited"):
        gen.generate([1, 2], 4, SamplingConfig(temperature=1.0), seed=0)


def test_a_chain_is_decided_every_node_at_once_even_on_the_path_setting(monkeypatch):
    """A chain's walk would visit every row: ``rows="path"`` decides it as ``"all"`` (fewer ops),
    without calling the walk; a branching tree still walks."""
    by_name = {c[0]: c for c in CASES}
    _, builder, verifier_name = by_name["chain"]
    rule = get("verifier", verifier_name)().fused
    config = SamplingConfig(temperature=1.0)
    _, batch, logits, u = _batch(builder, [0, 1, 2, 3])
    assert batch.node_slots <= batch.max_depth + 1
    want = _fields(fast.TreeDecision(*decide_tree_walk(rule, batch, logits, u, config)))

    def no_walk(*args, **kwargs):
        raise AssertionError("the walk was called for a chain")

    monkeypatch.setattr(fast, "decide_tree_walk", no_walk)
    assert _fields(decide_from_logits(rule, batch, logits, u, config, rows="path")) == want
    _, tree_builder, tree_verifier = by_name["rheo"]
    _, branching, b_logits, b_u = _batch(tree_builder, [0, 1])
    with pytest.raises(AssertionError, match="the walk was called"):
        decide_from_logits(get("verifier", tree_verifier)().fused, branching, b_logits, b_u, config, rows="path")
