"""EAGLE checkpoints: own format round trip, reference layouts (EAGLE-2, EAGLE-3), shipped weights."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.drafts.eagle.checkpoints import (
    CheckpointError,
    load_head,
    load_reference_head,
    read_state_dict,
    reference_state_dict,
    save_head,
)
from specdec.drafts.eagle import hf_feature_fn, make_draft
from specdec.errors import VocabMismatchError
from specdec.train.trainer import new_head

V = 53

# The reference key sets (SafeAILab/EAGLE cnets1.py / cnets.py, SpecForge), for a 1-layer head.
EAGLE2_KEYS = {
    "fc.weight", "fc.bias",
    *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    "layers.0.post_attention_layernorm.weight",
}
EAGLE3_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    *(f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
}


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    torch.manual_seed(1)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=V, max_position_embeddings=128, rope_theta=5000.0)
    return LlamaForCausalLM(cfg).eval()


def _head(target, version):
    head = new_head(target, version, draft_vocab=torch.arange(0, V, 3) if version == 3 else None, seed=7)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return head


def _drafts_agree(target, a, b, atol=1e-5):
    prompt = [4, 8, 15, 16, 23, 42]
    fn = hf_feature_fn(target, a.config.target_layers)
    da, db = make_draft(a, feature_fn=fn), make_draft(b, feature_fn=fn)
    for d in (da, db):
        d.begin(prompt)
    torch.testing.assert_close(da.root_logits(), db.root_logits(), atol=atol, rtol=atol)
    torch.testing.assert_close(da.tree_logits([0, 0], [1, 2]), db.tree_logits([0, 0], [1, 2]), atol=atol, rtol=atol)
    torch.testing.assert_close(da.tree_logits([2, 1], [5, 6]), db.tree_logits([2, 1], [5, 6]), atol=atol, rtol=atol)


@pytest.mark.parametrize("version", [2, 3])
def test_own_format_round_trip(target, version, tmp_path):
    head = _head(target, version)
    save_head(head, tmp_path / "ck", meta={"steps": 3})
    doc = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert doc["format"] == "specdec-eagle" and doc["meta"] == {"steps": 3}
    stored = read_state_dict(tmp_path / "ck" / "model.safetensors")
    assert "embed_weight" not in stored and "target_lm_head" not in stored  # the target's tensors are not saved
    back = load_head(tmp_path / "ck", target)
    assert back.config == head.config
    _drafts_agree(target, head, back)
    # fp16 storage (shipping) stays close
    save_head(head, tmp_path / "half", dtype=torch.float16)
    _drafts_agree(target, head, load_head(tmp_path / "half", target), atol=5e-2)


def test_own_format_rejects_bad_checkpoints(target, tmp_path):
    head = _head(target, 2)
    save_head(head, tmp_path / "ck")
    with pytest.raises(CheckpointError):
        load_head(tmp_path / "nothing", target)
    other = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=V + 1))
    with pytest.raises(VocabMismatchError):
        load_head(tmp_path / "ck", other)
    from safetensors.torch import load_file, save_file

    sd = load_file(str(tmp_path / "ck" / "model.safetensors"))
    sd.pop("fc.bias")
    save_file(sd, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="fc.bias"):
        load_head(tmp_path / "ck", target)


def _reference_config(head, version):
    c = head.config
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
           "rope_theta": c.rope_theta, "vocab_size": c.vocab_size, "hidden_act": "silu", "bias": True,
           "max_position_embeddings": 128, "torch_dtype": "float16"}
    if version == 3:
        cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=c.draft_vocab_size,
                   target_hidden_size=c.target_hidden_size)
    return cfg


@pytest.mark.parametrize("version,storage", [(2, "bin"), (2, "safetensors"), (3, "bin"), (3, "safetensors")])
def test_reference_layout_maps_every_key(target, version, storage, tmp_path):
    head = _head(target, version)
    ref = reference_state_dict(head)
    assert set(ref) == (EAGLE2_KEYS if version == 2 else EAGLE3_KEYS)
    ref["embed_tokens.weight"] = torch.randn(V, 32)  # reference files may carry the target's embedding
    folder = tmp_path / "ref"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_reference_config(head, version)))
    if storage == "bin":
        torch.save({k: v.half() if v.is_floating_point() else v for k, v in ref.items()}, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in ref.items()}, str(folder / "model.safetensors"))
    back = load_reference_head(folder, target)
    assert back.config.version == version and back.config.target_layers == head.config.target_layers
    _drafts_agree(target, head, back, atol=5e-2 if storage == "bin" else 1e-5)
    if version == 3:
        assert torch.equal(back.d2t, head.d2t) and torch.equal(back.t2d, head.t2d)


def test_reference_layout_errors(target, tmp_path):
    head = _head(target, 3)
    ref = reference_state_dict(head)
    folder = tmp_path / "ref"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_reference_config(head, 3)))
    from safetensors.torch import save_file

    bad = dict(ref)
    bad["d2t"] = bad["d2t"] + 1  # no longer agrees with t2d
    save_file({k: v.contiguous() for k, v in bad.items()}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="d2t"):
        load_reference_head(folder, target)
    extra = dict(ref)
    extra["midlayer.extra.weight"] = torch.zeros(2)
    save_file({k: v.contiguous() for k, v in extra.items()}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected"):
        load_reference_head(folder, target)
    cfg = _reference_config(head, 3)
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    save_file({k: v.contiguous() for k, v in ref.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="rope"):
        load_reference_head(folder, target)


@pytest.mark.parametrize("version", [2, 3])
def test_heads_load_in_the_targets_dtype(target, version, tmp_path):
    head = _head(target, version)
    save_head(head, tmp_path / "ck")
    embed = target.get_input_embeddings().weight.detach()
    lm = target.get_output_embeddings().weight.detach()
    for dtype in (torch.bfloat16, torch.float64):
        back = load_head(tmp_path / "ck", (embed.to(dtype), lm.to(dtype)))
        assert {p.dtype for p in back.parameters()} == {dtype}
    assert {p.dtype for p in load_head(tmp_path / "ck", target, dtype=torch.float16).parameters()} == {torch.float16}
