"""Prompts and EOS ids are checked, never coerced (issue 16, defects 5 and 6)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec.errors import InvalidConfigError
from specdec.inputs import as_eos_ids, as_token_ids
from specdec.testing import MarkovLM

V = 5


def _gen():
    g = torch.Generator().manual_seed(0)
    target = MarkovLM(torch.randn(V, V, generator=g, dtype=torch.float64))
    draft = MarkovLM(torch.randn(V, V, generator=g, dtype=torch.float64))
    return specdec.SpeculativeGenerator(target=target, draft=draft, method="sd", depth=2)


@pytest.mark.parametrize("prompt", [[1, 2], (1, 2), torch.tensor([1, 2]), np.array([1, 2]), [np.int64(1), torch.tensor(2)]])
def test_one_sequence_of_integers_is_accepted_in_any_integer_type(prompt):
    assert as_token_ids(prompt) == [1, 2]
    out = _gen().generate(prompt, 4, specdec.SamplingConfig(), seed=0)
    assert out.tokens == _gen().generate([1, 2], 4, specdec.SamplingConfig(), seed=0).tokens


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (torch.tensor([[1, 2], [3, 4]]), "has shape (2, 2)"),  # a batch, not one prompt (was flattened)
        ([1, 2.7], "position 1 holds 2.7"),  # was truncated to 2
        ("12", "is a string"),  # was [1, 2]
        ({"input_ids": [1, 2]}, "is a mapping"),  # a tokenizer's output (was a raw int() error)
        ([[1, 2], [3]], "holds a sequence at position 0"),  # several prompts (was a raw int() error)
        (torch.tensor([1.0, 2.0]), "dtype torch.float32"),
        ([True, 1], "position 0 holds True"),
        (3, "must be a sequence"),
    ],
)
def test_anything_else_is_refused_clearly(prompt, message):
    with pytest.raises(InvalidConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _gen().generate(prompt, 4, specdec.SamplingConfig(), seed=0)


@pytest.mark.parametrize("eos", [3, np.int64(3), torch.tensor(3), [3], (3, 4), np.array([3]), torch.tensor([3, 4])])
def test_eos_ids_of_any_integer_type(eos):
    assert 3 in as_eos_ids(eos)
    free = _gen().generate([1, 2], 30, specdec.SamplingConfig(), seed=1).tokens
    out = _gen().generate([1, 2], 30, specdec.SamplingConfig(), seed=1, eos_token_id=eos)
    stops = set(as_eos_ids(eos))
    cut = next((i + 1 for i, t in enumerate(free) if t in stops), len(free))
    assert out.tokens == free[:cut]


@pytest.mark.parametrize(("eos", "message"), [("13", "is a string"), ([1, "2"], "holds '2'"), (1.5, "must be an int"),
                                              ([2.0], "holds 2.0"), (torch.tensor([[1]]), "shape")])
def test_bad_eos_ids_are_refused(eos, message):
    with pytest.raises(InvalidConfigError, match=message):
        _gen().generate([1, 2], 4, specdec.SamplingConfig(), seed=0, eos_token_id=eos)
