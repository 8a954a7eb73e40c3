"""verify_for_engine's log-probs (issue 58, deliverable 3): each emitted token's log-probability and
the top-k of the law it was drawn from, per row under its own sampling (with min_p and logit_bias)."""

from __future__ import annotations

import pytest
import torch

from specdec.engine.serving import verify_for_engine
from specdec.errors import InvalidConfigError
from specdec.logit_bias import logit_bias_rows
from specdec.models import CallableLM
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.tree_batch import TreeBatch
from specdec.trees import build_tree
from specdec.trees.static import StaticTreeBuilder

V = 12
_g = torch.Generator().manual_seed(3)
TARGET = torch.randn(V, V, generator=_g) * 2  # order 1: logits after token a = TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g)
CONFIGS = [SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0),
           SamplingConfig(temperature=0.7, top_k=5, min_p=0.05), SamplingConfig(temperature=1.2, top_p=0.8)]
BIASES = [None, {3: 2.0}, None, {0: -100.0}]
BUILDER = StaticTreeBuilder(expansion=(2, 2, 1), mode="wor")


def _batch(seed: int) -> TreeBatch:
    trees = []
    for b in range(len(CONFIGS)):
        draft = CallableLM(lambda ps: DRAFT[[p[-1] for p in ps]], vocab_size=V)
        draft.begin([b])
        trees.append(build_tree(BUILDER, b, draft, CONFIGS[b], TorchRandom.seeded(seed * 10 + b)))
    return TreeBatch.from_trees(trees, max_children=BUILDER.max_nodes, max_depth=BUILDER.max_depth)


def _expected_law(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """``[V]`` float64 log of the law a token at this row was drawn from (alone, one row)."""
    if cfg.greedy:
        return torch.log_softmax(logits.double(), -1)
    return process_logits(logits, cfg).double().log()


@pytest.mark.parametrize("seed", range(4))
def test_logprobs_and_top_k_are_each_rows_own_law(seed):
    batch = _batch(seed)
    logits = TARGET[batch.tokens]  # [B, n, V]
    streams = RowStreams([TorchRandom.seeded(seed * 7 + b) for b in range(len(CONFIGS))])
    out = verify_for_engine(batch, logits, "rejection-wor", CONFIGS, streams, logit_bias=BIASES, logprobs=3)
    plain = verify_for_engine(batch, logits, "rejection-wor", CONFIGS,
                              RowStreams([TorchRandom.seeded(seed * 7 + b) for b in range(len(CONFIGS))]),
                              logit_bias=BIASES)
    assert torch.equal(out.tokens, plain.tokens) and plain.logprobs is None  # log-probs draw nothing
    dense = logit_bias_rows(BIASES, len(CONFIGS), V, "cpu")
    for b, cfg in enumerate(CONFIGS):
        k = int(out.num_emitted[b])
        parents = [0] + out.accepted[b, : k - 1].tolist()
        for j, parent in enumerate(parents):
            law = _expected_law(logits[b, parent] + dense[b], cfg)
            token = int(out.tokens[b, j])
            assert torch.allclose(out.logprobs[b, j], law[token], rtol=1e-6, atol=0), (b, j)
            values, ids = torch.topk(law, 3)
            assert torch.allclose(out.top_logprobs[b, j], values, rtol=1e-6, atol=0), (b, j)
            assert out.top_ids[b, j].tolist() == ids.tolist(), (b, j)
        assert out.logprobs[b, k:].isnan().all() and (out.top_ids[b, k:] == -1).all()
        assert out.top_logprobs[b, k:].isnan().all()
    assert out.top_ids[3].ne(0).all()  # row 3 bans token 0 by its bias


def test_only_the_emitted_tokens_without_top_k():
    batch = _batch(0)
    out = verify_for_engine(batch, TARGET[batch.tokens], "rejection-wor", CONFIGS,
                            RowStreams([TorchRandom.seeded(b) for b in range(len(CONFIGS))]), logprobs=0)
    assert out.logprobs.shape == out.tokens.shape and out.top_logprobs is None and out.top_ids is None
    assert (out.logprobs[~out.logprobs.isnan()] <= 0).all()


@pytest.mark.parametrize("bad", [-1, V + 1, 1.5, True, "3"])
def test_bad_logprobs_are_refused_by_name(bad):
    batch = _batch(0)
    with pytest.raises(InvalidConfigError, match="logprobs must be None or an int"):
        verify_for_engine(batch, TARGET[batch.tokens], "rejection-wor", CONFIGS,
                          RowStreams([TorchRandom.seeded(b) for b in range(len(CONFIGS))]), logprobs=bad)
