"""The mixed rule (docs/verifiers.md rule 5; RheoSampling's verifier).

A node may have sampled children (drawn from the recorded law ``q'``) and
deterministic children (a kept top-K set ``S``). Sampled children are tested
FIRST, by recursive rejection against ``q'`` (rule 3 if they were drawn i.i.d.,
rule 4 if without replacement); then, on the residual ``P`` they leave,
sample-and-match (rule 2) over the deterministic children in rank order; the
*bonus* comes from the final residual. The ratio and the residual use ``q'``,
the law the children were really drawn from, never the draft's full ``q``.

With one sampled child the acceptance is the optimum
``p(S) + sum_{x not in S} min(p(x), q'(x))``. Testing the deterministic
children first would also be exact on a static tree but accepts only
``p(S) + sum_{x not in S} min(p(x), (1 - p(S)) q'(x))``, and it is not lossless
when the tree was pruned using the sampled child's identity (RheoSampling), so
this verifier never does it.
"""

from __future__ import annotations

import torch

from specdec.registry import register
from specdec.rng import RandomSource
from specdec.tree import DraftTree, NodeKind, SampleMode
from specdec.verify.base import FusedRule, NodeOutcome, Verifier
from specdec.verify.match import sample_and_match
from specdec.verify.rejection import recursive_rejection
from specdec.verify.residual import working_dtype

__all__ = ["MixedVerifier"]


@register("verifier", "mixed")
class MixedVerifier(Verifier):
    """Rule 5: sampled children first (rules 3/4 against ``q'``), then rule 2
    over the deterministic children on the residual.

    With only sampled children it is rule 3/4; with only deterministic
    children it is rule 2.

    Example:
        >>> import torch
        >>> from specdec.tree import SparseLaw, TreeAssembler
        >>> from specdec.rng import TorchRandom
        >>> asm = TreeAssembler(root_token=0, vocab_size=4)
        >>> _ = asm.add_deterministic(0, token=1, weight=0.5)  # S = {1}
        >>> law = SparseLaw(torch.tensor([2, 3]), torch.tensor([0.6, 0.4]), SampleMode.IID)  # q'
        >>> _ = asm.add_sampled(0, token=2, law=law, weight=0.5)
        >>> p = torch.tensor([[0.0, 0.0, 1.0, 0.0], [1.0, 0, 0, 0], [1.0, 0, 0, 0]])
        >>> MixedVerifier().verify(asm.build(), p, TorchRandom.seeded(0)).tokens
        (2, 0)
    """

    fused = FusedRule("mixed", rejection=True, without_replacement=None, match_deterministic=True)
    supported_kinds = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        dtype = working_dtype(p_node)
        p = p_node.to(dtype)
        P = p / p.sum()
        sampled = tree.sampled_children(node)
        if sampled:
            law = tree.law_of(sampled[0])  # q', the law the sampled children were drawn from
            q_prime = law.dense(tree.vocab_size, dtype=dtype).to(p.device)
            tokens = [int(tree.tokens[c]) for c in sampled]
            accepted, P = recursive_rejection(
                P,
                q_prime,
                sampled,
                tokens,
                rng,
                without_replacement=law.mode == SampleMode.WITHOUT_REPLACEMENT,
            )
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        determ = tree.deterministic_children(node)
        if determ:
            tokens = [int(tree.tokens[c]) for c in determ]
            accepted, P = sample_and_match(P, determ, tokens, rng)
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))
