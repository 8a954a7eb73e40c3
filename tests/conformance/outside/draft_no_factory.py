"""An outside draft registered without a factory: nothing can build it for a given target, so the
conformance command reports it as SKIP (naming it) and ``specdec bench`` refuses it by name."""

from good_bigram import OutsideBigram
from specdec.registry import register


@register("draft", "outside-bigram-no-factory")
class NoFactory(OutsideBigram):
    pass
