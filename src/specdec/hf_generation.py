"""From a ``transformers.GenerationConfig`` to specdec's sampling and logits processors.

:func:`from_generation_config` maps the fields that define the *law* of
decoding -- ``do_sample`` (False = greedy), ``temperature``, ``top_k``,
``top_p``, ``min_p``, the length and end-of-sequence fields, and the logits processors
transformers builds from the config (repetition penalty, no-repeat n-gram,
bad words, minimum lengths, suppressed tokens, sequence bias, forced EOS) --
to a :class:`~specdec.sampling.SamplingConfig` plus a ``LogitsProcessorList``
(:mod:`specdec.processors`), in transformers' own order (processors, then
temperature / top-k / top-p). Any other field set to a non-default value
(beam search, typical sampling, output flags, ...) raises
:class:`~specdec.errors.InvalidConfigError` naming it: nothing is silently
ignored (docs/generation.md, "From transformers' GenerationConfig").

Unset fields take transformers' defaults (``do_sample=False``, ``top_k=50``
when sampling, ``max_length=20`` when no length is given).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from specdec.errors import InvalidConfigError
from specdec.sampling import SamplingConfig

__all__ = [
    "LENGTH_DEPENDENT", "HFGeneration", "from_generation_config", "from_generation_config_rows", "is_generation_config",
]

# fields that describe the model or the runtime, not the law of the tokens
_METADATA = frozenset({
    "pad_token_id", "bos_token_id", "decoder_start_token_id", "transformers_version", "_from_model_config",
    "use_cache", "_commit_hash", "_original_object_hash",
})
# fields mapped here (the law of decoding)
_SUPPORTED = frozenset({
    "do_sample", "temperature", "top_k", "top_p", "max_new_tokens", "max_length", "eos_token_id",
    "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length", "min_new_tokens",
    "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_eos_token_id", "min_p",
})
LENGTH_DEPENDENT = ("min_new_tokens", "forced_eos_token_id", "begin_suppress_tokens")
"""Fields whose processors count from the prompt's own length (a batch of prompts of
different lengths cannot share them: :func:`from_generation_config_rows`); ``max_length``
is one too when no ``max_new_tokens`` is given."""
# transformers' defaults for the fields above when unset (GenerationConfig._get_default_generation_params)
_DEFAULTS: dict[str, Any] = {
    "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "max_length": 20, "min_length": 0,
    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "num_beams": 1, "num_return_sequences": 1,
    "typical_p": 1.0, "length_penalty": 1.0, "encoder_no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
    "output_scores": False, "return_dict_in_generate": False, "remove_invalid_values": False,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "early_stopping": False, "num_beam_groups": 1,
    "diversity_penalty": 0.0, "output_attentions": False, "output_hidden_states": False, "output_logits": False,
    "min_p": None,
}
# fields that only matter for assisted generation, beams or other decoding modes,
# harmless at these values (transformers' own defaults)
_ASSISTANT_DEFAULTS: dict[str, Any] = {
    "num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4,
    "assistant_lookbehind": 10, "target_lookbehind": 10,
}


def is_generation_config(obj: Any) -> bool:
    """Whether ``obj`` is a ``transformers.GenerationConfig`` (False when transformers is absent)."""
    try:
        from transformers import GenerationConfig
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, GenerationConfig)


@attrs.frozen
class HFGeneration:
    """What a ``GenerationConfig`` means for specdec.

    Attributes:
        sampling: temperature / top-k / top-p (``temperature=0`` when ``do_sample`` is False).
        processors: ``LogitsProcessorList`` of the processors the config implies (may be empty).
        max_new_tokens: the length limit in new tokens.
        eos_token_id: the end-of-sequence id(s), or None.
    """

    sampling: SamplingConfig
    processors: Any
    max_new_tokens: int
    eos_token_id: int | tuple[int, ...] | None


def _set_fields(config: Any) -> dict[str, Any]:
    """The fields of ``config`` that differ from transformers' defaults (None = unset)."""
    out = {}
    for key, value in config.to_dict().items():
        if value is None or key in _METADATA:
            continue
        default = _DEFAULTS.get(key, _ASSISTANT_DEFAULTS.get(key))
        if key in _DEFAULTS or key in _ASSISTANT_DEFAULTS:
            if value == default:
                continue
        out[key] = value
    return out


def from_generation_config(
    config: Any,
    prompt_length: int,
    *,
    max_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    device: Any = "cpu",
) -> HFGeneration:
    """Translate ``config`` for a prompt of ``prompt_length`` tokens.

    Args:
        config: a ``transformers.GenerationConfig``.
        prompt_length: the prompt's length (``max_length``, ``min_length``
            and ``begin_suppress_tokens`` count from the start of the sequence).
        max_new_tokens, eos_token_id: the caller's explicit values; they win
            over the config's (as in ``model.generate(..., max_new_tokens=)``).
        device: where the processors keep their token-id tensors (the target's logits' device).

    Raises:
        InvalidConfigError: ``config`` is not a GenerationConfig, sets a
            field specdec does not support (named), or gives no positive length.
    """
    if not is_generation_config(config):
        raise InvalidConfigError(f"expected a transformers.GenerationConfig, got {type(config).__name__}")
    fields = _set_fields(config)
    unsupported = sorted(k for k in fields if k not in _SUPPORTED)
    if unsupported:
        shown = ", ".join(f"{k}={fields[k]!r}" for k in unsupported)
        raise InvalidConfigError(
            f"GenerationConfig fields specdec does not support: {shown}. Supported: "
            f"{', '.join(sorted(_SUPPORTED))} (docs/generation.md, \"From transformers' GenerationConfig\")"
        )
    from transformers import (
        ForcedEOSTokenLogitsProcessor,
        LogitsProcessorList,
        MinLengthLogitsProcessor,
        MinNewTokensLengthLogitsProcessor,
        NoBadWordsLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
        SequenceBiasLogitsProcessor,
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
    )

    def get(key: str) -> Any:
        return fields.get(key, _DEFAULTS.get(key))

    # the sampling law: do_sample=False is greedy whatever temperature / top-k / top-p say (transformers' rule)
    if get("do_sample"):
        top_k = get("top_k")
        sampling = SamplingConfig(temperature=float(get("temperature")), top_k=int(top_k or 0), top_p=float(get("top_p")),
                                  min_p=float(get("min_p") or 0.0))
    else:
        sampling = SamplingConfig(temperature=0.0)

    # lengths: an explicit max_new_tokens wins, then the config's, then its max_length
    if max_new_tokens is None:
        max_new_tokens = fields.get("max_new_tokens")
    if max_new_tokens is None:
        max_new_tokens = int(get("max_length")) - prompt_length
        if max_new_tokens <= 0:
            raise InvalidConfigError(
                f"GenerationConfig max_length={get('max_length')} leaves no new token after a prompt of {prompt_length}"
            )
    max_length = prompt_length + int(max_new_tokens)

    eos: Any = eos_token_id if eos_token_id is not None else fields.get("eos_token_id")
    eos_list = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])

    def needs_eos(key: str) -> list[int]:
        if not eos_list:
            raise InvalidConfigError(f"GenerationConfig {key}={fields[key]!r} needs an eos_token_id")
        return eos_list

    # transformers' order (GenerationMixin._get_logits_processor)
    processors = LogitsProcessorList()
    if "sequence_bias" in fields:
        processors.append(SequenceBiasLogitsProcessor(sequence_bias=fields["sequence_bias"]))
    if "repetition_penalty" in fields:
        processors.append(RepetitionPenaltyLogitsProcessor(float(fields["repetition_penalty"])))
    if "no_repeat_ngram_size" in fields and int(fields["no_repeat_ngram_size"]) > 0:
        processors.append(NoRepeatNGramLogitsProcessor(int(fields["no_repeat_ngram_size"])))
    if "bad_words_ids" in fields:
        processors.append(NoBadWordsLogitsProcessor(fields["bad_words_ids"], eos_list or None))
    if "min_length" in fields and int(fields["min_length"]) > 0:
        processors.append(MinLengthLogitsProcessor(int(fields["min_length"]), needs_eos("min_length"), device=device))
    if "min_new_tokens" in fields and int(fields["min_new_tokens"]) > 0:
        processors.append(MinNewTokensLengthLogitsProcessor(prompt_length, int(fields["min_new_tokens"]),
                                                            needs_eos("min_new_tokens"), device=device))
    if "forced_eos_token_id" in fields:
        processors.append(ForcedEOSTokenLogitsProcessor(max_length, fields["forced_eos_token_id"], device=device))
    if "suppress_tokens" in fields:
        processors.append(SuppressTokensLogitsProcessor(fields["suppress_tokens"], device=device))
    if "begin_suppress_tokens" in fields:
        processors.append(SuppressTokensAtBeginLogitsProcessor(fields["begin_suppress_tokens"], prompt_length,
                                                               device=device))
    return HFGeneration(
        sampling=sampling,
        processors=processors,
        max_new_tokens=int(max_new_tokens),
        eos_token_id=None if not eos_list else (eos_list[0] if len(eos_list) == 1 else tuple(eos_list)),
    )


def from_generation_config_rows(
    config: Any,
    prompt_lengths: Sequence[int],
    *,
    max_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    device: Any = "cpu",
) -> HFGeneration:
    """:func:`from_generation_config` for a batch of prompts: one translation every row shares.

    A batch applies one processor to every row (each row in its own context), so the
    translation must not depend on the prompt's length: prompts of different lengths are
    refused with a field of :data:`LENGTH_DEPENDENT` set (``min_new_tokens``,
    ``forced_eos_token_id``, ``begin_suppress_tokens``), or a length taken from ``max_length``
    (no ``max_new_tokens``). Otherwise each row's translation is the one its batch-1
    generation makes.

    Raises:
        InvalidConfigError: as :func:`from_generation_config`, or such a field (named) with
            prompts of different lengths (the first two named).
    """
    lengths = [int(n) for n in prompt_lengths]
    if not lengths:
        raise InvalidConfigError("a GenerationConfig needs at least one prompt")
    out = from_generation_config(config, lengths[0], max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                                 device=device)
    other = next((b for b, n in enumerate(lengths) if n != lengths[0]), None)
    if other is None:
        return out
    fields = _set_fields(config)
    depends = [k for k in LENGTH_DEPENDENT if k in fields and fields[k] not in (0, [], ())]
    if max_new_tokens is None and "max_new_tokens" not in fields:
        depends.append("max_length")
    if depends:
        shown = ", ".join(f"{k}={fields.get(k, _DEFAULTS.get(k))!r}" for k in depends)
        raise InvalidConfigError(
            f"GenerationConfig {shown} counts from each prompt's own length, and prompts 0 and {other} have "
            f"different lengths ({lengths[0]}, {lengths[other]}): a batch applies one processor to every row; "
            "give max_new_tokens (for max_length), prompts of one length, or decode them one at a time "
            "(docs/generation.md, \"From transformers' GenerationConfig\")"
        )
    return out
