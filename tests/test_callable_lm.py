"""CallableLM refuses an fn that returns probabilities instead of logits (the rule in its docstring)."""

from __future__ import annotations

import doctest

import pytest
import torch

import specdec
import specdec.models.callable as callable_module
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.testing import markov_pair
from specdec.testing.markov import MarkovLM
from specdec.tree import DraftTree

V = 3
PROBS = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)


def constant(row: torch.Tensor) -> CallableLM:
    return CallableLM(lambda prefixes: row.expand(len(prefixes), -1).clone(), vocab_size=int(row.numel()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_probabilities_are_refused_on_every_call(dtype):
    lm = constant(PROBS.to(dtype))
    lm.begin([0])
    with pytest.raises(InvalidConfigError, match=r"returned probabilities, not logits.*probs\.log\(\)"):
        lm.root_logits()
    lm.prefill([0])
    with pytest.raises(InvalidConfigError, match="returned probabilities"):
        lm.score_tree(DraftTree.chain(0, [], [], V))
    with pytest.raises(InvalidConfigError, match="returned probabilities"):
        specdec.SpeculativeGenerator(target=lm, draft=lm, method="sd").generate(
            [0], 4, specdec.SamplingConfig(temperature=1.0), seed=0)


def test_a_softmax_output_is_refused():
    lm = CallableLM(lambda prefixes: torch.softmax(torch.randn(len(prefixes), 50), dim=-1), vocab_size=50)
    lm.begin([0])
    with pytest.raises(InvalidConfigError, match="returned probabilities"):
        lm.root_logits()


@pytest.mark.parametrize(
    "row",
    [
        PROBS.log(),  # the fix the error suggests
        torch.tensor([1.0, 0.0, 0.0]),  # one-hot as logits: plausible, kept
        torch.tensor([0.0, 1.0, 1.0]),  # 0/1 logits that do not sum to 1
        torch.tensor([0.0, 0.0, 0.0]),  # uniform logits
        torch.tensor([0.5, 0.3, 0.1]),  # in [0, 1] but not summing to 1
        torch.tensor([0.7, 0.4, -0.1]),  # sums to 1 but a negative entry
        torch.tensor([0.5, 0.5, float("-inf")]),  # -inf marks an impossible token
        torch.tensor([2.0, 1.0, 0.0]),
    ],
)
def test_logits_pass(row):
    lm = constant(row)
    lm.begin([0])
    assert torch.equal(lm.root_logits(), row)


def test_one_token_vocabularies_pass():
    lm = constant(torch.tensor([1.0]))  # V = 1: every logit row is "a distribution"
    lm.begin([0])
    assert lm.root_logits().tolist() == [1.0]


def test_the_rule_needs_every_row():
    """One probability-looking row among logit rows passes (logits of a real model may
    contain any row); the rule flags an fn whose whole output is probabilities."""
    rows = torch.stack([PROBS, PROBS.log()])
    lm = CallableLM(lambda prefixes: rows[: len(prefixes)], vocab_size=V)
    lm.prefill([0])
    tree = DraftTree.chain(0, [1], [specdec.tree.SparseLaw(torch.tensor([1]), torch.tensor([1.0]),
                                                            specdec.SampleMode.IID)], V)
    assert lm.score_tree(tree).shape == (2, V)


def test_markov_models_still_run():
    target, draft = markov_pair(4)
    out = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo").generate(
        [0, 1], 6, specdec.SamplingConfig(temperature=1.0), seed=0)
    assert len(out.tokens) == 6
    table = torch.log(torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64))
    assert MarkovLM(table).vocab_size == 2  # log-probability tables: logits


def test_docstring_examples():
    failures, tried = doctest.testmod(callable_module, verbose=False)
    assert tried > 0 and failures == 0
