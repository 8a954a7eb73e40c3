"""What a draft's declared factory is given: the target it drafts for (:class:`DraftSetting`).

A registered draft declares how it is built for a given target with
``register("draft", NAME, factory=FACTORY)`` (:func:`specdec.registry.register`);
``FACTORY(setting)`` returns the draft. The same factory serves ``specdec bench``
(``--methods "sd@NAME"``: the bench's target, a Hugging Face model) and the
conformance command (``python -m specdec.testing.conformance MODULE``: a toy
Markov target over a few tokens), so a draft proven by the one is the draft
benched by the other. A draft registered without a factory is refused by name
by both (:func:`specdec.registry.draft_factory`).

Example:
    >>> import specdec
    >>> from specdec.drafts.ngram import NgramDraft
    >>> from specdec.registry import register, unregister
    >>> @register("draft", "doc-ngram", factory=lambda s: NgramDraft(s.vocab_size, device=s.device))
    ... class DocNgram(NgramDraft):
    ...     pass
    >>> draft = specdec.registry.draft_factory("doc-ngram")(DraftSetting(vocab_size=7))
    >>> draft.vocab_size
    7
    >>> unregister("draft", "doc-ngram")
"""

from __future__ import annotations

from typing import Any

import attrs

from specdec.errors import InvalidConfigError
from specdec.targets.base import TargetModel

__all__ = ["DraftSetting"]


def _positive(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidConfigError(f"DraftSetting: {attribute.name} must be an int >= 1, got {value!r}")


@attrs.frozen
class DraftSetting:
    """The target a draft is built for.

    Attributes:
        vocab_size: ``V``, the target's vocabulary size (the draft's logits are ``[..., V]``).
        target: the target wrapper the rows run with, or None.
        device: where the target's logits live (the draft's logits go there too).
        hf_model: the bench's Hugging Face target model (a draft that reads the target's
            weights, e.g. its embeddings), None on a toy target.
        tokenizer: the bench's tokenizer, None on a toy target.
        seed: a seed for a draft that draws its own parameters.
    """

    vocab_size: int = attrs.field(validator=_positive)
    target: TargetModel | None = None
    device: str = "cpu"
    hf_model: Any = None
    tokenizer: Any = None
    seed: int = 0
