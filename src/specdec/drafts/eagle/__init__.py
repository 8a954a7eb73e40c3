"""EAGLE-2 and EAGLE-3 feature-level draft heads, as :class:`~specdec.drafts.base.DraftModel`.

Words used here (EAGLE papers, Li et al. 2024/2025):

* **feature** ``f_i``: the target's hidden state(s) at position ``i`` (the
  state from which the target predicts token ``x_{i+1}``). EAGLE-2 uses the
  target's last hidden state after its final norm (``hidden_states[N]`` in the
  Hugging Face convention, ``N`` = number of layers); EAGLE-3 concatenates three
  layers' *inputs* ``hidden_states[l]`` for ``l`` in (2, N//2, N-3) (low,
  middle, high).
* **pair** ``(f_{i-1}, x_i)``: one input position of the head: the feature of
  the previous position fused with the embedding of the current token. The
  head's output ``h_i`` at that pair is its guess of the next feature, and its
  logits are the draft law of ``x_{i+1}``.
* **committed pairs**: pairs built from *target* features; they live in the
  head's KV cache. **Tree pairs** are built from the head's *own* outputs
  ``h`` (the target has not scored those tokens yet); they live in a per-step
  buffer that :meth:`EagleDraft.commit` drops and replaces by the committed
  pairs of the accepted tokens, recomputed with the target's true features
  ("catching up" the cache).

Architectures (key names follow the reference checkpoints, see
:mod:`specdec.drafts.eagle.checkpoints`):

* EAGLE-2: ``x = fc([emb(x_i); f_{i-1}])`` (2H -> H, with bias), one LLaMA
  decoder layer *without* input norm, and the target's own LM head applied to
  the layer output directly.
* EAGLE-3: ``g = fc([f^low; f^mid; f^high])`` (3H -> H, no bias) for target
  features (the head's own outputs ``h`` are used as-is), one decoder layer
  whose attention input is ``[input_layernorm(emb(x_i)); hidden_norm(g)]``
  (2H wide) with residual ``g`` (``hidden_norm(g)`` with ``norm_before_residual``,
  as vLLM and speculators allow), then its own ``norm`` and ``lm_head`` over a
  reduced draft vocabulary of ``Vd`` tokens; ``d2t[j]`` maps draft id ``j`` to
  target id ``j + d2t[j]``. Verification still happens in the target's full
  vocabulary: :meth:`EagleDraft.tree_logits` returns ``[k, V]`` logits with
  ``-inf`` at target tokens outside the draft vocabulary.

Integration with the generation loop (see :class:`EagleDraft`): the target
must capture ``hidden_states[l]`` for ``l`` in :attr:`EagleDraft.target_layers`
and pass them as ``target_hidden`` (``[n, L, H]``) to :meth:`EagleDraft.begin`
(the prompt's features) and :meth:`EagleDraft.commit` (features at the step's
root and accepted nodes).

The package is split by role: :mod:`~specdec.drafts.eagle.head` (the
``nn.Module`` and its config), :mod:`~specdec.drafts.eagle.draft` (the head as a
:class:`~specdec.drafts.base.DraftModel`, registered as ``"eagle2"`` /
``"eagle3"``) and :mod:`~specdec.drafts.eagle.checkpoints` (files in and out).
"""

from specdec.drafts.eagle.checkpoints import load_shipped
from specdec.drafts.eagle.draft import Eagle2Draft, Eagle3Draft, EagleDraft, FeatureFn, hf_feature_fn, make_draft
from specdec.drafts.eagle.head import (
    EagleConfig,
    EagleHead,
    apply_rope,
    attend,
    eagle3_target_layers,
    rope_cos_sin,
    target_embeddings,
)

__all__ = [
    "EagleConfig",
    "EagleHead",
    "EagleDraft",
    "Eagle2Draft",
    "Eagle3Draft",
    "FeatureFn",
    "eagle3_target_layers",
    "hf_feature_fn",
    "make_draft",
    "load_shipped",
    "rope_cos_sin",
    "apply_rope",
    "attend",
    "target_embeddings",
]
