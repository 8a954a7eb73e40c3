"""Bad plug-in: a tree builder declaring batch_form = True without its own feed_build (its tensor form)."""

import attrs

from good_nucleus import NucleusBuilder
from specdec.registry import register


@register("tree", "outside-bad-batch-form")
@attrs.frozen
class ClaimsBatches(NucleusBuilder):
    batch_form = True  # BUG: no feed_build (tensor form) of its own
