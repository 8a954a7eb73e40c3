"""Self-distillation data: the target's own answers to the training prompts.

A draft head is judged on the text the *target* writes, but public corpora
(ShareGPT) hold text other models wrote. EAGLE-3 therefore regenerates the
assistant turns of its training conversations with the target; this module
does the same: for each training record whose first message is a user turn,
it asks the target for an answer (greedy, or sampled at ``temperature``) and
writes a ShareGPT-style JSONL record:

    {"id": "<record id>#regen", "temperature": 0.0, "finished": true,
     "conversations": [{"from": "human", "value": PROMPT}, {"from": "gpt", "value": ANSWER}]}

``finished`` is false when the answer was cut at ``max_new_tokens`` (its
rendered form then ends with an end-of-turn token the target did not write).
The file is a training source for :func:`specdec.train.data.load_records`
(``fmt="jsonl"``). A regenerated record keeps its source's held-out status:
:func:`~specdec.train.data.base_id` drops the ``#regen`` suffix before
hashing, and :func:`regenerate` refuses held-out source records.

Resumable: records whose id is already in the output file are skipped, so an
interrupted run continues where it stopped.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from specdec._extras import needs_extra
from specdec.errors import InvalidConfigError
from specdec.train.data import Record, is_heldout

__all__ = ["RegenStats", "regen_prompt", "regenerate", "REGEN_SUFFIX"]

REGEN_SUFFIX = "#regen"


@attrs.frozen
class RegenStats:
    """What one :func:`regenerate` call wrote."""

    records: int
    tokens: int
    finished: int
    seconds: float
    skipped_done: int


def regen_prompt(record: Record, tokenizer: Any, max_prompt_tokens: int) -> str | None:
    """The first user turn of ``record``, cut to ``max_prompt_tokens`` tokens of
    content, or None when the record does not start with a user turn (plain
    text, or a conversation opened by the assistant)."""
    if record.messages is None or not record.messages or record.messages[0][0] != "user":
        return None
    content = record.messages[0][1]
    ids = tokenizer(content, add_special_tokens=False)["input_ids"]
    if len(ids) > max_prompt_tokens:
        content = tokenizer.decode(ids[:max_prompt_tokens], skip_special_tokens=True)
    return content if content.strip() else None


def _left_padded(rows: Sequence[Sequence[int]], pad: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``input_ids [B, L]`` left-padded with ``pad`` and the matching ``attention_mask [B, L]``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
        mask[i, width - len(r):] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def _done_ids(out: Path) -> set[str]:
    done: set[str] = set()
    if out.exists():
        with out.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh):
                if not line.strip():
                    continue
                try:
                    done.add(str(json.loads(line)["id"]))
                except (json.JSONDecodeError, KeyError):
                    raise InvalidConfigError(f"{out}:{n + 1}: not a regenerated record; "
                                             "refusing to append to it") from None
    return done


def regenerate(model: Any, tokenizer: Any, records: Sequence[Record], out_path: str | os.PathLike, *,
               max_new_tokens: int = 128, max_prompt_tokens: int = 384, batch_size: int = 32,
               sample_fraction: float = 0.0, temperature: float = 1.0, seed: int = 0,
               time_budget_s: float | None = None, max_records: int | None = None,
               progress: bool = True) -> RegenStats:
    """Append the target's answers to ``records``' first user turns to ``out_path``.

    Args:
        model: a Hugging Face causal LM (the target).
        tokenizer: its tokenizer (with a chat template).
        records: training records; held-out ShareGPT ids are refused
            (:func:`~specdec.train.data.is_heldout`), records without a leading
            user turn are skipped.
        out_path: JSONL file (created or appended to).
        max_new_tokens: answer length cap.
        max_prompt_tokens: the prompt's content is cut to this many tokens.
        batch_size: prompts per ``generate`` call (prompts are length-sorted
            within windows of ``8 * batch_size`` to limit padding).
        sample_fraction: share of records answered by sampling at
            ``temperature`` (chosen per record with ``seed``); the rest greedy.
        temperature: sampling temperature (> 0) of the sampled share.
        seed: record order, the greedy/sampled choice and the sampling (torch's
            global generator is reseeded before each sampled batch). A run
            is a pure function of its arguments and of the records already in
            ``out_path``; a resumed run draws these for the remaining records
            afresh, so it need not equal an uninterrupted one.
        time_budget_s: stop after the batch that crosses this many seconds.
        max_records: stop after this many new records.
        progress: show a tqdm bar.

    Returns:
        :class:`RegenStats` of this call.
    """
    if not 0.0 <= sample_fraction <= 1.0:
        raise InvalidConfigError(f"sample_fraction must be in [0, 1], got {sample_fraction}")
    if sample_fraction > 0 and not (temperature > 0 and temperature == temperature):
        raise InvalidConfigError(f"temperature must be > 0 for sampled answers, got {temperature}")
    if max_new_tokens < 1 or max_prompt_tokens < 1 or batch_size < 1:
        raise InvalidConfigError("max_new_tokens, max_prompt_tokens and batch_size must be >= 1")
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidConfigError("the tokenizer has no chat template; regeneration renders user turns with it")
    held = [r.id for r in records if is_heldout(r.id)]
    if held:
        raise InvalidConfigError(f"{len(held)} held-out records (e.g. {held[0]!r}) passed to regenerate; "
                                 "pass the training split only")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _done_ids(out)
    rng = random.Random(seed)
    order = list(records)
    rng.shuffle(order)
    todo = [r for r in order if r.id + REGEN_SUFFIX not in done]
    skipped = len(order) - len(todo)
    if max_records is not None:
        todo = todo[:max_records]
    eos = tokenizer.eos_token_id
    if eos is None:
        raise InvalidConfigError("the tokenizer has no EOS token; answers could not end")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    device = next(model.parameters()).device
    bar = None
    if progress:
        with needs_extra("train", "regenerate"):
            from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="regenerate", unit="rec", dynamic_ncols=True)
    n_rec = n_tok = n_fin = 0
    t0 = time.time()
    window = 8 * batch_size
    try:
        for w0 in range(0, len(todo), window):
            items = []
            for r in todo[w0:w0 + window]:
                p = regen_prompt(r, tokenizer, max_prompt_tokens)
                if p is None:
                    if bar is not None:
                        bar.update(1)
                    continue
                sampled = rng.random() < sample_fraction
                text = tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                     add_generation_prompt=True)
                items.append((r, p, text, sampled))
            items.sort(key=lambda it: (it[3], len(it[2])))
            stop = False
            for b0 in range(0, len(items), batch_size):
                chunk = items[b0:b0 + batch_size]
                groups = [[it for it in chunk if not it[3]], [it for it in chunk if it[3]]]
                lines = []
                for group in groups:
                    if not group:
                        continue
                    sampled = group[0][3]
                    enc = _left_padded([tokenizer(it[2], add_special_tokens=False)["input_ids"] for it in group],
                                       pad, device)
                    gen_kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": pad}
                    if sampled:
                        torch.manual_seed(rng.randrange(2**31))
                        gen_kw.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
                    else:
                        gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
                    with torch.no_grad():
                        seqs = model.generate(**enc, **gen_kw)
                    new = seqs[:, enc["input_ids"].shape[1]:].tolist()
                    for (r, p, _, _), row in zip(group, new):
                        finished = eos in row
                        if finished:
                            row = row[:row.index(eos)]
                        answer = tokenizer.decode(row, skip_special_tokens=True)
                        n_tok += len(row)
                        n_fin += finished
                        lines.append(json.dumps({
                            "id": r.id + REGEN_SUFFIX, "temperature": temperature if sampled else 0.0,
                            "finished": finished,
                            "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": answer}],
                        }))
                with out.open("a", encoding="utf-8") as fh:
                    fh.write("".join(line + "\n" for line in lines))
                n_rec += len(lines)
                if bar is not None:
                    bar.update(len(chunk))
                    bar.set_postfix(tok_s=f"{n_tok / max(1e-9, time.time() - t0):.0f}")
                if time_budget_s is not None and time.time() - t0 >= time_budget_s:
                    stop = True
                    break
            if stop:
                break
    finally:
        if bar is not None:
            bar.close()
    return RegenStats(records=n_rec, tokens=n_tok, finished=n_fin, seconds=time.time() - t0, skipped_done=skipped)
