"""Training EAGLE heads and distilled draft LMs from a frozen target.

One loop serves any number of *students* trained on the same stream: each
batch of tokens goes through the frozen target once (features of every layer a
student needs, plus the target's logits), then every student takes one
optimizer step on it. Target features are computed batch by batch and
discarded (nothing is dumped to disk or kept in memory).

Losses (per student):

* EAGLE-2 (Li et al. 2024, EAGLE-1/2 training): pair ``(f_t, x_{t+1})`` must
  regress the next feature ``f_{t+1}`` (smooth L1, weight 1) and match the
  target's law of ``x_{t+2}`` (soft cross-entropy against
  ``softmax(target logits)``, weight 0.1); input features get uniform noise
  ``U(-noise, noise)`` as in the reference.
* EAGLE-3 (Li et al. 2025, *training-time test*): step 0 runs pairs built
  from the target's fused low/mid/high features; step ``j >= 1`` feeds the
  head's own step ``j-1`` outputs with the ground-truth tokens shifted by
  ``j``, attending to the step-0 keys up to its column and to its own chain's
  keys of steps ``1..j`` (exactly the tree mask of inference); step ``j``'s
  soft cross-entropy against the target's law restricted to the draft
  vocabulary is weighted ``0.8**j``.
* draft LM: KL(target || draft) per position, temperature 1.

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
import torch.nn.functional as F
from torch import nn

from specdec.drafts.eagle.checkpoints import save_head
from specdec.drafts.eagle.head import EagleConfig, EagleHead, attend, causal_mask, target_embeddings
from specdec.errors import InvalidConfigError

__all__ = [
    "TargetBatch",
    "Student",
    "Eagle2Student",
    "Eagle3Student",
    "DraftLMStudent",
    "train_students",
    "load_student_weights",
    "target_batch",
    "eagle3_ttt_forward",
    "draft_vocab_from_counts",
    "count_tokens",
    "make_draft_lm",
    "pick_device",
]


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when present, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ------------------------------------------------------------ target side
class TargetBatch:
    """The frozen target's view of one batch.

    Attributes:
        input_ids: ``[B, T]``.
        hidden: ``{l: [B, T, H]}`` ``hidden_states[l]`` for each requested layer.
        logits: ``[B, T, V']`` the target's next-token logits over ``vocab_ids``
            (``V' = V`` and ``vocab_ids`` None: the full vocabulary).
        vocab_ids: ``[V']`` sorted target ids the token losses are restricted
            to, or None.
    """

    def __init__(self, input_ids: torch.Tensor, hidden: dict[int, torch.Tensor], logits: torch.Tensor,
                 vocab_ids: torch.Tensor | None = None) -> None:
        self.input_ids, self.hidden, self.logits, self.vocab_ids = input_ids, hidden, logits, vocab_ids


@torch.no_grad()
def target_batch(model: Any, input_ids: torch.Tensor, layers: Sequence[int],
                 vocab_ids: torch.Tensor | None = None) -> TargetBatch:
    """Run the frozen target once over ``input_ids [B, T]`` and keep the
    requested ``hidden_states`` layers and the logits (float32), over the
    whole vocabulary or only the sorted target ids ``vocab_ids`` (a cheaper
    LM head; the token losses are then softmaxes over that sub-vocabulary)."""
    if vocab_ids is None:
        out = model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        logits = out.logits.float()
    else:
        out = model.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        w = model.get_output_embeddings().weight[vocab_ids.to(input_ids.device)]
        logits = F.linear(out.last_hidden_state, w).float()
    hidden = {int(l): out.hidden_states[int(l)].float() for l in set(layers)}
    return TargetBatch(input_ids, hidden, logits, vocab_ids)


def soft_ce(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``-sum softmax(target) * log_softmax(logits)`` (``[..., V]`` each)."""
    p = torch.softmax(target_logits, dim=-1)
    return -(p * torch.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


# ------------------------------------------------------------- students
class Student:
    """A model trained by :func:`train_students`.

    Subclasses set ``name``, ``layers`` (target ``hidden_states`` indices they
    need) and ``module`` (what the optimizer trains), and implement
    :meth:`loss` and :meth:`export`.
    """

    name: str = "student"
    layers: tuple[int, ...] = ()
    module: nn.Module
    lr: float = 1e-3
    #: the target's layer count, set by :func:`train_students` before :meth:`export`
    #: (EAGLE heads record it so that loading them with a target of another depth fails)
    target_num_layers: int | None = None

    def loss(self, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def export(self, path: Path, meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def trainable(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self.module.named_parameters() if p.requires_grad}


class Eagle2Student(Student):
    """EAGLE-2 feature + token loss (see module docs).

    Args:
        head: a version-2 :class:`EagleHead`.
        feature_weight, token_weight: the loss weights (reference: 1.0 and 0.1).
        noise: half-width of the uniform noise added to input features.
    """

    def __init__(self, head: EagleHead, feature_weight: float = 1.0, token_weight: float = 0.1,
                 noise: float = 0.1, lr: float = 1e-3, name: str = "eagle2") -> None:
        if head.config.version != 2:
            raise InvalidConfigError("Eagle2Student needs a version-2 head")
        self.head = self.module = head
        self.layers = head.config.target_layers
        self.feature_weight, self.token_weight, self.noise = feature_weight, token_weight, noise
        self.lr, self.name = lr, name

    def loss(self, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        f = batch.hidden[self.layers[0]]
        ids = batch.input_ids
        b, t, _ = f.shape
        inp = f[:, :-1]
        if self.noise and self.head.training:
            inp = inp + (torch.rand_like(inp) - 0.5) * 2 * self.noise
        pos = torch.arange(t - 1, device=f.device).expand(b, -1)
        h, _, _ = self.head(inp, ids[:, 1:], pos, causal_mask(t - 1, 0, h_dtype(self.head), f.device))
        feat_loss = F.smooth_l1_loss(h.float(), f[:, 1:])
        if batch.vocab_ids is None:
            logits = self.head.draft_logits(h)
        else:
            w = self.head.target_lm_head[batch.vocab_ids.to(h.device)]
            logits = F.linear(h.to(w.dtype), w)
        tok_loss = soft_ce(logits, batch.logits[:, 1:])
        acc = (logits.argmax(-1) == batch.logits[:, 1:].argmax(-1)).float().mean()
        loss = self.feature_weight * feat_loss + self.token_weight * tok_loss
        return loss, {"loss": loss.item(), "feat_loss": feat_loss.item(), "token_loss": tok_loss.item(),
                      "acc": acc.item()}

    def export(self, path: Path, meta: dict[str, Any]) -> None:
        save_head(self.head, path, meta=meta, target_num_layers=self.target_num_layers)


def h_dtype(head: nn.Module) -> torch.dtype:
    return next(head.parameters()).dtype


def eagle3_ttt_forward(head: EagleHead, features: torch.Tensor, input_ids: torch.Tensor,
                       steps: int) -> list[torch.Tensor]:
    """EAGLE-3 training-time test: the head's outputs at each unrolled step.

    Args:
        head: a version-3 :class:`EagleHead`.
        features: ``[B, T, L*H]`` fused-layer target features.
        input_ids: ``[B, T]``.
        steps: number of unrolled draft steps ``K >= 1``.

    Returns:
        ``K`` tensors ``[B, T-1, H]``: entry ``j`` at column ``i`` is the head's
        output for the chain that starts at committed pair ``(f_i, x_{i+1})``
        and has fed ``j`` of its own outputs; its logits are the draft law of
        ``x_{i+2+j}``. Columns with ``i + 1 + j > T - 1`` are padding.
    """
    b, t, _ = features.shape
    n = t - 1
    dev = features.device
    dtype = h_dtype(head)
    pos0 = torch.arange(n, device=dev).expand(b, -1)
    x, emb = head.fuse(features[:, :-1], input_ids[:, 1:], from_target=True)
    q, k0, v0 = head.qkv(x, emb, pos0)
    mask0 = causal_mask(n, 0, dtype, dev)
    h = head.finish(x, attend(q, k0, v0, mask0))
    outs = [h]
    ks: list[torch.Tensor] = []
    vs: list[torch.Tensor] = []
    groups = head.config.num_attention_heads // head.config.num_key_value_heads
    k0e, v0e = k0.repeat_interleave(groups, 1), v0.repeat_interleave(groups, 1)
    scale = 1.0 / math.sqrt(head.config.head_dim)
    for j in range(1, steps):
        tok = input_ids[:, 1 + j:]
        tok = torch.cat([tok, tok.new_zeros(b, n - tok.shape[1])], dim=1)
        x, emb = head.fuse(h, tok, from_target=False)
        q, k, v = head.qkv(x, emb, pos0 + j)
        ks.append(k.repeat_interleave(groups, 1))
        vs.append(v.repeat_interleave(groups, 1))
        s0 = torch.matmul(q, k0e.transpose(-1, -2)) * scale + mask0
        diag = [(q * kk).sum(-1, keepdim=True) * scale for kk in ks]
        w = torch.softmax(torch.cat([s0, *diag], dim=-1).float(), dim=-1).to(v.dtype)
        attn = torch.matmul(w[..., :n], v0e)
        for s, vv in enumerate(vs):
            attn = attn + w[..., n + s: n + s + 1] * vv
        attn = attn.transpose(1, 2).reshape(b, n, -1)
        h = head.finish(x, attn)
        outs.append(h)
    return outs


class Eagle3Student(Student):
    """EAGLE-3 training-time-test loss (see module docs).

    Args:
        head: a version-3 :class:`EagleHead` whose draft vocabulary is set.
        ttt_steps: unrolled steps ``K`` (reference: 7; fewer on a CPU budget).
        step_decay: weight of step ``j`` is ``step_decay ** j`` (reference 0.8).
    """

    def __init__(self, head: EagleHead, ttt_steps: int = 3, step_decay: float = 0.8, lr: float = 1e-3,
                 name: str = "eagle3") -> None:
        if head.config.version != 3:
            raise InvalidConfigError("Eagle3Student needs a version-3 head")
        if ttt_steps < 1:
            raise InvalidConfigError("ttt_steps must be >= 1")
        self.head = self.module = head
        self.layers = head.config.target_layers
        self.ttt_steps, self.step_decay, self.lr, self.name = ttt_steps, step_decay, lr, name

    def loss(self, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        feats = torch.cat([batch.hidden[l] for l in self.layers], dim=-1)
        ids = batch.input_ids
        t = ids.shape[1]
        outs = eagle3_ttt_forward(self.head, feats, ids, self.ttt_steps)
        d2t = self.head.draft_to_target
        if batch.vocab_ids is None:
            cols, to_target = d2t, lambda idx: d2t[idx]
        else:  # restricted target logits: find the draft ids' columns
            vids = batch.vocab_ids.to(d2t.device)
            cols = torch.searchsorted(vids, d2t)
            if (cols >= vids.numel()).any() or not torch.equal(vids[cols.clamp(max=vids.numel() - 1)], d2t):
                raise InvalidConfigError("the restricted target vocabulary must contain the draft vocabulary")
            to_target = lambda idx: cols[idx]  # noqa: E731 (positions in the restricted vocabulary)
        total = feats.new_zeros(())
        metrics: dict[str, float] = {}
        weight_sum = 0.0
        for j, h in enumerate(outs):
            valid = t - 2 - j  # columns i <= T-2-j have a target law at position i+1+j
            if valid <= 0:
                break
            target = batch.logits[:, 1 + j: 1 + j + valid]
            logits = self.head.draft_logits(h[:, :valid])
            lj = soft_ce(logits, target[..., cols])
            acc = (to_target(logits.argmax(-1)) == target.argmax(-1)).float().mean()
            w = self.step_decay ** j
            total = total + w * lj
            weight_sum += w
            metrics[f"loss{j}"] = lj.item()
            metrics[f"acc{j}"] = acc.item()
        loss = total / weight_sum
        metrics["loss"] = loss.item()
        metrics["acc"] = metrics.get("acc0", 0.0)
        return loss, metrics

    def export(self, path: Path, meta: dict[str, Any]) -> None:
        save_head(self.head, path, meta=meta, target_num_layers=self.target_num_layers)


def make_draft_lm(target_model: Any, num_layers: int = 2, init_from_target: bool = True) -> Any:
    """A small causal LM at the target's width whose embedding and LM head are
    the target's (frozen), initialised from the target's first ``num_layers``
    decoder layers and final norm.

    A LLaMA target (SmolLM2) gets a ``LlamaForCausalLM`` (the shipped draft
    LM's architecture); any other (Gemma 2/3, Mistral, ...) a model of the
    target's own class with ``num_layers`` layers, the target's first
    ``num_layers`` layer types (sliding or full attention) and the rest of its
    configuration (norm convention, embedding scale, rotary bases)."""
    tc = target_model.config
    if getattr(tc, "model_type", None) != "llama":
        return _same_class_draft_lm(target_model, num_layers, init_from_target)
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = int(tc.num_attention_heads)
    cfg = LlamaConfig(
        vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=int(getattr(tc, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(tc, "head_dim", None) or tc.hidden_size // heads),
        max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
        rope_parameters=getattr(tc, "rope_parameters", None) or {"rope_type": "default",
                                                                   "rope_theta": getattr(tc, "rope_theta", 10000.0)},
        tie_word_embeddings=bool(getattr(tc, "tie_word_embeddings", False)),
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=getattr(tc, "pad_token_id", None),
    )
    model = LlamaForCausalLM(cfg)
    embed, lm_head = target_embeddings(target_model)
    dtype = embed.dtype
    model = model.to(dtype)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        if not cfg.tie_word_embeddings:
            model.lm_head.weight.copy_(lm_head)
        if init_from_target:
            src_layers = target_model.model.layers
            for i in range(min(num_layers, len(src_layers))):
                model.model.layers[i].load_state_dict(src_layers[i].state_dict())
            model.model.norm.load_state_dict(target_model.model.norm.state_dict())
    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    return model


def _same_class_draft_lm(target_model: Any, num_layers: int, init_from_target: bool) -> Any:
    """:func:`make_draft_lm` for a non-LLaMA target: the target's class, ``num_layers`` layers."""
    import copy

    tc = target_model.config
    if num_layers < 1 or num_layers > int(tc.num_hidden_layers):
        raise InvalidConfigError(f"a draft LM of {num_layers} layers from a target of {tc.num_hidden_layers}")
    cfg = copy.deepcopy(tc)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types[:num_layers])
    attn = getattr(tc, "_attn_implementation", None) or "sdpa"
    model = type(target_model)._from_config(cfg, attn_implementation=attn)
    embed, lm_head = target_embeddings(target_model)
    model = model.to(embed.dtype)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(embed)
        if not getattr(cfg, "tie_word_embeddings", False):
            model.get_output_embeddings().weight.copy_(lm_head)
        if init_from_target:
            for i in range(num_layers):
                model.model.layers[i].load_state_dict(target_model.model.layers[i].state_dict())
            model.model.norm.load_state_dict(target_model.model.norm.state_dict())
    model.get_input_embeddings().weight.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(False)
    return model


class DraftLMStudent(Student):
    """Distils the target into a small causal LM with KL(target || draft)."""

    def __init__(self, model: Any, lr: float = 5e-4, name: str = "draft_lm") -> None:
        self.model = self.module = model
        self.layers = ()
        self.lr, self.name = lr, name

    def loss(self, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.vocab_ids is None:
            logits = self.model(input_ids=batch.input_ids, use_cache=False).logits.float()
        else:
            h = self.model.model(input_ids=batch.input_ids, use_cache=False).last_hidden_state
            w = self.model.get_output_embeddings().weight[batch.vocab_ids.to(h.device)]
            logits = F.linear(h, w).float()
        logq = torch.log_softmax(logits, -1)
        logp = torch.log_softmax(batch.logits, -1)
        kl = (logp.exp() * (logp - logq)).sum(-1).mean()
        acc = (logits.argmax(-1) == batch.logits.argmax(-1)).float().mean()
        return kl, {"loss": kl.item(), "acc": acc.item()}

    def export(self, path: Path, meta: dict[str, Any]) -> None:
        self.model.save_pretrained(str(path))
        (Path(path) / "specdec_meta.json").write_text(json.dumps(meta, indent=2) + "\n")


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


# ------------------------------------------------------- draft vocabulary
def count_tokens(batches: Any, vocab_size: int, n_batches: int) -> torch.Tensor:
    """``[V]`` token counts over the first ``n_batches`` batches of a stream."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i, ids in enumerate(batches):
        if i >= n_batches:
            break
        counts += torch.bincount(ids.flatten(), minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocab_from_counts(counts: torch.Tensor, draft_vocab_size: int,
                            always: Sequence[int] = ()) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent target ids (ties by id), forcing
    ``always`` (e.g. EOS) in; sorted ascending."""
    counts = counts.clone().double()
    for t in always:
        counts[int(t)] = float("inf")
    order = sorted(range(counts.numel()), key=lambda i: (-counts[i].item(), i))
    return torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)


def new_head(target_model: Any, version: int, *, draft_vocab: torch.Tensor | None = None,
             seed: int = 0) -> EagleHead:
    """A freshly initialised EAGLE head for ``target_model`` (reference shape).

    EAGLE-3 also copies the target's final norm and the LM-head rows of the
    draft vocabulary into its own ``norm`` / ``lm_head`` (a warm start).
    """
    torch.manual_seed(seed)
    cfg = EagleConfig.for_target(target_model.config, version,
                                 draft_vocab_size=None if draft_vocab is None else int(draft_vocab.numel()))
    embed, lm_head = target_embeddings(target_model)
    head = EagleHead(cfg, embed.float(), lm_head.float() if version == 2 else None)
    if version == 3:
        if draft_vocab is not None:
            head.set_draft_vocab(draft_vocab)
        with torch.no_grad():
            head.lm_head.weight.copy_(lm_head.float()[head.draft_to_target])
            norm = getattr(getattr(target_model, "model", None), "norm", None)
            if norm is not None and getattr(norm, "weight", None) is not None:
                w = norm.weight.float()
                if type(norm).__name__.startswith("Gemma"):  # Gemma's RMSNorm scales by (1 + weight)
                    w = 1.0 + w
                head.norm.weight.copy_(w)
    return head
