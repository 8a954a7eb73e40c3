"""Repetition, presence and frequency penalties on a tree (issue 58, deliverable 3): every node
under its own history, equal to vLLM's formula on that history; exact by enumeration through the
engine call."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import specdec

from specdec.engine import serving as serving_module
from specdec.engine.serving import verify_for_engine
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.penalties import OutputPenalties, Penalties, apply_penalties
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import exact_law
from specdec.tree_batch import TreeBatch
from specdec.trees import build_tree
from specdec.trees.static import StaticTreeBuilder
from tests.engine._per_row import gap


def _reference_row(logits: torch.Tensor, prompt: list[int], output: list[int], r: float, p: float,
                   f: float) -> torch.Tensor:
    """vLLM's apply_penalties on one row of logits, its history given as lists."""
    V = logits.shape[-1]
    counts = torch.zeros(V, dtype=torch.int64)
    for t in output:
        counts[t] += 1
    seen = counts > 0
    for t in prompt:
        seen[t] = True
    rep = torch.where(seen, torch.full((V,), r, dtype=logits.dtype), torch.ones(V, dtype=logits.dtype))
    x = torch.where(logits > 0, logits / rep, logits * rep)
    x = x - f * counts.to(logits.dtype)
    return x - p * (counts > 0).to(logits.dtype)


def _tree_batch(V: int, table: torch.Tensor, roots: list[int], builder, configs, seed: int) -> TreeBatch:
    trees = []
    for b, root in enumerate(roots):
        draft = CallableLM(lambda ps: table[[q[-1] for q in ps]], vocab_size=V)
        draft.begin([root])
        trees.append(build_tree(builder, root, draft, configs[b], TorchRandom.seeded(seed + b)))
    return TreeBatch.from_trees(trees, max_children=builder.max_nodes, max_depth=builder.max_depth)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_node_is_penalised_with_its_own_history(dtype):
    V = 9
    g = torch.Generator().manual_seed(2)
    table = torch.randn(V, V, generator=g, dtype=torch.float64)
    builder = StaticTreeBuilder(expansion=(3, 2, 1), mode="wor")
    roots = [1, 5, 5]
    batch = _tree_batch(V, table, roots, builder, [SamplingConfig()] * 3, 0)
    logits = (torch.randn(3, batch.node_slots, V, generator=g) * 2).to(dtype)
    prompts, outputs = [[4, 1], [2, 2, 5], [5]], [[3, 3, 1], [], [7]]
    rep, pre, fre = [1.3, 0.8, 1.0], [0.5, 0.0, -0.25], [0.2, 0.7, 0.0]
    pen = Penalties.of(prompts, outputs, V, repetition=rep, presence=pre, frequency=fre)
    got = apply_penalties(logits, batch, pen)
    for b in range(3):
        tree = batch.tree(b)
        for i in range(tree.num_nodes):
            path, j = [], i
            while j > 0:  # the node's tokens below the root, its own last
                path.insert(0, int(tree.tokens[j]))
                j = int(tree.parents[j])
            ref = _reference_row(logits[b, i], prompts[b], outputs[b] + path, rep[b], pre[b], fre[b])
            assert torch.equal(got[b, i], ref), (b, i, path)
    assert not torch.equal(got, logits)


def test_off_is_the_logits_themselves():
    V = 5
    batch = _tree_batch(V, torch.randn(V, V), [0], StaticTreeBuilder(expansion=(2,), mode="wor"),
                        [SamplingConfig()], 0)
    logits = torch.randn(1, batch.node_slots, V)
    assert torch.equal(apply_penalties(logits, batch, Penalties.of([[1, 2]], [[3]], V)), logits)


@pytest.mark.parametrize("kwargs,match", [
    (dict(repetition=[0.0]), "row 0: repetition must be a number > 0"),
    (dict(presence=[math.nan]), "row 0: presence must be a number finite"),
    (dict(frequency=[1.0, 2.0]), "frequency must be one number per row"),
])
def test_bad_penalties_are_refused_by_name(kwargs, match):
    with pytest.raises(InvalidConfigError, match=match):
        Penalties.of([[1]], [[2]], 4, **kwargs)


def test_a_token_outside_the_vocabulary_is_refused_naming_the_row():
    with pytest.raises(InvalidConfigError, match="row 1: output token 4 is outside"):
        Penalties.of([[1], [2]], [[], [4]], 4)


# ------------------------------------------------------------------ exact through the engine call
V = 4
_g = torch.Generator().manual_seed(11)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # order 1: logits after token a = TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
BUILDER = StaticTreeBuilder(expansion=(2, 1), mode="wor")
CONFIGS = [SamplingConfig(temperature=0.8, top_k=3), SamplingConfig(temperature=0.0)]
PROMPTS, OUTPUTS = [[2, 0], [1, 3, 1]], [[1], [2, 2]]
PEN = dict(repetition=[1.6, 0.7], presence=[0.8, 0.3], frequency=[0.5, 1.1])


def _law(row: int, history_out: list[int], token_logits: torch.Tensor) -> torch.Tensor:
    pen = _reference_row(token_logits, PROMPTS[row], history_out, PEN["repetition"][row], PEN["presence"][row],
                         PEN["frequency"][row])
    return process_logits(pen, CONFIGS[row])


def _target_two(row: int) -> dict[tuple[int, int], float]:
    """The autoregressive law of the next two tokens under the row's penalties."""
    root = PROMPTS[row][-1]
    p1 = _law(row, OUTPUTS[row], TARGET[root])
    out = {}
    for a in range(V):
        p2 = _law(row, OUTPUTS[row] + [a], TARGET[a])
        for b in range(V):
            if float(p1[a] * p2[b]) > 0:
                out[(a, b)] = float(p1[a] * p2[b])
    return out


def _engine_two(row: int) -> dict[tuple[int, int], float]:
    roots = [p[-1] for p in PROMPTS]
    others = _tree_batch(V, DRAFT, roots, BUILDER, CONFIGS, 100)
    pen = Penalties.of(PROMPTS, OUTPUTS, V, **PEN)

    def program(rng):
        draft = CallableLM(lambda ps: DRAFT[[q[-1] for q in ps]], vocab_size=V)
        draft.begin([roots[row]])
        trees = [others.tree(b) for b in range(len(roots))]
        trees[row] = build_tree(BUILDER, roots[row], draft, CONFIGS[row], rng)
        batch = TreeBatch.from_trees(trees, max_children=BUILDER.max_nodes, max_depth=BUILDER.max_depth)
        sources = [rng if b == row else TorchRandom.seeded(200 + b) for b in range(len(roots))]
        out = verify_for_engine(batch, TARGET[batch.tokens], "rejection-wor", CONFIGS, RowStreams(sources),
                                check_trees=False, penalties=pen)
        return tuple(out.tokens[row, : int(out.num_emitted[row])].tolist())

    law: dict[tuple[int, int], float] = {}
    for tokens, prob in exact_law(program).items():
        if len(tokens) >= 2:
            law[tokens[:2]] = law.get(tokens[:2], 0.0) + prob
        else:  # one token emitted: the second from the target's penalised law after it
            p2 = _law(row, OUTPUTS[row] + [tokens[0]], TARGET[tokens[0]])
            for b in range(V):
                if float(p2[b]) > 0:
                    law[(tokens[0], b)] = law.get((tokens[0], b), 0.0) + prob * float(p2[b])
    return law


@pytest.mark.parametrize("row", [0, 1])
def test_each_row_has_its_penalised_target_law(row):
    target = _target_two(row)
    assert gap(_engine_two(row), target) < 1e-9
    root = PROMPTS[row][-1]
    plain = {(a, b): float(process_logits(TARGET[root], CONFIGS[row])[a] * process_logits(TARGET[a], CONFIGS[row])[b])
             for a in range(V) for b in range(V)}
    assert gap({k: v for k, v in plain.items() if v > 0}, target) > 0.05  # power: the penalties move the law


def test_a_history_of_another_shape_is_refused():
    batch = _tree_batch(V, DRAFT, [2, 1], BUILDER, CONFIGS, 0)
    with pytest.raises(InvalidConfigError, match="penalties: a history of"):
        verify_for_engine(batch, TARGET[batch.tokens], "rejection-wor", CONFIGS,
                          RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)]),
                          penalties=Penalties.of([[1]], [[2]], V))


def test_penalising_with_the_committed_history_alone_is_caught(monkeypatch):
    """Power: every node penalised with the committed tokens only (not its path) departs from the
    target's law (the bonus after an accepted child sees the child's token)."""
    real = serving_module.apply_penalties
    monkeypatch.setattr(serving_module, "apply_penalties", lambda logits, tree, pen: real(
        logits, attrs.evolve(tree, num_nodes=torch.ones_like(tree.num_nodes)), pen))
    assert gap(_engine_two(0), _target_two(0)) > 0.05


# ------------------------------------------------------------------ generation: the processor
def test_the_processor_is_the_formula_on_the_output():
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 10, generator=g)
    ids = torch.tensor([[1, 2, 3, 3, 5], [4, 4, 4, 0, 0]])
    got = OutputPenalties(2, presence=0.4, frequency=0.3)(ids, scores.clone())
    for b in range(2):
        ref = _reference_row(scores[b], [], ids[b, 2:].tolist(), 1.0, 0.4, 0.3)
        assert torch.equal(got[b], ref)
    with pytest.raises(InvalidConfigError, match="shorter than prompt_length=6"):
        OutputPenalties(6)(ids, scores)
    with pytest.raises(InvalidConfigError, match="presence must be a number finite"):
        OutputPenalties(1, presence=math.inf)


@pytest.mark.parametrize("method,options", [("sd", {"depth": 3}), ("specinfer", {"expansion": (2, 1)}),
                                            ("rheo", {"K": 2, "m": 1, "depth": 2, "N": 3})])
def test_generation_with_penalties_equals_autoregressive_decoding_at_T0(method, options):
    """At ``T = 0`` every registered rule emits the processed target's argmax: the same tokens as
    autoregressive decoding with the same processors (penalties that change the path)."""
    Vg = 8
    table = torch.randn(Vg, Vg, generator=torch.Generator().manual_seed(9)) * 2
    lm = CallableLM(lambda ps: table[[q[-1] for q in ps]], vocab_size=Vg)
    prompt = [1, 2]
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5),
                                 OutputPenalties(len(prompt), presence=0.7, frequency=0.4)])
    gen = specdec.SpeculativeGenerator(target=lm, draft=lm, method=method, **options)
    ours = gen.generate(prompt, 16, sampling=SamplingConfig(temperature=0.0), logits_processor=procs).tokens
    ref = specdec.autoregressive_generate(lm, prompt, 16, SamplingConfig(temperature=0.0), logits_processor=procs).tokens
    plain = specdec.autoregressive_generate(lm, prompt, 16, SamplingConfig(temperature=0.0)).tokens
    assert list(ours) == list(ref) and list(ref) != list(plain)
