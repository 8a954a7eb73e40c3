"""EAGLE checkpoint errors (issue 16, defect 8): every bad checkpoint raises a
:class:`~specdec.errors.SpecDecError` that names the file and what is wrong,
never a raw library error or a silent wrong load."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.drafts.eagle.checkpoints import (
    CheckpointError,
    load_head,
    load_reference_head,
    read_state_dict,
    reference_state_dict,
    save_head,
)
from specdec.errors import InvalidConfigError, SpecDecError
from specdec.train.trainer import Eagle2Student, Eagle3Student, new_head, train_students

V = 53


def _target(layers: int) -> LlamaForCausalLM:
    torch.manual_seed(1)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=V, max_position_embeddings=128, rope_theta=5000.0)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return _target(6)


@pytest.fixture(scope="module")
def deep_target() -> LlamaForCausalLM:
    """Same width and vocabulary as ``target``, twice as deep."""
    return _target(12)


def _head(target, version):
    return new_head(target, version, draft_vocab=torch.arange(0, V, 3) if version == 3 else None, seed=7)


def _reference_folder(target, version, folder, storage="safetensors"):
    head = _head(target, version)
    c = head.config
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
           "rope_theta": c.rope_theta, "vocab_size": c.vocab_size}
    if version == 3:
        cfg.update(draft_vocab_size=c.draft_vocab_size, target_hidden_size=c.target_hidden_size)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    ref = {k: v.contiguous() for k, v in reference_state_dict(head).items()}
    if storage == "bin":
        torch.save(ref, folder / "pytorch_model.bin")
    else:
        save_file(ref, str(folder / "model.safetensors"))
    return folder


class _Evil:
    """A pickle that would create ``marker`` when unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


# ------------------------------------------------- 1. corrupt / truncated safetensors
def _spoil(f, how):
    data = f.read_bytes()
    if how == "random":
        f.write_bytes(torch.randint(0, 256, (len(data),), generator=torch.Generator().manual_seed(0),
                                    dtype=torch.uint8).numpy().tobytes())
    elif how == "truncated":
        f.write_bytes(data[: len(data) // 2])
    else:  # header only
        f.write_bytes(data[:12])


@pytest.mark.parametrize("how", ["random", "truncated", "header_only"])
def test_corrupt_own_format_weights_name_the_file(target, tmp_path, how):
    save_head(_head(target, 3), tmp_path / "ck")
    f = tmp_path / "ck" / "model.safetensors"
    _spoil(f, how)
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        load_head(tmp_path / "ck", target)
    assert str(f) in str(info.value)
    assert info.value.__cause__ is not None  # the safetensors error is chained


@pytest.mark.parametrize("how", ["random", "truncated"])
def test_corrupt_reference_weights_name_the_file(target, tmp_path, how):
    folder = _reference_folder(target, 2, tmp_path / "ref")
    _spoil(folder / "model.safetensors", how)
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        load_reference_head(folder, target)
    assert str(folder / "model.safetensors") in str(info.value) and info.value.__cause__ is not None
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        read_state_dict(folder / "model.safetensors")


def test_corrupt_or_malicious_bin_is_refused_with_its_path(target, tmp_path):
    folder = _reference_folder(target, 2, tmp_path / "ref", storage="bin")
    f = folder / "pytorch_model.bin"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        load_reference_head(folder, target)
    assert str(f) in str(info.value) and info.value.__cause__ is not None
    marker = tmp_path / "pwned"
    torch.save({"fc.weight": _Evil(marker)}, f)
    with pytest.raises(CheckpointError, match="weights_only") as info:
        load_reference_head(folder, target)
    assert str(f) in str(info.value)
    assert not marker.exists()  # never unpickled


# ------------------------------------------------------------ 2. malformed config.json
def _own_doc(target, tmp_path):
    save_head(_head(target, 3), tmp_path / "ck")
    return json.loads((tmp_path / "ck" / "config.json").read_text())


def _with(doc, **config):
    out = json.loads(json.dumps(doc))
    for k, v in config.items():
        if v is _DROP:
            del out["config"][k]
        else:
            out["config"][k] = v
    return out


_DROP = object()


@pytest.mark.parametrize("case,field", [
    ("not_utf8", "config.json"),
    ("not_json", "not valid JSON"),
    ("list", "JSON object"),
    ("no_config", "config"),
    ("config_not_object", "config"),
    ("missing_hidden_size", "hidden_size"),
    ("string_hidden_size", "hidden_size"),
    ("float_heads", "num_attention_heads"),
    ("zero_kv_heads", "num_key_value_heads"),
    ("bad_target_layers", "target_layers"),
    ("layers_not_list", "target_layers"),
    ("string_eps", "rms_norm_eps"),
    ("string_bias", "fc_bias"),
    ("unknown_key", "hiden_size"),
    ("bad_format_version", "format_version"),
    ("bad_version", "version"),
])
def test_malformed_own_config_names_file_and_field(target, tmp_path, case, field):
    doc = _own_doc(target, tmp_path)
    cfg = tmp_path / "ck" / "config.json"
    text = {
        "not_json": "{format: specdec-eagle",
        "list": json.dumps([doc]),
        "no_config": json.dumps({k: v for k, v in doc.items() if k != "config"}),
        "config_not_object": json.dumps({**doc, "config": [1, 2]}),
        "missing_hidden_size": json.dumps(_with(doc, hidden_size=_DROP)),
        "string_hidden_size": json.dumps(_with(doc, hidden_size="32")),
        "float_heads": json.dumps(_with(doc, num_attention_heads=4.5)),
        "zero_kv_heads": json.dumps(_with(doc, num_key_value_heads=0)),
        "bad_target_layers": json.dumps(_with(doc, target_layers=["low", "mid", "high"])),
        "layers_not_list": json.dumps(_with(doc, target_layers=3)),
        "string_eps": json.dumps(_with(doc, rms_norm_eps="1e-6")),
        "string_bias": json.dumps(_with(doc, fc_bias="no")),
        "unknown_key": json.dumps(_with(doc, hiden_size=32)),
        "bad_format_version": json.dumps({**doc, "format_version": "one"}),
        "bad_version": json.dumps(_with(doc, version="3")),
    }.get(case)
    if case == "not_utf8":
        cfg.write_bytes(b"\xff\xfe\x00\x81 not text")
    else:
        cfg.write_text(text)
    with pytest.raises(CheckpointError) as info:
        load_head(tmp_path / "ck", target)
    assert str(cfg) in str(info.value) and field in str(info.value)


@pytest.mark.parametrize("case,field", [
    ("list", "JSON object"),
    ("missing_hidden_size", "hidden_size"),
    ("string_hidden_size", "hidden_size"),
    ("null_heads", "num_attention_heads"),
    ("string_intermediate", "intermediate_size"),
    ("string_eps", "rms_norm_eps"),
    ("zero_heads", "num_attention_heads"),
])
def test_malformed_reference_config_names_file_and_field(target, tmp_path, case, field):
    folder = _reference_folder(target, 3, tmp_path / "ref")
    f = folder / "config.json"
    cfg = json.loads(f.read_text())
    if case == "list":
        cfg = [cfg]
    elif case == "missing_hidden_size":
        del cfg["hidden_size"]
    elif case == "string_hidden_size":
        cfg["hidden_size"] = "thirty-two"
    elif case == "null_heads":
        cfg["num_attention_heads"] = None
    elif case == "string_intermediate":
        cfg["intermediate_size"] = "48"
    elif case == "string_eps":
        cfg["rms_norm_eps"] = "tiny"
    elif case == "zero_heads":
        cfg["num_attention_heads"] = 0
    f.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as info:
        load_reference_head(folder, target)
    assert str(f) in str(info.value) and field in str(info.value)


# ------------------------------------------------------ 3. a .bin in an own-format folder
def test_own_format_folder_with_a_bin_says_so(target, tmp_path):
    head = _head(target, 2)
    folder = save_head(head, tmp_path / "ck")
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as info:
        load_head(folder, target)
    msg = str(info.value)
    assert "found pytorch_model.bin" in msg and "model.safetensors" in msg and "read_state_dict" in msg
    # the conversion the message suggests works (read with weights_only=True) and the head then loads
    save_file(read_state_dict(folder), str(folder / "model.safetensors"))
    back = load_head(folder, target)
    assert back.config == head.config
    # a pickle that is not a plain state dict is never unpickled by load_head
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save({"fc.weight": _Evil(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="found pytorch_model.bin"):
        load_head(folder, target)
    assert not marker.exists()


def test_missing_weights_file_is_reported_as_missing(target, tmp_path):
    folder = save_head(_head(target, 2), tmp_path / "ck")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_head(folder, target)


# ------------------------------------------------------------ 4. another target depth
@pytest.mark.parametrize("version", [2, 3])
def test_trained_head_refuses_a_target_of_another_depth(target, deep_target, tmp_path, version):
    head = _head(target, version)
    student = Eagle2Student(head) if version == 2 else Eagle3Student(head, ttt_steps=1)
    ids = torch.randint(0, V, (1, 8), generator=torch.Generator().manual_seed(0))
    train_students(target, [ids], [student], tmp_path / "run", steps=1, warmup=0, device="cpu", progress=False)
    folder = tmp_path / "run" / student.name
    assert json.loads((folder / "config.json").read_text())["target"]["num_hidden_layers"] == 6
    assert load_head(folder, target).config.target_layers == head.config.target_layers  # its own target: fine
    with pytest.raises(CheckpointError, match="6 layers") as info:
        load_head(folder, deep_target)  # same width and vocabulary: it used to load with layers meant for 6
    assert "12" in str(info.value) and str(folder) in str(info.value)
    # tensor-pair targets: the depth is checked when given
    pair = (deep_target.get_input_embeddings().weight.detach(), deep_target.get_output_embeddings().weight.detach())
    with pytest.raises(CheckpointError, match="6 layers"):
        load_head(folder, pair, target_num_layers=12)
    load_head(folder, pair)  # depth unknown: loads as before


def test_save_head_records_the_target_depth(target, deep_target, tmp_path):
    folder = save_head(_head(target, 3), tmp_path / "ck", target_num_layers=6)
    doc = json.loads((folder / "config.json").read_text())
    assert doc["target"] == {"num_hidden_layers": 6, "feature_layers": list(doc["config"]["target_layers"])}
    with pytest.raises(CheckpointError, match="6 layers"):
        load_head(folder, deep_target)
    # an old checkpoint without the record keeps loading as before
    del doc["target"]
    (folder / "config.json").write_text(json.dumps(doc))
    assert load_head(folder, deep_target).config.target_layers == (2, 3, 3)


def test_feature_layers_must_exist_in_the_target(deep_target, target, tmp_path):
    # an old (unrecorded) EAGLE-2 head of the 12-layer target reads hidden_states[12]: a 6-layer target has none
    folder = save_head(_head(deep_target, 2), tmp_path / "ck")
    with pytest.raises(CheckpointError, match="hidden_states"):
        load_head(folder, target)


def test_reference_head_uses_recorded_aux_layer_ids(target, tmp_path):
    folder = _reference_folder(target, 3, tmp_path / "ref")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
    (folder / "config.json").write_text(json.dumps(cfg))
    # a non-speculators config does not say whose numbering its ids use: vLLM's and SGLang's differ by one
    with pytest.raises(CheckpointError, match="aux_layer_convention") as info:
        load_reference_head(folder, target)
    assert "[1, 3, 4]" in str(info.value) and "[2, 4, 5]" in str(info.value)  # both readings shown
    assert load_reference_head(folder, target, aux_layer_convention="vllm").config.target_layers == (1, 3, 4)
    assert load_reference_head(folder, target, aux_layer_convention="sglang").config.target_layers == (2, 4, 5)
    top = {**cfg, "eagle_aux_hidden_state_layer_ids": [0, 2, 5]}  # where vLLM reads it first
    (folder / "config.json").write_text(json.dumps(top))
    assert load_reference_head(folder, target, aux_layer_convention="vllm").config.target_layers == (0, 2, 5)
    # SGLang's +1 makes id 5 hidden_states[6]: the 6-layer target has it (the final normed output); 6 would not be
    top["eagle_aux_hidden_state_layer_ids"] = [0, 2, 6]
    (folder / "config.json").write_text(json.dumps(top))
    with pytest.raises(CheckpointError, match=r"sglang's numbering.*\[7\]"):
        load_reference_head(folder, target, aux_layer_convention="sglang")
    with pytest.raises(InvalidConfigError, match="aux_layer_convention"):
        load_reference_head(folder, target, aux_layer_convention="vLLM+1")
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 40]}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="40"):
        load_reference_head(folder, target, aux_layer_convention="vllm")
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": "1,3,4"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="eagle_aux_hidden_state_layer_ids"):
        load_reference_head(folder, target)
    # no ids: both engines take the inputs of layers (2, N // 2, N - 3); the convention does not matter
    del cfg["eagle_config"]
    (folder / "config.json").write_text(json.dumps(cfg))
    for convention in (None, "vllm", "sglang"):
        assert load_reference_head(folder, target, aux_layer_convention=convention).config.target_layers == (2, 3, 3)


# -------------------------------------------------------------- 5. unsupported versions
@pytest.mark.parametrize("version", [0, False, 1, 4, "3", -2])
def test_reference_version_must_be_supported(target, tmp_path, version):
    folder = _reference_folder(target, 3, tmp_path / "ref")
    with pytest.raises(InvalidConfigError, match=r"2 or 3") as info:
        load_reference_head(folder, target, version=version)
    assert isinstance(info.value, SpecDecError) and repr(version) in str(info.value)
    assert load_reference_head(folder, target, version=None).config.version == 3  # None still detects
