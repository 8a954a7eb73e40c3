"""Verification for serving engines (specdec.engine.serving.verify_for_engine).

- Eight rows with eight different (temperature, top-k, top-p) settings, greedy included:
  every row's law of its first two tokens is exactly its own configuration's target law
  (enumeration over the row's builder and verifier draws, the other rows fixed), for
  SpecInfer-style trees without replacement (rule 4) and for chains (block, rule 8).
  Power: processing every row with row 0's configuration fails it.
- A grammar mask (``allowed``) gives each row its configuration's law of the masked target, exactly.
- On the tensor path every row of the batch emits, bit for bit, what it emits verified alone
  with the same source; a row with bad logits is flagged and emits nothing while the others
  are unchanged.
- Bad input is refused before anything is drawn, naming the row where there is one.
"""

from __future__ import annotations

import pytest
import torch

from specdec.engine.serving import RowSampling, verify_for_engine
from tests.engine._per_row import CONFIGS, first_two, gap, target_law
from specdec.errors import InvalidConfigError, UnknownNameError
from specdec.models import CallableLM
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import exact_law
from specdec.testing.counter import StepCounter
from specdec.tree_batch import TreeBatch
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.rheo import RheoTreeBuilder
from specdec.trees.static import StaticTreeBuilder
from specdec.trees import build_tree

V = 4
CASES = {
    "static-wor": (StaticTreeBuilder(expansion=(2, 1), mode="wor"), "rejection-wor"),
    "chain-block": (ChainTreeBuilder(depth=2), "block"),
}
_g = torch.Generator().manual_seed(11)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # order-1: logits after token a = TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)


def _draft() -> CallableLM:
    return CallableLM(lambda ps: DRAFT[[p[-1] for p in ps]], vocab_size=V)


def _trees(builder, roots, configs, sources):
    trees = []
    for root, config, src in zip(roots, configs, sources):
        draft = _draft()
        draft.begin([root])
        trees.append(build_tree(builder, root, draft, config, src))
    return TreeBatch.from_trees(trees, max_children=builder.max_nodes, max_depth=builder.max_depth)


def _logits(batch: TreeBatch) -> torch.Tensor:
    return TARGET[batch.tokens]  # [B, n, V]: each node's row is the target's after its token


def _row_law(case: str, row: int, configs, process_as=None, ban=None) -> dict[tuple[int, int], float]:
    """Exact law of row ``row``'s first two tokens: its builder and verifier draws enumerated, the
    other rows built and verified from fixed seeds; one emitted token is completed with the
    target's conditional under the row's configuration."""
    builder, verifier = CASES[case]
    roots = [b % V for b in range(len(configs))]

    fixed = _trees(builder, roots, configs, [TorchRandom.seeded(100 + b) for b in range(len(configs))])
    others = [fixed.tree(b) for b in range(len(configs))]

    def program(rng):
        draft = _draft()
        draft.begin([roots[row]])
        trees = list(others)
        trees[row] = build_tree(builder, roots[row], draft, configs[row], rng)
        batch = TreeBatch.from_trees(trees, max_children=builder.max_nodes, max_depth=builder.max_depth)
        sources = [rng if b == row else TorchRandom.seeded(200 + b) for b in range(len(configs))]
        allowed = None
        if ban is not None:  # a grammar that never allows token ``ban``
            allowed = torch.ones(batch.batch_size, batch.node_slots, V, dtype=torch.bool)
            allowed[..., ban] = False
        out = verify_for_engine(batch, _logits(batch), verifier, process_as or configs, RowStreams(sources),
                                check_trees=False, allowed=allowed)
        k = int(out.num_emitted[row])
        return tuple(out.tokens[row, :k].tolist())

    return first_two(exact_law(program), TARGET if ban is None else _banned(ban), configs[row])


def _banned(token: int) -> torch.Tensor:
    table = TARGET.clone()
    table[:, token] = float("-inf")
    return table


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_row_is_exact_for_its_own_sampling(case):
    for row in range(len(CONFIGS)):
        got = _row_law(case, row, CONFIGS)
        assert gap(got, target_law(TARGET, row % V, CONFIGS[row])) < 1e-9, (case, row, CONFIGS[row])


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_grammar_mask_gives_each_row_its_masked_target_law(case):
    """``allowed`` (a grammar that never allows token 2): each row's law is its configuration's law of
    the masked target (issue 58); power: the unmasked target's law is far from it."""
    for row in (6,):  # T = 1.2, top-k 2, top-p 0.8 (the fastest to enumerate)
        got = _row_law(case, row, CONFIGS, ban=2)
        assert gap(got, target_law(_banned(2), row % V, CONFIGS[row])) < 1e-9, (case, row)
        assert gap(got, target_law(TARGET, row % V, CONFIGS[row])) > 0.05


def test_processing_every_row_with_one_configuration_is_caught():
    """Power: rows processed with row 0's (greedy) configuration depart from their own laws."""
    got = _row_law("static-wor", 1, CONFIGS, process_as=CONFIGS[0])
    assert gap(got, target_law(TARGET, 1, CONFIGS[1])) > 0.05


@pytest.mark.parametrize("case", sorted(CASES) + ["rheo-mixed"])
def test_a_batch_row_emits_what_it_emits_alone(case):
    builder, verifier = CASES.get(case, (RheoTreeBuilder(K=3, m=1, B=2, depth=2, N=5, M=4), "mixed"))
    roots = [b % V for b in range(8)]
    for trial in range(6):
        seeds = [1000 * trial + b for b in range(8)]
        batch = _trees(builder, roots, CONFIGS, [TorchRandom.seeded(s) for s in seeds])
        logits = _logits(batch)
        logits[3, 0] = float("nan")  # row 3: bad at the root, which every verifier visits
        out = verify_for_engine(batch, logits, verifier, CONFIGS, RowStreams([TorchRandom.seeded(s + 7) for s in seeds]))
        assert out.path == "tensor"
        assert out.bad.tolist() == [b == 3 for b in range(8)]
        assert int(out.num_emitted[3]) == 0 and (out.tokens[3] == -1).all()
        for b in range(8):
            if b == 3:
                continue
            alone = TreeBatch.from_trees([batch.tree(b)], max_children=batch.max_children, max_depth=batch.max_depth)
            one = verify_for_engine(alone, _logits(alone), verifier, CONFIGS[b], TorchRandom.seeded(seeds[b] + 7))
            k = int(one.num_emitted[0])
            assert int(out.num_emitted[b]) == k
            assert out.tokens[b, :k].tolist() == one.tokens[0, :k].tolist()
            assert out.accepted[b].tolist() == one.accepted[0].tolist()


def test_row_sampling_groups_rows_and_carries_tensors():
    rows = RowSampling.of([CONFIGS[1], CONFIGS[3], CONFIGS[1]], 3)
    assert [ix.tolist() for _, ix in rows.groups] == [[0, 2], [1]]
    assert rows.temperature.tolist() == [1.0, 1.5, 1.0] and rows.top_k.tolist() == [0, 2, 0]
    logits = torch.randn(3, 5, V, dtype=torch.float64)
    p = rows.process(logits)
    for b, c in enumerate([CONFIGS[1], CONFIGS[3], CONFIGS[1]]):
        assert torch.equal(p[b], process_logits(logits[b], c))


def test_the_tensor_path_reads_nothing_from_the_device():
    builder, verifier = CASES["static-wor"]
    batch = _trees(builder, [0, 1], CONFIGS[1:3], [TorchRandom.seeded(0), TorchRandom.seeded(1)])
    logits = _logits(batch)
    verify_for_engine(batch, logits, verifier, CONFIGS[1:3], RowStreams([TorchRandom.seeded(2), TorchRandom.seeded(3)]),
                      check_trees=False)  # warm-up
    with StepCounter() as counter:
        verify_for_engine(batch, logits, verifier, CONFIGS[1:3], RowStreams([TorchRandom.seeded(2), TorchRandom.seeded(3)]),
                          check_trees=False)
    reads = [site for kind, site in counter.sync_sites["step"] if kind == "read"]
    assert not reads, counter.report()
    assert counter.syncs <= 5, counter.report()  # host -> device: the per-row parameter tensors and the group indices


def test_bad_input_is_refused_naming_what_is_wrong():
    builder, verifier = CASES["chain-block"]
    batch = _trees(builder, [0, 1], CONFIGS[1:3], [TorchRandom.seeded(0), TorchRandom.seeded(1)])
    logits = _logits(batch)
    streams = RowStreams([TorchRandom.seeded(2), TorchRandom.seeded(3)])
    with pytest.raises(InvalidConfigError, match=r"logits must be \[B, n, V\]"):
        verify_for_engine(batch, logits[:, :-1], verifier, CONFIGS[1], streams)
    with pytest.raises(InvalidConfigError, match="floating point"):
        verify_for_engine(batch, logits.long(), verifier, CONFIGS[1], streams)
    with pytest.raises(InvalidConfigError, match="3 configurations for 2 rows"):
        verify_for_engine(batch, logits, verifier, CONFIGS[:3], streams)
    with pytest.raises(InvalidConfigError, match="1 row streams for 2 rows"):
        verify_for_engine(batch, logits, verifier, CONFIGS[1], RowStreams([TorchRandom.seeded(2)]))
    with pytest.raises(InvalidConfigError, match="row 1: sampling must be a SamplingConfig"):
        verify_for_engine(batch, logits, verifier, [CONFIGS[1], "greedy"], streams)
    with pytest.raises(UnknownNameError):
        verify_for_engine(batch, logits, "no-such-rule", CONFIGS[1], streams)
    wide = _trees(StaticTreeBuilder(expansion=(2, 1), mode="wor"), [0, 1], CONFIGS[1:3], [TorchRandom.seeded(0), TorchRandom.seeded(1)])
    out = verify_for_engine(wide, _logits(wide), "block", CONFIGS[1], streams)  # several children: flagged, not raised
    assert out.flag.tolist() == [1, 1] and out.bad.all()
    assert out.reasons()[0] == ("row 0: refused: the rule cannot serve this row: verifier 'block' cannot verify several "
                                "children drawn 'wor' losslessly; it supports ['sampled'] children, several drawn []")
