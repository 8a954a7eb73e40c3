"""High-level training functions: one student per call (see :mod:`specdec.train.trainer`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specdec.errors import InvalidConfigError
from specdec.train.data import PackedBatches, load_records
from specdec.train.models import count_tokens, draft_vocab_from_counts, make_draft_lm, new_head
from specdec.train.students import DraftLMStudent, Eagle2Student, Eagle3Student
from specdec.train.trainer import train_students

__all__ = ["train_eagle", "train_draft_lm", "make_batches"]


def make_batches(data: str | os.PathLike | None, tokenizer: Any, *, fmt: str = "auto", batch_size: int = 4,
                 seq_len: int = 256, seed: int = 0) -> PackedBatches:
    """The packed training stream of a data source (see :func:`~specdec.train.data.load_records`)."""
    return PackedBatches(load_records(data, fmt, split="train"), tokenizer, batch_size=batch_size,
                         seq_len=seq_len, seed=seed)


def train_eagle(target_model: Any, tokenizer: Any, data: str | os.PathLike | None, out_dir: str | os.PathLike, *,
                version: int = 3, steps: int = 1000, batch_size: int = 4, seq_len: int = 256, lr: float = 1e-3,
                draft_vocab_size: int | None = 8192, ttt_steps: int = 3, fmt: str = "auto", seed: int = 0,
                checkpoint_every: int = 50, resume: bool = True, device: str | None = None,
                time_budget_s: float | None = None, progress: bool = True) -> Path:
    """Train an EAGLE-``version`` head for ``target_model``; returns the folder of
    the exported head (own format, :func:`specdec.drafts.eagle.checkpoints.load_head`).

    Example (tiny random target, a few steps):

        train_eagle(model, tok, "corpus.txt", "runs/e3", version=3, steps=10, draft_vocab_size=64)
    """
    if version not in (2, 3):
        raise InvalidConfigError(f"version must be 2 or 3, got {version!r}")
    batches = make_batches(data, tokenizer, fmt=fmt, batch_size=batch_size, seq_len=seq_len, seed=seed)
    vocab = int(target_model.config.vocab_size)
    draft_vocab = None
    if version == 3:
        dv = min(int(draft_vocab_size or vocab), vocab)
        counts = count_tokens(iter(batches), vocab, n_batches=200)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        draft_vocab = draft_vocab_from_counts(counts, dv, always=eos)
    head = new_head(target_model, version, draft_vocab=draft_vocab, seed=seed)
    student = (Eagle2Student(head, lr=lr, name=f"eagle{version}") if version == 2
               else Eagle3Student(head, ttt_steps=ttt_steps, lr=lr, name=f"eagle{version}"))
    meta = {"data": str(data or "sharegpt"), "batch_size": batch_size, "seq_len": seq_len, "lr": lr, "seed": seed,
            "ttt_steps": ttt_steps if version == 3 else None}
    train_students(target_model, batches, [student], out_dir, steps=steps, checkpoint_every=checkpoint_every,
                   resume=resume, seed=seed, device=device, meta=meta, time_budget_s=time_budget_s,
                   progress=progress)
    return Path(out_dir) / student.name


def train_draft_lm(target_model: Any, tokenizer: Any, data: str | os.PathLike | None, out_dir: str | os.PathLike, *,
                   num_layers: int = 2, steps: int = 1000, batch_size: int = 4, seq_len: int = 256,
                   lr: float = 5e-4, fmt: str = "auto", seed: int = 0, checkpoint_every: int = 50,
                   resume: bool = True, device: str | None = None, time_budget_s: float | None = None,
                   progress: bool = True) -> Path:
    """Distil ``target_model`` into a ``num_layers``-layer LLaMA causal LM sharing its
    (frozen) embeddings and LM head; returns the exported Hugging Face model folder
    (``AutoModelForCausalLM.from_pretrained`` loads it; the tokenizer is saved beside)."""
    import torch

    torch.manual_seed(seed)
    batches = make_batches(data, tokenizer, fmt=fmt, batch_size=batch_size, seq_len=seq_len, seed=seed)
    student = DraftLMStudent(make_draft_lm(target_model, num_layers), lr=lr)
    meta = {"data": str(data or "sharegpt"), "batch_size": batch_size, "seq_len": seq_len, "lr": lr, "seed": seed}
    train_students(target_model, batches, [student], out_dir, steps=steps, checkpoint_every=checkpoint_every,
                   resume=resume, seed=seed, device=device, meta=meta, time_budget_s=time_budget_s,
                   progress=progress)
    folder = Path(out_dir) / student.name
    tokenizer.save_pretrained(str(folder))
    return folder
