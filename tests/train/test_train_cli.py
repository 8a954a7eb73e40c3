"""specdec train-eagle / train-draft front ends on a tiny local target."""

from __future__ import annotations

import pytest
import torch

from specdec.drafts.eagle.checkpoints import load_head
from specdec.train.cli import train_draft_main, train_eagle_main
from specdec.train.data import PackedBatches, load_records
from specdec.train.models import new_head
from specdec.train.students import Eagle2Student, Eagle3Student, target_batch
from specdec.train.trainer import train_students


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tiny_target, tokenizer):
    d = tmp_path_factory.mktemp("target")
    tiny_target.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.mark.parametrize("version", ["2", "3"])
def test_train_eagle_cli(target_dir, corpus, tmp_path, tiny_target, capsys, version):
    out = tmp_path / "e"
    rc = train_eagle_main(["--target", str(target_dir), "--data", corpus["json"], "--out", str(out),
                           "--version", version, "--steps", "3", "--batch-size", "2", "--seq-len", "16",
                           "--draft-vocab-size", "20", "--no-progress"])
    assert rc == 0 and "saved" in capsys.readouterr().out
    head = load_head(out / f"eagle{version}", tiny_target)
    assert head.config.version == int(version)
    assert (out / "checkpoint" / "state.json").exists()


def test_train_draft_cli(target_dir, corpus, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "d"
    rc = train_draft_main(["--target", str(target_dir), "--data", corpus["txt"], "--out", str(out), "--steps", "2",
                           "--batch-size", "2", "--seq-len", "16", "--layers", "1", "--no-progress"])
    assert rc == 0
    model = AutoModelForCausalLM.from_pretrained(out / "draft_lm")  # a plain HF folder
    assert model.config.num_hidden_layers == 1


def test_cli_bad_input(target_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        train_eagle_main(["--target", str(target_dir), "--data", str(tmp_path / "missing.txt"), "--out",
                          str(tmp_path / "o")])
    assert exc.value.code == 2 and "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_eagle_main(["--target", str(target_dir), "--out", str(tmp_path / "o"), "--version", "4"])
    with pytest.raises(SystemExit):
        train_draft_main(["--target", str(target_dir), "--out", str(tmp_path / "o"), "--steps", "0"])


def test_restricted_vocabulary_losses(corpus, tokenizer, tiny_target, tmp_path):
    """Token losses over a sub-vocabulary (the recipe's cheaper mode) train too,
    and equal the full-vocabulary losses when the sub-vocabulary is everything."""
    vocab = len(tokenizer)
    recs = load_records(corpus["txt"], split="all")
    it = iter(PackedBatches(recs, tokenizer, batch_size=2, seq_len=20, seed=0))
    batches = [next(it) for _ in range(2)]
    everything = torch.arange(vocab)
    s3 = Eagle3Student(new_head(tiny_target, 3, draft_vocab=torch.arange(2, 22), seed=0), ttt_steps=2)
    s2 = Eagle2Student(new_head(tiny_target, 2, seed=0), noise=0.0)
    for s in (s3, s2):
        s.module.eval()
        full = s.loss(target_batch(tiny_target, batches[0], s.layers))[0]
        sub = s.loss(target_batch(tiny_target, batches[0], s.layers, everything))[0]
        torch.testing.assert_close(full, sub, atol=1e-4, rtol=1e-4)
    sub_ids = torch.arange(0, 24)
    s3.module.train()
    before = s3.loss(target_batch(tiny_target, batches[0], s3.layers, sub_ids))[0].item()
    train_students(tiny_target, batches * 6, [s3], tmp_path / "r", steps=12, warmup=2, progress=False,
                   resume=False, vocab_ids=sub_ids)
    s3.module.eval()
    after = s3.loss(target_batch(tiny_target, batches[0], s3.layers, sub_ids))[0].item()
    assert after < 0.9 * before
