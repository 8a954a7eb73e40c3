"""logit_bias (issue 58, deliverable 3): a per-token bias on the target's raw logits, before
temperature; equal to transformers' SequenceBiasLogitsProcessor on single tokens; per row in the
engine call, exact by enumeration; in generation as a logits processor."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import SequenceBiasLogitsProcessor

import specdec
from specdec.engine.serving import verify_for_engine
from specdec.errors import InvalidConfigError
from specdec.logit_bias import LogitBias, logit_bias_rows
from specdec.models import CallableLM
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing import exact_law
from specdec.tree_batch import TreeBatch
from specdec.trees import build_tree
from specdec.trees.static import StaticTreeBuilder
from tests.engine._per_row import first_two, gap, target_law

V = 4
_g = torch.Generator().manual_seed(11)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # order 1: logits after token a = TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
BIAS = {2: 2.5, 0: -1.0}
CONFIGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=3, min_p=0.1),
           SamplingConfig(temperature=0.0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_equals_transformers_sequence_bias_on_single_tokens(dtype):
    bias = {3: 1.7, 10: -4.25, 0: 0.1, 99: -100.0}
    scores = (torch.randn(5, 100, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    ids = torch.zeros(5, 2, dtype=torch.long)
    theirs = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(ids, scores.clone())
    ours = LogitBias(bias)(ids, scores.clone())
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


@pytest.mark.parametrize("bad,match", [
    ([1, 2], "logit_bias must be a mapping"), ({-1: 1.0}, "logit_bias: token id -1"),
    ({"a": 1.0}, "logit_bias: token id 'a'"), ({True: 1.0}, "logit_bias: token id True"),
    ({1: math.inf}, "logit_bias: the bias of token 1 must be a finite number"),
    ({1: "x"}, "the bias of token 1 must be a finite number"), ({1: math.nan}, "finite number, got nan"),
])
def test_bad_maps_are_refused_by_name(bad, match):
    with pytest.raises(InvalidConfigError, match=match):
        LogitBias(bad)


def test_a_token_outside_the_vocabulary_is_refused_at_the_first_call():
    with pytest.raises(InvalidConfigError, match="logit_bias: token id 7 is outside the vocabulary of 5"):
        LogitBias({7: 1.0})(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 5))


def test_rows_tensor():
    dense = logit_bias_rows([None, {1: 2.0}, {}], 3, 4, "cpu")
    assert dense.tolist() == [[0.0] * 4, [0.0, 2.0, 0.0, 0.0], [0.0] * 4]
    assert logit_bias_rows([None, None], 2, 4, "cpu") is None
    with pytest.raises(InvalidConfigError, match="logit_bias: 1 entries for 2 rows"):
        logit_bias_rows([None], 2, 4, "cpu")
    with pytest.raises(InvalidConfigError, match="logit_bias row 1: token id 9 is outside the vocabulary of 4"):
        logit_bias_rows([None, {9: 1.0}], 2, 4, "cpu")
    with pytest.raises(InvalidConfigError, match="one mapping .or None. per row"):
        logit_bias_rows({1: 1.0}, 1, 4, "cpu")


# ------------------------------------------------------------------ the engine call
def _draft() -> CallableLM:
    return CallableLM(lambda ps: DRAFT[[p[-1] for p in ps]], vocab_size=V)


BUILDER = StaticTreeBuilder(expansion=(2, 1), mode="wor")


def _biased(bias: dict[int, float]) -> torch.Tensor:
    return TARGET + logit_bias_rows([bias], 1, V, "cpu")[0].double()  # [V, V]


def _row_law(row: int, biases) -> dict[tuple[int, int], float]:
    """Exact law of row ``row``'s first two tokens out of the engine call (its build and
    verification draws enumerated, the other rows from fixed seeds)."""
    roots = [b % V for b in range(len(CONFIGS))]

    def tree(b, rng):
        draft = _draft()
        draft.begin([roots[b]])
        return build_tree(BUILDER, roots[b], draft, CONFIGS[b], rng)

    others = [tree(b, TorchRandom.seeded(100 + b)) for b in range(len(CONFIGS))]

    def program(rng):
        trees = list(others)
        trees[row] = tree(row, rng)
        batch = TreeBatch.from_trees(trees, max_children=BUILDER.max_nodes, max_depth=BUILDER.max_depth)
        sources = [rng if b == row else TorchRandom.seeded(200 + b) for b in range(len(CONFIGS))]
        out = verify_for_engine(batch, TARGET[batch.tokens], "rejection-wor", CONFIGS, RowStreams(sources),
                                check_trees=False, logit_bias=biases)
        return tuple(out.tokens[row, : int(out.num_emitted[row])].tolist())

    table = TARGET if biases[row] is None else _biased(biases[row])
    return first_two(exact_law(program), table, CONFIGS[row])


@pytest.mark.parametrize("row", [1, 2])  # T = 0.8 with top-k and min-p; greedy (row 0, T = 1, takes 18 s)
def test_each_biased_row_has_the_law_of_its_biased_logits(row):
    biases = [BIAS if b == row else None for b in range(len(CONFIGS))]
    got = _row_law(row, biases)
    assert gap(got, target_law(_biased(BIAS), row % V, CONFIGS[row])) < 1e-9
    assert gap(got, target_law(TARGET, row % V, CONFIGS[row])) > 0.05  # power: the bias moves the law


def test_the_engine_call_is_the_call_on_biased_logits_draw_for_draw():
    roots = [1, 2, 3]
    trees = []
    for b, root in enumerate(roots):
        draft = _draft()
        draft.begin([root])
        trees.append(build_tree(BUILDER, root, draft, CONFIGS[b], TorchRandom.seeded(b)))
    batch = TreeBatch.from_trees(trees, max_children=BUILDER.max_nodes, max_depth=BUILDER.max_depth)
    logits = TARGET[batch.tokens].float()
    biases = [BIAS, None, {1: -100.0}]
    dense = logit_bias_rows(biases, 3, V, "cpu")
    for seed in range(20):
        got = verify_for_engine(batch, logits, "rejection-wor", CONFIGS,
                                RowStreams([TorchRandom.seeded(seed * 3 + b) for b in range(3)]), logit_bias=biases)
        ref = verify_for_engine(batch, logits + dense.unsqueeze(1), "rejection-wor", CONFIGS,
                                RowStreams([TorchRandom.seeded(seed * 3 + b) for b in range(3)]))
        assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.num_accepted, ref.num_accepted)
        assert 1 not in got.tokens[2].tolist()  # banned by its bias
    with pytest.raises(InvalidConfigError, match="logit_bias row 2: token id 4 is outside the vocabulary of 4"):
        verify_for_engine(batch, logits, "rejection-wor", CONFIGS, RowStreams([TorchRandom.seeded(b) for b in range(3)]),
                          logit_bias=[None, None, {4: 1.0}])


# ------------------------------------------------------------------ generation
@pytest.mark.parametrize("method,options", [("sd", {"depth": 2}), ("rheo", {"K": 2, "m": 1, "depth": 2, "N": 3})])
def test_generation_with_the_processor_equals_transformers_processor(method, options):
    lm = CallableLM(lambda ps: TARGET[[p[-1] for p in ps]].float(), vocab_size=V)
    gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method=method, **options)
    bias = {1: -100.0, 3: 1.5}
    for cfg in (SamplingConfig(temperature=0.9), SamplingConfig(temperature=0.0)):
        for seed in range(3):
            ours = gen.generate([0], 10, sampling=cfg, seed=seed, logits_processor=LogitBias(bias)).tokens
            theirs = gen.generate([0], 10, sampling=cfg, seed=seed, logits_processor=SequenceBiasLogitsProcessor(
                [[[t], b] for t, b in bias.items()])).tokens
            assert list(ours) == list(theirs) and 1 not in ours
