"""Shared plumbing for Hugging Face causal LMs: KV-cache access, tree
attention masks, one-call forwards, vocabulary checks, truncated-layer copies.

Everything version-dependent in the ``transformers`` API that specdec uses is
isolated here, behind :class:`KVCache` and :func:`forward_tokens`:

- the cache object (``DynamicCache``): per-layer ``cache.layers[i].keys/.values``
  (transformers >= 4.56) or the older ``cache.key_cache[i]`` / ``cache.value_cache[i]``
  lists (4.46 - 4.55);
- the keyword that passes it (``cache`` from 5.x on, ``past_key_values`` before);
- the keyword that restricts logits to the last position (``logits_to_keep`` /
  ``num_logits_to_keep``).

The supported range is :data:`SUPPORTED_TRANSFORMERS`; the compatibility test
(``tests/models/test_hf_compat.py``) checks the installed version against it and
exercises every cache access used here. No modeling file is forked: trees are
scored with the model's own forward, a 4D additive float attention mask and
explicit ``position_ids``.

Words: the *committed context* is the token sequence decoding has fixed so
far; a *draft tree* (see :mod:`specdec.tree`) hangs below its last token, the
*root*. A node at depth ``d`` gets position ``len(context) - 1 + d``.

The plumbing lives in one module per role; this module gathers their public
names (import them from here):

- :mod:`specdec.models.hf_model`: model facts (vocabulary, context, config),
  the supported ``transformers`` versions, the training-mode check, truncated copies;
- :mod:`specdec.models.hf_checks`: prompt, token, context and vocabulary checks;
- :mod:`specdec.models.hf_masks`: additive tree masks and sliding windows;
- :mod:`specdec.models.hf_slab` and :mod:`specdec.models.hf_cache`: the
  preallocated, compacted KV cache;
- :mod:`specdec.models.hf_forward`: one forward over the cache;
- :mod:`specdec.models.hf_attention`: which attention implementations can score a tree.
"""

from __future__ import annotations

from specdec.models.hf_attention import TREE_MASK_ATTENTION, check_attention, probe_tree_attention
from specdec.models.hf_cache import KVCache, KVCompactor
from specdec.models.hf_checks import (
    check_context,
    check_prompt,
    check_tokenizers_match,
    check_tokens,
    check_vocab_match,
)
from specdec.models.hf_forward import forward_rows, forward_tokens
from specdec.models.hf_masks import SLIDING_LAYER_TYPES, SlidingWindow, additive_mask, sliding_window
from specdec.models.hf_model import (
    SUPPORTED_TRANSFORMERS,
    check_eval_mode,
    check_transformers_version,
    model_max_length,
    model_vocab_size,
    text_config,
    truncated_copy,
)
from specdec.models.hf_slab import MIN_CAPACITY, KVSlab

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "TREE_MASK_ATTENTION",
    "check_attention",
    "check_eval_mode",
    "probe_tree_attention",
    "KVCache",
    "KVCompactor",
    "KVSlab",
    "MIN_CAPACITY",
    "SLIDING_LAYER_TYPES",
    "SlidingWindow",
    "additive_mask",
    "check_context",
    "check_prompt",
    "check_tokenizers_match",
    "check_tokens",
    "check_transformers_version",
    "check_vocab_match",
    "forward_rows",
    "forward_tokens",
    "model_max_length",
    "model_vocab_size",
    "sliding_window",
    "text_config",
    "truncated_copy",
]
