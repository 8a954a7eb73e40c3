"""The EAGLE-2/3 head as an ``nn.Module``: its config, layers and the target's shared weights.

The words (feature, pair) and the two architectures are described in
:mod:`specdec.drafts.eagle`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import InvalidConfigError, VocabMismatchError

__all__ = [
    "EagleConfig",
    "EagleHead",
    "eagle3_target_layers",
    "rope_cos_sin",
    "apply_rope",
    "attend",
    "causal_mask",
    "rms_norm",
    "target_embeddings",
]


# ----------------------------------------------------------------- config
def eagle3_target_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/middle/high feature layers: the *inputs* of decoder layers
    2, N//2 and N-3 (``hidden_states[l]`` in the Hugging Face convention),
    clamped into ``[0, N-1]`` and sorted for tiny models."""
    if num_layers < 1:
        raise InvalidConfigError(f"a target needs at least one layer, got {num_layers}")
    picks = (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))
    return tuple(sorted(min(max(p, 0), num_layers - 1) for p in picks))  # type: ignore[return-value]


@attrs.frozen
class EagleConfig:
    """Shape and wiring of an EAGLE head.

    Attributes:
        version: 2 or 3.
        hidden_size: ``H`` of the head (= the target's, since the head shares
            the target's embeddings).
        intermediate_size: MLP width of the decoder layer.
        num_attention_heads, num_key_value_heads, head_dim: attention shape.
        vocab_size: the target's vocabulary ``V``.
        draft_vocab_size: ``Vd`` (EAGLE-3; equals ``V`` for EAGLE-2).
        target_layers: which ``hidden_states[l]`` of the target form a feature.
        target_hidden_size: the target's hidden size (the fc input is
            ``len(target_layers) * target_hidden_size`` for EAGLE-3).
        rms_norm_eps, rope_theta: as in the target's config.
        fc_bias: whether ``fc`` has a bias (EAGLE-2 reference: yes; EAGLE-3: no).
        norm_before_residual: EAGLE-3 only: the layer's residual stream starts
            from ``hidden_norm(g)`` instead of ``g`` (the ``norm_before_residual``
            option of vLLM's and speculators' EAGLE-3 heads; default off, as in
            the SafeAILab reference).
        max_position_embeddings: the head's position limit (None: not
            recorded). An :class:`~specdec.drafts.eagle.draft.EagleDraft` of the
            head refuses longer contexts; the loaders raise a limit below the
            target's context to the target's (RoPE needs no new weights).
    """

    version: int = attrs.field()
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    target_layers: tuple[int, ...] = attrs.field(converter=lambda xs: tuple(int(x) for x in xs))
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    fc_bias: bool = True
    norm_before_residual: bool = False
    max_position_embeddings: int | None = None

    @version.validator
    def _check_version(self, _attr: Any, value: int) -> None:
        if value not in (2, 3):
            raise InvalidConfigError(f"EAGLE version must be 2 or 3, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.version == 2 and (self.draft_vocab_size != self.vocab_size or len(self.target_layers) != 1):
            raise InvalidConfigError("EAGLE-2 uses the full vocabulary and exactly one feature layer")
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise InvalidConfigError(f"draft_vocab_size {self.draft_vocab_size} not in [1, {self.vocab_size}]")
        if self.norm_before_residual and self.version != 3:
            raise InvalidConfigError("norm_before_residual is an EAGLE-3 option (EAGLE-2 has no hidden_norm)")
        limit = self.max_position_embeddings
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidConfigError(f"max_position_embeddings must be a positive integer or None, got {limit!r}")

    @classmethod
    def for_target(
        cls,
        target_config: Any,
        version: int,
        *,
        draft_vocab_size: int | None = None,
        intermediate_size: int | None = None,
    ) -> EagleConfig:
        """The reference head shape for a Hugging Face LLaMA-style target config.

        Example:
            >>> from transformers import LlamaConfig
            >>> c = EagleConfig.for_target(LlamaConfig(hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
            ...     intermediate_size=128, vocab_size=100), 3, draft_vocab_size=50)
            >>> c.target_layers, c.draft_vocab_size
            ((2, 4, 5), 50)
        """
        n = int(target_config.num_hidden_layers)
        hidden = int(target_config.hidden_size)
        heads = int(target_config.num_attention_heads)
        kv = int(getattr(target_config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(target_config, "head_dim", None) or hidden // heads)
        vocab = int(target_config.vocab_size)
        theta = _rope_theta(target_config)
        if version == 2:
            layers: tuple[int, ...] = (n,)
            dv = vocab
        else:
            layers = eagle3_target_layers(n)
            dv = vocab if draft_vocab_size is None else int(draft_vocab_size)
        return cls(
            version=version, hidden_size=hidden,
            intermediate_size=int(intermediate_size or target_config.intermediate_size),
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
            draft_vocab_size=dv, target_layers=layers, target_hidden_size=hidden,
            rms_norm_eps=float(getattr(target_config, "rms_norm_eps", 1e-6)), rope_theta=theta,
            fc_bias=(version == 2),
        )


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        rope_type = params.get("rope_type", "default")
        if rope_type not in ("default", None):
            raise InvalidConfigError(f"EAGLE heads support the default RoPE only, the target uses {rope_type!r}")
        return float(params["rope_theta"])
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise InvalidConfigError(f"EAGLE heads support the default RoPE only, got rope_scaling={scaling!r}")
    return float(getattr(config, "rope_theta", 10000.0) or 10000.0)


# ------------------------------------------------------- pure functions
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LLaMA RMSNorm of ``x [..., H]`` (computed in float32)."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` of shape ``[*positions.shape, head_dim]`` for LLaMA (half-rotation) RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, heads, T, d]`` by ``cos, sin [B, T, d]``."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention with an additive float mask.

    Args:
        q: ``[B, nh, T, d]`` queries.
        k, v: ``[B, nkv, S, d]`` keys and values (``nh`` a multiple of ``nkv``).
        mask: ``[B or 1, 1, T, S]`` additive mask (0 = visible, very negative = hidden).

    Returns:
        ``[B, T, nh * d]``.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + mask.to(q.dtype)
    out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def causal_mask(t: int, past: int = 0, dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
    """``[1, 1, t, past + t]`` additive mask: every query sees the ``past`` keys
    and the new keys up to itself."""
    visible = torch.ones(t, past + t, dtype=torch.bool, device=device).tril(diagonal=past)
    return _additive(visible, dtype)[None, None]


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return out.masked_fill(~visible, torch.finfo(dtype).min)


# ----------------------------------------------------------------- module
class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class _Attention(nn.Module):
    def __init__(self, in_features: int, cfg: EagleConfig) -> None:
        super().__init__()
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_features, nh * d, bias=False)
        self.k_proj = nn.Linear(in_features, nkv * d, bias=False)
        self.v_proj = nn.Linear(in_features, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, cfg.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__()
        width = cfg.hidden_size * (2 if cfg.version == 3 else 1)
        self.self_attn = _Attention(width, cfg)
        self.mlp = _MLP(cfg)
        self.post_attention_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.version == 3:
            self.input_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.hidden_norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class EagleHead(nn.Module):
    """The trainable EAGLE head plus frozen references to the target's embedding
    (and, for EAGLE-2, LM head).

    The frozen tensors are non-persistent buffers: they are never saved with the
    head and must be supplied from the target at construction.

    Args:
        config: :class:`EagleConfig`.
        embed_weight: ``[V, H]`` the target's input embedding matrix.
        lm_head_weight: ``[V, H]`` the target's LM head (EAGLE-2 only).

    State dict keys (own format): ``fc.*``, ``layer.self_attn.{q,k,v,o}_proj.weight``,
    ``layer.mlp.{gate,up,down}_proj.weight``, ``layer.post_attention_layernorm.weight``,
    EAGLE-3 also ``layer.input_layernorm.weight``, ``layer.hidden_norm.weight``,
    ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``.
    """

    # buffers (registered in __init__): the draft vocabulary mapping (EAGLE-3), the target's frozen tensors
    d2t: torch.Tensor
    t2d: torch.Tensor
    embed_weight: torch.Tensor
    target_lm_head: torch.Tensor | None

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor | None = None) -> None:
        super().__init__()
        cfg = config
        self.config = cfg
        if tuple(embed_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise VocabMismatchError(
                f"target embedding has shape {tuple(embed_weight.shape)}, the head expects "
                f"({cfg.vocab_size}, {cfg.hidden_size})"
            )
        feat_in = cfg.target_hidden_size * len(cfg.target_layers)
        if cfg.version == 2:
            if lm_head_weight is None or tuple(lm_head_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
                raise VocabMismatchError(
                    f"EAGLE-2 needs the target's LM head of shape ({cfg.vocab_size}, {cfg.hidden_size}), got "
                    f"{None if lm_head_weight is None else tuple(lm_head_weight.shape)}"
                )
            if feat_in != cfg.hidden_size:
                raise InvalidConfigError("EAGLE-2 features must have the head's hidden size")
            self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        else:
            self.fc = nn.Linear(feat_in, cfg.hidden_size, bias=cfg.fc_bias)
        self.layer = _Layer(cfg)
        if cfg.version == 3:
            self.norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
            self.set_draft_vocab(torch.arange(cfg.draft_vocab_size))
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer(
            "target_lm_head", lm_head_weight.detach() if lm_head_weight is not None else None, persistent=False
        )
        # EAGLE-2: ``x -> x @ target_lm_head.T`` with the few-row CPU dispatch, set by EagleDraft
        self.target_lm_head_dispatch: Callable[[torch.Tensor], torch.Tensor] | None = None

    # ------------------------------------------------------------ vocab
    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """EAGLE-3: set the draft vocabulary to ``target_ids [Vd]`` (distinct,
        sorted ascending as in the reference) and the ``d2t``/``t2d`` buffers."""
        cfg = self.config
        ids = torch.as_tensor(target_ids, dtype=torch.long).flatten().sort().values
        if ids.numel() != cfg.draft_vocab_size or ids.unique().numel() != ids.numel():
            raise InvalidConfigError(f"need {cfg.draft_vocab_size} distinct target ids for the draft vocabulary")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise VocabMismatchError("draft vocabulary ids outside the target vocabulary")
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        self.t2d.copy_(t2d)

    @property
    def draft_to_target(self) -> torch.Tensor:
        """``[Vd]`` target id of each draft id (``j + d2t[j]``; identity for EAGLE-2)."""
        if self.config.version == 2:
            return torch.arange(self.config.vocab_size, device=self.embed_weight.device)
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    # ------------------------------------------------------ forward pieces
    def fuse(self, hidden: torch.Tensor, tokens: torch.Tensor, from_target: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Build the layer input of a batch of pairs.

        Args:
            hidden: ``[..., F]`` target features (``F = L * H_t``, ``from_target``)
                or the head's own outputs (``F = H``).
            tokens: ``[...]`` token ids of the pairs.
            from_target: which of the two ``hidden`` is.

        Returns:
            ``(x, emb)``: ``x [..., H]`` the layer's residual stream input
            (EAGLE-3 with ``norm_before_residual``: already ``hidden_norm``-ed) and
            ``emb [..., H]`` the token embeddings.
        """
        emb = F.embedding(tokens, self.embed_weight).to(self.fc.weight.dtype)
        hidden = hidden.to(self.fc.weight.dtype)
        if self.config.version == 2:
            return self.fc(torch.cat([emb, hidden], dim=-1)), emb
        g = self.fc(hidden) if from_target else hidden
        if self.config.norm_before_residual:  # the residual stream starts from hidden_norm(g)
            return self.layer.hidden_norm(g), emb
        return g, emb

    def qkv(self, x: torch.Tensor, emb: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Queries ``[B, nh, T, d]`` and keys/values ``[B, nkv, T, d]`` (RoPE
        applied) for layer inputs ``x, emb [B, T, H]`` at ``positions [B, T]``."""
        cfg, layer = self.config, self.layer
        if cfg.version == 3:
            # norm_before_residual: fuse already normed x (it is also the residual)
            a = torch.cat([layer.input_layernorm(emb), x if cfg.norm_before_residual else layer.hidden_norm(x)], dim=-1)
        else:
            a = x  # the reference's first (only) layer has no input norm
        b, t, _ = x.shape
        q = layer.self_attn.q_proj(a).view(b, t, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = layer.self_attn.k_proj(a).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = layer.self_attn.v_proj(a).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Layer output ``h [B, T, H]`` from residual input ``x`` and attention output ``attn [B, T, nh*d]``."""
        layer = self.layer
        h = x + layer.self_attn.o_proj(attn)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def forward(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        from_target: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run a block of pairs.

        Args:
            hidden: ``[B, T, F]`` features of the previous positions (see :meth:`fuse`).
            tokens: ``[B, T]`` tokens of the pairs.
            positions: ``[B, T]`` RoPE positions.
            mask: ``[B or 1, 1, T, P + T]`` additive mask over past + new keys.
            past: cached ``(k, v)`` each ``[B, nkv, P, d]``, or None (``P = 0``).
            from_target: whether ``hidden`` holds target features.

        Returns:
            ``(h, k, v)``: outputs ``[B, T, H]`` and the new keys/values ``[B, nkv, T, d]``.
        """
        x, emb = self.fuse(hidden, tokens, from_target)
        q, k, v = self.qkv(x, emb, positions)
        if past is not None:
            k_all, v_all = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        else:
            k_all, v_all = k, v
        return self.finish(x, attend(q, k_all, v_all, mask)), k, v

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., Vd]`` logits over the draft vocabulary from outputs ``h [..., H]``
        (EAGLE-2: the target's LM head on ``h``; EAGLE-3: ``lm_head(norm(h))``)."""
        if self.config.version == 2:
            lm_head = self.target_lm_head
            if lm_head is None:  # __init__ refuses an EAGLE-2 head without it
                raise InvalidConfigError("an EAGLE-2 head needs the target's LM head (target_lm_head is None)")
            if self.target_lm_head_dispatch is not None and not self.training:
                return self.target_lm_head_dispatch(h.to(lm_head.dtype))
            return F.linear(h.to(lm_head.dtype), lm_head)
        return self.lm_head(self.norm(h))

    def full_logits(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits in the target vocabulary (``-inf`` outside the draft vocabulary)."""
        logits = self.draft_logits(h).float()
        if self.config.version == 2:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        out[..., self.draft_to_target] = logits
        return out

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict that checkpoints hold (frozen target tensors excluded)."""
        return {k: v for k, v in self.state_dict().items() if k not in ("embed_weight", "target_lm_head")}


def target_embeddings(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embed [V, H], lm_head [V, H])`` weights of a Hugging Face causal LM."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None:
        raise InvalidConfigError("the target has no output embeddings (LM head)")
    return embed.detach(), head.weight.detach()
