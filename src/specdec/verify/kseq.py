"""SpecTr's K-SEQ verification (docs/verifiers.md rule 6; Sun et al. 2023,
"SpecTr: Fast Speculative Decoding via Optimal Transport").

For ``k`` sampled children drawn i.i.d. from the recorded law ``q``:
``beta(rho) = sum_x min(q(x), p(x)/rho)``; ``rho`` is the smallest value in
``[1, k]`` with ``1 - (1-beta)^k <= rho beta``
(:func:`~specdec.verify.residual.kseq_rho`). Draw ``i`` (in draw order) is
accepted with probability ``min(1, p(x_i) / (rho q(x_i)))``, with no update
between draws; if all are rejected the *bonus* is drawn from
``norm(p - min(q, p/rho) (1 - (1-beta)^k) / beta)``.

Exactness: ``x`` is emitted through acceptance with probability
``sum_i (1-beta)^(i-1) min(q(x), p(x)/rho) = min(q(x), p(x)/rho) (1-(1-beta)^k)/beta``,
which is ``<= p(x)`` exactly when the ``rho`` inequality holds; the residual
(mass ``(1-beta)^k``, the probability that all draws are rejected) supplies
the rest. So the law is exact for ANY ``rho`` satisfying the inequality,
provided the test and the residual use the same one; the smallest maximises
acceptance, which is ``1 - (1 - beta(rho))^k``. With ``k = 1``, ``rho = 1``:
classic speculative sampling. Only sampled i.i.d. children are supported.
"""

from __future__ import annotations

import torch

from specdec.registry import register
from specdec.rng import RandomSource
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier
from specdec.verify.residual import kseq_accept_prob, kseq_residual, kseq_rho, working_dtype

__all__ = ["KSeqVerifier"]


@register("verifier", "kseq")
class KSeqVerifier(Verifier):
    """Rule 6 (SpecTr K-SEQ) for sampled children drawn i.i.d.

    Example:
        >>> import torch
        >>> from specdec.tree import SparseLaw, TreeAssembler
        >>> from specdec.rng import TorchRandom
        >>> law = SparseLaw(torch.tensor([1, 2]), torch.tensor([0.5, 0.5]), SampleMode.IID)
        >>> asm = TreeAssembler(root_token=0, vocab_size=3)
        >>> _ = asm.add_sampled(0, token=2, law=law, weight=0.5)
        >>> _ = asm.add_sampled(0, token=2, law=law, weight=0.5)
        >>> p = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
        >>> KSeqVerifier().verify(asm.build(), p, TorchRandom.seeded(0)).tokens
        (2, 0)
    """

    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        dtype = working_dtype(p_node)
        p = p_node.to(dtype)
        P = p / p.sum()
        children = tree.sampled_children(node)
        if not children:
            return NodeOutcome(bonus_token=rng.categorical(P))
        law = tree.law_of(children[0])  # q', the law of the i.i.d. draws
        support = law.indices.to(p.device)
        q_s = law.probs.to(device=p.device, dtype=dtype)
        k = len(children)
        rho = kseq_rho(P[support], q_s, k)
        q = torch.zeros_like(P).scatter_(0, support, q_s)
        for child in children:
            if rng.bernoulli(kseq_accept_prob(P, q, int(tree.tokens[child]), rho)):
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token=rng.categorical(kseq_residual(P, q, rho, k)))
