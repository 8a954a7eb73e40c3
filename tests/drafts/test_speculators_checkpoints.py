"""EAGLE-3 heads in vLLM's ``speculators`` format (issue 17, item 5): a checkpoint written by the
``speculators`` package itself loads and computes what speculators' own modules compute; our
writer round-trips; aux-layer numbering (vLLM vs SGLang); the head's position limit; bad input.

``data/speculators_eagle3/`` was written by ``speculators==0.9.0``, and
``data/speculators_eagle3_expected.safetensors`` holds what its modules compute (see
``data/make_speculators_eagle3.py``)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.drafts.eagle import hf_feature_fn, make_draft
from specdec.drafts.eagle.checkpoints import (
    CheckpointError,
    load_head,
    load_reference_head,
    save_head,
    save_speculators_head,
    speculators_state_dict,
)
from specdec.drafts.eagle.head import causal_mask
from specdec.errors import InvalidConfigError, VocabMismatchError
from specdec.train.trainer import new_head

V = 53
REAL = Path(__file__).parent / "data" / "speculators_eagle3"
EXPECTED = Path(__file__).parent / "data" / "speculators_eagle3_expected.safetensors"
LOGGER = "specdec.drafts.eagle.checkpoints"

# speculators' Eagle3DraftModel.save_pretrained keys (speculators 0.9.0, one llama layer, reduced draft vocabulary)
SPECULATORS_KEYS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight",
    *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    *(f"layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
}


def _target(layers: int = 6, max_positions: int = 128, architectures: list[str] | None = None) -> LlamaForCausalLM:
    torch.manual_seed(1)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=V, max_position_embeddings=max_positions, rope_theta=5000.0,
                      architectures=architectures)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return _target()


def _real_pair() -> tuple[torch.Tensor, torch.Tensor]:
    """The verifier's embedding as stored in the real checkpoint (what speculators computed with), and an LM head."""
    embed = load_file(str(REAL / "model.safetensors"))["embed_tokens.weight"]
    return embed, torch.randn(V, 32, generator=torch.Generator().manual_seed(3))


def _copy_real(tmp_path: Path) -> Path:
    folder = tmp_path / "real"
    shutil.copytree(REAL, folder)
    return folder


def _edit(folder: Path, fn) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def _outputs(head, features, tokens):
    t = tokens.shape[1]
    positions, mask = torch.arange(t)[None], causal_mask(t)
    with torch.no_grad():
        h1, _, _ = head(features, tokens, positions, mask)
        h2, _, _ = head(h1, tokens, positions, mask, from_target=False)  # depth 2: its own output fed back
        return h1, h2, head.draft_logits(h1), head.draft_logits(h2)


# ------------------------------------------------- the real speculators checkpoint
def test_real_speculators_checkpoint_computes_what_speculators_computes(caplog):
    assert set(load_file(str(REAL / "model.safetensors"))) == SPECULATORS_KEYS
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        head = load_reference_head(REAL, _real_pair(), target_num_layers=6, target_max_positions=128)
    c = head.config
    assert (c.version, c.target_layers, c.draft_vocab_size, c.norm_before_residual, c.fc_bias) == (3, (1, 3, 4), 18, True, False)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rope_theta) == (4, 2, 8, 5000.0)
    assert torch.equal(head.draft_to_target, torch.arange(0, V, 3))
    # the head's 64 positions raised to the target's 128, with a note
    assert c.max_position_embeddings == 128 and make_draft(head).max_length == 128
    assert any("max_position_embeddings (64)" in r.getMessage() and "128" in r.getMessage() for r in caplog.records)
    exp = load_file(str(EXPECTED))
    got = _outputs(head, exp["features"], exp["tokens"])
    for name, value in zip(("h1", "h2", "logits1", "logits2"), got):
        torch.testing.assert_close(value, exp[name], atol=2e-5, rtol=1e-5, msg=name)
    # the comparison has power: the same weights read without norm_before_residual compute something else
    mutant = load_reference_head(REAL, _real_pair(), target_num_layers=6)
    mutant.config = attrs.evolve(c, norm_before_residual=False)
    assert (_outputs(mutant, exp["features"], exp["tokens"])[2] - exp["logits1"]).abs().max() > 1e-2


def test_real_checkpoint_round_trips_to_own_format(target, tmp_path):
    head = load_reference_head(REAL, target)  # a model target: its architecture matches the recorded verifier
    save_head(head, tmp_path / "own", target_num_layers=6)
    back = load_head(tmp_path / "own", target)
    assert back.config == head.config
    exp = load_file(str(EXPECTED))
    for a, b in zip(_outputs(head, exp["features"], exp["tokens"]), _outputs(back, exp["features"], exp["tokens"])):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # and back to the speculators layout: same tensors under the same names (the embedding is the target's)
    save_speculators_head(back, tmp_path / "spec", verifier_name_or_path="specdec-tests/tiny-llama-6l")
    ours, real = load_file(str(tmp_path / "spec" / "model.safetensors")), load_file(str(REAL / "model.safetensors"))
    assert set(ours) == SPECULATORS_KEYS - {"embed_tokens.weight"}
    for k, v in ours.items():
        assert torch.equal(v, real[k]), k


def test_our_config_has_the_real_fields(target, tmp_path):
    """save_speculators_head writes the fields speculators 0.9.0 writes, with the same meaning."""
    real = json.loads((REAL / "config.json").read_text())
    save_speculators_head(load_reference_head(REAL, target), tmp_path / "spec",
                          verifier_name_or_path="specdec-tests/tiny-llama-6l")
    ours = json.loads((tmp_path / "spec" / "config.json").read_text())
    for key in ("architectures", "speculators_model_type", "draft_vocab_size", "eagle_aux_hidden_state_layer_ids",
                "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "target_hidden_size",
                "speculators_config"):
        assert ours[key] == real[key], key
    for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters",
                "attention_bias", "mlp_bias", "hidden_act"):
        assert ours["transformer_layer_config"][key] == real["transformer_layer_config"][key], key
    # the head's limit was raised to the target's 128 when it loaded, and is written as such
    assert ours["transformer_layer_config"]["max_position_embeddings"] == 128


# ------------------------------------------------------------ round trips of our heads
@pytest.mark.parametrize("norm_before_residual", [False, True])
@pytest.mark.parametrize("draft_vocab", ["reduced", "full"])
def test_speculators_round_trip(target, tmp_path, norm_before_residual, draft_vocab):
    head = new_head(target, 3, draft_vocab=torch.arange(0, V, 3) if draft_vocab == "reduced" else None, seed=7)
    head.config = attrs.evolve(head.config, norm_before_residual=norm_before_residual)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    folder = save_speculators_head(head, tmp_path / "spec", verifier_name_or_path="tiny",
                                   verifier_architectures=["LlamaForCausalLM"])
    stored = load_file(str(folder / "model.safetensors"))
    assert ("d2t" in stored) == (draft_vocab == "reduced")  # speculators stores no mapping for a full vocabulary
    back = load_reference_head(folder, target)
    assert back.config == head.config
    fn = hf_feature_fn(target, head.config.target_layers)
    da, db = make_draft(head, feature_fn=fn), make_draft(back, feature_fn=fn)
    for d in (da, db):
        d.begin([4, 8, 15, 16, 23, 42])
    torch.testing.assert_close(da.root_logits(), db.root_logits(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(da.tree_logits([0, 0], [1, 2]), db.tree_logits([0, 0], [1, 2]), atol=1e-5, rtol=1e-5)
    save_head(back, tmp_path / "own")
    assert load_head(tmp_path / "own", target).config == head.config


@pytest.mark.parametrize("layout", ["eagle2", "eagle3", "eagle3-sglang-ids", "speculators"])
def test_every_layout_round_trips_to_own_format(target, tmp_path, layout):
    """A head written in each public layout loads, is saved in specdec's format and loads back the same."""
    from specdec.drafts.eagle.checkpoints import reference_state_dict

    version = 2 if layout == "eagle2" else 3
    head = new_head(target, version, draft_vocab=torch.arange(0, V, 3) if version == 3 else None, seed=7)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    c, folder, kwargs = head.config, tmp_path / layout, {}
    if layout == "speculators":
        save_speculators_head(head, folder)
    else:
        folder.mkdir()
        cfg = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
               "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
               "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "vocab_size": c.vocab_size}
        if version == 3:
            cfg["draft_vocab_size"] = c.draft_vocab_size
        if layout == "eagle3-sglang-ids":  # SpecForge / SGLang: ids of the layers whose *output* is taken
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [l - 1 for l in c.target_layers]}
            kwargs["aux_layer_convention"] = "sglang"
        (folder / "config.json").write_text(json.dumps(cfg))
        save_file({k: v.contiguous() for k, v in reference_state_dict(head).items()}, str(folder / "model.safetensors"))
    loaded = load_reference_head(folder, target, **kwargs)
    assert loaded.config == head.config
    save_head(loaded, tmp_path / "own", target_num_layers=6)
    back = load_head(tmp_path / "own", target)
    assert back.config == head.config
    for k, v in head.trainable_state_dict().items():
        assert torch.equal(back.trainable_state_dict()[k], v), k


def test_norm_before_residual_changes_the_head(target):
    """The flag is used: the same weights with and without it draft differently (and EAGLE-2 refuses it)."""
    head = new_head(target, 3, seed=7)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    features, tokens = torch.randn(1, 5, 96, generator=torch.Generator().manual_seed(0)), torch.tensor([[1, 2, 3, 4, 5]])
    plain = _outputs(head, features, tokens)[2]
    head.config = attrs.evolve(head.config, norm_before_residual=True)
    assert (plain - _outputs(head, features, tokens)[2]).abs().max() > 1e-2
    with pytest.raises(InvalidConfigError, match="norm_before_residual"):
        attrs.evolve(new_head(target, 2, seed=7).config, norm_before_residual=True)
    with pytest.raises(InvalidConfigError, match="max_position_embeddings"):
        attrs.evolve(head.config, max_position_embeddings=0)


# ---------------------------------------------------------------- position limits
def test_position_limit_is_raised_only_below_the_targets(tmp_path, caplog):
    folder = _copy_real(tmp_path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_reference_head(folder, _target(max_positions=64)).config.max_position_embeddings == 64
        assert load_reference_head(folder, _target(max_positions=32)).config.max_position_embeddings == 64
        assert load_reference_head(folder, _real_pair(), target_num_layers=6).config.max_position_embeddings == 64
    assert not caplog.records  # nothing raised, nothing logged
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        head = load_reference_head(folder, _target(max_positions=4096))
    assert head.config.max_position_embeddings == 4096 and len(caplog.records) == 1
    assert str(folder) in caplog.records[0].getMessage()
    # a recorded limit that stays below the target's (a smaller target_max_positions) is enforced by the draft
    small = load_reference_head(folder, _real_pair(), target_num_layers=6, target_max_positions=8)
    assert make_draft(small).max_length == 64
    # own format: a stored limit is raised the same way when the head meets a longer-context target
    save_head(small, tmp_path / "own")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_head(tmp_path / "own", _target(max_positions=256)).config.max_position_embeddings == 256
    assert len(caplog.records) == 1


def test_eagle2_reference_position_limit_is_raised(target, tmp_path, caplog):
    from specdec.drafts.eagle.checkpoints import reference_state_dict

    head = new_head(target, 2, seed=7)
    c = head.config
    folder = tmp_path / "ref"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "rope_theta": c.rope_theta, "vocab_size": c.vocab_size, "max_position_embeddings": 2048}))
    save_file({k: v.contiguous() for k, v in reference_state_dict(head).items()}, str(folder / "model.safetensors"))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_reference_head(folder, target, target_max_positions=8192).config.max_position_embeddings == 8192
    assert "2048" in caplog.records[0].getMessage()


# -------------------------------------------------------------------- bad input
def test_config_and_tensors_that_disagree(tmp_path):
    folder = _copy_real(tmp_path)
    _edit(folder, lambda c: c.update(draft_vocab_size=20))
    with pytest.raises(CheckpointError, match="disagree") as info:
        load_reference_head(folder, _real_pair(), target_num_layers=6)
    assert "lm_head.weight" in str(info.value) and "draft_vocab_size" in str(info.value)
    assert str(folder / "config.json") in str(info.value)
    _edit(folder, lambda c: c.update(draft_vocab_size=18, eagle_aux_hidden_state_layer_ids=[1, 3]))
    with pytest.raises(CheckpointError, match=r"fc\.weight.*feature layers"):
        load_reference_head(folder, _real_pair(), target_num_layers=6)
    _edit(folder, lambda c: (c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 4]),
                             c["transformer_layer_config"].update(intermediate_size=40)))
    with pytest.raises(CheckpointError, match=r"layers\.0\.mlp\..*intermediate_size"):
        load_reference_head(folder, _real_pair(), target_num_layers=6)
    # a reduced draft vocabulary without its d2t / t2d mapping
    _edit(folder, lambda c: c["transformer_layer_config"].update(intermediate_size=48))
    sd = load_file(str(folder / "model.safetensors"))
    del sd["d2t"], sd["t2d"]
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing keys.*d2t"):
        load_reference_head(folder, _real_pair(), target_num_layers=6)


def test_a_config_for_another_target(tmp_path):
    folder = _copy_real(tmp_path)
    wide = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=48, num_hidden_layers=6,
                                        num_attention_heads=4, vocab_size=V))
    with pytest.raises(VocabMismatchError, match="specdec-tests/tiny-llama-6l") as info:
        load_reference_head(folder, wide)
    assert "another target size" in str(info.value)
    bigger_vocab = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                                num_attention_heads=4, vocab_size=V + 10))
    with pytest.raises(VocabMismatchError, match="vocab 53"):
        load_reference_head(folder, bigger_vocab)
    # the aux layers name layers a shallower target lacks
    with pytest.raises(CheckpointError, match=r"\[4\].*3 layers"):
        load_reference_head(folder, _target(layers=3))
    # the verifier's architecture is recorded: a target of another architecture is refused
    with pytest.raises(CheckpointError, match="made for specdec-tests/tiny-llama-6l"):
        load_reference_head(folder, _target(architectures=["Qwen2ForCausalLM"]))
    assert load_reference_head(folder, _target(architectures=["LlamaForCausalLM"])).config.version == 3


@pytest.mark.parametrize("case,match", [
    ("eagle1", "speculators_model_type"),
    ("qwen3_layer", "q_norm"),
    ("two_layers", "num_hidden_layers"),
    ("norm_before_fc", "norm_before_fc"),
    ("fc_norm", "fc_norm"),
    ("attention_bias", "attention_bias"),
    ("no_norm_before_residual", "norm_before_residual"),
    ("string_norm_before_residual", "norm_before_residual"),
    ("llama3_rope", "rope"),
    ("layer_config_not_object", "transformer_layer_config"),
    ("verifier_archs_not_list", "architectures"),
])
def test_unsupported_or_malformed_speculators_configs(tmp_path, case, match):
    folder = _copy_real(tmp_path)

    def edit(c):
        tl = c["transformer_layer_config"]
        if case == "eagle1":
            c["speculators_model_type"] = "eagle"
        elif case == "qwen3_layer":
            tl["model_type"] = "qwen3"
        elif case == "two_layers":
            tl["num_hidden_layers"] = 2
        elif case in ("norm_before_fc", "fc_norm"):
            c[case] = True
        elif case == "attention_bias":
            tl["attention_bias"] = True
        elif case == "no_norm_before_residual":
            del c["norm_before_residual"]
        elif case == "string_norm_before_residual":
            c["norm_before_residual"] = "true"
        elif case == "llama3_rope":
            tl["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5000.0, "factor": 8.0}
        elif case == "layer_config_not_object":
            c["transformer_layer_config"] = "llama"
        elif case == "verifier_archs_not_list":
            c["speculators_config"]["verifier"]["architectures"] = "LlamaForCausalLM"

    _edit(folder, edit)
    with pytest.raises(CheckpointError, match=match) as info:
        load_reference_head(folder, _target())
    assert str(folder) in str(info.value)


def test_bad_arguments(target, tmp_path):
    with pytest.raises(CheckpointError, match="version=2"):
        load_reference_head(REAL, target, version=2)
    with pytest.raises(InvalidConfigError, match="aux_layer_convention"):
        load_reference_head(REAL, target, aux_layer_convention="tgi")
    with pytest.raises(InvalidConfigError, match="target_max_positions"):
        load_reference_head(REAL, target, target_max_positions=0)
    # an explicit convention overrides the speculators default (vLLM's): SGLang's +1
    assert load_reference_head(REAL, target, aux_layer_convention="sglang").config.target_layers == (2, 4, 5)
    with pytest.raises(InvalidConfigError, match="EAGLE-3"):
        save_speculators_head(new_head(target, 2, seed=7), tmp_path / "x")
    with pytest.raises(InvalidConfigError, match="speculative_tokens"):
        save_speculators_head(load_reference_head(REAL, target), tmp_path / "x", speculative_tokens=0)
    with pytest.raises(InvalidConfigError, match="EAGLE-3"):
        speculators_state_dict(new_head(target, 2, seed=7))


# ---------------------------------------------------- against the installed package
def test_the_speculators_package_reads_what_we_write(target, tmp_path):
    """Where ``speculators`` is importable, its own config class parses our config.json and its
    model has our tensors' names and shapes."""
    pytest.importorskip("speculators", reason="the speculators package (vLLM's format) is not installed: "
                        "speculators 0.9.0 imports openai, datasets and hs_connectors and pins transformers<=5.19")
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel

    head = load_reference_head(REAL, target)
    folder = save_speculators_head(head, tmp_path / "spec", verifier_name_or_path="specdec-tests/tiny-llama-6l")
    parsed = SpeculatorModelConfig.from_pretrained(str(folder))
    assert parsed.speculators_model_type == "eagle3" and parsed.draft_vocab_size == 18
    assert parsed.norm_before_residual is True and list(parsed.eagle_aux_hidden_state_layer_ids) == [1, 3, 4]
    assert parsed.transformer_layer_config.hidden_size == 32
    model_sd = Eagle3DraftModel(parsed).state_dict()
    for k, v in load_file(str(folder / "model.safetensors")).items():
        assert tuple(model_sd[k].shape) == tuple(v.shape), k
