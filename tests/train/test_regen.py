"""Self-distillation data (specdec.train.regen, specdec regen-data) and starting a run from another's weights."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.errors import InvalidConfigError
from specdec.train.cli import regen_data_main
from specdec.train.data import Record, base_id, is_heldout, load_records, render
from specdec.train.regen import REGEN_SUFFIX, regen_prompt, regenerate
from specdec.train.models import new_head
from specdec.train.students import Eagle3Student
from specdec.train.trainer import load_student_weights, train_students


@pytest.fixture(scope="module")
def tokenizer(tokenizer):
    """A copy of the training tests' word-level tokenizer whose chat template opens the assistant turn."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = tokenizer.chat_template + "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
    return tok


@pytest.fixture(scope="module")
def tiny_target(tokenizer):
    """A random untied LLaMA whose greedy answers vary with the context (the
    shared tiny target repeats its last token, which would hide padding bugs)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=1, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # well-separated logits: argmax is not decided by rounding
    return model


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _greedy_alone(model, tokenizer, prompt, n):
    """The target's greedy answer to one prompt, generated without batching or padding."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = ids
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=out).logits[0, -1].argmax()
            if int(nxt) == tokenizer.eos_token_id:
                break
            out = torch.cat([out, nxt.view(1, 1)], dim=1)
    return out[0, ids.shape[1]:].tolist()


def _prompt_records(n):
    prompts = ["hello how are you", "what do you like", "the cat sat on the mat", "i am fine thanks",
               "do you like fish", "the dog ran to the park and saw a bird", "what", "how are you"]
    recs = []
    for i in range(n):
        rid = f"p{i}_0"
        if is_heldout(rid):
            continue
        recs.append(Record(id=rid, messages=(("user", prompts[i % len(prompts)]), ("assistant", "fine"))))
    return recs


def test_greedy_answers_equal_unbatched_greedy(tiny_target, tokenizer, tmp_path):
    """Left-padded batches of different prompt lengths give each prompt exactly
    the answer the target writes for it alone."""
    recs = _prompt_records(8)
    out = tmp_path / "regen.jsonl"
    stats = regenerate(tiny_target, tokenizer, recs, out, max_new_tokens=6, batch_size=3, progress=False)
    rows = _rows(out)
    assert stats.records == len(rows) == len(recs)
    assert {r["id"] for r in rows} == {r.id + REGEN_SUFFIX for r in recs}
    by_id = {r.id + REGEN_SUFFIX: r for r in recs}
    for row in rows:
        prompt = row["conversations"][0]["value"]
        assert prompt == by_id[row["id"]].messages[0][1] and row["temperature"] == 0.0
        want = _greedy_alone(tiny_target, tokenizer, prompt, 6)
        got = tokenizer(row["conversations"][1]["value"], add_special_tokens=False)["input_ids"]
        assert got == want
        assert row["finished"] == (len(want) < 6)
    assert stats.tokens == sum(len(tokenizer(r["conversations"][1]["value"])["input_ids"]) for r in rows)


def test_resume_skips_done_and_file_is_training_data(tiny_target, tokenizer, tmp_path):
    recs = _prompt_records(10)
    out = tmp_path / "regen.jsonl"
    first = regenerate(tiny_target, tokenizer, recs, out, max_new_tokens=4, batch_size=4, max_records=3,
                       progress=False)
    assert first.records == 3
    second = regenerate(tiny_target, tokenizer, recs, out, max_new_tokens=4, batch_size=4, progress=False)
    assert second.skipped_done == 3 and second.records == len(recs) - 3
    ids = [r["id"] for r in _rows(out)]
    assert len(ids) == len(set(ids)) == len(recs)
    loaded = load_records(out, "jsonl", split="train", english_only=False)  # none lost to the held-out split
    assert len(loaded) == len(recs)
    assert all(base_id(r.id) == r.id.split("_")[0] for r in loaded)
    ids0 = render(loaded[0], tokenizer)
    assert ids0[0] == tokenizer.convert_tokens_to_ids("<|user|>")


def test_sampling_is_seeded_and_mixed(tiny_target, tokenizer, tmp_path):
    recs = _prompt_records(12)
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    for f, seed in ((a, 5), (b, 5), (c, 6)):
        regenerate(tiny_target, tokenizer, recs, f, max_new_tokens=5, batch_size=4, sample_fraction=0.5,
                   temperature=1.5, seed=seed, progress=False)
    assert a.read_text() == b.read_text()
    assert a.read_text() != c.read_text()
    temps = [r["temperature"] for r in _rows(a)]
    assert set(temps) == {0.0, 1.5}
    everything = tmp_path / "all.jsonl"
    regenerate(tiny_target, tokenizer, recs, everything, max_new_tokens=5, sample_fraction=1.0, progress=False)
    assert {r["temperature"] for r in _rows(everything)} == {1.0}


def test_regen_inputs_are_checked(tiny_target, tokenizer, tmp_path):
    out = tmp_path / "r.jsonl"
    recs = _prompt_records(4)
    for kw in ({"sample_fraction": 1.5}, {"sample_fraction": 0.5, "temperature": 0.0},
               {"sample_fraction": 0.5, "temperature": float("nan")}, {"max_new_tokens": 0}, {"batch_size": 0}):
        with pytest.raises(InvalidConfigError):
            regenerate(tiny_target, tokenizer, recs, out, progress=False, **kw)
    held = next(f"h{i}_0" for i in range(10_000) if is_heldout(f"h{i}_0"))
    with pytest.raises(InvalidConfigError, match="held-out"):
        regenerate(tiny_target, tokenizer, recs + [Record(id=held, messages=(("user", "hello"),))], out,
                   progress=False)
    out.write_text("not json\n")
    with pytest.raises(InvalidConfigError, match="refusing"):
        regenerate(tiny_target, tokenizer, recs, out, progress=False)
    # records without a leading user turn are skipped, not answered
    assert regen_prompt(Record(id="t", text="the cat"), tokenizer, 10) is None
    assert regen_prompt(Record(id="t", messages=(("assistant", "hi"),)), tokenizer, 10) is None
    cut = regen_prompt(Record(id="t", messages=(("user", "the cat sat on the mat"),)), tokenizer, 3)
    assert tokenizer(cut, add_special_tokens=False)["input_ids"] == tokenizer("the cat sat")["input_ids"]


def test_regen_cli(tmp_path, tiny_target, tokenizer, corpus, capsys):
    d = tmp_path / "target"
    tiny_target.save_pretrained(d)
    tokenizer.save_pretrained(d)
    out = tmp_path / "cli.jsonl"
    rc = regen_data_main(["--target", str(d), "--data", corpus["json"], "--out", str(out), "--max-new-tokens", "3",
                          "--max-records", "5", "--batch-size", "2", "--no-progress"])
    assert rc == 0 and "5 records" in capsys.readouterr().out
    assert len(_rows(out)) == 5
    with pytest.raises(SystemExit):
        regen_data_main(["--target", str(d), "--out", str(out), "--sample-fraction", "2"])
    with pytest.raises(SystemExit):
        regen_data_main(["--target", str(d), "--data", str(tmp_path / "missing.jsonl"), "--out", str(out)])


def test_load_student_weights_starts_a_run_from_another(corpus, tokenizer, tiny_target, tmp_path):
    from specdec.train.data import PackedBatches

    recs = load_records(corpus["txt"], split="all")
    dv = torch.arange(len(tokenizer))

    def student(seed):
        return Eagle3Student(new_head(tiny_target, 3, draft_vocab=dv, seed=seed), ttt_steps=2)

    trained = student(0)
    train_students(tiny_target, PackedBatches(recs, tokenizer, 2, 16, seed=0), [trained], tmp_path / "a", steps=3,
                   checkpoint_every=3, progress=False, device="cpu")
    fresh = student(1)
    before = {k: v.clone() for k, v in fresh.module.state_dict().items()}
    load_student_weights(tmp_path / "a" / "checkpoint", [fresh])
    after = fresh.module.state_dict()
    want = trained.module.state_dict()
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert changed and all(torch.equal(after[k], want[k]) for k in after)
    with pytest.raises(InvalidConfigError, match="no weights"):
        load_student_weights(tmp_path / "a", [fresh])
