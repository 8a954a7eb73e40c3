"""Mutant draft: the outside bigram draft that proposes nothing after token 3 (every logit
``-inf``): no law at all there. The ``laws`` suite must catch it."""

from good_bigram import OutsideBigram
from specdec.registry import register


def make(setting):
    return DeadEnd(setting.vocab_size, device=setting.device)


@register("draft", "outside-mutant-bigram-dead-end", factory=make)
class DeadEnd(OutsideBigram):
    def _logits(self, tokens):
        out = super()._logits(tokens)
        for row, t in enumerate(tokens):
            if t == 3:
                out[row] = float("-inf")  # BUG: no token is proposed after 3
        return out
