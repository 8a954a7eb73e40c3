"""The step's target law without a normalised ``[n, V]`` softmax (``verify.fast.target_weights``):
decisions equal the walk's on the processed law, and the bad-row flags equal ``row_is_bad``
read from the law instead of a pass of their own (eager and compiled)."""

from __future__ import annotations

import threading

import attrs
import pytest
import torch

from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, law_is_bad, process_logits, row_is_bad, temperature_scores
from specdec.tree_batch import TreeBatch
from specdec.trees.rheo import RheoTreeBuilder
from specdec.trees.static import StaticTreeBuilder
import specdec.verify.fast as fast
from specdec.verify.fast import decide_from_scores, step_scores, target_weights

from test_verify_fast import TableRandom, random_draft
from specdec.trees import build_tree

NAN, INF = float("nan"), float("inf")
BAD_ROWS = torch.tensor(
    [
        [0.0, 1.0, 2.0, -1.0, 0.5],
        [NAN, 0.0, 1.0, 2.0, 3.0],
        [-INF, -INF, -INF, -INF, -INF],
        [INF, 0.0, 1.0, 2.0, 3.0],
        [1.0, -INF, -INF, 0.0, -INF],
        [3.0e38, 1.0, 0.0, -1.0, 2.0],  # finite, but logits / T overflows at a small T
        [0.0, 0.0, 0.0, 0.0, NAN],
    ]
)
CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1e-3),
    SamplingConfig(temperature=1.3, top_k=2),
    SamplingConfig(temperature=0.9, top_p=0.6),
    SamplingConfig(temperature=0.9, top_k=3, top_p=0.8),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"T{c.temperature}-k{c.top_k}-p{c.top_p}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_law_flags_exactly_the_bad_rows(config, dtype):
    logits = BAD_ROWS.to(dtype)
    want = row_is_bad(logits)
    assert want.tolist() == [False, True, True, True, False, False, True]
    assert torch.equal(law_is_bad(process_logits(logits, config, check=False)), want)
    scores, temperature = step_scores(logits, config)
    s = temperature_scores(scores, temperature)
    _, eager = target_weights(s)
    assert torch.equal(eager, want)
    torch._dynamo.reset()
    _, compiled = torch.compile(target_weights, fullgraph=True, backend="aot_eager")(s)
    assert torch.equal(compiled, want)


CASES = [
    ("rheo-mixed", RheoTreeBuilder(K=3, m=1, B=2, depth=3, N=8, M=6), "mixed"),
    ("rheo-m2", RheoTreeBuilder(K=4, m=2, B=2, depth=3, N=9, M=7), "mixed"),
    ("static-wor", StaticTreeBuilder(expansion=(3, 2), mode="wor"), "rejection-wor"),
    ("static-iid", StaticTreeBuilder(expansion=(3, 2), mode="iid"), "rejection-iid"),
]


def _agreement(builder, verifier_name, config, compiled: bool, temperature_given: float | None = None) -> tuple[int, int]:
    """(seeds where the decision from the logits equals the walk on the processed law, seeds run)."""
    verifier = get("verifier", verifier_name)()
    if compiled:
        torch._dynamo.reset()  # each case its own graphs (dynamo's recompile limit is per function)
    decide = torch.compile(decide_from_scores, fullgraph=True, backend="aot_eager") if compiled else decide_from_scores
    vocab, same, runs = 6, 0, 40
    for seed in range(runs):
        draft = random_draft(vocab, seed % 7)
        draft.begin([seed % vocab])
        tree = build_tree(builder, seed % vocab, draft, config, TorchRandom.seeded(seed))
        batch = TreeBatch.from_trees([tree], max_children=builder.max_nodes, max_depth=builder.max_depth)
        g = torch.Generator().manual_seed(2000 + seed)
        logits = torch.randn(tree.num_nodes, vocab, generator=g, dtype=torch.float64) * 2
        u = torch.rand(tree.num_nodes, batch.max_children + 1, generator=g, dtype=torch.float64)
        want = verifier.verify(tree, process_logits(logits, config), TableRandom(u))
        scores, temperature = step_scores(logits, config)
        if temperature_given is not None:
            temperature = temperature_given
        got = decide(verifier.fused, batch, scores[None], u[None], temperature)
        k = int(got[1][0])
        same += (
            tuple(got[0][0, :k].tolist()) == want.accepted_nodes
            and tuple(got[2][0, : k + 1].tolist()) == want.tokens
            and int(got[4][0]) == want.attempted_depths
            and not bool(got[5][0])
        )
    return same, runs


@pytest.mark.parametrize("path", ["eager", "aot_eager", "workspace"])
@pytest.mark.parametrize("config", [SamplingConfig(temperature=0.7), SamplingConfig(temperature=1.2, top_k=4)],
                         ids=["T0.7", "T1.2-k4"])
@pytest.mark.parametrize("name,builder,verifier_name", CASES, ids=[c[0] for c in CASES])
def test_decisions_from_the_logits_equal_the_walk_on_the_processed_law(name, builder, verifier_name, config, path,
                                                                        monkeypatch):
    if path == "workspace":  # the per-thread buffers, used here for every law (by default only for large ones)
        monkeypatch.setattr(fast, "WORKSPACE_MIN_ENTRIES", 0)
    same, runs = _agreement(builder, verifier_name, config, path == "aot_eager")
    assert same == runs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_workspace_gives_the_same_decisions_as_new_tensors(temperature, monkeypatch):
    """Verifications of different sizes and dtypes in turn through the reused buffers (bad rows
    included) decide as with new tensors, bit for bit; each thread has its own buffers."""
    builder, verifier_name = CASES[1][1], CASES[1][2]
    rule = get("verifier", verifier_name)().fused
    vocab = 6
    runs = []
    for seed, (rows, dtype) in enumerate([(1, torch.float64), (3, torch.float32), (2, torch.float64), (3, torch.float32)]):
        draft = random_draft(vocab, seed)
        draft.begin([seed])
        tree = build_tree(builder, seed, draft, SamplingConfig(temperature=temperature), TorchRandom.seeded(seed))
        batch = TreeBatch.from_trees([tree] * rows, max_children=builder.max_nodes, max_depth=builder.max_depth)
        g = torch.Generator().manual_seed(seed)
        logits = (torch.randn(rows, tree.num_nodes, vocab, generator=g, dtype=torch.float64) * 2).to(dtype)
        logits[0, 0] = float("nan") if seed % 2 else logits[0, 0]
        logits[-1, -1] = float("-inf")
        u = torch.rand(rows, tree.num_nodes, batch.max_children + 1, generator=g, dtype=torch.float64)
        runs.append((batch, logits, u))
    fresh = [decide_from_scores(rule, b, x, u, temperature) for b, x, u in runs]
    monkeypatch.setattr(fast, "WORKSPACE_MIN_ENTRIES", 0)
    fast.release_workspace()
    reused = [decide_from_scores(rule, b, x, u, temperature) for b, x, u in runs]
    for a, b in zip(fresh, reused):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert fast._WORKSPACE.buffers["law"].numel() == max(x.numel() for _, x, _ in runs)
    mine = fast._WORKSPACE.buffers["law"]
    other: dict = {}
    thread = threading.Thread(target=lambda: (decide_from_scores(rule, *runs[0][:2], runs[0][2], temperature),
                                              other.update(fast._WORKSPACE.buffers)))
    thread.start()
    thread.join()
    assert other["law"].data_ptr() != mine.data_ptr() and fast._WORKSPACE.buffers["law"] is mine
    # a law above the cap is a new tensor: the thread keeps no larger buffer
    monkeypatch.setattr(fast, "WORKSPACE_MAX_ENTRIES", runs[0][1].numel())
    fast.release_workspace()
    again = [decide_from_scores(rule, b, x, u, temperature) for b, x, u in runs]
    assert all(all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(fresh, again))
    assert fast._WORKSPACE.buffers["law"].numel() == runs[0][1].numel()


def test_a_lost_temperature_is_caught_by_the_comparison():
    """Power: deciding on ``logits / 1`` where the law is ``logits / 0.7`` differs from the walk."""
    builder, verifier_name = CASES[0][1], CASES[0][2]
    same, runs = _agreement(builder, verifier_name, SamplingConfig(temperature=0.7), False, temperature_given=1.0)
    assert same < runs


def test_greedy_rows_in_the_workspace_decide_as_process_logits_rows(monkeypatch):
    """At T = 0 the one-hot rows written into the reused buffer (after a larger T > 0 law left
    other values there) decide as process_logits' new rows, bit for bit; float16 logits too."""
    from specdec.verify.fast import decide_from_logits

    builder, verifier_name = CASES[0][1], CASES[0][2]
    rule = get("verifier", verifier_name)().fused
    greedy = SamplingConfig(temperature=0.0)
    draft = random_draft(6, 3)
    draft.begin([3])
    tree = build_tree(builder, 3, draft, greedy, TorchRandom.seeded(3))
    batch = TreeBatch.from_trees([tree] * 2, max_children=builder.max_nodes, max_depth=builder.max_depth)
    g = torch.Generator().manual_seed(5)
    u = torch.rand(2, tree.num_nodes, batch.max_children + 1, generator=g, dtype=torch.float64)
    for dtype in (torch.float32, torch.float16):
        logits = (torch.randn(2, tree.num_nodes, 6, generator=g) * 3).to(dtype)
        logits[1, 0, 2] = logits[1, 0].max()  # a tie: the first maximum wins, as in process_logits
        monkeypatch.setattr(fast, "WORKSPACE_MIN_ENTRIES", 1 << 30)
        # decide given (a compiled step's role): the general form on one-hot rows, where the workspace is used
        want = decide_from_logits(rule, batch, logits, u, greedy, fast.decide_tree_batch, rows="all")
        monkeypatch.setattr(fast, "WORKSPACE_MIN_ENTRIES", 0)
        big = torch.randn(3, tree.num_nodes, 6, generator=g)
        decide_from_scores(rule, TreeBatch.from_trees([tree] * 3, max_children=builder.max_nodes,
                                                       max_depth=builder.max_depth), big, u[:1].expand(3, -1, -1), 1.0)
        got = decide_from_logits(rule, batch, logits, u, greedy, fast.decide_tree_batch, rows="all")
        assert all(torch.equal(getattr(want, f), getattr(got, f)) for f in attrs.fields_dict(type(want)))
