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

from collections.abc import Sequence
from typing import Any

import torch

from specdec.drafts.base import DraftModel
from specdec.kernels.kv_compact import compact_kv_inplace
from specdec.kernels.linear import LinearPlan, accelerate_linears, resolve_cpu_linear
from specdec.models.hf_common import (
    check_attention,
    check_eval_mode,
    KVCache,
    KVCompactor,
    check_context,
    check_prompt,
    check_tokens,
    forward_tokens,
    model_max_length,
    model_vocab_size,
)
from specdec.registry import register

__all__ = ["HFDraft"]


@register("draft", "hf")
class HFDraft(DraftModel):
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

    def __init__(
        self,
        model: Any,
        *,
        kv_compactor: KVCompactor = compact_kv_inplace,
        logits_device: str | torch.device | None = "cpu",
        cpu_linear: bool | str = "auto",
    ) -> None:
        check_attention(model, "HFDraft")  # the tree's 4D mask must be honoured (docs/models.md)
        check_eval_mode(model, "HFDraft")
        self.model = model
        self.linear_plans: dict[tuple[int, int], LinearPlan] = {}
        if resolve_cpu_linear(cpu_linear, next(model.parameters()).device):
            self.linear_plans = accelerate_linears(model)
        self._vocab_size = model_vocab_size(model)
        self._max_length = model_max_length(model)
        self.kv_compactor = kv_compactor
        self.logits_device = logits_device
        self._cache: KVCache | None = None
        self._reserved = 0
        self._committed: list[int] = []
        self._cached = 0  # committed tokens whose KV is in the cache (a prefix)
        self._root: torch.Tensor | None = None  # root logits of this step, once computed
        self._reset_tree()

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa", **kwargs: Any) -> "HFDraft":
        """Load a local HF model folder (no download) and wrap it; ``kwargs`` go to :class:`HFDraft`."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(name_or_path, attn_implementation=attn_implementation, local_files_only=True)
        return cls(model.to(dtype).eval(), **kwargs)

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

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start a sequence; nothing runs until :meth:`root_logits`.

        Raises:
            ValueError: empty prompt or token ids outside the vocabulary.
            ContextOverflowError: prompt longer than the model's context.
        """
        self._committed = check_prompt(prompt_ids, self._vocab_size, self._max_length)
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
        if self._cache is None:
            raise RuntimeError("root_logits() called before begin()")
        if self._root is None:
            pending = self._committed[self._cached :]
            assert pending and self.num_tree_nodes == 0, "draft cache out of sync"
            check_context(len(self._committed) - 1, self._max_length, "the draft's context")
            logits, _ = forward_tokens(
                self.model, self._cache, pending, list(range(self._cached, len(self._committed))), None, logits="last"
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
            return torch.empty(0, self._vocab_size, dtype=dtype, device=self.logits_device)
        self.root_logits()  # the root must be cached before nodes attend to it
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
            self.model, self._cache, tokens, [context - 1 + d for d in depths], allowed, logits="all"
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

    # -------------------------------------------------------------- helpers
    def _out_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _out(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.dtype != torch.float64:
            logits = logits.float()
        return logits if self.logits_device is None else logits.to(self.logits_device)
