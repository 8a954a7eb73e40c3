"""The students of :func:`~specdec.train.trainer.train_students` and their losses.

A *student* is a model trained on the frozen target's view of a batch
(:class:`TargetBatch`, computed once per batch by :func:`target_batch` for
every student). Losses (per student):

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
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafts.eagle.checkpoints import save_head
from specdec.drafts.eagle.head import EagleHead, attend, causal_mask
from specdec.errors import InvalidConfigError

__all__ = [
    "TargetBatch",
    "target_batch",
    "soft_ce",
    "Student",
    "Eagle2Student",
    "Eagle3Student",
    "DraftLMStudent",
    "eagle3_ttt_forward",
]


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
            lm_head = self.head.target_lm_head
            if not isinstance(lm_head, torch.Tensor):
                raise InvalidConfigError("an EAGLE-2 head needs the target's LM head (target_lm_head is None)")
            w = lm_head[batch.vocab_ids.to(h.device)]
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


