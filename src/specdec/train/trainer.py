"""Training EAGLE heads and distilled draft LMs from a frozen target.

One loop serves any number of *students* trained on the same stream: each
batch of tokens goes through the frozen target once (features of every layer a
student needs, plus the target's logits), then every student takes one
optimizer step on it. Target features are computed batch by batch and
discarded (nothing is dumped to disk or kept in memory).

The students and their losses are :mod:`specdec.train.students`' (see there);
the fresh heads and draft LMs they start from, and EAGLE-3's draft vocabulary,
:mod:`specdec.train.models`'. Their names stay importable from here.

Checkpoints: every ``checkpoint_every`` steps, ``<out>/checkpoint/`` holds each
student's trainable tensors (safetensors), optimizer state (a tensor-only dict
read back with ``weights_only=True``) and ``state.json``; ``resume=True``
restarts from it, skipping the data already seen.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec._extras import needs_extra
from specdec.errors import InvalidConfigError
from specdec.train.models import count_tokens, draft_vocab_from_counts, make_draft_lm, new_head
from specdec.train.students import (
    DraftLMStudent,
    Eagle2Student,
    Eagle3Student,
    Student,
    TargetBatch,
    eagle3_ttt_forward,
    target_batch,
)

# the students (TargetBatch, target_batch, Student, Eagle2Student, Eagle3Student, DraftLMStudent,
# eagle3_ttt_forward: specdec.train.students) and the fresh models (new_head, make_draft_lm, count_tokens,
# draft_vocab_from_counts: specdec.train.models) were defined here: they stay importable from this module,
# and are documented where they are defined now
__all__ = ["train_students", "load_student_weights", "pick_device"]


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when present, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------- loop
def _lr_at(step: int, total: int, warmup: int, time_progress: float = 0.0) -> float:
    """Linear warmup, then cosine from 1 to 0.1 over the larger of the step
    progress and the time-budget progress (so a time-limited run anneals too)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, total - warmup), time_progress))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _save_checkpoint(out: Path, students: Sequence[Student], opts: Sequence[torch.optim.Optimizer], step: int,
                     extra: dict[str, Any]) -> None:
    with needs_extra("train", "train_students"):
        from safetensors.torch import save_file

    ck = out / "checkpoint"
    tmp = out / "checkpoint.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for s, opt in zip(students, opts):
        save_file(_ckpt_state(s.module), str(tmp / f"{s.name}.safetensors"))
        torch.save(opt.state_dict(), str(tmp / f"{s.name}.optim.pt"))
    (tmp / "state.json").write_text(json.dumps({"step": step, **extra}, indent=2))
    if ck.exists():
        old = out / "checkpoint.old"
        if old.exists():
            _rmtree(old)
        ck.rename(old)
        tmp.rename(ck)
        _rmtree(old)
    else:
        tmp.rename(ck)


def _frozen_names(module: nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _ckpt_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict without its frozen (target-owned) parameters."""
    frozen = _frozen_names(module)
    return {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items() if k not in frozen}


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)


def load_student_weights(checkpoint: str | os.PathLike, students: Sequence[Student]) -> None:
    """Load each student's trainable weights from a ``checkpoint/`` folder of
    :func:`train_students` (``<name>.safetensors``; frozen target-owned
    parameters are not stored and keep their values). Used to start a new
    run (another data mix, another schedule) from an earlier run's weights.

    Raises:
        InvalidConfigError: a student has no file there, or its keys differ.
    """
    with needs_extra("train", "load_student_weights"):
        from safetensors.torch import load_file

    ck = Path(checkpoint)
    for s in students:
        f = ck / f"{s.name}.safetensors"
        if not f.is_file():
            raise InvalidConfigError(f"checkpoint {ck} has no weights for {s.name} ({f.name})")
        missing, unexpected = s.module.load_state_dict(load_file(str(f)), strict=False)
        frozen = _frozen_names(s.module)
        missing = [m for m in missing if m not in frozen]
        if missing or unexpected:
            raise InvalidConfigError(f"checkpoint {ck} does not match {s.name}: {missing} {unexpected}")


def _load_checkpoint(out: Path, students: Sequence[Student], opts: Sequence[torch.optim.Optimizer]) -> int:
    ck = out / "checkpoint"
    state = json.loads((ck / "state.json").read_text())
    load_student_weights(ck, students)
    for s, opt in zip(students, opts):
        opt.load_state_dict(torch.load(str(ck / f"{s.name}.optim.pt"), weights_only=True))
    return int(state["step"])


def train_students(
    target_model: Any,
    batches: Any,
    students: Sequence[Student],
    out_dir: str | os.PathLike,
    *,
    steps: int,
    warmup: int = 20,
    checkpoint_every: int = 50,
    resume: bool = True,
    seed: int = 0,
    grad_clip: float = 1.0,
    device: str | torch.device | None = None,
    progress: bool = True,
    meta: dict[str, Any] | None = None,
    time_budget_s: float | None = None,
    on_step: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
    vocab_ids: torch.Tensor | None = None,
) -> dict[str, list[dict[str, float]]]:
    """Train ``students`` on the target's features of the ``batches`` stream.

    Args:
        target_model: the frozen Hugging Face target.
        batches: a :class:`~specdec.train.data.PackedBatches` (or any iterable of
            ``[B, T]`` id tensors; resuming then replays it from the start and skips).
        students: what to train (their ``name`` must be distinct).
        out_dir: logs (``<name>.metrics.jsonl``), ``checkpoint/`` and ``<name>/``
            (the exported model at the end).
        steps: optimizer steps (the cosine schedule's length).
        warmup, checkpoint_every, grad_clip: schedule and checkpointing.
        resume: continue from ``out_dir/checkpoint`` when it exists.
        seed: seeds torch (noise, initialisation done by the caller before).
        device: default: CUDA when present, else CPU.
        progress: show a tqdm bar.
        meta: provenance stored with the exported models.
        time_budget_s: stop (checkpoint + export) after this many seconds of
            training (summed over resumed runs); the learning-rate schedule
            anneals over it when it ends before ``steps``.
        on_step: callback ``(step, {student: metrics})``.
        vocab_ids: restrict the token losses to these sorted target ids (see
            :func:`target_batch`); None: the full vocabulary.

    Returns:
        ``{student name: [metrics per step]}`` of this run.
    """
    names = [s.name for s in students]
    if len(set(names)) != len(names):
        raise InvalidConfigError(f"student names must be distinct: {names}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = pick_device(str(device) if device is not None else None)
    torch.manual_seed(seed)
    target_model.to(dev).eval()
    for p in target_model.parameters():
        p.requires_grad_(False)
    opts = []
    for s in students:
        s.module.to(dev).train()
        opts.append(torch.optim.AdamW(list(s.trainable().values()), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.0))
    start, elapsed0 = 0, 0.0
    if resume and (out / "checkpoint" / "state.json").exists():
        start = _load_checkpoint(out, students, opts)
        elapsed0 = float(json.loads((out / "checkpoint" / "state.json").read_text()).get("elapsed_s", 0.0))
    layers = sorted({l for s in students for l in s.layers})
    it = iter(batches)
    for _ in range(start):
        next(it)
    history: dict[str, list[dict[str, float]]] = {s.name: [] for s in students}
    logs = {s.name: (out / f"{s.name}.metrics.jsonl").open("a") for s in students}
    bar = None
    if progress:
        with needs_extra("train", "train_students"):
            from tqdm.auto import tqdm

        bar = tqdm(total=steps, initial=start, desc="train " + "+".join(names), dynamic_ncols=True)
    t_start = time.time()
    step = start
    try:
        while step < steps:
            ids = next(it).to(dev)
            tb = target_batch(target_model, ids, layers, vocab_ids)
            elapsed = elapsed0 + time.time() - t_start
            scale = _lr_at(step, steps, warmup, elapsed / time_budget_s if time_budget_s else 0.0)
            row: dict[str, dict[str, float]] = {}
            for s, opt in zip(students, opts):
                for g in opt.param_groups:
                    g["lr"] = s.lr * scale
                opt.zero_grad(set_to_none=True)
                loss, m = s.loss(tb)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(list(s.trainable().values()), grad_clip)
                opt.step()
                m = {"step": step + 1, "lr": s.lr * scale, "time": elapsed0 + time.time() - t_start, **m}
                row[s.name] = m
                history[s.name].append(m)
                logs[s.name].write(json.dumps(m) + "\n")
                logs[s.name].flush()
            step += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix({n: f"{r['loss']:.3f}/{r['acc']:.2f}" for n, r in row.items()})
            if on_step is not None:
                on_step(step, row)
            elapsed = elapsed0 + time.time() - t_start
            if step % checkpoint_every == 0 or step == steps:
                _save_checkpoint(out, students, opts, step, {"seed": seed, "elapsed_s": elapsed})
            if time_budget_s is not None and elapsed >= time_budget_s:
                _save_checkpoint(out, students, opts, step, {"seed": seed, "elapsed_s": elapsed,
                                                             "stopped": "time budget"})
                break
    finally:
        if bar is not None:
            bar.close()
        for f in logs.values():
            f.close()
    depth = getattr(getattr(target_model, "config", None), "num_hidden_layers", None)
    for s in students:
        s.module.eval()
        s.target_num_layers = depth if isinstance(depth, int) else None
        s.export(out / s.name, {**(meta or {}), "steps": step})
    return history


