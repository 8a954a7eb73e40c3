"""``HFDraft``: an independent Hugging Face causal LM as the draft.

The draft keeps its own KV cache. During a step it holds the committed
context followed by the nodes of this step's draft tree, in node-id order;
:meth:`HFDraft.tree_logits` drafts a whole tree level in one forward, each new
node attending the committed context, its tree ancestors and itself, at
position ``len(context) - 1 + depth``.

:meth:`HFDraft.commit` drops the tree, except that it *keeps* the KV of tree
nodes that spell a prefix of the emitted tokens (a node's keys and values
depend only on the tokens of its path, so they equal what a sequential forward
would compute); the remaining emitted tokens wait, uncached, for the next
:meth:`HFDraft.root_logits`. At least the last emitted token is left
uncached, so that ``root_logits`` always has a fresh forward to read.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specdec._extras import needs_extra
from specdec.drafts.base import OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.kernels.kv_compact import compact_kv_inplace
from specdec.kernels.linear import (
    LinearPlan,
    RowDispatchLinear,
    accelerate_linears,
    dispatch_for,
    resolve_cpu_linear,
)
from specdec.models.hf_common import (
    check_attention,
    check_eval_mode,
    KVCache,
    KVCompactor,
    check_context,
    check_prompt,
    check_tokens,
    forward_rows,
    forward_tokens,
    model_max_length,
    model_vocab_size,
    sliding_window,
    text_config,
)
from specdec.registry import register

__all__ = ["HFDraft"]


@register("draft", "hf")
class HFDraft(OneRowDraft):
    """A Hugging Face causal LM as the draft ``q`` (its own weights and KV cache).

    Args:
        model: an HF ``*ForCausalLM`` in eval mode (full attention; eager or sdpa).
        kv_compactor: gather used when :meth:`commit` keeps accepted tree
            nodes (default :func:`~specdec.kernels.kv_compact.compact_kv_inplace`).
        logits_device: where logits are returned (``"cpu"`` by default; None =
            the model's device).
        cpu_linear: install the tuned few-row linear dispatch on the model's
            linear layers (as :class:`~specdec.targets.hf.HFTarget` does;
            ``"auto"`` = on the CPU).
        proposal_ids: ``[Vd]`` ascending target ids, the draft's *proposal
            vocabulary* (:attr:`~specdec.drafts.base.DraftModel.proposal_ids`), or
            None (all ``V``). Its forwards then apply only those rows of the LM
            head (``[..., Vd]`` logits, which the level-wise builders rank and
            draw over); :meth:`root_logits` / :meth:`tree_logits` return ``-inf``
            outside the vocabulary. For a draft LM distilled over a draft
            vocabulary (docs/models.md, "Gemma-3-270M").

    Logits are returned in float32 (float64 for a float64 model).

    Example:
        >>> import transformers
        >>> cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> draft = HFDraft(transformers.LlamaForCausalLM(cfg).eval())
        >>> draft.begin([1, 2, 3])
        >>> draft.root_logits().shape
        torch.Size([11])
        >>> draft.tree_logits([0, 0], [4, 5]).shape   # two children of the root
        torch.Size([2, 11])
        >>> draft.tree_logits([1], [6]).shape          # a child of node 1 (token 4)
        torch.Size([1, 11])
        >>> draft.commit([4, 6, 9]); draft.committed_tokens
        (1, 2, 3, 4, 6, 9)
    """

    supports_rows = True

    def __init__(
        self,
        model: Any,
        *,
        kv_compactor: KVCompactor = compact_kv_inplace,
        logits_device: str | torch.device | None = "cpu",
        cpu_linear: bool | str = "auto",
        proposal_ids: torch.Tensor | Sequence[int] | None = None,
    ) -> None:
        check_attention(model, "HFDraft")  # the tree's 4D mask must be honoured (docs/models.md)
        check_eval_mode(model, "HFDraft")
        sliding_window(model)  # a malformed window is refused before any forward (docs/models.md, "Sliding-window attention")
        self.model = model
        self.linear_plans: dict[tuple[int, int], LinearPlan] = {}
        accelerate = resolve_cpu_linear(cpu_linear, next(model.parameters()).device)
        if accelerate:
            self.linear_plans = accelerate_linears(model)
        self._vocab_size = model_vocab_size(model)
        self._proposal_ids, self._head, head_plan = _proposal_head(model, proposal_ids, self._vocab_size, accelerate)
        if head_plan is not None:  # the [Vd, H] rows of the LM head that the forwards apply
            self.linear_plans[head_plan.shape] = head_plan
        self._full_ids = self._proposal_ids  # the ids on the logits' device (moved once, by _full)
        self._max_length = model_max_length(model)
        self.kv_compactor = kv_compactor
        self.logits_device = logits_device
        self._cache: KVCache | None = None
        self._reserved = 0
        self._committed: list[int] = []
        self._cached = 0  # committed tokens whose KV is in the cache (a prefix)
        self._root: torch.Tensor | None = None  # root logits of this step ([V], or [Vd] with proposal_ids), once computed
        self._reset_tree()
        # rows mode (begin_rows): per row, the committed tokens and how many are cached; the
        # step's tree on the device (every row adds the same number of nodes per level)
        self._rrows: list[list[int]] | None = None
        self._rcached: list[int] = []
        self._rroot: torch.Tensor | None = None  # [B, V] ([B, Vd] with proposal_ids) root logits of this step, once computed
        self._rbase: torch.Tensor | None = None  # [B] committed length of each row (the tree starts there)
        self._rdepth: torch.Tensor | None = None  # [B, n] depth of each tree node (node 0 = root)
        self._ranc: torch.Tensor | None = None  # [B, n, n] ancestors-or-self among tree nodes
        self._rlevels = 0  # tree_rows_logits calls this step (a bound on the tree's depth)
        self._rstart: torch.Tensor | None = None  # [B] cached tokens per row, on the device (after the first root)
        self._rpend: tuple[torch.Tensor, torch.Tensor] | None = None  # the batched step's emitted tokens and counts

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa", **kwargs: Any) -> "HFDraft":
        """Load a local HF model folder (no download) and wrap it; ``kwargs`` go to :class:`HFDraft`."""
        with needs_extra("hf", "HFDraft.from_pretrained"):
            from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(name_or_path, attn_implementation=attn_implementation, local_files_only=True)
        # transformers wraps PreTrainedModel.to with functools.wraps: mypy sees an unbound _Wrapped (stub gap)
        return cls(model.to(dtype).eval(), **kwargs)  # type: ignore[arg-type]

    def _reset_tree(self) -> None:
        # per tree node (index = node id; 0 = root): token, parent, depth, tree
        # slots (cache positions) of its path below the root, children by token
        self._tokens: list[int] = [-1]
        self._depth: list[int] = [0]
        self._path_slots: list[list[int]] = [[]]
        self._children: list[dict[int, int]] = [{}]

    # ----------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def proposal_ids(self) -> torch.Tensor | None:
        """``[Vd]`` the proposal vocabulary given at construction (on the model's device), or None."""
        return self._proposal_ids

    @property
    def max_length(self) -> int | None:
        """Number of positions of the draft model."""
        return self._max_length

    @property
    def committed_tokens(self) -> tuple[int, ...]:
        """The committed context (prompt + committed tokens)."""
        return tuple(self._committed)

    @property
    def cache_length(self) -> int:
        """Positions currently in the KV cache (cached committed tokens + tree nodes)."""
        return 0 if self._cache is None else len(self._cache)

    @property
    def num_tree_nodes(self) -> int:
        """Nodes (root excluded) added to this step's tree so far."""
        return len(self._tokens) - 1

    # ------------------------------------------------------------ lifecycle
    def reserve(self, positions: int) -> None:
        """Size the preallocated KV cache for ``positions`` positions at the
        next :meth:`begin` (capped at the model's context)."""
        cap = int(positions) if self._max_length is None else min(int(positions), self._max_length)
        self._reserved = max(cap, 0)

    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        """Start a sequence; nothing runs until :meth:`root_logits` (``target_hidden`` is
        ignored: a token-level draft).

        Raises:
            ValueError: empty prompt or token ids outside the vocabulary.
            ContextOverflowError: prompt longer than the model's context.
        """
        self._committed = check_prompt(prompt_ids, self._vocab_size, self._max_length)
        if self._rrows is not None:  # leaving rows mode: its B-row slabs are not this sequence's
            self._rrows, self._cache = None, None
        if self._cache is not None and self._cache.preallocated:  # reuse the slabs: no new allocation
            self._cache.truncate(0)
            self._cache.reserve(max(self._reserved, len(self._committed)))
        else:
            self._cache = KVCache(self.model, capacity=max(self._reserved, len(self._committed)))
        self._cached = 0
        self._root = None
        self._reset_tree()

    def root_logits(self) -> torch.Tensor:
        """``[V]`` logits after the committed context; runs the uncached
        committed tokens (the whole prompt after :meth:`begin`, the emitted
        tokens not found in the tree after :meth:`commit`) in one forward."""
        return self._full(self._root_raw())

    def root_proposal_logits(self) -> torch.Tensor:
        """``[Vd]`` :meth:`root_logits` over the proposal vocabulary (``[V]`` without one)."""
        return self._root_raw()

    def _root_raw(self) -> torch.Tensor:
        if self._cache is None:
            raise RuntimeError("root_logits() called before begin()")
        if self._root is None:
            pending = self._committed[self._cached :]
            assert pending and self.num_tree_nodes == 0, "draft cache out of sync"
            check_context(len(self._committed) - 1, self._max_length, "the draft's context")
            logits, _ = forward_tokens(
                self.model, self._cache, pending, list(range(self._cached, len(self._committed))), None, logits="last",
                head=self._head,
            )
            assert logits is not None
            self._cached = len(self._committed)
            self._root = self._out(logits)
        return self._root

    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Add ``k`` nodes (ids ``num_tree_nodes + 1 ...``) and return their ``[k, V]`` logits, in one forward.

        ``parents`` and ``tokens`` may be ``[k]`` int64 tensors (the tensor
        builders' form): they are read in one device-to-host copy, since this
        draft keeps its tree bookkeeping on the host.

        Raises:
            ValueError: unknown parent, length mismatch, or a token outside the vocabulary.
            ContextOverflowError: a node's position is beyond the draft's context.
        """
        return self._full(self._tree_raw(parents, tokens))

    def tree_proposal_logits(
        self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor
    ) -> torch.Tensor:
        """``[k, Vd]`` :meth:`tree_logits` over the proposal vocabulary (``[k, V]`` without one)."""
        return self._tree_raw(parents, tokens)

    def _tree_raw(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if self._cache is None:
            raise RuntimeError("tree_logits() called before begin()")
        if len(parents) != len(tokens):
            raise ValueError(f"tree_logits: {len(parents)} parents but {len(tokens)} tokens")
        if isinstance(parents, torch.Tensor) and isinstance(tokens, torch.Tensor):
            # the level's parents and tokens in one host read (this draft keeps its tree on the host)
            parents, tokens = torch.stack([parents.reshape(-1), tokens.reshape(-1).to(parents.dtype)]).tolist()
        tokens = check_tokens(tokens, self._vocab_size, "tree_logits")
        parents = [int(p) for p in parents]
        for p in parents:
            if not 0 <= p < len(self._tokens):
                raise ValueError(f"tree_logits: unknown parent node {p} (the tree has nodes 0..{len(self._tokens) - 1})")
        if not tokens:
            dtype = torch.float64 if self._out_dtype() == torch.float64 else torch.float32
            return torch.empty(0, self._width, dtype=dtype, device=self.logits_device)
        self._root_raw()  # the root must be cached before nodes attend to it
        context = len(self._committed)
        first_slot = context + self.num_tree_nodes
        depths = [self._depth[p] + 1 for p in parents]
        check_context(context - 1 + max(depths), self._max_length, "the draft tree")
        k = len(tokens)
        allowed = torch.zeros(k, first_slot + k, dtype=torch.bool)
        allowed[:, :context] = True
        paths = [self._path_slots[p] + [first_slot + j] for j, p in enumerate(parents)]
        for j, path in enumerate(paths):
            allowed[j, path] = True
        logits, _ = forward_tokens(
            self.model, self._cache, tokens, [context - 1 + d for d in depths], allowed, logits="all", head=self._head
        )
        assert logits is not None
        for p, tok, depth, path in zip(parents, tokens, depths, paths):  # bookkeeping once the forward succeeded
            self._children[p].setdefault(tok, len(self._tokens))
            self._tokens.append(tok)
            self._depth.append(depth)
            self._path_slots.append(path)
            self._children.append({})
        return self._out(logits)

    def commit(self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        """Append the emitted ``tokens`` to the committed context and drop the step's tree.

        Tree nodes spelling a prefix of ``tokens`` (all but the last token)
        keep their KV; the rest of ``tokens`` is run at the next :meth:`root_logits`.
        ``target_hidden`` is ignored (token-level draft).
        """
        if self._cache is None:
            raise RuntimeError("commit() called before begin()")
        tokens = check_tokens(tokens, self._vocab_size, "commit")
        if not tokens:
            self._drop_tree([])
            return
        kept: list[int] = []
        if self.num_tree_nodes:
            node = 0
            for tok in tokens[:-1]:
                node = self._children[node].get(tok, -1)
                if node < 0:
                    break
                kept.append(node)
        self._drop_tree(kept)
        self._committed.extend(tokens)
        self._root = None

    def _drop_tree(self, kept_nodes: list[int]) -> None:
        assert self._cache is not None
        if self.num_tree_nodes:
            context = len(self._committed)
            keep = list(range(context)) + [self._path_slots[n][-1] for n in kept_nodes]
            self._cache.compact(torch.tensor(keep, dtype=torch.int64), self.kv_compactor)
            self._cached = context + len(kept_nodes)
        self._reset_tree()

    # ------------------------------------------------------ rows (batch > 1)
    @property
    def rows_mode(self) -> bool:
        return self._rrows is not None

    @property
    def committed_rows(self) -> tuple[tuple[int, ...], ...]:
        """Rows mode: each row's committed context."""
        return tuple(tuple(r) for r in self._rrows or ())

    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: Any = None, *,
                   positions: int | None = None) -> None:
        """Start ``B`` rows at once (rows mode, for batched generation); nothing
        runs until :meth:`root_rows_logits`. ``target_hidden`` is ignored (token-level draft).
        One prompt is served by :meth:`begin` (the one-row layout).

        Layout: one KV slab of ``B`` rows, each with its own length (as
        :meth:`~specdec.targets.hf.HFTarget.prefill_batch`): row ``b``'s
        committed tokens, then this step's tree nodes in node-id order (every
        row adds the same number of nodes per level). :meth:`commit_rows` drops
        every tree node; the emitted tokens are run at the next root (one
        forward for all rows, padded to the longest). Each row drafts the
        logits its :meth:`begin` alone drafts (tested).
        """
        if len(prompts) == 1:
            return OneRowDraft.begin_rows(self, prompts, positions=positions)
        if len(prompts) == 0:
            raise ValueError("begin_rows needs at least one prompt")
        if positions is not None:  # sizing a cache is not inference: its buffers stay normal tensors
            with torch.inference_mode(False):
                self.reserve(positions)
        rows = [check_prompt(p, self._vocab_size, self._max_length) for p in prompts]
        self._cache = KVCache(self.model, capacity=max(self._reserved, max(len(r) for r in rows)))
        if not self._cache.preallocated:
            raise NotImplementedError("batch rows need the preallocated KV cache (transformers >= 4.56)")
        self._rrows = rows
        self._rcached = [0] * len(rows)
        self._rroot = None
        self._rbase = self._rdepth = self._ranc = None
        self._rstart = self._rpend = None
        self._root = None
        self._reset_tree()

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        """Rows mode: ``[B, V]`` logits after every row's committed context (``[B, Vd]`` with
        ``proposal`` and a proposal vocabulary); runs every row's uncached committed tokens in
        one forward (padded to the longest)."""
        return self._rows_root_raw() if proposal else self._full(self._rows_root_raw())

    def _rows_root_raw(self) -> torch.Tensor:
        if self._rrows is None or self._cache is None:
            raise RuntimeError("root_rows_logits() outside rows mode (begin_rows)")
        if self._rroot is not None:
            return self._rroot
        device = next(self.model.parameters()).device
        rows, cached = self._rrows, self._rcached
        pending = [len(r) - c for r, c in zip(rows, cached)]  # >= 1 per row: the root's token at least
        for r in rows:
            check_context(len(r) - 1, self._max_length, "the draft's context")
        B, P = len(rows), max(pending)
        if self._rpend is not None and self._rstart is not None:  # the step's tokens, already on the device
            ids = self._rpend[0][:, :P].clamp_min(0)  # [B, P] (-1 padding: masked below)
            start, count = self._rstart, self._rpend[1]  # [B], [B]
        else:  # after begin_rows (or a commit without device tokens): built once from the host rows
            ids = torch.zeros(B, P, dtype=torch.int64)
            for b, (r, c) in enumerate(zip(rows, cached)):
                ids[b, : len(r) - c] = torch.tensor(r[c:], dtype=torch.int64)
            start = torch.tensor(cached, dtype=torch.int64, device=device)  # [B] where each row's pending tokens go
            count = torch.tensor(pending, dtype=torch.int64, device=device)  # [B]
        span = max(cached) + P
        cols = torch.arange(span, device=device)  # [K]
        j = torch.arange(P, device=device)  # [P]
        key_rel = cols.view(1, 1, span) - start.view(B, 1, 1)  # [B, 1, K] key position after the row's cached ones
        # a pending token sees its row's cached tokens and the pending ones up to itself; a padding
        # position (j >= count) sees itself only (its output and cache entry are never used)
        allowed = (key_rel < 0) | ((key_rel >= 0) & (key_rel <= j.view(1, P, 1)))  # [B, P, K]
        pad = j.view(1, P) >= count.view(B, 1)  # [B, P]
        allowed = torch.where(pad.unsqueeze(-1), key_rel == j.view(1, P, 1), allowed)
        self._cache.write_rows(start, span)
        try:
            logits, _ = forward_rows(self.model, self._cache, ids.to(device), start.view(B, 1) + j, allowed,
                                     logits="all", head=self._head)
        finally:
            self._cache.write_rows(None)
        assert logits is not None
        last = (count - 1).view(B, 1, 1).expand(B, 1, logits.shape[-1])
        self._rroot = self._out(logits.gather(1, last).squeeze(1))  # [B, V] ([B, Vd])
        self._rcached = [len(r) for r in rows]
        self._rbase = start + count  # [B] committed length of each row, on the device
        self._rpend = None
        self._rdepth = torch.zeros(B, 1, dtype=torch.int64, device=device)
        self._ranc = torch.ones(B, 1, 1, dtype=torch.bool, device=device)
        self._rlevels = 0
        return self._rroot

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        """Rows mode: add ``k`` nodes to every row's tree (``parents``, ``tokens``
        ``[B, k]``, node ids as in :meth:`tree_logits`) and return their
        ``[B, k, V]`` logits (``[B, k, Vd]`` with ``proposal`` and a proposal vocabulary), in one
        forward. Nothing is read back to the host."""
        if self._rrows is None or self._cache is None:
            raise RuntimeError("tree_rows_logits() outside rows mode (begin_rows)")
        self._rows_root_raw()  # the roots must be cached before nodes attend to them
        assert self._rbase is not None and self._rdepth is not None and self._ranc is not None
        B, k = tokens.shape
        if parents.shape != tokens.shape or B != len(self._rrows):
            raise ValueError(f"tree_rows_logits: parents {tuple(parents.shape)} and tokens {tuple(tokens.shape)} "
                             f"must both be [{len(self._rrows)}, k]")
        device = self._rbase.device
        n = self._rdepth.shape[1]  # nodes so far, root included
        parent = parents.to(device, torch.int64)  # [B, k]
        depth = self._rdepth.gather(1, parent) + 1  # [B, k]
        self._rlevels += 1  # the new nodes' depth is at most the number of levels added (no host read)
        check_context(max(self._rcached) - 1 + self._rlevels, self._max_length, "the draft tree")
        # ancestors-or-self of the new nodes over all n + k nodes
        anc_old = self._ranc.gather(1, parent.unsqueeze(-1).expand(B, k, n))  # [B, k, n]
        anc_new = torch.cat([anc_old, torch.eye(k, dtype=torch.bool, device=device).expand(B, k, k)], dim=2)  # [B, k, n+k]
        span = int(max(self._rcached)) + n - 1 + k  # positions: committed, then tree nodes 1 .. n + k - 1
        cols = torch.arange(span, device=device)
        rel = cols.view(1, span) - self._rbase.view(B, 1) + 1  # [B, K]: tree node id of each key (< 1: committed)
        in_tree = (rel >= 1) & (rel < n + k)
        seen = anc_new.gather(2, rel.clamp(0, n + k - 1).unsqueeze(1).expand(B, k, span))  # [B, k, K]
        allowed = (rel < 1).unsqueeze(1) | (seen & in_tree.unsqueeze(1))
        self._cache.write_rows(self._rbase + n - 1, span)  # node n goes at base + n - 1
        try:
            logits, _ = forward_rows(self.model, self._cache, tokens.to(device), self._rbase.view(B, 1) - 1 + depth,
                                     allowed, logits="all", head=self._head)
        finally:
            self._cache.write_rows(None)
        assert logits is not None
        # bookkeeping once the forward succeeded
        self._rdepth = torch.cat([self._rdepth, depth], dim=1)
        pad = torch.zeros(B, n, k, dtype=torch.bool, device=device)
        self._ranc = torch.cat([torch.cat([self._ranc, pad], dim=2), anc_new], dim=1)  # [B, n + k, n + k]
        return self._out(logits) if proposal else self._full(self._out(logits))

    def commit_rows(
        self,
        emitted: Sequence[Sequence[int]],
        target_hidden: Any = None,
        *,
        device_tokens: torch.Tensor | None = None,
        device_counts: torch.Tensor | None = None,
    ) -> None:
        """Rows mode: append each row's emitted tokens (accepted + bonus) and
        drop every row's tree; the emitted tokens run at the next root.
        ``device_tokens`` ``[B, >= A]`` (``-1`` padded) and ``device_counts``
        ``[B]``: the same tokens on the device (the batched step's), so that the
        next root copies nothing from the host. Outside rows mode: :meth:`commit`."""
        if self._rrows is None:
            return OneRowDraft.commit_rows(self, emitted, target_hidden)
        if self._rrows is None or self._cache is None:
            raise RuntimeError("commit_rows() outside rows mode (begin_rows)")
        if len(emitted) != len(self._rrows):
            raise ValueError(f"{len(emitted)} rows of emitted tokens for {len(self._rrows)} rows")
        for b, tokens in enumerate(emitted):
            self._rrows[b].extend(check_tokens(tokens, self._vocab_size, f"row {b}'s emitted tokens"))
        device = next(self.model.parameters()).device
        if device_tokens is not None and device_counts is not None:  # the next root copies nothing from the host
            self._rpend = (device_tokens.to(device), device_counts.to(device))
        else:
            self._rpend = None
        self._drop_rows_tree()

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Rows mode: keep only the rows ``rows``, renumbered in order."""
        if self._rrows is None or self._cache is None:
            raise RuntimeError("keep_rows() outside rows mode (begin_rows)")
        keep = [int(r) for r in rows]
        if not keep or any(not 0 <= r < len(self._rrows) for r in keep) or len(set(keep)) != len(keep):
            raise ValueError(f"keep_rows: {keep} is not a non-empty set of rows of a batch of {len(self._rrows)}")
        self._cache.keep_rows(keep)
        self._rrows = [self._rrows[r] for r in keep]
        self._rcached = [self._rcached[r] for r in keep]
        if self._rstart is not None or self._rpend is not None:
            index = torch.tensor(keep, dtype=torch.int64, device=next(self.model.parameters()).device)
            if self._rstart is not None:
                self._rstart = self._rstart.index_select(0, index)
            if self._rpend is not None:
                self._rpend = (self._rpend[0].index_select(0, index), self._rpend[1].index_select(0, index))
        self._drop_rows_tree()

    def _drop_rows_tree(self) -> None:
        assert self._cache is not None
        # the tree nodes lie beyond every row's cached tokens: the next forward overwrites them
        # and no mask reaches them; the span shrinks to the longest cached row
        self._cache.truncate(min(len(self._cache), max(self._rcached)))
        if self._rbase is not None:  # the rows' committed lengths become their cached lengths
            self._rstart = self._rbase
        self._rroot = None
        self._rbase = self._rdepth = self._ranc = None

    # -------------------------------------------------------------- helpers
    def _out_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def _width(self) -> int:
        """Columns of the forwards' logits: ``Vd`` with a proposal vocabulary, else ``V``."""
        return self._vocab_size if self._proposal_ids is None else int(self._proposal_ids.shape[0])

    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits from the forwards' ``[..., Vd]`` (``-inf`` outside the proposal vocabulary)."""
        if self._proposal_ids is None:
            return logits
        ids = self._full_ids  # None only without a proposal vocabulary
        if ids is None or ids.device != logits.device:
            ids = self._full_ids = self._proposal_ids.to(logits.device)
        full = logits.new_full((*logits.shape[:-1], self._vocab_size), float("-inf"))
        return full.index_copy_(-1, ids, logits)

    def _out(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.dtype != torch.float64:
            logits = logits.float()
        return logits if self.logits_device is None else logits.to(self.logits_device)


def _proposal_tensor(proposal_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """``proposal_ids`` as ``[Vd]`` int64 on the CPU: a 1-D integer tensor (or numpy array) or a
    flat sequence of integers; a float (``1.7`` is not id 1), a bool or a nested list is refused."""
    if isinstance(proposal_ids, torch.Tensor) or type(proposal_ids).__module__.startswith("numpy"):
        ids = torch.as_tensor(proposal_ids)
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InvalidConfigError(
                f"proposal_ids must be a 1-D integer tensor of token ids, got {ids.dtype} of shape {list(ids.shape)}"
            )
        return ids.to("cpu", torch.int64)
    if isinstance(proposal_ids, (str, bytes)):
        raise InvalidConfigError(f"proposal_ids must be a flat sequence of integer token ids, got {proposal_ids!r:.40}")
    items = list(proposal_ids)
    for i, t in enumerate(items):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise InvalidConfigError(
                f"proposal_ids must be a flat sequence of integer token ids; entry {i} is {t!r:.40} ({type(t).__name__})"
            )
    return torch.tensor([int(t) for t in items], dtype=torch.int64)


def _proposal_head(
    model: Any, proposal_ids: torch.Tensor | Sequence[int] | None, vocab: int, accelerate: bool
) -> tuple[torch.Tensor | None, Callable[[torch.Tensor], torch.Tensor] | None, LinearPlan | None]:
    """``(ids [Vd], head, plan)`` of a proposal vocabulary: ``head(h [..., H])`` is the model's LM
    head restricted to the rows ``ids`` (``[..., Vd]``), with its final logit soft-capping if it
    has one; ``(None, None, None)`` without a vocabulary. With ``accelerate`` (the CPU linear
    dispatch is on, as for the model's own layers) the ``[Vd, H]`` product goes through the tuned
    dispatch (:func:`~specdec.kernels.linear.dispatch_for`; ``plan`` is its plan), else
    ``F.linear`` (``plan`` None). Refuses ids that are not ascending, distinct and in ``[0, V)``,
    and a model whose LM head cannot be read as one linear layer."""
    if proposal_ids is None:
        return None, None, None
    ids = _proposal_tensor(proposal_ids)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab or not bool((ids[1:] > ids[:-1]).all()):
        raise InvalidConfigError(
            f"proposal_ids must be distinct ascending token ids in [0, {vocab}), got {ids.numel()} ids"
            + (f" from {int(ids.min())} to {int(ids.max())}" if ids.numel() else "")
        )
    out = model.get_output_embeddings()
    weight = getattr(out, "weight", None)
    if not isinstance(out, torch.nn.Linear) or weight is None or weight.shape[0] != vocab:
        raise InvalidConfigError(
            f"proposal_ids needs the draft's LM head as one linear layer of {vocab} rows; got {type(out).__name__}"
        )
    device = weight.device
    ids = ids.to(device)
    rows = weight.detach()[ids]  # [Vd, H] (a copy: the head applied per forward)
    bias = None if out.bias is None else out.bias.detach()[ids]
    cap = getattr(text_config(model.config), "final_logit_softcapping", None)

    product: Callable[[torch.Tensor], torch.Tensor] = (
        dispatch_for(rows, bias) if accelerate else (lambda x: torch.nn.functional.linear(x, rows, bias))
    )
    plan = product.plan if isinstance(product, RowDispatchLinear) else None  # F.linear off the CPU / float32

    def head(h: torch.Tensor) -> torch.Tensor:
        logits = product(h.to(rows.dtype))  # [..., Vd]
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return ids, head, plan
