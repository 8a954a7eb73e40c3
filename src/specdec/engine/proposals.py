"""Verify an engine's own proposals, in the engine's layouts (docs/serving.md, "Verifying an engine's own proposals").

An engine that drafts with its own proposer hands specdec what the proposer made, in its own
layout, and gets the decision back in its own output layout:

- :class:`ChainProposals`: vLLM v1's flat ragged chains (``draft_token_ids [T]``,
  ``cu_num_draft_tokens [B]``, target logits ``[T + B, V]``: each request's draft positions, then
  its bonus position); :func:`verify_chain_proposals` returns ``output_token_ids
  [B, max_spec_len + 1]`` padded with ``-1``;
- :class:`TreeProposals`: SGLang's trees as retrieve arrays (``retrieve_index``,
  ``retrieve_next_token``, ``retrieve_next_sibling`` ``[B, n]``, the inverse of
  :func:`~specdec.engine.layouts.retrieve_arrays`); :func:`verify_tree_proposals` returns
  ``accept_index [B, D + 1]`` and ``accept_length [B]``.

The draft law of each proposal is :class:`DraftLaws` (dense ``[N, V]`` or sparse ``[N, k]`` ids
and probabilities) or None: deterministic children (a greedy or top-k drafter). The proposals are
converted to a :class:`~specdec.tree_batch.TreeBatch` on the device with tensor ops (no host read)
and decided by :func:`~specdec.engine.serving.verify_for_engine`, the one executor; the outputs
also carry the KV keep indices (:func:`~specdec.engine.layouts.kv_compaction`) and the per-row
flags of :class:`~specdec.engine.serving.EngineVerification`.

Which rules serve which proposals is read from each verifier's declarations
(:attr:`~specdec.verify.base.Verifier.supported_kinds`, ``supported_modes``, ``fused``):
:func:`check_rule` refuses, naming the rule, one that needs more than was given (deterministic
children to a rule that takes sampled ones only; children drawn without replacement to a rule for
i.i.d. draws; several sampled siblings whose draws' order is unknown to a rule that tests them in
that order) before any work; :func:`serving_rules` lists the registered rules that fit.

Inputs are checked on the device (``validate=True``, the default) and read back once, before
anything is drawn: each bad input raises :class:`~specdec.errors.InvalidConfigError` or
:class:`~specdec.errors.InvalidDistributionError` naming the argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import torch

from specdec.engine.layouts import KVCompaction, kv_compaction
from specdec.engine.proposal_layouts import (
    ChainProposals,
    DraftLaws,
    TreeProposals,
    as_int_tensor,
    chain_target_logits,
    chain_tree_batch,
    flat_logits,
    tree_tree_batch,
)
from specdec.engine.serving import EngineVerification, RowSampling, verify_for_engine
from specdec.errors import InvalidConfigError, UnsupportedTreeError
from specdec.penalties import Penalties
from specdec.registry import get, list_registered
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind, SampleMode
from specdec.tree_batch import TreeBatch
from specdec.verify.base import Verifier

__all__ = ["KINDS", "ChainProposals", "ChainVerification", "DraftLaws", "TreeProposals", "TreeVerification",
           "check_rule", "serving_rules", "verify_chain_proposals", "verify_tree_proposals"]

KINDS = ("chain", "deterministic", "iid", "wor")
"""Proposal kinds: sampled chains (one child per node), deterministic children, sampled children
drawn i.i.d., sampled children drawn without replacement."""


@attrs.frozen(eq=False)
class ChainVerification:
    """The decision in vLLM's layout (``S = max_spec_len``).

    Attributes:
        output_token_ids: ``[B, S + 1]`` int64 accepted tokens then the bonus, ``-1`` padded.
        num_accepted: ``[B]`` int64 accepted draft tokens (0 on a flagged row).
        kv: the KV keep indices (given ``prefix_lens``), else None.
        verification: the executor's record (``bad``, ``flag``, ``reasons()``).
        tree: the converted :class:`~specdec.tree_batch.TreeBatch`.
    """

    output_token_ids: torch.Tensor
    num_accepted: torch.Tensor
    kv: KVCompaction | None
    verification: EngineVerification
    tree: TreeBatch


@attrs.frozen(eq=False)
class TreeVerification:
    """The decision in SGLang's layout (``D = max_depth``).

    Attributes:
        accept_index: ``[B, D + 1]`` int64 ``retrieve_index`` of the root, then of each accepted node, ``-1`` padded
            (all ``-1`` on a flagged row).
        accept_length: ``[B]`` int64 accepted draft tokens (0 on a flagged row).
        tokens: ``[B, D + 1]`` int64 emitted tokens (accepted, then the bonus), ``-1`` padded.
        kv: the KV keep indices (given ``prefix_lens``), else None.
        verification: the executor's record (``bad``, ``flag``, ``reasons()``).
        tree: the converted :class:`~specdec.tree_batch.TreeBatch`.
    """

    accept_index: torch.Tensor
    accept_length: torch.Tensor
    tokens: torch.Tensor
    kv: KVCompaction | None
    verification: EngineVerification
    tree: TreeBatch


# ----------------------------------------------------------------- which rules serve which proposals
def _needs_order(rule: type[Verifier] | Verifier) -> bool:
    """The rule tests sampled siblings in their draws' order with a ``q'`` ratio (every rule but the
    match family, whose declared tensor form never reads ``q'``: ``fused.rejection`` False)."""
    return rule.fused is None or rule.fused.rejection


def _refusal(rule: type[Verifier] | Verifier, kind: str, order_known: bool) -> str | None:
    name = rule.registry_name
    if kind == "deterministic":
        if NodeKind.DETERMINISTIC not in rule.supported_kinds:
            return f"verifier {name!r} cannot serve deterministic proposals (a greedy or top-k drafter): it verifies sampled children only"
        return None
    if NodeKind.SAMPLED not in rule.supported_kinds:
        return f"verifier {name!r} cannot serve sampled proposals: it verifies {sorted(k.name.lower() for k in rule.supported_kinds)} children"
    if kind == "chain":
        return None
    mode = SampleMode.IID if kind == "iid" else SampleMode.WITHOUT_REPLACEMENT
    if mode not in rule.supported_modes:
        return (f"verifier {name!r} cannot serve several children drawn {mode.value!r}; it supports modes "
                f"{sorted(m.value for m in rule.supported_modes)}")
    if not order_known and _needs_order(rule):
        return (f"verifier {name!r} needs the draws' order of sampled siblings (draw_order), which was not given; "
                "pass draw_order=[B, n] or 'siblings'")
    return None


def check_rule(verifier: str | Verifier | type[Verifier], kind: str, *, order_known: bool = True) -> None:
    """Raise :class:`~specdec.errors.UnsupportedTreeError`, naming the rule, when it cannot serve
    proposals of ``kind`` (one of :data:`KINDS`) from its declarations; no work is done.

    Args:
        verifier: a registry name, a verifier or its class.
        kind: ``"chain"``, ``"deterministic"``, ``"iid"`` or ``"wor"``.
        order_known: the draws' order of sampled siblings was given.
    """
    if kind not in KINDS:
        raise InvalidConfigError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    rule = get("verifier", verifier) if isinstance(verifier, str) else verifier
    message = _refusal(rule, kind, order_known)
    if message is not None:
        raise UnsupportedTreeError(message)


def serving_rules(kind: str, *, order_known: bool = True) -> list[str]:
    """The registered verifiers that serve proposals of ``kind`` (:func:`check_rule`), by name."""
    if kind not in KINDS:
        raise InvalidConfigError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return [name for name in list_registered("verifier") if _refusal(get("verifier", name), kind, order_known) is None]


def verify_chain_proposals(
    proposals: ChainProposals,
    target_logits: torch.Tensor,
    verifier: str | Verifier,
    sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling,
    rng: RandomSource,
    *,
    prefix_lens: torch.Tensor | list[int] | None = None,
    validate: bool = True,
    logit_bias: Sequence[Mapping[int, float] | None] | None = None,
    penalties: Penalties | None = None,
    logprobs: int | None = None,
) -> ChainVerification:
    """Verify vLLM-layout chains (module docstring) through :func:`~specdec.engine.serving.verify_for_engine`.

    Args:
        proposals: the chains, their laws or None (deterministic).
        target_logits: ``[T + B, V]`` raw target logits: each row's draft positions, then its bonus position.
        verifier, sampling, rng: as for :func:`~specdec.engine.serving.verify_for_engine`.
        prefix_lens: ``[B]`` cached tokens before each root: the KV keep indices are computed (else ``kv`` is None).
        validate: check the inputs' values on the device (one host read before anything is drawn).
        logit_bias, penalties, logprobs: the engine's sampling fields, passed on to
            :func:`~specdec.engine.serving.verify_for_engine` (per row; penalties read each node's path).

    Raises:
        UnsupportedTreeError: the rule cannot serve the proposals' kind (named, before any work).
        InvalidConfigError, InvalidDistributionError: bad input, naming the argument.
    """
    rule = get("verifier", verifier)() if isinstance(verifier, str) else verifier
    check_rule(rule, proposals.kind)
    tokens = as_int_tensor(proposals.draft_token_ids, "draft_token_ids", 1)
    B = as_int_tensor(proposals.cu_num_draft_tokens, "cu_num_draft_tokens", 1).shape[0]
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 2:
        raise InvalidConfigError(f"target_logits must be a [T + B, V] tensor, got {getattr(target_logits, 'shape', target_logits)!r:.60}")
    flat = flat_logits(target_logits, tokens.shape[0] + B, None)
    tree = chain_tree_batch(proposals, flat.shape[-1], validate=validate)
    logits = chain_target_logits(tree, proposals, flat)  # [B, n, V]
    out = verify_for_engine(tree, logits, rule, sampling, rng, check_trees=False, logit_bias=logit_bias,
                            penalties=penalties, logprobs=logprobs)
    kv = None if prefix_lens is None else kv_compaction(out.accepted, out.num_accepted, prefix_lens)
    return ChainVerification(output_token_ids=out.tokens, num_accepted=out.num_accepted, kv=kv, verification=out, tree=tree)


def verify_tree_proposals(
    proposals: TreeProposals,
    target_logits: torch.Tensor,
    verifier: str | Verifier,
    sampling: SamplingConfig | Sequence[SamplingConfig] | RowSampling,
    rng: RandomSource,
    *,
    prefix_lens: torch.Tensor | list[int] | None = None,
    validate: bool = True,
    logit_bias: Sequence[Mapping[int, float] | None] | None = None,
    penalties: Penalties | None = None,
    logprobs: int | None = None,
) -> TreeVerification:
    """Verify SGLang-layout trees (module docstring) through :func:`~specdec.engine.serving.verify_for_engine`.

    Args:
        proposals: the trees as retrieve arrays, their laws or None (deterministic).
        target_logits: ``[B, n, V]`` or ``[B * n, V]`` raw target logits at every slot.
        verifier, sampling, rng: as for :func:`~specdec.engine.serving.verify_for_engine`.
        prefix_lens: ``[B]`` cached tokens before each root: the KV keep indices are computed (else ``kv`` is None).
        validate: check the inputs' values on the device (one host read before anything is drawn).
        logit_bias, penalties, logprobs: the engine's sampling fields, passed on to
            :func:`~specdec.engine.serving.verify_for_engine` (per row; penalties read each node's path).

    Raises:
        UnsupportedTreeError: the rule cannot serve the proposals' kind (named, before any work).
        InvalidConfigError, InvalidDistributionError: bad input, naming the argument.
    """
    if proposals.mode not in ("iid", "wor"):
        raise InvalidConfigError(f"mode must be 'iid' or 'wor', got {proposals.mode!r}")
    rule = get("verifier", verifier)() if isinstance(verifier, str) else verifier
    check_rule(rule, proposals.kind, order_known=proposals.draw_order is not None)
    index = as_int_tensor(proposals.retrieve_index, "retrieve_index", 2)
    B, n = index.shape
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() not in (2, 3) or \
            (target_logits.dim() == 3 and tuple(target_logits.shape[:2]) != (B, n)):
        raise InvalidConfigError(f"target_logits must be [B, n, V] = [{B}, {n}, V] or [B * n, V], "
                                 f"got {getattr(target_logits, 'shape', target_logits)!r:.60}")
    flat = flat_logits(target_logits, B * n, None)
    tree = tree_tree_batch(proposals, flat.shape[-1], validate=validate)
    out = verify_for_engine(tree, flat.reshape(B, n, -1), rule, sampling, rng, check_trees=False,
                            logit_bias=logit_bias, penalties=penalties, logprobs=logprobs)
    taken = out.accepted >= 0  # [B, D]
    nodes = index.to(out.accepted.device).gather(1, out.accepted.clamp_min(0))  # [B, D]
    accept = torch.cat([index[:, :1].to(nodes.device), torch.where(taken, nodes, -1)], 1)  # [B, D + 1]
    accept = torch.where(out.bad.view(B, 1), -1, accept)
    kv = None if prefix_lens is None else kv_compaction(out.accepted, out.num_accepted, prefix_lens)
    return TreeVerification(accept_index=accept, accept_length=out.num_accepted, tokens=out.tokens, kv=kv,
                            verification=out, tree=tree)
