"""The training recipe's ``--target gemma3`` path on a tiny random Gemma 3 (the real
Gemma-3-270M is never loaded here): plain-text conversations, the held-out list left
alone, EAGLE-3 only, export to the user cache and never into ``specdec/assets``,
and the bench's ``auto`` head for Gemma."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

import specdec.models.gemma3 as gemma3
import specdec.train.data as data
import specdec.train.export as export
import specdec.train.recipes as recipes
from specdec.train.data import Record


def tiny_gemma3(vocab: int) -> transformers.Gemma3ForCausalLM:
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, max_position_embeddings=256,
        sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        eos_token_id=1, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.Gemma3ForCausalLM._from_config(config, attn_implementation="sdpa").eval()


@pytest.fixture()
def gemma_env(monkeypatch, tmp_path, corpus, tokenizer):
    """The recipe's loaders swapped for a tiny Gemma 3 and the test corpus; a temporary
    copy of the assets folder and user cache."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None  # as Gemma-3-270M's tokenizer: none
    model = tiny_gemma3(len(tok))
    real_load = data.load_records
    monkeypatch.setattr(gemma3, "load_gemma3", lambda *a, **k: (model, tok))
    monkeypatch.setattr(data, "load_records",
                        lambda path, *a, **k: real_load(corpus["json"] if path is None else path, *a, **k))
    assets = tmp_path / "assets"
    assets.mkdir()
    shutil.copy(export.ASSETS / "sharegpt_heldout_ids.txt", assets / "sharegpt_heldout_ids.txt")
    monkeypatch.setattr(export, "ASSETS", assets)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return {"model": model, "tok": tok, "assets": assets, "cache": tmp_path / "cache"}


def test_plain_conversation_keeps_the_id():
    rec = Record(id="x_1", messages=(("system", "Be brief."), ("user", " Hi? "), ("assistant", "Hello.")))
    out = recipes.plain_conversation(rec)
    assert out.id == "x_1" and out.messages is None
    assert out.text == "System: Be brief.\n\nUser: Hi?\n\nAssistant: Hello."
    text = Record(id="t", text="plain")
    assert recipes.plain_conversation(text) is text


def test_gemma3_recipe_trains_eagle3_and_exports_to_the_cache(gemma_env, tmp_path, capsys):
    real = Path(data.__file__).resolve().parent.parent / "assets"  # the package's (export.ASSETS is a copy here)
    real_assets = sorted(p.name for p in real.iterdir())
    real_heldout = (real / "sharegpt_heldout_ids.txt").read_bytes()
    shipped = (gemma_env["assets"] / "sharegpt_heldout_ids.txt").read_bytes()
    run = tmp_path / "run"
    assert recipes.main(["--target", "gemma3", "--out", str(run), "--steps", "3", "--batch-size", "2",
                         "--seq-len", "16", "--draft-vocab-size", "20", "--threads", "1", "--checkpoint-every", "2",
                         "--no-progress"]) == 0
    log = capsys.readouterr().out
    # EAGLE-3 only, over the draft vocabulary; no draft LM folder
    assert (run / "eagle3" / "config.json").is_file() and not (run / "eagle2").exists()
    assert not (run / "draft_lm").exists()
    doc = json.loads((run / "eagle3" / "config.json").read_text())
    assert doc["meta"]["target"].startswith("Gemma-3-270M") and "Gemma Terms of Use" in doc["meta"]["license"]
    assert "plain" in doc["meta"]["data"] and doc["meta"]["token_loss_vocab"].startswith("draft vocabulary")
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 3
    # the held-out list: written into the run, the shipped one untouched
    assert (gemma_env["assets"] / "sharegpt_heldout_ids.txt").read_bytes() == shipped
    held = data.read_heldout_ids(run / "sharegpt_heldout_ids.txt")
    assert held == sorted(r.id for r in data.load_records(None, split="heldout"))
    assert "held-out ids:" in log and "--target gemma3" in log
    # export: into the user cache with a NOTICE, never into the assets
    assert recipes.main(["--target", "gemma3", "--out", str(run), "--export"]) == 0
    head = gemma3.cached_head_path(3)
    assert head is not None and head.parent == gemma_env["cache"] / "heads"
    assert (head / "NOTICE").read_text().startswith("Gemma is provided under and subject to the Gemma Terms of Use")
    assert sorted(p.name for p in gemma_env["assets"].iterdir()) == ["sharegpt_heldout_ids.txt"]
    with pytest.raises(ValueError, match="package assets"):
        recipes.export_gemma3_heads(run, gemma_env["assets"])
    with pytest.raises(ValueError, match="package assets"):
        recipes.export_gemma3_heads(run, gemma_env["assets"] / "sub")
    # the real package assets were not touched either
    assert sorted(p.name for p in real.iterdir()) == real_assets
    assert (real / "sharegpt_heldout_ids.txt").read_bytes() == real_heldout
    assert not any("gemma" in p.name for p in real.iterdir())
    # the exported head loads on the target and drafts over its vocabulary
    from specdec.drafts.eagle.checkpoints import load_head

    loaded = load_head(head, gemma_env["model"])
    assert loaded.config.version == 3 and loaded.config.draft_vocab_size == 20
    # resuming with the same command is a no-op past the last step
    assert recipes.main(["--target", "gemma3", "--out", str(run), "--steps", "3", "--batch-size", "2",
                         "--seq-len", "16", "--draft-vocab-size", "20", "--threads", "1", "--no-progress"]) == 0
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 3


def test_gemma3_recipe_distils_a_draft_lm_over_the_draft_vocabulary(gemma_env, tmp_path):
    """``--students draft_lm``: a 2-layer Gemma 3 draft LM (the target's first layers), trained over
    the draft vocabulary, exported to the user cache with a NOTICE and its proposal vocabulary;
    ``specdec bench --target gemma3`` drafts with it over that vocabulary, losslessly (greedy)."""
    import specdec
    from specdec.bench.models import load_bench_models
    from specdec.drafts.eagle.checkpoints import draft_lm_proposal_ids, load_draft_lm
    from specdec.targets.hf import HFTarget

    target = gemma_env["model"]
    run = tmp_path / "run"
    assert recipes.main(["--target", "gemma3", "--students", "draft_lm", "--out", str(run), "--steps", "3",
                         "--batch-size", "2", "--seq-len", "16", "--draft-vocab-size", "20", "--threads", "1",
                         "--no-progress"]) == 0
    lm = transformers.AutoModelForCausalLM.from_pretrained(str(run / "draft_lm"))
    assert type(lm) is type(target) and lm.config.num_hidden_layers == 2
    assert lm.config.layer_types == ["sliding_attention", "full_attention"]  # the target's first two
    meta = json.loads((run / "draft_lm" / "specdec_meta.json").read_text())
    assert meta["token_loss_vocab"].startswith("draft vocabulary") and "Gemma Terms of Use" in meta["license"]
    assert gemma3.cached_draft_lm_path() is None
    # an export from the latest checkpoint (training still running) records the same vocabulary
    assert recipes.main(["--target", "gemma3", "--out", str(run), "--export", "--from-checkpoint"]) == 0
    early = json.loads((run / "from-checkpoint" / "draft_lm" / "specdec_meta.json").read_text())
    assert early["token_loss_vocab"] == meta["token_loss_vocab"] and early["from"] == "checkpoint"
    assert (gemma3.cached_draft_lm_path() / "proposal_ids.json").is_file()
    assert recipes.main(["--target", "gemma3", "--out", str(run), "--export"]) == 0
    path = gemma3.cached_draft_lm_path()
    assert path is not None and path.parent == gemma_env["cache"] / "heads" and path.name == gemma3.DRAFT_LM_NAME
    assert (path / "NOTICE").read_text().startswith("Gemma is provided under and subject to the Gemma Terms of Use")
    assert sorted(p.name for p in gemma_env["assets"].iterdir()) == ["sharegpt_heldout_ids.txt"]
    ids = draft_lm_proposal_ids(path)
    assert torch.equal(ids, torch.load(str(run / "draft_vocab.pt"), weights_only=True)) and len(ids) == 20
    loaded = load_draft_lm(path, target)
    assert torch.equal(loaded.get_input_embeddings().weight, target.get_input_embeddings().weight)
    assert "lm-full" not in load_bench_models("gemma3", need_kinds=frozenset({"lm"})).drafts
    models = load_bench_models("gemma3", need_kinds=frozenset({"lm", "lm-full"}))
    draft = models.drafts["lm"]
    assert torch.equal(draft.proposal_ids, ids) and "proposes over 20 ids" in models.descriptions["lm"]
    # the bench's lm-full kind: the same model over the whole vocabulary, as transformers runs it
    full = models.drafts["lm-full"]
    assert full.proposal_ids is None and full.model is draft.model and models.targets["lm-full"] is models.targets["lm"]
    assert "proposing over the full vocabulary" in models.descriptions["lm-full"]
    prompt = [2, 5, 7, 9]
    for method, d in (("sd", draft), ("specinfer", draft), ("sd", full)):
        gen = specdec.SpeculativeGenerator(target=HFTarget(target), draft=d, method=method)
        out = gen.generate(prompt, 10, specdec.SamplingConfig(temperature=0.0), seed=0)
        greedy = specdec.autoregressive_generate(HFTarget(target), prompt, 10, specdec.SamplingConfig(temperature=0.0))
        assert out.tokens == greedy.tokens
        sampled = gen.generate(prompt, 10, specdec.SamplingConfig(temperature=1.0), seed=0)
        assert len(sampled.tokens) == 10


def test_make_draft_lm_keeps_the_targets_class_and_layers(gemma_env):
    from specdec.errors import InvalidConfigError
    from specdec.train.models import make_draft_lm

    target = gemma_env["model"]
    lm = make_draft_lm(target, 2)
    for i in range(2):
        for (name, a), (_, b) in zip(lm.model.layers[i].state_dict().items(), target.model.layers[i].state_dict().items()):
            assert torch.equal(a, b), name
    assert not lm.get_input_embeddings().weight.requires_grad
    x = torch.tensor([[3, 4, 5]])
    with torch.no_grad():  # one layer: the target truncated to its first layer, exactly
        one = make_draft_lm(target, 1)
        full = target(x, output_hidden_states=True)
        assert torch.allclose(one.model(x).last_hidden_state, target.model.norm(full.hidden_states[1]), atol=1e-5)
    with pytest.raises(InvalidConfigError, match="a draft LM of 5 layers from a target of 4"):
        make_draft_lm(target, 5)


def test_gemma3_head_warm_start_uses_gemma_norm_scale(gemma_env):
    from specdec.train.models import new_head

    model = gemma_env["model"]
    with torch.no_grad():
        model.model.norm.weight.fill_(0.5)
    head = new_head(model, 3, draft_vocab=torch.arange(10))
    x = torch.randn(3, 32)
    assert torch.allclose(head.norm(x), model.model.norm(x), atol=1e-5)  # Gemma: x * (1 + w)


def test_bench_auto_head_for_gemma3(gemma_env, tmp_path):
    from specdec.bench.models import auto_head_path, missing_head_message

    assert auto_head_path("gemma3", 3) is None
    msg = missing_head_message("gemma3", 3)
    assert "python -m specdec.train.recipes --target gemma3" in msg and "--export" in msg
    assert "eagle3-gemma-3-270m" in msg and "--eagle3-head PATH" in msg
    dst = gemma3.heads_root() / gemma3.HEAD_NAME.format(version=3)
    dst.mkdir(parents=True)
    (dst / "config.json").write_text("{}")
    assert auto_head_path("gemma3", 3) == dst and auto_head_path("gemma3", 2) is None
    assert auto_head_path("some/folder", 3) is None


def test_load_bench_models_uses_the_cached_gemma3_head(gemma_env):
    from specdec.bench.models import load_bench_models
    from specdec.drafts.eagle.checkpoints import save_head
    from specdec.train.models import new_head

    lines: list[str] = []
    need = frozenset({"lm", "eagle3"})
    models = load_bench_models("gemma3", "truncated:1", need_kinds=need, log=lines.append)
    assert "eagle3" not in models.drafts
    assert any("no EAGLE-3 head for Gemma-3-270M" in ln and "--target gemma3" in ln for ln in lines)
    head = new_head(gemma_env["model"], 3, draft_vocab=torch.arange(12))
    save_head(head, gemma3.heads_root() / "eagle3-gemma-3-270m", target_num_layers=4)
    models = load_bench_models("gemma3", "truncated:1", need_kinds=need)
    assert models.drafts["eagle3"].vocab_size == len(gemma_env["tok"])
    assert "user cache" in models.descriptions["eagle3"]
    none = load_bench_models("gemma3", "truncated:1", {3: "none"}, need_kinds=need)
    assert "eagle3" not in none.drafts


def test_smollm2_default_is_unchanged(monkeypatch, tmp_path, corpus, tokenizer, tiny_target):
    """Without --target: the SmolLM2 recipe (three students, the shipped held-out list rewritten)."""
    import specdec.models.smollm2 as smollm2

    real_load = data.load_records
    monkeypatch.setattr(smollm2, "load_smollm2", lambda *a, **k: (tiny_target, tokenizer))
    monkeypatch.setattr(data, "load_records",
                        lambda path, *a, **k: real_load(corpus["json"] if path is None else path, *a, **k))
    monkeypatch.setattr(export, "ASSETS", tmp_path / "assets")
    run = tmp_path / "run"
    assert recipes.main(["--out", str(run), "--steps", "2", "--seq-len", "16", "--draft-vocab-size", "20",
                         "--threads", "1", "--no-progress"]) == 0
    for name in ("eagle2", "eagle3", "draft_lm"):
        assert (run / name / "config.json").is_file()
    doc = json.loads((run / "eagle3" / "config.json").read_text())
    assert doc["meta"]["target"].startswith("SmolLM2") and doc["meta"]["token_loss_vocab"] == "full"
    assert "license" not in doc["meta"]
    assert (tmp_path / "assets" / "sharegpt_heldout_ids.txt").is_file()
    assert not (run / "sharegpt_heldout_ids.txt").exists()


def test_smollm2_export_gives_a_restricted_draft_lm_its_proposal_vocabulary(monkeypatch, tmp_path, corpus, tokenizer,
                                                                            tiny_target):
    """A SmolLM2 draft LM distilled over the draft vocabulary (``--restrict-vocab``) is exported into the
    assets with that vocabulary as its proposal vocabulary, as a Gemma one is into the cache; one
    distilled over the full vocabulary gets none."""
    import specdec.models.smollm2 as smollm2
    from specdec.drafts.eagle.checkpoints import draft_lm_proposal_ids

    real_load = data.load_records
    monkeypatch.setattr(smollm2, "load_smollm2", lambda *a, **k: (tiny_target, tokenizer))
    monkeypatch.setattr(data, "load_records",
                        lambda path, *a, **k: real_load(corpus["json"] if path is None else path, *a, **k))
    for restrict in (True, False):
        assets = tmp_path / f"assets-{restrict}"
        monkeypatch.setattr(export, "ASSETS", assets)
        run = tmp_path / f"run-{restrict}"
        flag = "--restrict-vocab" if restrict else "--no-restrict-vocab"
        assert recipes.main(["--out", str(run), "--students", "draft_lm", "--steps", "2", "--seq-len", "16",
                             "--draft-vocab-size", "20", "--threads", "1", "--no-progress", flag]) == 0
        assert recipes.main(["--out", str(run), "--export"]) == 0
        folder = assets / "draft-lm-smollm2-135m-instruct"
        meta = json.loads((folder / "specdec_meta.json").read_text())
        ids = draft_lm_proposal_ids(folder)
        if restrict:
            assert torch.equal(ids, torch.load(str(run / "draft_vocab.pt"), weights_only=True)) and len(ids) == 20
            assert meta["proposal_vocabulary"].startswith("20 ids")
        else:
            assert ids is None and "proposal_vocabulary" not in meta and meta["token_loss_vocab"] == "full"


def test_the_shipped_draft_lm_proposes_over_the_vocabulary_it_was_distilled_over():
    """The shipped SmolLM2 draft LM's loss read the joint run's 8,192-id draft vocabulary, which the
    shipped EAGLE-3 head (warm-started from that run) keeps as its ``t2d``: its proposal vocabulary."""
    from safetensors.torch import load_file

    from specdec.bench.models import shipped_draft_available, shipped_heads_available
    from specdec.drafts.eagle import shipped
    from specdec.drafts.eagle.checkpoints import draft_lm_proposal_ids, shipped_draft_lm_path

    if not shipped_draft_available() or not shipped_heads_available()[3]:
        pytest.skip("the shipped weights are not installed")
    folder = shipped_draft_lm_path()
    meta = json.loads((folder / "specdec_meta.json").read_text())
    ids = draft_lm_proposal_ids(folder)
    assert meta["token_loss_vocab"] == "draft vocabulary (8192 ids)" and ids is not None and len(ids) == 8192
    head = load_file(str(shipped.SHIPPED_DIR / "eagle3-smollm2-135m-instruct" / "model.safetensors"))
    assert torch.equal(ids, head["t2d"].nonzero().flatten())
