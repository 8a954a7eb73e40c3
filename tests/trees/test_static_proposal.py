"""Static trees (chain, SpecInfer, Sequoia) keep their laws over a draft's proposal vocabulary.

An EAGLE-3 draft proposes over ``Vd`` of the target's ``V`` ids (``DraftModel.proposal_ids``);
``grow_static`` records each node's law, and draws its children, over those ``Vd`` columns, so the
draws and the rejection verifiers' residual work are ``[., Vd]`` instead of ``[., V]`` (at Gemma-3's
V = 262,144 and Vd = 16,384, 16x less). The trees, and so the outputs, are those of the full-width law,
draw for draw (the columns are ascending and the others hold 0, so the cumulative sums are the same bits).
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.errors import InvalidDistributionError
from specdec.models import CallableLM
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.testing import ProposalLM
from specdec.trees import build_trees

V = 8
KEEP = torch.tensor([0, 2, 3, 5, 6])


def _logits(prefixes):
    g = torch.Generator().manual_seed(7)
    table = torch.randn(V, V, generator=g)  # a context-dependent law: the row of the last token
    out = table[[p[-1] for p in prefixes]].clone()
    out[:, [1, 4, 7]] = float("-inf")  # nothing outside the proposal vocabulary
    return out


class Full(CallableLM):
    """The draft over all V columns (no proposal vocabulary declared)."""


def Reduced(fn, vocab_size):  # noqa: N802 - used like the class Full
    return ProposalLM(fn, vocab_size=vocab_size, keep=KEEP)


def _target():
    g = torch.Generator().manual_seed(3)
    table = torch.randn(V, V, generator=g)
    return CallableLM(lambda prefixes: table[[p[-1] for p in prefixes]].clone(), vocab_size=V)


CASES = [
    ("static", dict(expansion=(3, 2, 1), mode="iid")),
    ("static", dict(expansion=(3, 2, 2), mode="wor")),
    ("sequoia", dict(num_nodes=8, max_depth=3, acceptance=(0.6, 0.2, 0.1))),
    ("chain", dict(depth=3)),
]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_tree_is_the_full_width_tree_with_laws_over_the_proposal_columns(name, options, temperature):
    builder = get("tree", name)(**options)
    sampling = specdec.SamplingConfig(temperature=temperature)
    for seed in range(6):
        trees = []
        for cls in (Full, Reduced):
            draft = cls(_logits, vocab_size=V)
            draft.begin([seed % V, (3 * seed + 2) % V])
            trees.append(build_trees(builder, (3 * seed + 2) % V, draft, sampling, TorchRandom.seeded(seed)))
        full, reduced = trees
        assert full.law_ids.shape[-1] == V and reduced.law_ids.shape[-1] == len(KEEP)
        assert not bool(reduced.draft_bad.any())
        a, b = full.tree(0), reduced.tree(0)
        for field in ("tokens", "parents", "kinds", "draw_order", "weights", "law_index"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        assert len(a.laws) == len(b.laws)
        for la, lb in zip(a.laws, b.laws):
            assert torch.equal(la.indices, lb.indices) and torch.equal(la.probs, lb.probs) and la.mode == lb.mode


@pytest.mark.parametrize("method", ["specinfer", "sequoia"])
def test_generation_is_unchanged(method):
    """The same tokens as the full-width law, seed by seed (the full-width path is the one proven exact)."""
    target = _target()
    options = {"expansion": (3, 2, 1)} if method == "specinfer" else {"num_nodes": 6, "max_depth": 3}
    for temperature in (1.0, 0.0):
        for seed in range(4):
            outs = []
            for cls in (Full, Reduced):
                gen = specdec.SpeculativeGenerator(target=target, draft=cls(_logits, vocab_size=V), method=method,
                                                   **options)
                outs.append(gen.generate([1, 2], 24, specdec.SamplingConfig(temperature=temperature), seed=seed).tokens)
            assert outs[0] == outs[1]


def test_mass_outside_the_declared_vocabulary_is_an_error_not_a_cut():
    def leaky(prefixes):
        out = _logits(prefixes)
        out[:, 1] = 0.0  # token 1 is not in proposal_ids, yet gets probability
        return out

    gen = specdec.SpeculativeGenerator(target=_target(), draft=Reduced(leaky, vocab_size=V), method="specinfer",
                                       expansion=(2, 1))
    with pytest.raises(InvalidDistributionError, match="proposal_ids"):
        gen.generate([1, 2], 8, specdec.SamplingConfig(), seed=0)
