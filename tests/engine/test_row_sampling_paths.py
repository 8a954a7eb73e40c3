"""Per-row sampling on every verification path (issue 56, deliverable 3): one pass over the rows,
each under its own configuration, whichever path verifies them (every node at once, the walk
over depths, a path-level rule's tensor form); per-row log-probabilities equal each row's own."""

from __future__ import annotations

import attrs
import pytest
import torch

import specdec
from specdec.engine import StepOptions
from specdec.engine.step import emitted_logprobs
from specdec.models.callable import CallableLM
from specdec.sampling import RowSampling
from specdec.verify.fast import TreeDecision
from tests.engine._per_row import CONFIGS

V = 6
PROMPTS = [[1, 2], [3], [4, 5, 0], [2], [5, 1, 1, 3], [0], [3, 4], [1]]
_g = torch.Generator().manual_seed(7)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
CASES = {
    "rheo": {"method": "rheo", "K": 3, "m": 1, "depth": 3, "N": 6},
    "eagle3": {"method": "eagle3", "K": 2, "depth": 3, "N": 5},
    "sequoia-traversal": {"method": "sequoia", "verifier": "traversal", "num_nodes": 5, "max_depth": 3,
                          "acceptance": (0.5, 0.2, 0.1)},
}


def _lm(table: torch.Tensor) -> CallableLM:
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=V)


def _generator(case: str, rows: str) -> specdec.SpeculativeGenerator:
    return specdec.SpeculativeGenerator(target=_lm(TARGET), draft=_lm(DRAFT), options=StepOptions(rows=rows),
                                        **CASES[case])


@pytest.mark.parametrize("rows", ["all", "path"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_row_equals_its_batch_one_run_on_each_path(case, rows):
    seeds = [70 + b for b in range(len(PROMPTS))]
    out = _generator(case, rows).generate_batch(PROMPTS, 8, CONFIGS, seeds)
    single = _generator(case, rows)
    for b, prompt in enumerate(PROMPTS):
        assert list(out.tokens[b]) == single.generate(prompt, 8, CONFIGS[b], seed=seeds[b]).tokens, (case, rows, b)


def test_per_row_logprobs_equal_each_rows_own():
    g = torch.Generator().manual_seed(2)
    B, n, D = len(CONFIGS), 4, 3
    logits = (torch.randn(B, n, 30, generator=g) * 3).round()  # ties
    accepted = torch.tensor([[1, 2, -1]] * 4 + [[-1, -1, -1]] * 2 + [[3, -1, -1]] * 2)
    num = (accepted >= 0).sum(dim=-1)
    tokens = torch.randint(0, 30, (B, D + 1), generator=g)
    decision = TreeDecision(accepted, num, tokens, tokens[:, 0], num, torch.zeros(B, dtype=torch.bool), num)
    got = emitted_logprobs(logits, decision, RowSampling.of(CONFIGS, B))
    for b, config in enumerate(CONFIGS):
        row = TreeDecision(*(getattr(decision, f.name)[b : b + 1] for f in attrs.fields(TreeDecision)))
        assert torch.equal(got[b : b + 1], emitted_logprobs(logits[b : b + 1], row, config)), (b, config)
