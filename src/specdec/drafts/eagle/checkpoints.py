"""EAGLE head checkpoints: specdec's own format and the public reference layouts.

Own format (a folder):

    config.json         {"format": "specdec-eagle", "format_version": 1, "config": {EagleConfig fields},
                         "target": {"num_hidden_layers": N, "feature_layers": [...]}, "meta": {...}}
    model.safetensors   the head's trainable tensors (EagleHead.trainable_state_dict()),
                        never the target's frozen embedding / LM head

``"target"`` (optional) records the depth of the target the head was trained
for; :func:`load_head` refuses a target of another depth, whose
``hidden_states`` of the same indices are other layers. Heads saved before it
was recorded have no ``"target"`` and load as before. Own-format heads are
never read from pickle (``.bin``) files.

Reference layouts (read only; files are read with safetensors, or with
``torch.load(weights_only=True)``: never unpickled):

* EAGLE-2 (SafeAILab/EAGLE ``cnets1.py``, e.g. ``yuhuili/EAGLE-LLaMA3-Instruct-8B``):
  ``config.json`` is a LLaMA config (``hidden_size``, ``intermediate_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``num_hidden_layers`` = 1,
  ``rms_norm_eps``, ``rope_theta``, ``vocab_size``); weights ``fc.weight``,
  ``fc.bias``, ``layers.0.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.0.mlp.{gate,up,down}_proj.weight``,
  ``layers.0.post_attention_layernorm.weight`` and optionally
  ``embed_tokens.weight`` (the target's, ignored: the target's own is used).
* EAGLE-3 (SafeAILab/EAGLE ``cnets.py``, SpecForge, e.g.
  ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``): config adds ``draft_vocab_size``
  (and optionally ``target_hidden_size``, and ``eagle_aux_hidden_state_layer_ids``,
  at the top or in ``eagle_config``: the feature layers, numbered as vLLM
  numbers them (id ``l`` = the input of layer ``l``) or as SGLang does (the
  output of layer ``l``), which the file does not say: ``aux_layer_convention=``
  picks one; without ids the default is (2, N//2, N-3)); weights ``fc.weight``,
  ``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.*``,
  ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
  ``norm.weight``, ``lm_head.weight``, buffers ``d2t`` (int64 offsets, target
  id = draft id + d2t) and ``t2d`` (bool mask over the target vocabulary), and
  optionally ``embed_tokens.weight``.
* EAGLE-3 in vLLM's ``speculators`` format (vllm-project/speculators
  ``Eagle3SpeculatorConfig``, e.g. the ``RedHatAI/*speculator.eagle3`` heads):
  ``config.json`` has ``speculators_model_type: "eagle3"``, ``architectures``
  ``["Eagle3DraftModel"]`` (``["Eagle3Speculator"]`` before speculators 0.9), the
  decoder layer's LLaMA fields in ``transformer_layer_config``, and at the top
  ``draft_vocab_size``, ``norm_before_residual``, ``target_hidden_size``,
  ``eagle_aux_hidden_state_layer_ids`` (vLLM's numbering) and a
  ``speculators_config`` block whose ``verifier`` names the target
  (``name_or_path``, ``architectures``); weights as EAGLE-3's with ``layers.0.``
  for ``midlayer.``, ``d2t`` / ``t2d`` only for a reduced draft vocabulary, and
  ``embed_tokens.weight`` (ignored). :func:`save_speculators_head` writes it.

A head's ``max_position_embeddings`` below the target's context is raised to
it (RoPE needs no new weights) with a logged warning.

The code lives in one module per role; this module gathers their public names
(import them from here):

- :mod:`~specdec.drafts.eagle.checkpoint_config`: ``config.json`` fields,
  :class:`CheckpointError`, the checks every format shares (target depth,
  position limit);
- :mod:`~specdec.drafts.eagle.checkpoint_weights`: weight files and loading tensors into a head;
- :mod:`~specdec.drafts.eagle.checkpoint_own`: specdec's own format;
- :mod:`~specdec.drafts.eagle.checkpoint_reference`: the reference layouts
  (format detection, config mapping, aux-layer numbering);
- :mod:`~specdec.drafts.eagle.checkpoint_speculators`: the ``speculators`` format;
- :mod:`~specdec.drafts.eagle.checkpoint_draft_lm`: distilled draft LMs stored without the target's tensors;
- :mod:`~specdec.drafts.eagle.shipped`: the heads and the draft LM shipped in ``specdec/assets``.
"""

from __future__ import annotations

from specdec.drafts.eagle.checkpoint_config import CheckpointError
from specdec.drafts.eagle.checkpoint_draft_lm import (
    PROPOSAL_IDS_FILE,
    draft_lm_proposal_ids,
    export_draft_lm,
    load_draft_lm,
)
from specdec.drafts.eagle.checkpoint_own import FORMAT, FORMAT_VERSION, load_head, save_head
from specdec.drafts.eagle.checkpoint_reference import (
    AUX_LAYER_CONVENTIONS,
    load_reference_head,
    reference_state_dict,
)
from specdec.drafts.eagle.checkpoint_speculators import save_speculators_head, speculators_state_dict
from specdec.drafts.eagle.checkpoint_weights import read_state_dict
from specdec.drafts.eagle.shipped import SHIPPED_DIR, load_shipped, shipped_draft_lm_path, shipped_head_path

__all__ = [
    "CheckpointError",
    "save_head",
    "load_head",
    "load_reference_head",
    "reference_state_dict",
    "save_speculators_head",
    "speculators_state_dict",
    "AUX_LAYER_CONVENTIONS",
    "read_state_dict",
    "shipped_head_path",
    "SHIPPED_DIR",
    "export_draft_lm",
    "load_draft_lm",
    "shipped_draft_lm_path",
    "load_shipped",
    "FORMAT",
    "FORMAT_VERSION",
    "PROPOSAL_IDS_FILE",
    "draft_lm_proposal_ids",
]
