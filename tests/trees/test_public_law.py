"""normalised_law is public (specdec.trees), documented with an example, and is what a
builder of one's own passes to a categorical draw (which refuses an unnormalised law)."""

from __future__ import annotations

import doctest

import pytest
import torch

import specdec.trees
import specdec.trees._common as common
from specdec.errors import InvalidDistributionError
from specdec.rng import TorchRandom


def test_normalised_law_is_exported():
    assert "normalised_law" in specdec.trees.__all__
    assert specdec.trees.normalised_law is common.normalised_law


def test_its_law_is_accepted_where_the_draft_q_is_not():
    q = torch.tensor([0.2, 0.3, 0.4], dtype=torch.float64)  # a truncated law, mass 0.9
    with pytest.raises(InvalidDistributionError, match="total mass 0.9"):
        TorchRandom.seeded(0).categorical(q)
    law = specdec.trees.normalised_law(q)
    assert law.dtype == torch.float64 and abs(float(law.sum()) - 1.0) < 1e-15
    assert 0 <= TorchRandom.seeded(0).categorical(law) < 3


def test_docstring_examples():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(verbose=False)
    (test,) = [t for t in finder.find(common) if t.name.endswith(".normalised_law")]
    assert test.examples
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
    failures, tried = doctest.testmod(common, verbose=False)
    assert tried > 0 and failures == 0
