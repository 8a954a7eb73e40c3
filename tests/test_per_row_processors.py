"""One logits processor per row in a batch (issue 58, deliverable 3): ``generate_batch(...,
logits_processor=[p0, None, p2])``; each row emits what its batch-1 run with its own processor
emits (same seed), e.g. per-row ``logit_bias`` and penalties."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

import specdec
from specdec.batch import autoregressive_generate_batch
from specdec.errors import InvalidConfigError
from specdec.logit_bias import LogitBias
from specdec.models import CallableLM
from specdec.penalties import OutputPenalties
from specdec.sampling import SamplingConfig

V = 8
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(3)) * 2  # order 1: logits after a = TABLE[a]
PROMPTS = [[1, 2], [3], [4, 5, 6]]


def _lm() -> CallableLM:
    return CallableLM(lambda ps: TABLE[[p[-1] for p in ps]], vocab_size=V)


def _processors() -> list:
    return [LogitBias({0: 3.0, 5: -100.0}), None,
            LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.8),
                                 OutputPenalties(len(PROMPTS[2]), presence=1.0, frequency=0.7)])]


@pytest.mark.parametrize("method,options", [("sd", {"depth": 3}), ("rheo", {"K": 2, "m": 1, "depth": 2, "N": 3})])
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.9), SamplingConfig(temperature=0.0)],
                         ids=["T0.9", "T0"])
def test_each_row_equals_its_batch_1_run_with_its_own_processor(method, options, sampling):
    gen = specdec.SpeculativeGenerator(target=_lm(), draft=_lm(), method=method, kernel="torch", **options)
    procs = _processors()
    batch = gen.generate_batch(PROMPTS, 12, sampling=sampling, seeds=[5, 6, 7], logits_processor=procs)
    changed = 0
    for b, prompt in enumerate(PROMPTS):
        alone = gen.generate(prompt, 12, sampling=sampling, seed=5 + b, logits_processor=_processors()[b]).tokens
        plain = gen.generate(prompt, 12, sampling=sampling, seed=5 + b).tokens
        assert list(batch.tokens[b]) == list(alone), b
        changed += list(alone) != list(plain)
    assert 5 not in batch.tokens[0]  # banned by row 0's bias alone
    assert changed == 2  # power: rows 0 and 2 are processed, row 1 is not


def test_bad_per_row_processors_are_refused_by_name():
    gen = specdec.SpeculativeGenerator(target=_lm(), draft=_lm(), method="sd", depth=2)
    with pytest.raises(InvalidConfigError, match="logits_processor: 2 entries for 3 prompts"):
        gen.generate_batch(PROMPTS, 4, logits_processor=[None, None])
    with pytest.raises(InvalidConfigError, match=r"logits_processor\[1\] must be a callable"):
        gen.generate_batch(PROMPTS, 4, logits_processor=[None, 3, None])
    with pytest.raises(InvalidConfigError, match="one per prompt is for batches"):
        gen.generate(PROMPTS[0], 4, logits_processor=[LogitBias({0: 1.0})])


def test_autoregressive_batches_take_one_processor_per_row():
    sampling = SamplingConfig(temperature=0.8)
    out = autoregressive_generate_batch(_lm(), PROMPTS, 10, sampling, seeds=[1, 2, 3], logits_processor=_processors())
    for b, prompt in enumerate(PROMPTS):
        alone = specdec.autoregressive_generate(_lm(), prompt, 10, sampling, seed=1 + b,
                                                logits_processor=_processors()[b]).tokens
        assert list(out.tokens[b]) == list(alone), b
