"""``HFTarget``: any Hugging Face decoder-only causal LM as the target.

One forward scores a whole draft tree: the tree's ``n`` nodes (root included)
go through the model together with a 4D additive float attention mask (each
node sees the cached committed context, its ancestors and itself) and
``position_ids = past + depth``. After verification the KV cache is compacted
to the committed context (root + accepted path), so the next tree forward
reuses it.

Cache invariant (:mod:`specdec.targets.base`): between steps the cache holds
the committed context except its last token, the next tree's root.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from specdec._extras import needs_extra
from specdec.errors import VocabMismatchError
from specdec.kernels.kv_compact import compact_kv_inplace, kv_keep_index
from specdec.kernels.linear import LinearPlan, accelerate_linears, resolve_cpu_linear
from specdec.models.hf_common import (
    check_attention,
    check_eval_mode,
    KVCache,
    KVCompactor,
    check_context,
    forward_rows,
    check_prompt,
    check_tokens,
    forward_tokens,
    model_max_length,
    model_vocab_size,
    sliding_window,
    text_config,
)
from specdec.registry import register
from specdec.targets.base import OneRowTarget
from specdec.regions import model_call
from specdec.tree import DraftTree
from specdec.tree_batch import TreeBatch

__all__ = ["HFTarget", "tree_allowed"]


def tree_allowed(tree: DraftTree, past_len: int) -> torch.Tensor:
    """``[n, past_len + n]`` bool attention pattern of a tree forward.

    Row ``i`` (node ``i``) may attend every cached position ``< past_len`` and,
    among the tree's positions, node ``i`` itself and its ancestors
    (:meth:`~specdec.tree.DraftTree.ancestor_mask`).
    """
    n = tree.num_nodes
    allowed = torch.ones(n, past_len + n, dtype=torch.bool)
    allowed[:, past_len:] = tree.ancestor_mask()
    return allowed


def _check_accepted_path(tree: DraftTree, accepted_nodes: Sequence[int]) -> list[int]:
    """The accepted nodes as ints; ValueError unless they form a path down from the root's child."""
    nodes = [int(a) for a in accepted_nodes]
    parents = tree.parents.tolist()
    previous = 0
    for node in nodes:
        if not 0 < node < tree.num_nodes or parents[node] != previous:
            raise ValueError(
                f"accepted nodes {nodes} are not a path from the root (node {node} "
                f"{'is out of range' if not 0 < node < tree.num_nodes else f'has parent {parents[node]}, expected {previous}'})"
            )
        previous = node
    return nodes


@register("target", "hf")
class HFTarget(OneRowTarget):
    """A Hugging Face causal LM (LLaMA family and other decoder-only models,
    sliding-window ones included: Gemma 2/3, Mistral) as the target ``p``.

    Sliding-window models keep every position in the KV cache; each tree
    forward gives full layers the tree's mask and sliding layers the same
    mask restricted to the window (docs/models.md, "Sliding-window attention").

    Args:
        model: an HF ``*ForCausalLM`` (put it in eval mode on its device and
            dtype; any ``attn_implementation`` with 4D mask support: eager, sdpa).
        capture_layers: indices into the model's ``hidden_states`` tuple to
            capture at every forward, for feature-level drafts (EAGLE): ``i``
            is the input of decoder layer ``i`` (0 = embeddings), ``L`` (the
            number of layers) is the final normed hidden state. Negative
            indices count from the end (``-1`` = final).
        kv_compactor: the gather used to compact the KV cache (default
            :func:`~specdec.kernels.kv_compact.compact_kv_inplace`; a fused
            kernel with the signature of ``compact_kv_reference`` can replace it).
        logits_device: where :meth:`score_tree` returns logits (``"cpu"``
            by default, where specdec's verifiers work; None = the model's device).
        min_tree_tokens: a tree of ``2 <= n <`` this many nodes is scored
            padded to this many tokens (padding rows see only the cached
            context, no tree row sees them, and their outputs and cache
            entries are dropped). ``"auto"`` (default): 1 (no padding),
            except 4 for a model on the CPU with ``cpu_linear`` off, where 2-
            and 3-row matrix products take a slow path (measured on
            SmolLM2-135M, 2 threads: 2 / 3 / 4 / 5 tokens cost 87 / 107 / 77 /
            72 ms). One-token forwards (autoregressive decoding) are never padded.
        cpu_linear: install the tuned few-row linear dispatch
            (:func:`~specdec.kernels.linear.accelerate_linears`) on the
            model's linear layers, in place: ``"auto"`` (default) = when the
            model is on the CPU. The same products, each row count taking the
            layout measured fastest on this machine (on SmolLM2-135M, 2
            threads: a 1-token forward 55 -> 35 ms, 5 tokens 85 -> 39 ms).
            Only float32 layers of at least 65,536 weights change; training
            and autograd keep ``F.linear``. The plans are in ``linear_plans``.
            Tuned once per machine and cached (about 13 s for SmolLM2-135M on
            a quiet 2-core CPU, with progress lines on stderr; docs/kernels.md).
        linear_rows: the row counts (tokens per forward) to tune the dispatch
            for; None: the scope's
            (:func:`~specdec.kernels.tuning_scope.tuning_rows`), by default a
            one-row run's (1-16 and 24-64: trees of up to 64 nodes + the root,
            one-token decoding). Other counts take the method of the largest
            tuned count below them.

    Logits are returned in float32 (float64 for a float64 model).

    Example:
        >>> import torch, transformers
        >>> from specdec.tree import DraftTree
        >>> cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> target = HFTarget(transformers.LlamaForCausalLM(cfg).eval())
        >>> target.prefill([1, 2, 3])
        >>> tree = DraftTree.chain(3, [], [], vocab_size=11)  # just the root
        >>> target.score_tree(tree).shape
        torch.Size([1, 11])
        >>> target.accept([], bonus_token=5); target.committed_tokens
        (1, 2, 3, 5)
    """

    supports_batch = True
    rescores_trees: ClassVar[bool] = True
    """:meth:`score_tree` / :meth:`score_batch` may be called again before :meth:`accept`: the previous tree is discarded
    (a timing loop prefills once: :func:`specdec.bench.forward_timing.time_tree_forwards`)."""

    def __init__(
        self,
        model: Any,
        *,
        capture_layers: Sequence[int] = (),
        kv_compactor: KVCompactor = compact_kv_inplace,
        logits_device: str | torch.device | None = "cpu",
        min_tree_tokens: int | str = "auto",
        cpu_linear: bool | str = "auto",
        linear_rows: Sequence[int] | None = None,
    ) -> None:
        check_attention(model, "HFTarget")  # the tree's 4D mask must be honoured (docs/models.md)
        check_eval_mode(model, "HFTarget")
        self.sliding_window = sliding_window(model)  # validated before any forward (docs/models.md, "Sliding-window attention")
        self.model = model
        device = next(model.parameters()).device
        self.linear_plans: dict[tuple[int, int], LinearPlan] = {}
        if resolve_cpu_linear(cpu_linear, device):
            self.linear_plans = accelerate_linears(model, rows=linear_rows)
        if min_tree_tokens == "auto":
            min_tree_tokens = 4 if device.type == "cpu" and not self.linear_plans else 1
        if not isinstance(min_tree_tokens, int) or isinstance(min_tree_tokens, bool) or min_tree_tokens < 1:
            raise ValueError(f"min_tree_tokens must be 'auto' or an int >= 1, got {min_tree_tokens!r}")
        self.min_tree_tokens = min_tree_tokens
        self._vocab_size = model_vocab_size(model)
        self._max_length = model_max_length(model)
        num_states = int(text_config(model.config).num_hidden_layers) + 1
        layers = []
        for i in capture_layers:
            if not -num_states <= int(i) < num_states:
                raise ValueError(f"capture_layers: {i} outside the {num_states} hidden states of this model")
            layers.append(int(i) % num_states)
        self.capture_layers: tuple[int, ...] = tuple(layers)
        self.kv_compactor = kv_compactor
        self.logits_device = logits_device
        self._cache: KVCache | None = None
        self._reserved = 0
        self._committed: list[int] = []
        self._tree: DraftTree | TreeBatch | None = None  # the scored tree (a TreeBatch on the step path)
        self._hidden: torch.Tensor | None = None
        # batch mode (prefill_batch): per row, the committed tokens and the cached positions
        self._rows: list[list[int]] | None = None
        self._row_cached: list[int] = []  # host copy of the cached positions per row
        self._row_cached_dev: torch.Tensor | None = None  # [B] the same, on the model's device

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa", **kwargs: Any) -> "HFTarget":
        """Load a local HF model folder (no download) and wrap it.

        ``kwargs`` go to :class:`HFTarget`.
        """
        with needs_extra("hf", "HFTarget.from_pretrained"):
            from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(name_or_path, attn_implementation=attn_implementation, local_files_only=True)
        # transformers wraps PreTrainedModel.to with functools.wraps: mypy sees an unbound _Wrapped (stub gap)
        return cls(model.to(dtype).eval(), **kwargs)  # type: ignore[arg-type]

    # ----------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_length(self) -> int | None:
        return self._max_length

    @property
    def committed_tokens(self) -> tuple[int, ...]:
        """The committed context (prompt + emitted tokens); its last token is the next root."""
        return tuple(self._committed)

    @property
    def cache_length(self) -> int:
        """Positions currently in the KV cache."""
        return 0 if self._cache is None else len(self._cache)

    # ------------------------------------------------------------ lifecycle
    def reserve(self, positions: int) -> None:
        """Size the preallocated KV cache for ``positions`` positions at the
        next :meth:`prefill` (capped at the model's context)."""
        cap = int(positions) if self._max_length is None else min(int(positions), self._max_length)
        self._reserved = max(cap, 0)

    def prefill(self, prompt_ids: Sequence[int]) -> None:
        """Cache every prompt token but the last (a 1-token prompt caches nothing).

        With ``capture_layers``, :meth:`hidden_states` then returns the
        features of those ``len(prompt) - 1`` tokens.

        Raises:
            ValueError: empty prompt or token ids outside the vocabulary.
            ContextOverflowError: prompt longer than the model's context.
        """
        tokens = check_prompt(prompt_ids, self._vocab_size, self._max_length)
        if self._cache is not None and self._cache.preallocated and self._rows is None:  # reuse the one-row slabs
            self._cache.truncate(0)
            self._cache.reserve(max(self._reserved, len(tokens)))
        else:
            self._cache = KVCache(self.model, capacity=max(self._reserved, len(tokens)))
        self._rows = None
        self._tree = None
        self._hidden = None
        self._committed = tokens
        head = tokens[:-1]
        if head:
            _, self._hidden = forward_tokens(
                self.model, self._cache, head, list(range(len(head))), None, logits="none", hidden_layers=self.capture_layers
            )
        elif self.capture_layers:
            self._hidden = self._empty_hidden()

    def score_tree(self, tree: DraftTree) -> torch.Tensor:
        """``[n, V]`` logits after each node of ``tree``, from one forward.

        Scoring again before :meth:`accept` discards the previous tree.

        Raises:
            RuntimeError: before :meth:`prefill`.
            VocabMismatchError: ``tree.vocab_size`` differs from the model's.
            ValueError: the root is not the last committed token.
            ContextOverflowError: the deepest node's position is beyond the context.
        """
        if self._cache is None:
            raise RuntimeError("score_tree() called before prefill()")
        if tree.vocab_size != self._vocab_size:
            raise VocabMismatchError(f"tree over V = {tree.vocab_size}, target model has V = {self._vocab_size}")
        if int(tree.tokens[0]) != self._committed[-1]:
            raise ValueError(
                f"the tree's root token {int(tree.tokens[0])} is not the last committed token {self._committed[-1]}"
            )
        past = len(self._committed) - 1
        if self._tree is not None or len(self._cache) != past:  # re-scoring, or a failed forward
            self._cache.truncate(past)
            self._tree = None
        depths = tree.depths
        check_context(past + int(depths.max()), self._max_length, "the draft tree")
        n = tree.num_nodes
        tokens, positions, allowed = tree.tokens.tolist(), depths + past, tree_allowed(tree, past)
        pad = self.min_tree_tokens - n if 1 < n < self.min_tree_tokens else 0
        if pad:  # faster than the 2-3 row path on CPU; the padding rows are invisible and dropped
            tokens += [tokens[0]] * pad
            positions = torch.cat([positions, positions[:1].expand(pad)])
            padded = torch.zeros(n + pad, past + n + pad, dtype=torch.bool)
            padded[:n, : past + n] = allowed
            padded[n:, :past] = True
            padded[n:, past + n :] = torch.eye(pad, dtype=torch.bool)
            allowed = padded
        logits, self._hidden = forward_tokens(
            self.model,
            self._cache,
            tokens,
            positions,
            allowed,
            logits="all",
            hidden_layers=self.capture_layers,
        )
        assert logits is not None
        if pad:
            logits = logits[:n]
            if self._hidden is not None:
                self._hidden = self._hidden[:n]
        self._tree = tree
        if logits.dtype != torch.float64:
            logits = logits.float()
        return logits if self.logits_device is None else logits.to(self.logits_device)

    def score_batch(self, tree: TreeBatch) -> torch.Tensor:
        """``[1, n, V]`` logits after every node slot of a one-tree batch, from
        one forward, with no host read: tokens, ``positions = past + depth``
        and the attention pattern (cached context + the ancestor mask; a
        padding slot sees the context and itself) are built on the device.
        The caller has bounded the depth against the context
        (:class:`~specdec.generate.SpeculativeGenerator` checks
        ``prompt + max_new_tokens - 1 + max_depth`` before the first forward).
        Logits stay on the device (``logits_device`` is not applied): the
        model's, or for a model split over devices (``device_map``), the
        tree's, where the verifier works.
        """
        if self._cache is None:
            raise RuntimeError("score_batch() called before prefill()")
        if self._rows is not None:
            return self._score_rows(tree)
        if tree.batch_size != 1:
            raise ValueError(
                f"a batch of {tree.batch_size} trees after prefill() of one prompt; use prefill_batch() for several rows"
            )
        if tree.vocab_size != self._vocab_size:
            raise VocabMismatchError(f"tree over V = {tree.vocab_size}, target model has V = {self._vocab_size}")
        past = len(self._committed) - 1
        if self._tree is not None or len(self._cache) != past:  # re-scoring, or a failed forward
            self._cache.truncate(past)
            self._tree = None
        n = tree.node_slots
        device = next(self.model.parameters()).device
        allowed = torch.ones(n, past + n, dtype=torch.bool, device=device)  # [n, past + n]
        allowed[:, past:] = tree.ancestors[0]
        with model_call():
            logits, self._hidden = forward_tokens(
                self.model, self._cache, tree.tokens[0], tree.depths[0] + past, allowed,
                logits="all", hidden_layers=self.capture_layers,
            )
        assert logits is not None
        self._tree = tree
        if logits.device != tree.device:  # a model split over devices: the verifier works beside the tree
            logits = logits.to(tree.device)
        return (logits if logits.dtype == torch.float64 else logits.float()).unsqueeze(0)

    def accept(
        self,
        accepted_nodes: Sequence[int],
        bonus_token: int,
        path_tokens: Sequence[int] | None = None,
        device_path: torch.Tensor | None = None,
    ) -> None:
        """Compact the cache to past + root + ``accepted_nodes``; ``bonus_token`` becomes the next root.

        Args:
            accepted_nodes: the accepted path below the root, top-down
                (node ids of the last scored tree; root excluded; may be empty).
            bonus_token: the token the verifier drew from the target.
            path_tokens: the accepted nodes' tokens, when the caller has them
                (the step path's read), so that none is read back.
            device_path: the accepted nodes as a device tensor (the step path):
                the compaction index is then built on the device.

        Raises:
            RuntimeError: no tree was scored since the last accept.
            ValueError: ``accepted_nodes`` is not a path from the root, or the
                bonus token is outside the vocabulary.
        """
        if self._tree is None or self._cache is None:
            raise RuntimeError("accept() called before score_tree()")
        tree = self._tree
        (bonus,) = check_tokens([bonus_token], self._vocab_size, "bonus_token")
        past = len(self._committed) - 1
        if isinstance(tree, TreeBatch):  # the step path: the verifier's read gave the path and its tokens
            nodes = [int(a) for a in accepted_nodes]
            if device_path is not None:  # the keep index built on the device: no host-to-device copy
                device = device_path.device
                keep = torch.cat([torch.arange(past + 1, device=device), device_path + past])
                moved = next((i for i, node in enumerate(nodes) if node != i + 1), len(nodes))
                self._cache.compact(keep, self.kv_compactor, first_moved=past + 1 + moved)
            else:
                self._cache.compact(kv_keep_index(past, [0, *nodes]), self.kv_compactor)
            tokens = list(path_tokens) if path_tokens is not None else tree.tokens[0, nodes].tolist()
        else:
            nodes = _check_accepted_path(tree, accepted_nodes)
            self._cache.compact(kv_keep_index(past, [0, *nodes]), self.kv_compactor)
            tokens = [int(tree.tokens[i]) for i in nodes]
        self._committed.extend(tokens)
        self._committed.append(bonus)
        self._tree = None

    # ------------------------------------------------------------ batch rows
    def prefill_batch(self, prompts: Sequence[Sequence[int]], *, positions: int | None = None) -> None:
        """Start ``B`` sequences at once (batch mode): row ``b`` caches every
        token of ``prompts[b]`` but the last, in one padded forward. One prompt
        is served by :meth:`prefill` (the one-row layout, no padding).

        In batch mode the KV cache is one slab per device of ``B`` rows, each
        with its own length: a tree forward writes row ``b``'s nodes right
        after its cached positions (:meth:`KVCache.write_rows`), attention
        spans the longest row and masks, per row, what lies beyond its own
        length; after verification each row compacts its own accepted path
        (:meth:`accept_rows`). Rows of different lengths cost the span of the
        longest. :meth:`hidden_states` is then ``[B, q, L, H]``.

        Raises:
            ValueError: no prompt, an empty prompt or token ids outside the vocabulary.
            ContextOverflowError: a prompt longer than the model's context.
        """
        if len(prompts) == 0:
            raise ValueError("prefill_batch needs at least one prompt")
        if positions is not None:  # sizing a cache is not inference: its buffers stay normal tensors
            with torch.inference_mode(False):
                self.reserve(positions)
        if len(prompts) == 1:  # one row: the one-row layout (prefill), the loop's B = 1
            self.prefill(prompts[0])
            return
        rows = [check_prompt(p, self._vocab_size, self._max_length) for p in prompts]
        B = len(rows)
        need = max(self._reserved, max(len(r) for r in rows))
        self._cache = KVCache(self.model, capacity=need)
        if not self._cache.preallocated:
            raise NotImplementedError("batch rows need the preallocated KV cache (transformers >= 4.56)")
        self._tree = None
        self._rows = rows
        self._row_cached = [len(r) - 1 for r in rows]
        device = next(self.model.parameters()).device
        self._row_cached_dev = torch.tensor(self._row_cached, dtype=torch.int64, device=device)  # once per batch
        span = max(self._row_cached)
        self._hidden = None
        if span == 0:
            if self.capture_layers:
                self._hidden = self._empty_hidden().unsqueeze(0).expand(B, -1, -1, -1)
            return
        ids = torch.zeros(B, span, dtype=torch.int64)
        for b, r in enumerate(rows):
            ids[b, : len(r) - 1] = torch.tensor(r[:-1], dtype=torch.int64)
        cols = torch.arange(span, device=device)
        valid = cols < self._row_cached_dev.unsqueeze(-1)  # [B, span]
        # causal among a row's own tokens; a padding position sees itself only (its output is dropped)
        allowed = (cols.unsqueeze(0) <= cols.unsqueeze(1)).unsqueeze(0) & valid.unsqueeze(1)  # [B, span, span]
        allowed = allowed | (torch.eye(span, dtype=torch.bool, device=device) & ~valid.unsqueeze(-1))
        token_positions = cols.expand(B, span)
        self._cache.write_rows(torch.zeros(B, dtype=torch.int64, device=device), span)
        try:
            _, self._hidden = forward_rows(
                self.model, self._cache, ids.to(device), token_positions, allowed, logits="none", hidden_layers=self.capture_layers
            )
        finally:
            self._cache.write_rows(None)

    @property
    def batch_size(self) -> int:
        """Rows in batch mode (:meth:`prefill_batch`), else 1."""
        return 1 if self._rows is None else len(self._rows)

    @property
    def committed_rows(self) -> tuple[tuple[int, ...], ...]:
        """Batch mode: each row's committed context (its last token is the row's next root)."""
        if self._rows is None:
            return (tuple(self._committed),)
        return tuple(tuple(r) for r in self._rows)

    def _score_rows(self, tree: TreeBatch) -> torch.Tensor:
        """``[B, n, V]`` logits of every row's tree, from one forward (batch mode)."""
        assert self._rows is not None and self._row_cached_dev is not None and self._cache is not None
        B, n = tree.tokens.shape
        if B != len(self._rows):
            raise ValueError(f"a batch of {B} trees for {len(self._rows)} rows")
        if tree.vocab_size != self._vocab_size:
            raise VocabMismatchError(f"tree over V = {tree.vocab_size}, target model has V = {self._vocab_size}")
        device = next(self.model.parameters()).device
        past = self._row_cached_dev  # [B] cached positions per row: the trees start there
        span = max(self._row_cached) + n
        cols = torch.arange(span, device=device)  # [K]
        rel = cols - past.unsqueeze(-1)  # [B, K] key position relative to the row's root
        in_tree = (rel >= 0) & (rel < n)
        anc = tree.ancestors.to(device).gather(2, rel.clamp(0, n - 1).unsqueeze(1).expand(B, n, span))  # [B, n, K]
        allowed = (rel < 0).unsqueeze(1) | (anc & in_tree.unsqueeze(1))  # [B, n, K]
        self._cache.write_rows(past, span)
        try:
            logits, self._hidden = forward_rows(
                self.model, self._cache, tree.tokens.to(device), past.unsqueeze(-1) + tree.depths.to(device), allowed,
                logits="all", hidden_layers=self.capture_layers,
            )
        finally:
            self._cache.write_rows(None)
        assert logits is not None
        self._tree = tree
        if logits.device != tree.device:
            logits = logits.to(tree.device)
        return logits if logits.dtype == torch.float64 else logits.float()

    def accept_rows(
        self,
        accepted: torch.Tensor,
        num_accepted: torch.Tensor,
        emitted: Sequence[Sequence[int]],
        *,
        nodes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Batch mode: row ``b`` keeps its root and its accepted path in the
        cache and appends ``emitted[b]`` (its accepted tokens and the bonus,
        read by the caller) to its context.

        Args:
            accepted: ``[B, D]`` int64 accepted node slots of each row, top-down, ``-1`` padded (device).
            num_accepted: ``[B]`` int64 the path lengths (device).
            emitted: per row, ``num_accepted[b] + 1`` tokens (host).
            nodes: per row, the accepted node slots (host); used outside batch mode, where
                the one row is served by :meth:`accept` with its device path.
        """
        if self._rows is None and self._tree is not None:  # the one-row layout
            if nodes is None or len(emitted) != 1:
                raise ValueError("accept_rows() of one row needs its accepted nodes (nodes=)")
            path = list(nodes[0])
            self.accept(path, emitted[0][-1], path_tokens=emitted[0][:-1], device_path=accepted[0, : len(path)])
            return
        if self._tree is None or self._rows is None or self._row_cached_dev is None or self._cache is None:
            raise RuntimeError("accept_rows() called before a batch of trees was scored")
        B, D = accepted.shape
        if len(emitted) != B:
            raise ValueError(f"{len(emitted)} rows of emitted tokens for a batch of {B}")
        for b, tokens in enumerate(emitted):
            check_tokens(tokens, self._vocab_size, f"row {b}'s emitted tokens")
        device = self._row_cached_dev.device
        past = self._row_cached_dev.unsqueeze(-1)  # [B, 1]
        j = torch.arange(D, device=device)
        dest = past + 1 + j  # [B, D]: the accepted nodes follow the root
        source = torch.where(j < num_accepted.to(device).unsqueeze(-1), past + accepted.to(device), dest)
        new_cached = [c + len(t) for c, t in zip(self._row_cached, emitted)]  # root + accepted path
        self._cache.move_rows(source, dest, max(new_cached))
        self._row_cached_dev = self._row_cached_dev + 1 + num_accepted.to(device)
        self._row_cached = new_cached
        for row, tokens in zip(self._rows, emitted):
            row.extend(int(t) for t in tokens)
        self._tree = None

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Batch mode: keep only the rows ``rows`` (finished rows leave the
        batch and cost nothing more); the kept rows are renumbered in order."""
        if self._rows is None or self._cache is None or self._row_cached_dev is None:
            raise RuntimeError("keep_rows() outside batch mode")
        keep = [int(r) for r in rows]
        if not keep or any(not 0 <= r < len(self._rows) for r in keep) or len(set(keep)) != len(keep):
            raise ValueError(f"keep_rows: {keep} is not a non-empty set of rows of a batch of {len(self._rows)}")
        index = torch.tensor(keep, dtype=torch.int64, device=self._row_cached_dev.device)
        self._cache.keep_rows(keep)  # host ints: kept rows move down in place, nothing else is copied
        self._rows = [self._rows[r] for r in keep]
        self._row_cached = [self._row_cached[r] for r in keep]
        self._row_cached_dev = self._row_cached_dev.index_select(0, index)
        if self._hidden is not None:
            self._hidden = self._hidden.index_select(0, index.to(self._hidden.device))
        self._tree = None

    @property
    def device(self) -> torch.device:
        """The device of the model's first parameter (where its logits are)."""
        return next(self.model.parameters()).device

    def hidden_rows(self) -> torch.Tensor | None:
        """``[B, n, L, H]`` the captured features per row (batch mode: :meth:`hidden_states`
        itself; one row: with a batch dimension); None without ``capture_layers``."""
        hidden = self.hidden_states()
        if hidden is None or self._rows is not None:
            return hidden
        return hidden.unsqueeze(0)

    def hidden_states(self) -> torch.Tensor | None:
        """``[n, len(capture_layers), H]`` features of the last forward's tokens
        (the last tree's ``n`` nodes; after :meth:`prefill`, the cached prompt
        tokens), on the model's device; None without ``capture_layers``."""
        if not self.capture_layers:
            return None
        return self._hidden

    def _empty_hidden(self) -> torch.Tensor:
        hidden = int(text_config(self.model.config).hidden_size)
        p = next(self.model.parameters())
        return torch.empty(0, len(self.capture_layers), hidden, dtype=p.dtype, device=p.device)
