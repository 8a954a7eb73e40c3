"""The EAGLE head as a :class:`~specdec.drafts.base.DraftModel` (registered ``"eagle2"``, ``"eagle3"``).

How the draft meets the generation loop (features in, committed pairs, tree
pairs) is described in :mod:`specdec.drafts.eagle`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from specdec.drafts.base import OneRowDraft
from specdec.drafts.eagle.head import EagleHead, _additive, attend, causal_mask
from specdec.errors import InvalidConfigError, SpecDecError, VocabMismatchError
from specdec.kernels.linear import LinearPlan, accelerate_linears, dispatch_for, resolve_cpu_linear
from specdec.models.hf_common import MIN_CAPACITY
from specdec.regions import model_call
from specdec.registry import register

__all__ = ["EagleDraft", "Eagle2Draft", "Eagle3Draft", "FeatureFn", "make_draft", "hf_feature_fn"]


# -------------------------------------------------------------- the draft
FeatureFn = Callable[[Sequence[int]], torch.Tensor]
"""``fn(token_ids) -> [len(token_ids), L, H]``: the target's features at each position."""


class EagleDraft(OneRowDraft):
    """An EAGLE head as a :class:`~specdec.drafts.base.DraftModel`.

    State: the KV cache of committed pairs (features from the target), the
    head's output at the last committed pair (which gives :meth:`root_logits`),
    and this step's tree pairs (outputs, keys and values, ancestor sets).
    Every :meth:`tree_logits` call drafts a whole tree level in one forward,
    masking each new node to the committed pairs, its ancestors and itself.

    Generator contract (``target_hidden`` is ``[n, L, H]`` with
    ``L = len(target_layers)``, layer ``l`` meaning ``hidden_states[l]``):

    * ``begin(prompt, target_hidden=F)``: ``F`` holds the target's features at
      positions ``0 .. m-2`` of the ``m``-token prompt (what a prefill that
      leaves the last prompt token as the first root computes); ``[m, L, H]``
      is accepted too (the last row is ignored). Without ``target_hidden``, the
      draft calls ``feature_fn(prompt[:-1])`` when it was given one (an extra
      target prefill), else raises.
    * ``commit(tokens, target_hidden=F)``: ``tokens`` = accepted drafts +
      bonus (``k + 1`` tokens), ``F [k + 1, L, H]`` = the target's features at
      the step's root and at the accepted nodes, in path order. Pair ``i`` is
      ``(F[i], tokens[i])``.

    Args:
        head: a trained :class:`EagleHead`.
        feature_fn: optional fallback giving the prompt's features (see
            :func:`hf_feature_fn`).
        max_length: optional context limit (committed pairs + tree); default:
            the head's ``config.max_position_embeddings`` (None when not recorded).
        cpu_linear: install the tuned few-row linear dispatch
            (:func:`~specdec.kernels.linear.accelerate_linears`) on the head's
            linear layers and, for EAGLE-2, on its use of the target's LM head:
            ``"auto"`` (default) = when the head is on the CPU.
    """

    supports_rows = True

    needs_target_hidden: ClassVar[bool] = True
    version: ClassVar[int | None] = None

    def __init__(
        self,
        head: EagleHead,
        feature_fn: FeatureFn | None = None,
        max_length: int | None = None,
        cpu_linear: bool | str = "auto",
    ) -> None:
        if self.version is not None and head.config.version != self.version:
            raise InvalidConfigError(f"{type(self).__name__} needs an EAGLE-{self.version} head, got EAGLE-{head.config.version}")
        self.head = head.eval()
        self.feature_fn = feature_fn
        self._max_length: int | None = head.config.max_position_embeddings if max_length is None else max_length
        p = next(head.parameters())
        self._device, self._dtype = p.device, p.dtype
        self._proposal_ids: torch.Tensor | None = None  # EAGLE-3: the draft vocabulary's target ids (proposal_ids)
        self.linear_plans: dict[tuple[int, int], LinearPlan] = {}
        if resolve_cpu_linear(cpu_linear, self._device):
            self.linear_plans = accelerate_linears(head)
            lm = head.target_lm_head
            if lm is not None and lm.device.type == "cpu" and lm.dtype == torch.float32:
                head.target_lm_head_dispatch = dispatch_for(lm)
        self._reset()

    @property
    def vocab_size(self) -> int:
        return self.head.config.vocab_size

    @property
    def target_layers(self) -> tuple[int, ...]:
        """``hidden_states`` indices the target must capture (HF convention:
        0 = embeddings, ``l`` = input of layer ``l``, ``N`` = final normed output)."""
        return self.head.config.target_layers

    def reserve(self, positions: int) -> None:
        """Size the head's preallocated KV buffer for ``positions`` pairs (committed + tree)."""
        self._reserved = max(int(positions), 0)
        if self._kv.shape[-2] < self._reserved:
            self._grow_kv(self._reserved)

    def _reset(self) -> None:
        cfg = self.head.config
        if not hasattr(self, "_kv"):
            self._reserved = 0
            # [2, 1, nkv, capacity, d]: keys and values of the committed pairs, then this step's tree pairs
            self._kv = torch.zeros(2, 1, cfg.num_key_value_heads, MIN_CAPACITY, cfg.head_dim, device=self._device, dtype=self._dtype)
        self._pairs = 0  # committed pairs in _kv
        self._rows: int | None = None  # rows mode (begin_rows): the batch size
        self._last_h: torch.Tensor | None = None
        self._drop_tree()

    def _grow_kv(self, needed: int) -> None:
        """Reallocate the KV buffer for at least ``needed`` pairs (doubling; one copy)."""
        grown = self._kv.new_zeros(*self._kv.shape[:-2], max(needed, 2 * self._kv.shape[-2]), self._kv.shape[-1])
        grown[..., : self._kv.shape[-2], :] = self._kv
        self._kv = grown

    def _run_head(
        self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, from_target: bool
    ) -> torch.Tensor:
        """The head's layer over ``T`` new pairs (``hidden [1, T, F]``, ``tokens``/``positions [1, T]``),
        attending the ``S`` pairs in the buffer and themselves (``mask [1, 1, T, S + T]``); the new
        keys and values are written in place after the ``S`` (no concatenation). Returns ``h [1, T, H]``."""
        start, t = self._pairs + self._tree_pairs, tokens.shape[-1]
        if start + t > self._kv.shape[-2]:
            self._grow_kv(start + t)
        x, emb = self.head.fuse(hidden, tokens, from_target)
        q, k, v = self.head.qkv(x, emb, positions)  # q [1, nh, T, d]; k, v [1, nkv, T, d]
        self._kv[0, :, :, start : start + t] = k
        self._kv[1, :, :, start : start + t] = v
        end = start + t
        return self.head.finish(x, attend(q, self._kv[0, :, :, :end], self._kv[1, :, :, :end], mask))

    def _drop_tree(self) -> None:
        cfg = self.head.config
        self._tree_pairs = 0  # this step's tree pairs in _kv, after the committed ones
        self._tree_h = torch.zeros(0, cfg.hidden_size, device=self._device, dtype=self._dtype)  # [n, H] nodes 1..n
        self._depth = torch.zeros(1, dtype=torch.long, device=self._device)  # [n + 1] depth of every node, root 0
        # [n + 1, n + 1]: [i, j] iff tree node j >= 1 is i or an ancestor of i (the root's column stays False)
        self._anc = torch.zeros(1, 1, dtype=torch.bool, device=self._device)

    @property
    def committed_pairs(self) -> int:
        """Number of pairs in the KV cache."""
        return self._pairs

    # ---------------------------------------------------------- features
    def _features(self, target_hidden: torch.Tensor | None, n: int, who: str) -> torch.Tensor:
        cfg = self.head.config
        if not isinstance(target_hidden, torch.Tensor):
            raise InvalidConfigError(f"{who}: target_hidden must be a tensor [n, L, H]")
        th = target_hidden
        if th.dim() == 2 and len(cfg.target_layers) == 1:
            th = th[:, None]
        want = (len(cfg.target_layers), cfg.target_hidden_size)
        if th.dim() != 3 or tuple(th.shape[1:]) != want or th.shape[0] < n:
            raise VocabMismatchError(
                f"{who}: target_hidden has shape {tuple(target_hidden.shape)}; expected [{n}, {want[0]}, {want[1]}] "
                f"(hidden_states layers {cfg.target_layers} of the target)"
            )
        return th[:n].reshape(n, -1).to(self._device, self._dtype)

    def _append_pairs(self, feats: torch.Tensor, tokens: list[int], device_tokens: torch.Tensor | None = None) -> None:
        n = len(tokens)
        p0 = self.committed_pairs
        if self.max_length is not None and p0 + n > self.max_length:
            raise SpecDecError(f"EAGLE draft context overflow: {p0 + n} > {self.max_length}")
        if device_tokens is not None:  # the same tokens, already on a device: no host-to-device copy
            tok = device_tokens.to(self._device, torch.long).reshape(1, n)
        else:
            tok = torch.tensor([tokens], dtype=torch.long, device=self._device)
        pos = torch.arange(p0, p0 + n, device=self._device)[None]
        mask = causal_mask(n, p0, self._dtype, self._device)
        with model_call():
            h = self._run_head(feats[None], tok, pos, mask, from_target=True)
        self._pairs += n
        self._last_h = h[0, -1]

    # --------------------------------------------------------- DraftModel
    @property
    def max_length(self) -> int | None:
        """The context limit (committed pairs + tree): the head's ``max_position_embeddings`` by default."""
        return self._max_length

    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise InvalidConfigError("the prompt must contain at least one token")
        self._reset()
        m = len(prompt)
        if target_hidden is None:
            if self.feature_fn is None:
                raise InvalidConfigError(
                    "EAGLE draft: begin() needs target_hidden (the target's prompt features) or a feature_fn"
                )
            target_hidden = self.feature_fn(prompt[:-1]) if m > 1 else None
        cfg = self.head.config
        width = len(cfg.target_layers) * cfg.target_hidden_size
        with torch.inference_mode():
            if m == 1:
                # no feature precedes the first token: a zero feature stands in (documented choice)
                feats = torch.zeros(1, width, device=self._device, dtype=self._dtype)
                self._append_pairs(feats, prompt)
                return
            feats = self._features(target_hidden, m - 1, "begin")
            # pairs (f_{i-1}, x_i) for i = 1 .. m-1
            self._append_pairs(feats, prompt[1:])

    def root_logits(self) -> torch.Tensor:
        if self._last_h is None:
            raise RuntimeError("root_logits() before begin()")
        self._drop_tree()
        with torch.inference_mode():
            return self.head.full_logits(self._last_h[None])[0]

    @property
    def proposal_ids(self) -> torch.Tensor | None:
        """EAGLE-3: the ``[Vd]`` target ids of the head's draft vocabulary
        (``j + d2t[j]``, ascending in every reference checkpoint; where a
        checkpoint's map is not ascending, ties at a top-K cut are broken by
        the smaller draft id); EAGLE-2: None (the target's vocabulary)."""
        if self.head.config.version == 2:
            return None
        if self._proposal_ids is None:  # made once, on the head's device
            self._proposal_ids = self.head.draft_to_target.to(self._device)
        return self._proposal_ids

    def root_proposal_logits(self) -> torch.Tensor:
        """``[Vd]`` the root's logits over the draft vocabulary (no scatter to ``V``)."""
        if self._last_h is None:
            raise RuntimeError("root_logits() before begin()")
        self._drop_tree()
        with torch.inference_mode():
            return self.head.draft_logits(self._last_h[None])[0].float()

    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """One forward for ``k`` new tree nodes (a whole level).

        Tensors (the level-wise builders' form) are used on the device as they
        are, with no host read: their ids are not range-checked (an id out of
        range fails in the indexing). Python sequences are checked first.
        """
        h = self._grow(parents, tokens)
        if h is None:
            return torch.empty(0, self.vocab_size)
        with torch.inference_mode():
            return self.head.full_logits(h)

    def tree_proposal_logits(
        self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor
    ) -> torch.Tensor:
        """:meth:`tree_logits` over the draft vocabulary, ``[k, Vd]``."""
        h = self._grow(parents, tokens)
        if h is None:
            return torch.empty(0, self.head.config.draft_vocab_size)
        with torch.inference_mode():
            return self.head.draft_logits(h).float()

    def _grow(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor | None:
        """Add ``k`` tree nodes; return their outputs ``h [k, H]`` (None for ``k = 0``)."""
        if self._last_h is None:
            raise RuntimeError("tree_logits() before begin()")
        if len(parents) != len(tokens):
            raise ValueError(f"tree_logits: {len(parents)} parents but {len(tokens)} tokens")
        k = len(tokens)
        if k == 0:
            return None
        n_nodes = int(self._depth.shape[0])
        if not isinstance(parents, torch.Tensor) or not isinstance(tokens, torch.Tensor):
            parents, tokens = [int(p) for p in parents], [int(t) for t in tokens]
            for p in parents:
                if not 0 <= p < n_nodes:
                    raise ValueError(f"tree_logits: unknown parent node {p}")
            for t in tokens:
                if not 0 <= t < self.vocab_size:
                    raise ValueError(f"tree_logits: token {t} outside the vocabulary")
        parent = torch.as_tensor(parents, dtype=torch.long).to(self._device)  # [k]
        tok = torch.as_tensor(tokens, dtype=torch.long).to(self._device).reshape(1, k)  # [1, k]
        P, n_tree = self.committed_pairs, n_nodes - 1
        if self.max_length is not None and P + n_tree + k > self.max_length:
            raise SpecDecError(f"EAGLE draft context overflow: {P + n_tree + k} > {self.max_length}")
        with torch.inference_mode():
            outs = torch.cat([self._last_h[None], self._tree_h])  # [n_nodes, H] root first
            h_in = outs.index_select(0, parent)[None]  # [1, k, H]
            depths = self._depth.index_select(0, parent) + 1  # [k]
            # pair of the root sits at position P-1; a node at depth d at P-1+d
            pos = (depths + (P - 1))[None]  # [1, k]
            anc = self._anc.index_select(0, parent)  # [k, n_nodes]: ancestors among the tree nodes (root column 0)
            visible = torch.cat(
                [
                    torch.ones(k, P, dtype=torch.bool, device=self._device),
                    anc[:, 1:],  # tree node a (>= 1) sits at column P + a - 1
                    torch.eye(k, dtype=torch.bool, device=self._device),
                ],
                dim=1,
            )  # [k, P + n_tree + k]
            mask = _additive(visible, self._dtype)[None, None]
            h = self._run_head(h_in, tok, pos, mask, from_target=False)
            self._tree_pairs += k
            self._tree_h = torch.cat([self._tree_h, h[0]])
            self._depth = torch.cat([self._depth, depths])
            grown = torch.zeros(n_nodes + k, n_nodes + k, dtype=torch.bool, device=self._device)
            grown[:n_nodes, :n_nodes] = self._anc
            grown[n_nodes:, :n_nodes] = anc
            grown[n_nodes:, n_nodes:] = torch.eye(k, dtype=torch.bool, device=self._device)
            self._anc = grown
            return h[0]

    def commit(
        self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None, device_tokens: torch.Tensor | None = None
    ) -> None:
        """As :meth:`OneRowDraft.commit`; ``device_tokens``, the same tokens as a
        device tensor (the step path), saves their host-to-device copy."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("commit: no tokens")
        if target_hidden is None:
            raise InvalidConfigError(
                "EAGLE draft: commit() needs target_hidden (the target's features at the root and accepted nodes); "
                f"capture hidden_states layers {self.target_layers} in the target"
            )
        self._drop_tree()
        with torch.inference_mode():
            feats = self._features(target_hidden, len(tokens), "commit")
            self._append_pairs(feats, tokens, device_tokens)


    # ------------------------------------------------------ rows (batch > 1)
    @property
    def rows_mode(self) -> bool:
        return getattr(self, "_rows", None) is not None

    @property
    def batch_size(self) -> int:
        """Rows in rows mode (:meth:`begin_rows`), else 1."""
        rows = getattr(self, "_rows", None)
        return 1 if rows is None else int(rows)

    def _row_count(self) -> int:
        """``B`` in rows mode (:meth:`begin_rows`)."""
        if self._rows is None:
            raise RuntimeError("outside rows mode (begin_rows)")
        return self._rows

    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: torch.Tensor | None = None, *,
                   positions: int | None = None) -> None:
        """Start ``B`` rows at once (rows mode, for batched generation).

        Row ``b``'s committed pairs live in row ``b`` of one ``[2, B, H,
        capacity, d]`` buffer with its own length; every forward writes each
        row's new pairs right after its own (per-row offsets) and masks, per
        row, what lies beyond. Each row drafts exactly what :meth:`begin` on
        its prompt alone drafts (tested).

        Args:
            prompts: ``B`` non-empty prompts.
            target_hidden: ``[B, S, L, H]`` the target's features of every row's
                cached prompt tokens (``HFTarget.prefill_batch``; row ``b``'s
                first ``len(prompts[b]) - 1`` positions are read).
        """
        if len(prompts) == 1:  # one row: the one-row layout (begin)
            return OneRowDraft.begin_rows(self, prompts, target_hidden, positions=positions)
        if positions is not None:  # sizing a cache is not inference: its buffers stay normal tensors
            with torch.inference_mode(False):
                self.reserve(positions)
        rows = [[int(t) for t in p] for p in prompts]
        if not rows or any(not r for r in rows):
            raise InvalidConfigError("begin_rows needs non-empty prompts")
        B = len(rows)
        cfg = self.head.config
        width = len(cfg.target_layers) * cfg.target_hidden_size
        th = target_hidden
        if th is None:
            raise InvalidConfigError("begin_rows: the EAGLE draft needs target_hidden (the target's prompt features)")
        if th.dim() != 4 or th.shape[0] != B or tuple(th.shape[2:]) != (len(cfg.target_layers), cfg.target_hidden_size):
            raise VocabMismatchError(
                f"begin_rows: target_hidden has shape {tuple(th.shape)}; expected [{B}, S, "
                f"{len(cfg.target_layers)}, {cfg.target_hidden_size}]"
            )
        self._reset()
        self._rows = B
        capacity = max(self._reserved, MIN_CAPACITY, max(len(r) for r in rows))
        self._rkv = torch.zeros(2, B, cfg.num_key_value_heads, capacity, cfg.head_dim, device=self._device, dtype=self._dtype)
        self._rpairs = [0] * B
        self._rpairs_dev = torch.zeros(B, dtype=torch.int64, device=self._device)
        # pairs (f_{i-1}, x_i), i = 1 .. m-1; a one-token prompt: one pair of a zero feature and x_0
        counts = [max(len(r) - 1, 1) for r in rows]
        T = max(counts)
        feats = torch.zeros(B, T, width, device=self._device, dtype=self._dtype)
        tokens = torch.zeros(B, T, dtype=torch.long)
        for b, r in enumerate(rows):
            if len(r) > 1:
                feats[b, : len(r) - 1] = th[b, : len(r) - 1].reshape(len(r) - 1, width).to(self._device, self._dtype)
                tokens[b, : len(r) - 1] = torch.tensor(r[1:])
            else:
                tokens[b, 0] = r[0]
        with torch.inference_mode():
            self._append_rows(feats, tokens.to(self._device), counts)
        self._rdrop_tree()

    def _rdrop_tree(self) -> None:
        B, H = self._row_count(), self.head.config.hidden_size
        self._rtree_pairs = 0
        self._rtree_h = torch.zeros(B, 0, H, device=self._device, dtype=self._dtype)  # [B, n, H] nodes 1..n
        self._rdepth = torch.zeros(B, 1, dtype=torch.long, device=self._device)  # [B, n + 1]
        self._ranc = torch.zeros(B, 1, 1, dtype=torch.bool, device=self._device)  # [B, n + 1, n + 1]

    def _run_rows(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                  offsets: torch.Tensor, span: int, from_target: bool) -> torch.Tensor:
        """The head over ``T`` new pairs per row (``hidden [B, T, F]``, ``tokens``/``positions [B, T]``),
        written at ``offsets [B] + 0 .. T - 1`` of each row; ``visible [B, T, span]``. Returns ``h [B, T, H]``."""
        B, T = tokens.shape
        if span > self._rkv.shape[-2]:
            grown = self._rkv.new_zeros(*self._rkv.shape[:-2], max(span, 2 * self._rkv.shape[-2]), self._rkv.shape[-1])
            grown[..., : self._rkv.shape[-2], :] = self._rkv
            self._rkv = grown
        x, emb = self.head.fuse(hidden, tokens, from_target)
        q, k, v = self.head.qkv(x, emb, positions)  # q [B, nh, T, d]; k, v [B, nkv, T, d]
        index = (offsets.unsqueeze(-1) + torch.arange(T, device=self._device))[:, None, :, None].expand_as(k)
        self._rkv[0].scatter_(2, index, k)
        self._rkv[1].scatter_(2, index, v)
        mask = _additive(visible, self._dtype).unsqueeze(1)  # [B, 1, T, span]
        return self.head.finish(x, attend(q, self._rkv[0, :, :, :span], self._rkv[1, :, :, :span], mask))

    def _append_rows(
        self, feats: torch.Tensor, tokens: torch.Tensor, counts: Sequence[int], count: torch.Tensor | None = None
    ) -> None:
        """Append ``counts[b]`` pairs ``(feats[b, i], tokens[b, i])`` to every row (``[B, T, F]``, ``[B, T]``);
        ``count``: the same counts as a ``[B]`` device tensor, when the caller has it."""
        B, T = tokens.shape
        past = self._rpairs_dev  # [B]
        span = max(p + T for p in self._rpairs)
        if self.max_length is not None and max(p + c for p, c in zip(self._rpairs, counts)) > self.max_length:
            raise SpecDecError(f"EAGLE draft context overflow: more than {self.max_length} pairs in a row")
        cols = torch.arange(span, device=self._device)
        rel = cols - past.unsqueeze(-1)  # [B, span]: key position relative to the row's first new pair
        i = torch.arange(T, device=self._device)
        if count is None:
            count = torch.tensor(list(counts), device=self._device)  # [B]
        count = count.to(self._device)
        # a pair sees the row's committed pairs and the new ones up to itself (a padding pair past the
        # row's count sees real and padding pairs; its output is dropped, its keys are masked later)
        visible = rel.unsqueeze(1) <= i.view(1, T, 1)  # [B, T, span]
        positions = past.unsqueeze(-1) + i  # [B, T]
        with model_call():
            h = self._run_rows(feats, tokens, positions, visible, past, span, from_target=True)
        last = (count - 1).clamp_min(0)
        self._rlast_h = h.gather(1, last.view(B, 1, 1).expand(B, 1, h.shape[-1])).squeeze(1)  # [B, H]
        self._rpairs = [p + c for p, c in zip(self._rpairs, counts)]
        self._rpairs_dev = past + count

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        """Rows mode: ``[B, Vd]`` (``proposal``) or ``[B, V]`` root logits of every row."""
        if not self.rows_mode:
            raise RuntimeError("root_rows_logits() outside rows mode (begin_rows)")
        self._rdrop_tree()
        with torch.inference_mode():
            if proposal:
                return self.head.draft_logits(self._rlast_h).float()
            return self.head.full_logits(self._rlast_h)

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        """Rows mode: one forward for ``k`` new tree nodes of every row (``parents``,
        ``tokens`` ``[B, k]``, device tensors; node ids as in :meth:`tree_logits`)."""
        if not self.rows_mode:
            raise RuntimeError("tree_rows_logits() outside rows mode (begin_rows)")
        B, k = tokens.shape
        n_nodes = int(self._rdepth.shape[1])
        H = self.head.config.hidden_size
        with torch.inference_mode():
            parent = parents.to(self._device, torch.long)  # [B, k]
            outs = torch.cat([self._rlast_h.unsqueeze(1), self._rtree_h], dim=1)  # [B, n_nodes, H] root first
            h_in = outs.gather(1, parent.unsqueeze(-1).expand(B, k, H))  # [B, k, H]
            depths = self._rdepth.gather(1, parent) + 1  # [B, k]
            P = self._rpairs_dev  # [B]
            pos = depths + (P.unsqueeze(-1) - 1)  # the root's pair sits at P - 1, a node at depth d at P - 1 + d
            anc = self._ranc.gather(1, parent.unsqueeze(-1).expand(B, k, n_nodes))  # [B, k, n_nodes]
            n_tree = n_nodes - 1
            span = max(self._rpairs) + n_tree + k
            rel = torch.arange(span, device=self._device) - P.unsqueeze(-1)  # [B, span]
            in_tree = (rel >= 0) & (rel < n_tree)
            tree_col = anc.gather(2, (rel.clamp(0, max(n_tree - 1, 0)) + 1).clamp(max=n_nodes - 1).unsqueeze(1).expand(B, k, span))
            own = rel.unsqueeze(1) == (n_tree + torch.arange(k, device=self._device)).view(1, k, 1)  # [B, k, span]
            visible = (rel < 0).unsqueeze(1) | (tree_col & in_tree.unsqueeze(1)) | own
            h = self._run_rows(h_in, tokens.to(self._device, torch.long), pos, visible, P + n_tree, span, from_target=False)
            self._rtree_pairs += k
            self._rtree_h = torch.cat([self._rtree_h, h], dim=1)
            self._rdepth = torch.cat([self._rdepth, depths], dim=1)
            grown = torch.zeros(B, n_nodes + k, n_nodes + k, dtype=torch.bool, device=self._device)
            grown[:, :n_nodes, :n_nodes] = self._ranc
            grown[:, n_nodes:, :n_nodes] = anc
            grown[:, n_nodes:, n_nodes:] = torch.eye(k, dtype=torch.bool, device=self._device)
            self._ranc = grown
            return self.head.draft_logits(h).float() if proposal else self.head.full_logits(h)

    def commit_rows(
        self,
        emitted: Sequence[Sequence[int]],
        target_hidden: torch.Tensor | None = None,
        *,
        device_tokens: torch.Tensor | None = None,
        device_counts: torch.Tensor | None = None,
    ) -> None:
        """Rows mode: append each row's emitted tokens (accepted + bonus) with
        the target's features at its root and accepted nodes
        (``target_hidden [B, A, L, H]``, row ``b``'s first ``len(emitted[b])``
        read), as :meth:`commit` does for one row. ``device_tokens`` ``[B, >= A]``
        (``-1`` padded) and ``device_counts`` ``[B]``: the same tokens and counts
        on the device (the batched step's), so that nothing is copied to it. Outside rows
        mode: :meth:`commit` of the one row."""
        if not self.rows_mode:
            if len(emitted) != 1:
                raise RuntimeError("commit_rows() of several rows outside rows mode (begin_rows)")
            k = len(emitted[0])
            self.commit(emitted[0], target_hidden=None if target_hidden is None else target_hidden[0, :k],
                        device_tokens=None if device_tokens is None else device_tokens[0, :k])
            return
        B = self._row_count()
        if len(emitted) != B or any(len(e) == 0 for e in emitted):
            raise ValueError(f"commit_rows: {len(emitted)} rows of emitted tokens (each non-empty) for {B} rows")
        counts = [len(e) for e in emitted]
        T = max(counts)
        cfg = self.head.config
        width = len(cfg.target_layers) * cfg.target_hidden_size
        self._rdrop_tree()
        if device_tokens is not None:
            tokens = device_tokens[:, :T].clamp_min(0).to(self._device, torch.long)  # padding is masked
        else:
            tokens = torch.zeros(B, T, dtype=torch.long)
            for b, e in enumerate(emitted):
                tokens[b, : len(e)] = torch.tensor([int(t) for t in e])
            tokens = tokens.to(self._device)
        if target_hidden is None:
            raise InvalidConfigError("commit_rows: the EAGLE draft needs target_hidden (the target's features)")
        with torch.inference_mode():
            feats = target_hidden[:, :T].reshape(B, T, width).to(self._device, self._dtype)
            self._append_rows(feats, tokens, counts, device_counts)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Rows mode: keep only the rows ``rows``, renumbered in order."""
        if not self.rows_mode:
            raise RuntimeError("keep_rows() outside rows mode (begin_rows)")
        keep = [int(r) for r in rows]
        index = torch.tensor(keep, dtype=torch.int64, device=self._device)
        self._rows = len(keep)
        self._rkv = self._rkv.index_select(1, index)
        self._rlast_h = self._rlast_h.index_select(0, index)
        self._rpairs = [self._rpairs[r] for r in keep]
        self._rpairs_dev = self._rpairs_dev.index_select(0, index)
        self._rdrop_tree()


@register("draft", "eagle2")
class Eagle2Draft(EagleDraft):
    """EAGLE-2 head draft (see :class:`EagleDraft`)."""

    version = 2


@register("draft", "eagle3")
class Eagle3Draft(EagleDraft):
    """EAGLE-3 head draft (see :class:`EagleDraft`)."""

    version = 3


def make_draft(head: EagleHead, **kwargs: Any) -> EagleDraft:
    """The registered draft class matching the head's version."""
    return (Eagle2Draft if head.config.version == 2 else Eagle3Draft)(head, **kwargs)


# ----------------------------------------------------- target features
def hf_feature_fn(model: Any, layers: Sequence[int]) -> FeatureFn:
    """A :data:`FeatureFn` running a Hugging Face causal LM with
    ``output_hidden_states=True`` and stacking ``hidden_states[l]`` for ``l`` in ``layers``.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> m = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        ...     intermediate_size=64, vocab_size=50))
        >>> hf_feature_fn(m, (1, 2))([3, 4, 5]).shape
        torch.Size([3, 2, 32])
    """
    layers = tuple(int(l) for l in layers)

    def fn(token_ids: Sequence[int]) -> torch.Tensor:
        device = next(model.parameters()).device
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
        with torch.inference_mode():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        return torch.stack([out.hidden_states[l][0] for l in layers], dim=1)

    return fn
