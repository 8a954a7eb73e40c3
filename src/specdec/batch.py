"""Batched decoding: many prompts (*rows*) decoded together, one target forward per step (issue 15).

Rows keep their own state: their committed context in the target's batch
mode (:meth:`~specdec.targets.hf.HFTarget.prefill_batch`: one KV slab,
ragged per-row lengths), their own random stream (one seed per row) and their
own stops (EOS, length). A row that stops leaves the batch
(:meth:`~specdec.targets.hf.HFTarget.keep_rows`) and costs nothing more.

What is here: :func:`autoregressive_generate_batch` and
:func:`autoregressive_stream_batch`, the batched baseline (plain decoding,
every row a root-only tree per step, through the same tensor verification as
the speculative step). Each row draws from ``TorchRandom.seeded(seeds[b])``
exactly the uniforms its batch-1 decoding draws, so a row's tokens depend
only on its prompt, its seed and the model: at temperature 0 they equal its
batch-1 output token for token; at T > 0 wherever the model's logits are
equal across batch sizes up to rounding that no uniform falls within (tested
on float64 models, ``tests/test_batch.py``). :func:`speculative_stream_batch`
is the speculative form (``SpeculativeGenerator.generate_batch``), with the
same guarantees; each step of either makes one host read and builds nothing
on the host for the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch

from specdec.errors import InvalidConfigError, InvalidDistributionError
from specdec.inputs import as_eos_ids, as_seed, as_token_ids
from specdec.lease import hold
from specdec.rng import CounterRandom, RowStreams, TorchRandom
from specdec.sampling import SamplingConfig, process_logits, row_is_bad
from specdec.tree import NodeKind
from specdec.tree_batch import TreeBatch
from specdec import step as _step
from specdec.verify.fast import decide_from_logits

__all__ = [
    "BatchOutput",
    "autoregressive_generate_batch",
    "autoregressive_stream_batch",
    "batch_kernel",
    "collect_batch",
    "speculative_stream_batch",
]


@attrs.frozen
class BatchOutput:
    """Result of a batched generation.

    Attributes:
        tokens: per row (in the order of the prompts), the new tokens.
        stop_reasons: per row, ``"eos"`` or ``"length"``.
        steps: target forwards (one per step for all the rows still running).
        time_total: seconds, prefill included.
        row_steps: steps summed over the rows (a row counts each step it ran).
        tau: tokens emitted per row-step (accepted drafts + the bonus); 1 for plain decoding.
        steps_by_row: per row, the steps it ran.
        emitted_by_row: per row, the tokens the verifier emitted (before EOS / length truncation).
    """

    tokens: tuple[tuple[int, ...], ...]
    stop_reasons: tuple[str, ...]
    steps: int
    time_total: float
    row_steps: int = 0
    tau: float = 1.0
    steps_by_row: tuple[int, ...] = ()
    emitted_by_row: tuple[int, ...] = ()

    @property
    def new_tokens(self) -> int:
        """New tokens summed over the rows."""
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        """Throughput: new tokens summed over the rows per second of total time."""
        return self.new_tokens / self.time_total if self.time_total > 0 else 0.0


def grows_batches(builder: Any, sampling: SamplingConfig | None = None) -> bool:
    """Whether ``builder`` grows ``B`` trees at once from a draft in rows mode:
    the level-wise dynamic builders (eagle, rheo) without per-node hooks, and
    the shaped builders (chain, static, sequoia) that keep :func:`~specdec.trees.static.grow_static`."""
    from specdec.trees.dynamic import DynamicTreeBuilder
    from specdec.trees.static import ShapedTreeBuilder

    if isinstance(builder, DynamicTreeBuilder):
        return builder._level_fn_if_exact(sampling or SamplingConfig()) is not None
    if isinstance(builder, ShapedTreeBuilder):
        cls = type(builder)
        return cls.build is ShapedTreeBuilder.build and cls.build_batch is ShapedTreeBuilder.build_batch
    return False


def check_prompts(prompts: Any) -> None:
    """``prompts`` must be a non-empty sequence (of token-id sequences, checked row by row later)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise InvalidConfigError(
            f"prompts must be a non-empty list of token-id sequences, got {type(prompts).__name__} {prompts!r:.60}"
        )


def _check_rows(
    target: Any, prompts: Sequence[Sequence[int]], seeds: Sequence[int] | None, eos_token_id: Any, max_new_tokens: int
) -> tuple[list[list[int]], list[int], set[int]]:
    if not callable(getattr(target, "prefill_batch", None)):
        raise InvalidConfigError(
            f"{type(target).__name__} has no batch mode (prefill_batch / accept_rows / keep_rows): use HFTarget"
        )
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
        raise InvalidConfigError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    check_prompts(prompts)
    rows = []
    for b, prompt in enumerate(prompts):
        row = as_token_ids(prompt, f"prompt {b}")
        if not row:
            raise InvalidConfigError(f"prompt {b} must be a non-empty sequence of token ids")
        rows.append(row)
    if seeds is None:
        seeds = list(range(len(rows)))
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise InvalidConfigError(f"seeds must be a sequence of {len(rows)} ints, one per prompt, got {seeds!r}")
    seeds = list(seeds)
    if len(seeds) != len(rows):
        raise InvalidConfigError(f"seeds must be {len(rows)} ints, one per prompt, got {len(seeds)}: {seeds!r}")
    seeds = [as_seed(s, f"seeds[{b}]") for b, s in enumerate(seeds)]
    if any(s is None for s in seeds):
        raise InvalidConfigError(f"seeds must be ints (a row's tokens depend only on its seed), got {seeds!r}")
    eos = as_eos_ids(eos_token_id)
    return rows, seeds, eos


def autoregressive_stream_batch(
    target: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    seeds: Sequence[int] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    _stats: dict[str, Any] | None = None,
) -> Iterator[dict[int, list[int]]]:
    """Plain decoding of every prompt at once; yields ``{row: new tokens}``
    after each step for the rows that produced one (``row`` = index into
    ``prompts``). See the module docstring for the per-row guarantees.

    Args:
        target: an :class:`~specdec.targets.hf.HFTarget` (batch mode).
        prompts: ``B`` non-empty sequences of token ids (lists or 1-D tensors), of any lengths.
        max_new_tokens: per row.
        sampling: shared by the rows (default: temperature 1).
        seeds: one int per row (default ``0 .. B - 1``).
        eos_token_id: an id or ids that stop a row (kept as its last token).

    Raises:
        InvalidConfigError: bad prompts, seeds, ``eos_token_id`` or a target without batch mode.
        InvalidDistributionError: a row's target logits are NaN, +inf or all -inf.
    """
    from specdec.registry import get

    sampling = (SamplingConfig() if sampling is None else sampling)
    if not isinstance(sampling, SamplingConfig):
        raise InvalidConfigError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    rows, seeds, eos = _check_rows(target, prompts, seeds, eos_token_id, max_new_tokens)
    vocab = target.vocab_size
    rule = get("verifier", "match").__dict__["fused"]  # rule 2 with no children: the bonus is drawn from p
    rngs = [TorchRandom.seeded(s) for s in seeds]
    stats = _stats if _stats is not None else {}
    stats.update(steps=0, row_steps=0, stop_reasons=["length"] * len(rows), steps_by_row=[0] * len(rows),
                 emitted_by_row=[0] * len(rows))
    _check_context(target, rows, max_new_tokens, 0)
    with hold("autoregressive_generate_batch", target=target):  # one generation per model at a time (specdec.lease)
        target.reserve(max(len(r) for r in rows) + max_new_tokens + 1)
        with torch.inference_mode():
            target.prefill_batch(rows)
        active = list(range(len(rows)))  # the original row of each batch row
        roots = torch.tensor([r[-1] for r in rows], dtype=torch.int64, device=_device(target))  # [B], once
        produced = [0] * len(rows)
        while active:
            with torch.inference_mode():
                tree = _root_batch(roots, vocab)  # every row a root-only tree, built on the device
                logits = target.score_batch(tree)  # [B, 1, V]
                u = torch.cat([rngs[r].verify_uniforms((1, tree.node_slots, tree.max_children + 1), device=logits.device)
                               for r in active])  # [B, 1, C + 1]: each row from its own stream
                decision = decide_from_logits(rule, tree, logits, u, sampling, rows=_step._ROWS)
                read = torch.stack([decision.bonus, decision.bad_visited.long()], dim=-1).tolist()  # the step's one read, [B, 2]
            stats["steps"] += 1
            stats["row_steps"] += len(active)
            for r in active:
                stats["steps_by_row"][r] += 1
            if any(flag for _, flag in read):
                row = active[next(b for b, (_, flag) in enumerate(read) if flag)]
                raise InvalidDistributionError(f"row {row}: the target's logits contain NaN or +inf, or are all -inf")
            chunk: dict[int, list[int]] = {}
            keep: list[int] = []
            for b, r in enumerate(active):
                token = int(read[b][0])
                chunk[r] = [token]
                stats["emitted_by_row"][r] += 1
                produced[r] += 1
                if token in eos:
                    stats["stop_reasons"][r] = "eos"
                elif produced[r] < max_new_tokens:
                    keep.append(b)
            yield chunk
            if not keep:
                return
            with torch.inference_mode():
                target.accept_rows(decision.accepted, decision.num_accepted, [chunk[r] for r in active])
                roots = decision.bonus  # [B] the next roots, on the device
                if len(keep) < len(active):
                    target.keep_rows(keep)
                    roots = roots.index_select(0, torch.tensor(keep, dtype=torch.int64, device=roots.device))
            active = [active[b] for b in keep]


def autoregressive_generate_batch(
    target: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    seeds: Sequence[int] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> BatchOutput:
    """:func:`autoregressive_stream_batch`, collected: the batched baseline.

    Example:
        >>> import torch, transformers
        >>> from specdec.targets.hf import HFTarget
        >>> cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16,
        ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> target = HFTarget(transformers.LlamaForCausalLM(cfg).eval())
        >>> out = autoregressive_generate_batch(target, [[1, 2, 3], [4]], 5, SamplingConfig(temperature=0.0))
        >>> [len(t) for t in out.tokens], out.stop_reasons
        ([5, 5], ('length', 'length'))
    """
    check_prompts(prompts)
    return collect_batch(
        lambda stats: autoregressive_stream_batch(target, prompts, max_new_tokens, sampling, seeds, eos_token_id,
                                                  _stats=stats),
        len(prompts),
    )


def collect_batch(run: Callable[[dict[str, Any]], Iterator[dict[int, list[int]]]], num_rows: int) -> BatchOutput:
    """Run a batched stream (``run(stats)`` yields ``{row: new tokens}`` and fills ``stats``) to its
    end and collect a :class:`BatchOutput`, timed from the first call."""
    start = time.perf_counter()
    stats: dict[str, Any] = {}
    tokens: list[list[int]] = [[] for _ in range(num_rows)]
    for chunk in run(stats):
        for r, new in chunk.items():
            tokens[r].extend(new)
    row_steps = stats["row_steps"]
    return BatchOutput(
        tokens=tuple(tuple(t) for t in tokens), stop_reasons=tuple(stats["stop_reasons"]), steps=stats["steps"],
        time_total=time.perf_counter() - start, row_steps=row_steps,
        tau=stats["tau_sum"] / row_steps if "tau_sum" in stats and row_steps else 1.0,
        steps_by_row=tuple(stats["steps_by_row"]), emitted_by_row=tuple(stats["emitted_by_row"]),
    )


def speculative_stream_batch(
    target: Any,
    draft: Any,
    builder: Any,
    verifier: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingConfig,
    seeds: Sequence[int] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    *,
    kernel: str = "auto",
    random: str = "torch",
    _stats: dict[str, Any] | None = None,
) -> Iterator[dict[int, list[int]]]:
    """Speculative decoding of every prompt at once; yields ``{row: new
    tokens}`` after each step (the body of
    :meth:`~specdec.generate.SpeculativeGenerator.stream_batch`).

    One step for all running rows: the draft (rows mode) grows every row's
    tree with the level-wise builder in one set of tensor ops per level, the
    target scores all trees in one forward, the verifier's parallel rule
    decides every node of every tree, and one read brings back every row's
    accepted path and bonus. Row ``b`` draws from ``TorchRandom.seeded(seeds[b])``
    (:class:`~specdec.rng.RowStreams`) exactly what its batch-1 generation
    draws, so its tokens equal its batch-1 output wherever the models' logits
    agree across batch sizes (at T = 0, token for token).

    Needs: a target with a batch mode (``HFTarget``, ``CallableLM``), a draft
    with a rows mode (:meth:`~specdec.drafts.eagle.EagleDraft.begin_rows`: the
    EAGLE heads; :meth:`~specdec.drafts.hf.HFDraft.begin_rows`; ``CallableLM``),
    a builder that grows batches (:func:`grows_batches`: every built-in one)
    and a verifier with a parallel rule; anything else raises
    :class:`~specdec.errors.InvalidConfigError`.

    ``random="counter"`` draws row ``b``'s builder and verifier uniforms from
    ``CounterRandom.seeded(seeds[b])`` (for all rows in one set of Philox ops).
    ``kernel`` (:func:`batch_kernel`) chooses the verification: the tensor
    rule in torch, or the fused Triton kernel run ONCE for all rows
    (:func:`~specdec.kernels.verify_fused.fused_verify_batch`), each row
    drawing from its own counter stream keyed by its seed (with
    ``random="torch"`` the builder keeps the TorchRandom rows and the kernel
    draws from ``CounterRandom.seeded(seeds[b])``, as batch-1
    ``kernel="triton"`` does). Either way row ``b`` emits what its batch-1
    generation with the same ``kernel``, ``random`` and seed emits.
    """
    from specdec.step import _takes, step_supported

    if not isinstance(sampling, SamplingConfig):
        raise InvalidConfigError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    rows, seeds, eos = _check_rows(target, prompts, seeds, eos_token_id, max_new_tokens)
    verifier.check_sampling(sampling)  # temperature-dependent compatibility, before any forward
    if not callable(getattr(draft, "begin_rows", None)):
        raise InvalidConfigError(
            f"batched speculative generation needs a draft with a rows mode (the EAGLE heads, HFDraft, CallableLM); "
            f"{type(draft).__name__} has none yet"
        )
    if not grows_batches(builder, sampling):
        raise InvalidConfigError(
            f"batched speculative generation runs the tree builders that grow B trees in one set of tensor ops "
            f"(the level-wise eagle and rheo, the shaped chain, static and sequoia); "
            f"{type(builder).__name__} is not one (or has per-node hooks overridden)"
        )
    if random not in ("torch", "counter"):
        raise InvalidConfigError(f"random must be 'torch' or 'counter', got {random!r}")
    rng = RowStreams([(TorchRandom if random == "torch" else CounterRandom).seeded(s) for s in seeds])
    if not step_supported(verifier, rng):
        raise InvalidConfigError(f"verifier {verifier.registry_name!r} has no parallel rule; batched verification needs one")
    rule = type(verifier).__dict__["fused"]
    use_kernel = batch_kernel(kernel, verifier, target)
    # the kernel's streams: the rows' own counter streams, or (random="torch") one per row seeded as batch-1 does
    verify_rng = rng if random == "counter" else RowStreams([CounterRandom.seeded(s) for s in seeds])
    fuse_logits = not sampling.greedy and sampling.top_p >= 1.0  # softmax + top-k in the kernel (as StepVerifier)
    stats = _stats if _stats is not None else {}
    stats.update(steps=0, row_steps=0, stop_reasons=["length"] * len(rows), tau_sum=0.0,
                 steps_by_row=[0] * len(rows), emitted_by_row=[0] * len(rows))
    bound = max(len(r) for r in rows) + max_new_tokens + builder.max_nodes + builder.max_depth
    _check_context(target, rows, max_new_tokens, builder.max_depth)
    with hold("SpeculativeGenerator.generate_batch", target=target, draft=draft):  # one generation per model at a time (specdec.lease)
        target.reserve(bound)
        draft.reserve(bound)
        with torch.inference_mode():
            target.prefill_batch(rows)
            draft.begin_rows(rows, target.hidden_states() if draft.needs_target_hidden else None)
        active = list(range(len(rows)))
        produced = [0] * len(rows)
        roots = torch.tensor([r[-1] for r in rows], dtype=torch.int64, device=_device(target))  # [B], once
        first = True
        while active:
            with torch.inference_mode():
                tree = builder.build_batch(roots, draft, sampling, rng)  # B trees, one set of tensor ops per level
                logits = target.score_batch(tree)  # [B, n, V], one forward
                if first:
                    verifier.check_batch(tree)
                    first = False
                if use_kernel:  # one launch for every row's nodes
                    from specdec.kernels.verify_fused import fused_verify_batch

                    x = logits if fuse_logits else process_logits(logits, sampling, check=False)
                    decision = fused_verify_batch(verifier, tree, x, verify_rng, inputs="logits" if fuse_logits else "probs",
                                                  sampling=sampling, bad_rows=row_is_bad(logits))
                else:
                    u = rng.verify_uniforms((tree.batch_size, tree.node_slots, tree.max_children + 1), device=logits.device)
                    decision = decide_from_logits(rule, tree, logits, u, sampling, rows=_step._ROWS)
                draft_bad = tree.draft_bad if tree.draft_bad is not None else torch.zeros_like(decision.bad_visited)
                read = torch.cat([decision.packed(), draft_bad.long().unsqueeze(-1)], dim=-1).tolist()  # the one read
            stats["steps"] += 1
            stats["row_steps"] += len(active)
            for r in active:
                stats["steps_by_row"][r] += 1
            D = tree.max_depth
            chunk: dict[int, list[int]] = {}
            emitted: list[list[int]] = []
            keep: list[int] = []
            for b, r in enumerate(active):
                num, _bonus, _attempted, bad_visited, stop = read[b][:5]
                if read[b][-1]:
                    raise InvalidDistributionError(f"row {r}: the draft's logits contain NaN or +inf, or a row is all -inf")
                if bad_visited:
                    raise InvalidDistributionError(
                        f"row {r}: the target's logits at a node the verifier visited (the path ending at node {stop}) "
                        "contain NaN or +inf, or are all -inf"
                    )
                tokens = [int(t) for t in read[b][5 + D : 5 + D + num + 1]]
                emitted.append(tokens)
                stats["tau_sum"] += len(tokens)
                stats["emitted_by_row"][r] += len(tokens)
                kept = tokens[: max_new_tokens - produced[r]]
                for i, tok in enumerate(kept):
                    if tok in eos:
                        kept = kept[: i + 1]
                        stats["stop_reasons"][r] = "eos"
                        break
                produced[r] += len(kept)
                chunk[r] = kept
                if stats["stop_reasons"][r] != "eos" and produced[r] < max_new_tokens:
                    keep.append(b)
            yield chunk
            if not keep:
                return
            with torch.inference_mode():
                target.accept_rows(decision.accepted, decision.num_accepted, emitted)
                feats = None
                if draft.needs_target_hidden:  # [B, D + 1, L, H]: the target's features at the root and the accepted nodes
                    hidden = target.hidden_states()  # [B, n, L, H]
                    path = torch.cat([decision.accepted.new_zeros(len(active), 1), decision.accepted.clamp_min(0)], dim=1)
                    feats = hidden.gather(1, path.to(hidden.device)[..., None, None].expand(-1, -1, *hidden.shape[2:]))
                if _takes(type(draft).commit_rows, "device_tokens"):  # the emitted tokens as the verifier left them
                    draft.commit_rows(emitted, feats, device_tokens=decision.tokens, device_counts=decision.num_accepted + 1)
                else:
                    draft.commit_rows(emitted, feats)
                roots = decision.tokens.gather(1, decision.num_accepted.unsqueeze(-1)).squeeze(-1)  # [B] the bonus tokens
                if len(keep) < len(active):
                    index = torch.tensor(keep, dtype=torch.int64, device=roots.device)
                    target.keep_rows(keep)
                    if draft is not target:  # one object in both roles keeps both roles' rows in one call
                        draft.keep_rows(keep)
                    rng.keep(keep, index)
                    if verify_rng is not rng:
                        verify_rng.keep(keep, index)
                    roots = roots.index_select(0, index)
            active = [active[b] for b in keep]


def batch_kernel(kernel: str, verifier: Any, target: Any) -> bool:
    """Whether a batched step verifies with the fused Triton kernel (one launch
    for all rows) rather than the tensor rule in torch, checked before any forward.

    ``"torch"``: never. ``"auto"``: when Triton is installed, the target is on
    CUDA and the verifier is fused (as batch-1 generation decides).
    ``"triton"``: always, or :class:`~specdec.errors.InvalidConfigError` where
    it cannot run (no Triton, a verifier without a fused kernel, a CPU target
    without ``TRITON_INTERPRET=1``).
    """
    from specdec.kernels.select import interpreter_enabled, triton_available
    from specdec.kernels.verify_fused import KERNEL_CHOICES, fused_rule

    if kernel not in KERNEL_CHOICES:
        raise InvalidConfigError(f"kernel must be one of {', '.join(KERNEL_CHOICES)}, got {kernel!r}")
    if kernel == "torch":
        return False
    on_cuda = _device(target).type == "cuda"
    if kernel == "auto":
        return on_cuda and triton_available() and fused_rule(verifier) is not None
    if fused_rule(verifier) is None:
        raise InvalidConfigError(
            f"kernel='triton': verifier {getattr(verifier, 'registry_name', '?')!r} has no fused kernel "
            "(fused: match, rejection-iid, rejection-wor, mixed)"
        )
    if not triton_available():
        raise InvalidConfigError("kernel='triton' needs Triton: pip install 'specdec-trees[kernels]' (triton>=3.0)")
    if not (on_cuda or interpreter_enabled()):
        raise InvalidConfigError(
            f"kernel='triton' needs the target on a CUDA device (got {_device(target)}); "
            "set TRITON_INTERPRET=1 to run the kernel on CPU tensors (slow, for tests)"
        )
    return True


def _check_context(target: Any, rows: list[list[int]], max_new_tokens: int, depth: int) -> None:
    """Before any forward: the last step of every row (its prompt, its new tokens but the last, and
    the deepest tree node) must fit the target's context; the row that does not is named."""
    limit = getattr(target, "max_length", None)
    if limit is None:
        return
    for b, r in enumerate(rows):
        if len(r) + max_new_tokens - 1 + depth >= limit:
            raise InvalidConfigError(
                f"row {b}: {len(r)} prompt tokens + {max_new_tokens} new tokens"
                + (f" + a tree of depth {depth}" if depth else "")
                + f" exceed the target's context of {limit} positions"
            )


def _root_batch(roots: torch.Tensor, vocab: int) -> TreeBatch:
    """``B`` root-only trees (``roots [B]``), made on the roots' device: the same batch as
    ``TreeBatch.from_trees`` of root-only trees (``max_children`` 1, ``max_depth`` 0), with no host work."""
    B, dev = roots.shape[0], roots.device
    zeros = torch.zeros(B, 1, dtype=torch.int64, device=dev)  # [B, 1]
    return TreeBatch(
        tokens=roots.reshape(B, 1), parents=zeros - 1, depths=zeros, kinds=torch.full_like(zeros, int(NodeKind.ROOT)),
        draw_order=zeros, weights=torch.ones(B, 1, dtype=torch.float64, device=dev),
        num_nodes=torch.ones(B, dtype=torch.int64, device=dev),
        law_ids=torch.empty(B, 1, 0, dtype=torch.int64, device=dev),
        law_probs=torch.empty(B, 1, 0, dtype=torch.float64, device=dev),
        law_wor=torch.zeros(B, 1, dtype=torch.bool, device=dev), ancestors=torch.ones(B, 1, 1, dtype=torch.bool, device=dev),
        vocab_size=vocab, max_children=1, max_depth=0, max_sampled=0,
    )


def _device(target: Any) -> torch.device:
    model = getattr(target, "model", None)
    return next(model.parameters()).device if model is not None else torch.device("cpu")
