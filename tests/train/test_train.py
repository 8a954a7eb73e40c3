"""Training: data sources, losses go down on a tiny target, checkpoints resume, exports load."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.drafts.eagle.checkpoints import export_draft_lm, load_draft_lm, load_head
from specdec.drafts.eagle import hf_feature_fn, make_draft
from specdec.errors import InvalidConfigError
from specdec.train.data import (
    PackedBatches,
    Record,
    base_id,
    is_heldout,
    load_records,
    read_heldout_ids,
    render,
    write_heldout_ids,
)
from specdec.train.models import count_tokens, draft_vocab_from_counts, make_draft_lm, new_head
from specdec.train.students import DraftLMStudent, Eagle2Student, Eagle3Student, target_batch
from specdec.train.trainer import train_students


# ------------------------------------------------------------------ data
def test_sources_parse(corpus, tokenizer):
    txt = load_records(corpus["txt"], split="all")
    jl = load_records(corpus["jsonl"], split="all")
    sg = load_records(corpus["json"], split="all")
    cut = load_records(corpus["cut"], split="all")
    assert len(txt) == len(jl) == len(sg) == 60
    assert 0 < len(cut) < 60  # truncated tail dropped, complete records kept
    assert jl[0].messages is not None and jl[1].text is not None
    assert sg[0].messages[0][0] == "user" and sg[0].messages[1][0] == "assistant"
    ids = render(sg[0], tokenizer)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|user|>") and tokenizer.eos_token_id in ids
    assert render(txt[0], tokenizer)[-1] == tokenizer.eos_token_id
    with pytest.raises(InvalidConfigError):
        load_records(corpus["txt"] + ".missing")
    with pytest.raises(InvalidConfigError):
        load_records(corpus["txt"], split="dev")


def test_heldout_split_is_disjoint_and_by_conversation(corpus, tmp_path):
    assert base_id("abc_12") == "abc" and base_id("abc") == "abc" and base_id("a_b") == "a_b"
    ids = [f"conv{i}_{j}" for i in range(400) for j in range(2)]
    held = [i for i in ids if is_heldout(i, 0.05)]
    assert 0 < len(held) < len(ids) * 0.2
    assert all(is_heldout(f"{base_id(i)}_0", 0.05) == is_heldout(f"{base_id(i)}_1", 0.05) for i in ids)
    all_recs = load_records(corpus["json"], split="all")
    train = load_records(corpus["json"], split="train", heldout_fraction=0.2)
    heldout = load_records(corpus["json"], split="heldout", heldout_fraction=0.2)
    assert {r.id for r in train}.isdisjoint({r.id for r in heldout})
    assert len(train) + len(heldout) == len(all_recs)
    p = write_heldout_ids(tmp_path / "held.txt", heldout)
    assert read_heldout_ids(p) == sorted(r.id for r in heldout)


def test_packing_is_deterministic(corpus, tokenizer):
    recs = load_records(corpus["txt"], split="all")
    a = PackedBatches(recs, tokenizer, batch_size=2, seq_len=16, seed=3)
    b = PackedBatches(recs, tokenizer, batch_size=2, seq_len=16, seed=3)
    ia, ib = iter(a), iter(b)
    first = [next(ia) for _ in range(4)]
    b.skip(ib, 3)
    assert torch.equal(next(ib), first[3])
    assert first[0].shape == (2, 16)
    with pytest.raises(InvalidConfigError):
        PackedBatches(recs, tokenizer, batch_size=0, seq_len=16)


def test_draft_vocab():
    counts = torch.tensor([5, 0, 9, 9, 1, 3])
    assert draft_vocab_from_counts(counts, 3).tolist() == [0, 2, 3]
    assert draft_vocab_from_counts(counts, 3, always=[1]).tolist() == [1, 2, 3]
    batches = [torch.tensor([[0, 1, 1]]), torch.tensor([[2, 2, 2]])]
    assert count_tokens(batches, 4, 1).tolist() == [1, 2, 0, 0]


# --------------------------------------------------------------- training
def _fixed_batches(corpus, tokenizer, n=3):
    recs = load_records(corpus["txt"], split="all")
    it = iter(PackedBatches(recs, tokenizer, batch_size=2, seq_len=24, seed=1))
    return [next(it) for _ in range(n)]


def _eval(student, target, batches):
    student.module.eval()
    with torch.no_grad():
        return sum(student.loss(target_batch(target, b, student.layers))[0].item() for b in batches) / len(batches)


def _students(target, tokenizer):
    vocab = len(tokenizer)
    dv = torch.arange(0, vocab, 1)[:24]
    return [Eagle3Student(new_head(target, 3, draft_vocab=dv, seed=0), ttt_steps=2, lr=3e-3),
            Eagle2Student(new_head(target, 2, seed=0), lr=3e-3),
            DraftLMStudent(make_draft_lm(target, 1), lr=3e-3)]


def test_training_reduces_loss(corpus, tokenizer, tiny_target, tmp_path):
    batches = _fixed_batches(corpus, tokenizer)
    students = _students(tiny_target, tokenizer)
    before = [_eval(s, tiny_target, batches) for s in students]
    hist = train_students(tiny_target, batches * 5, students, tmp_path / "run", steps=15, warmup=2,
                          checkpoint_every=100, progress=False, resume=False)
    after = [_eval(s, tiny_target, batches) for s in students]
    for s, b, a in zip(students, before, after):
        assert a < 0.9 * b, (s.name, b, a)
        assert len(hist[s.name]) == 15
    # exported models load and draft
    head = load_head(tmp_path / "run" / "eagle3", tiny_target)
    d = make_draft(head, feature_fn=hf_feature_fn(tiny_target, head.config.target_layers))
    d.begin([2, 5, 6, 7])
    torch.testing.assert_close(d.root_logits(), students[0].head.eval().full_logits(
        d._last_h[None])[0], atol=1e-5, rtol=1e-5)
    lines = (tmp_path / "run" / "eagle2.metrics.jsonl").read_text().splitlines()
    assert len(lines) == 15 and "feat_loss" in json.loads(lines[-1])


def test_checkpoint_resume_matches_uninterrupted(corpus, tokenizer, tiny_target, tmp_path):
    batches = _fixed_batches(corpus, tokenizer, n=6)

    def run(out, steps, fresh):
        torch.manual_seed(0)
        students = [Eagle2Student(new_head(tiny_target, 2, seed=0), lr=3e-3, noise=0.0)]
        return students, train_students(tiny_target, batches, students, out, steps=6, warmup=2,
                                        checkpoint_every=2, progress=False, resume=not fresh,
                                        time_budget_s=None if steps == 6 else 0.0)

    full, _ = run(tmp_path / "a", 6, True)
    # interrupted after the first step by the time budget, then resumed
    _, h1 = run(tmp_path / "b", 1, True)
    assert len(h1["eagle2"]) == 1
    resumed, h2 = run(tmp_path / "b", 6, False)
    assert [m["step"] for m in h2["eagle2"]] == [2, 3, 4, 5, 6]
    for (k, v), (_, w) in zip(full[0].head.trainable_state_dict().items(),
                              resumed[0].head.trainable_state_dict().items()):
        torch.testing.assert_close(v, w, atol=1e-5, rtol=1e-4, msg=k)


def test_draft_lm_export_roundtrip(corpus, tokenizer, tiny_target, tmp_path):
    from transformers import AutoModelForCausalLM

    model = make_draft_lm(tiny_target, 2)
    with torch.no_grad():
        for p in model.model.layers.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")  # a normal HF folder
    sizes = export_draft_lm(tmp_path / "hf", tmp_path / "small")
    back = load_draft_lm(tmp_path / "small", tiny_target)
    ids = torch.tensor([[2, 5, 6, 7, 8]])
    with torch.no_grad():
        a, b = plain(ids).logits, back(ids).logits
    torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)  # fp16 storage
    assert list(sizes.values())[0] < (tmp_path / "hf" / "model.safetensors").stat().st_size


def test_records_validation():
    with pytest.raises(InvalidConfigError):
        PackedBatches([Record(id="x", text="a")], None, batch_size=1, seq_len=1)
