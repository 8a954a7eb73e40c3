"""The serving call's rows (issue 57 items 1, 15-18; issue 56 deliverable 4).

- One executor: :func:`verify_for_engine` decides through the step's decision
  (:data:`specdec.engine.step.decide_rows`) on the tensor, path-level and walk paths.
- A rule is checked against each row's sampling: a greedy-only rule at ``T > 0`` refuses that
  row by name (flagged, nothing drawn from its source); the other rows are bit-identical to
  the batch without it.
- Logits that require grad are verified as their values; outside-vocabulary tokens (a root or
  a drafted node) flag their row under both ``check_trees`` settings; an empty batch and too few
  sources are refused by name.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import specdec.engine.serving as serving
from specdec.engine.serving import FLAG_CAUSES, verify_for_engine
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.tree_batch import TreeBatch
from specdec.trees.static import StaticTreeBuilder
from tests.engine._serving_cases import TARGET, WalkingWOR, build
from specdec.trees import build_tree

T0, T1 = SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0)


def _streams(seeds):
    return RowStreams([TorchRandom.seeded(s) for s in seeds])


def _eagle(configs, trial=0):
    """An eagle batch (deterministic + sampled children) with clean logits, one row per configuration."""
    tree, logits, _, _, _ = build("eagle/mixed", "torch", trial)
    rows = torch.arange(len(configs))
    tree = attrs.evolve(tree.select_rows(rows), draft_bad=None)
    return tree, TARGET[tree.tokens]


@pytest.mark.parametrize(("case", "path"), [("static-wor/rejection-wor", "tensor"), ("chain/block", "tensor"),
                                            ("static-wor/walking-wor", "walk")])
def test_serving_decides_through_the_step_decision(case, path, monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("flag_bad"))
        return decide(*args, **kwargs)

    decide = serving.decide_rows
    monkeypatch.setattr(serving, "decide_rows", spy)
    tree, logits, verifier, configs, streams = build(case, "torch", 0)
    out = verify_for_engine(tree, logits, verifier, configs, streams)
    assert len(dict.fromkeys(configs)) > 1  # rows of several configurations: still one decision (issue 56)
    assert out.path == path and calls == [True], (out.path, calls)


def test_a_greedy_rule_refuses_a_row_at_temperature_above_zero_alone():
    tree, logits = _eagle([T0, T1, T0])
    seeds = [5, 6, 7]
    out = verify_for_engine(tree, logits, "greedy", [T0, T1, T0], _streams(seeds))
    assert out.bad.tolist() == [False, True, False]
    assert out.flag.tolist() == [0, 1, 0]
    assert int(out.num_emitted[1]) == 0 and (out.tokens[1] == -1).all() and (out.accepted[1] == -1).all()
    reasons = out.reasons()
    assert reasons[0] is None and reasons[2] is None
    assert reasons[1] is not None and reasons[1].startswith("row 1: refused: ") and "'greedy'" in reasons[1]
    assert "temperature 1.0" in reasons[1]
    # the other rows: bit-identical to the batch without the refused row
    kept = torch.tensor([0, 2])
    alone = verify_for_engine(tree.select_rows(kept), logits.index_select(0, kept), "greedy", T0, _streams([5, 7]))
    for field in ("accepted", "tokens", "num_accepted", "num_emitted"):
        assert torch.equal(getattr(out, field)[kept], getattr(alone, field)), field


def test_a_refused_row_draws_nothing_from_its_source():
    tree, logits = _eagle([T1, T0])
    streams = _streams([3, 4])
    verify_for_engine(tree, logits, "greedy", [T1, T0], streams)
    assert torch.equal(streams.sources[0].uniforms((4,)), TorchRandom.seeded(3).uniforms((4,)))
    assert not torch.equal(streams.sources[1].uniforms((4,)), TorchRandom.seeded(4).uniforms((4,)))


@pytest.mark.parametrize("verifier", ["rejection-wor", WalkingWOR()])
def test_logits_that_require_grad_are_verified_as_their_values(verifier):
    V = 1100  # top-p alone over more than 1,024 ids: the sort that reads the scores on the host
    g = torch.Generator().manual_seed(15)
    table = torch.randn(V, V, generator=g)
    builder, config = StaticTreeBuilder(expansion=(2, 1), mode="wor"), SamplingConfig(temperature=0.9, top_p=0.8)
    trees = []
    for b, root in enumerate([3, 9]):
        draft = CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=V)
        draft.begin([root])
        trees.append(build_tree(builder, root, draft, config, TorchRandom.seeded(b)))
    batch = TreeBatch.from_trees(trees, max_children=builder.max_nodes, max_depth=builder.max_depth)
    logits = (table[batch.tokens] * 1.3).requires_grad_(True)
    got = verify_for_engine(batch, logits, verifier, config, _streams([1, 2]))
    want = verify_for_engine(batch, logits.detach(), verifier, config, _streams([1, 2]))
    for field in ("accepted", "tokens", "num_emitted", "bad"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("check_trees", [True, False])
@pytest.mark.parametrize("slot", [0, 1])  # the root, a drafted node
def test_a_token_outside_the_vocabulary_flags_its_row_alone(check_trees, slot):
    tree, logits, verifier, configs, _ = build("static-wor/rejection-wor", "torch", 0)
    tree = attrs.evolve(tree, draft_bad=None)
    logits = TARGET[tree.tokens]
    tokens = tree.tokens.clone()
    tokens[4, slot] = tree.vocab_size + 3
    broken = attrs.evolve(tree, tokens=tokens)
    seeds = list(range(20, 28))
    out = verify_for_engine(broken, logits, verifier, configs, _streams(seeds), check_trees=check_trees)
    clean = verify_for_engine(tree, logits, verifier, configs, _streams(seeds), check_trees=check_trees)
    assert out.bad.tolist() == [b == 4 for b in range(8)]
    assert int(out.flag[4]) == 2 and out.reasons()[4] == f"row 4: {FLAG_CAUSES[2]}"
    assert int(out.num_emitted[4]) == 0 and (out.tokens[4] == -1).all()
    others = [b for b in range(8) if b != 4]
    for field in ("accepted", "tokens", "num_emitted"):
        assert torch.equal(getattr(out, field)[others], getattr(clean, field)[others]), field


def test_an_empty_batch_is_refused_by_name():
    tree, logits, verifier, configs, _ = build("chain/block", "torch", 0)
    empty = tree.select_rows(torch.zeros(0, dtype=torch.int64))
    with pytest.raises(InvalidConfigError, match=r"tree: an empty batch \(0 rows\)"):
        verify_for_engine(empty, logits[:0], verifier, [], TorchRandom.seeded(0))


def test_too_few_sources_are_refused_by_name():
    tree, logits, verifier, configs, _ = build("chain/block", "torch", 0)
    with pytest.raises(InvalidConfigError, match=r"rng: 7 row streams for 8 rows"):
        verify_for_engine(tree, logits, verifier, configs, _streams(range(7)))
    with pytest.raises(InvalidConfigError, match=r"rng: 1 row streams for 8 rows"):
        verify_for_engine(tree, logits, verifier, configs, TorchRandom.seeded(0))
