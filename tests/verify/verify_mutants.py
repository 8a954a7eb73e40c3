"""Broken variants of the verifiers (docs/verifiers.md, "Proving a verifier lossless": things that look harmless
and are NOT lossless"), used by the tests to show that the exact checks catch
them. Deliberately NOT registered: they must never be picked up by the
registry-parametrised conformance tests."""

from __future__ import annotations

import torch

from specdec.rng import RandomSource
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier
from specdec.verify.kseq import KSeqVerifier
from specdec.verify.match import sample_and_match
from specdec.verify.mixed import MixedVerifier
from specdec.verify.rejection import RejectionIIDVerifier, RejectionWORVerifier, recursive_rejection
from specdec.verify.residual import (
    kseq_accept_prob,
    kseq_residual,
    kseq_rho,
    normalise,
    rejection_accept_prob,
    rejection_residual,
    without_replacement_update,
)

IID, WOR = SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT


class RatioOnTopK(Verifier):
    """Verifies top-K deterministic children with a ``p/q`` ratio (rule 4 as
    if they had been drawn from the draft row ``q`` without replacement)."""

    registry_name = "mutant-ratio-on-topk"
    supported_kinds = frozenset({NodeKind.DETERMINISTIC})
    supported_modes = frozenset({IID, WOR})

    def __init__(self, q: torch.Tensor) -> None:
        self.q = q

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        P = p_node / p_node.sum()
        kids = tree.deterministic_children(node)
        if kids:
            toks = [int(tree.tokens[c]) for c in kids]
            q = self.q.clamp_min(1e-12)  # top-K tokens may have q = 0
            q = q / q.sum()
            accepted, P = recursive_rejection(P, q, kids, toks, rng, without_replacement=True)
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))


class MixedWithFullQ(MixedVerifier):
    """Rule 5 using the draft row ``q`` where the sampled child was drawn from ``q'``."""

    registry_name = "mutant-mixed-full-q"

    def __init__(self, q: torch.Tensor) -> None:
        self.q = q

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        P = p_node / p_node.sum()
        sampled = tree.sampled_children(node)
        if sampled:
            toks = [int(tree.tokens[c]) for c in sampled]
            accepted, P = recursive_rejection(P, self.q, sampled, toks, rng, without_replacement=True)
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        det = tree.deterministic_children(node)
        accepted, P = sample_and_match(P, det, [int(tree.tokens[c]) for c in det], rng)
        if accepted is not None:
            return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))


class MixedDeterministicFirst(MixedVerifier):
    """Rule 5 with the deterministic children tested BEFORE the sampled ones."""

    registry_name = "mutant-mixed-deterministic-first"

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        P = p_node / p_node.sum()
        det = tree.deterministic_children(node)
        accepted, P = sample_and_match(P, det, [int(tree.tokens[c]) for c in det], rng)
        if accepted is not None:
            return NodeOutcome(accepted_child=accepted)
        sampled = tree.sampled_children(node)
        if sampled:
            law = tree.law_of(sampled[0])
            q = law.dense(tree.vocab_size, dtype=P.dtype)
            toks = [int(tree.tokens[c]) for c in sampled]
            accepted, P = recursive_rejection(P, q, sampled, toks, rng, without_replacement=law.mode == WOR)
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))


class Rule3OnWithoutReplacement(RejectionIIDVerifier):
    """Rule 3 (``q`` unchanged after a rejection) on draws without replacement,
    i.e. a rule-4 verifier that forgets the ``q(x) = 0`` update."""

    registry_name = "mutant-rule3-on-wor"
    supported_modes = frozenset({IID, WOR})


class Rule4OnIID(RejectionWORVerifier):
    """Rule 4 (``q(x) = 0; q = norm(q)`` after a rejection) on i.i.d. draws,
    coded naively: a repeated draw (``P(x) = q(x) = 0`` after the update) is
    rejected and the residual updated as after any rejection.

    (Rejecting a repeat WITHOUT touching ``P`` and ``q`` would be exact: the
    first draw from ``q`` outside the rejected set has law ``norm(q minus
    rejected)``. The naive update is what makes it lossy.)"""

    registry_name = "mutant-rule4-on-iid"
    supported_modes = frozenset({IID, WOR})

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        P = p_node / p_node.sum()
        kids = tree.sampled_children(node)
        if kids:
            q = tree.law_of(kids[0]).dense(tree.vocab_size, dtype=P.dtype)
            for child in kids:
                x = int(tree.tokens[child])
                # a repeated token has P(x) = q(x) = 0: the naive ratio 0/0 rejects it
                accept = torch.nan_to_num(rejection_accept_prob(P, q, x), nan=0.0)
                if rng.bernoulli(accept):
                    return NodeOutcome(accepted_child=child)
                P = rejection_residual(P, q)
                q = without_replacement_update(q, x)
        return NodeOutcome(bonus_token=rng.categorical(P))


class _BrokenRejection(Verifier):
    """Rule 4 with a pluggable residual / ``q`` update, for the bookkeeping mutants."""

    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({WOR})

    def residual(self, P: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update_q(self, q: torch.Tensor, x: int) -> torch.Tensor:
        raise NotImplementedError

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        P = p_node / p_node.sum()
        kids = tree.sampled_children(node)
        if kids:
            q = tree.law_of(kids[0]).dense(tree.vocab_size, dtype=P.dtype)
            for child in kids:
                x = int(tree.tokens[child])
                if rng.bernoulli(rejection_accept_prob(P, q, x)):
                    return NodeOutcome(accepted_child=child)
                P = self.residual(P, q)
                q = self.update_q(q, x)
        # the bonus itself is drawn from a normalised residual
        return NodeOutcome(bonus_token=rng.categorical(normalise(P, fallback=p_node)))


class ForgetsToRenormaliseResidual(_BrokenRejection):
    """``P = [P - q]+`` without ``norm``: later ratios use an unnormalised residual."""

    registry_name = "mutant-unnormalised-residual"

    def residual(self, P: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return torch.clamp_min(P - q, 0)

    def update_q(self, q: torch.Tensor, x: int) -> torch.Tensor:
        r = q.clone()
        r[x] = 0
        return r / r.sum()


class ForgetsToRenormaliseQ(_BrokenRejection):
    """Rule 4 that sets ``q(x) = 0`` but forgets ``q = norm(q)``."""

    registry_name = "mutant-unnormalised-q"

    def residual(self, P: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return normalise(torch.clamp_min(P - q, 0), fallback=P)

    def update_q(self, q: torch.Tensor, x: int) -> torch.Tensor:
        r = q.clone()
        r[x] = 0
        return r


class KSeqRhoOne(KSeqVerifier):
    """K-SEQ with ``rho = 1`` regardless of the inequality (k >= 2)."""

    registry_name = "mutant-kseq-rho-one"

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        return _kseq_with(tree, node, p_node, rng, lambda p_s, q_s, k: 1.0, None)


class KSeqResidualOtherRho(KSeqVerifier):
    """K-SEQ whose residual uses ``rho = k`` while the tests used the optimal ``rho``."""

    registry_name = "mutant-kseq-residual-other-rho"

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        return _kseq_with(tree, node, p_node, rng, kseq_rho, lambda k: float(k))


class KSeqRhoK(KSeqVerifier):
    """K-SEQ with the valid but non-minimal ``rho = k``: exact, lower acceptance."""

    registry_name = "mutant-kseq-rho-k"

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        return _kseq_with(tree, node, p_node, rng, lambda p_s, q_s, k: float(k), None)


def _kseq_with(tree, node, p_node, rng, rho_fn, residual_rho) -> NodeOutcome:
    P = p_node / p_node.sum()
    kids = tree.sampled_children(node)
    if not kids:
        return NodeOutcome(bonus_token=rng.categorical(P))
    law = tree.law_of(kids[0])
    q = law.dense(tree.vocab_size, dtype=P.dtype)
    k = len(kids)
    rho = rho_fn(P[law.indices], law.probs, k)
    for child in kids:
        if rng.bernoulli(kseq_accept_prob(P, q, int(tree.tokens[child]), rho)):
            return NodeOutcome(accepted_child=child)
    r_rho = rho if residual_rho is None else residual_rho(k)
    return NodeOutcome(bonus_token=rng.categorical(kseq_residual(P, q, r_rho, k)))
