"""How ``speculators_eagle3/`` and ``speculators_eagle3_expected.safetensors`` were made (not a test;
run by hand).

``speculators_eagle3/config.json`` and ``model.safetensors`` were written by the ``speculators``
package itself (PyPI ``speculators==0.9.0``, vllm-project/speculators):
``Eagle3DraftModel(Eagle3SpeculatorConfig(...)).save_pretrained(folder)``, for a
tiny LLaMA verifier (6 layers, hidden 32, vocabulary 53: the target of
``tests/drafts/test_speculators_checkpoints.py``), ``norm_before_residual=True``,
``eagle_aux_hidden_state_layer_ids=[1, 3, 4]``, a 64-position head and an
18-token draft vocabulary (target ids 0, 3, 6, ...). Weights are seeded
random values; ``embed_tokens.weight`` is the verifier's embedding.
``speculators_eagle3_expected.safetensors`` holds inputs and what speculators' own modules compute
from them (``fc``, the first decoder layer ``layers[0]`` with eager attention
and its rotary embedding, ``norm``, ``lm_head``), at depth 1 (target features)
and depth 2 (the layer's own output fed back, as vLLM and speculators do).

``import speculators`` 0.9.0 needs ``openai``, ``datasets`` and
``hs_connectors`` (its data-generation and training code) although the model
and config classes do not use them, and the package pins
``transformers<=5.19`` and ``torch<=2.14.1`` with torchvision/torchaudio; it was
therefore unpacked (``pip download --no-deps speculators==0.9.0``) onto
``PYTHONPATH`` with those three modules stubbed out, as below, against
transformers 5.24 and torch 2.13:

    PYTHONPATH=/path/to/unpacked/wheel python tests/drafts/data/make_speculators_eagle3.py
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch
import transformers  # noqa: F401  (the real modules before the stubs)

for _name in ("openai", "openai.types", "openai.types.chat", "openai.types.completion", "datasets", "hs_connectors"):
    _m = types.ModuleType(_name)
    _m.__path__ = []  # type: ignore[attr-defined]
    _m.__file__ = f"/stub/{_name}.py"
    _m.__getattr__ = lambda a: (_ for _ in ()).throw(AttributeError(a)) if a.startswith("__") else type(a, (), {})  # type: ignore[method-assign]
    sys.modules[_name] = _m

from safetensors.torch import save_file  # noqa: E402
from speculators import SpeculatorsConfig, VerifierConfig  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402
from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

V, T = 53, 7


def main(data: Path) -> None:
    out = data / "speculators_eagle3"
    torch.manual_seed(1)
    verifier = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                                            max_position_embeddings=128, rope_theta=5000.0)).eval()
    layer = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=5000.0,
                        tie_word_embeddings=False)
    layer._attn_implementation = "eager"
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=18, norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=[1, 3, 4],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="specdec-tests/tiny-llama-6l", architectures=["LlamaForCausalLM"])))
    m = Eagle3DraftModel(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g) + (1.0 if "norm" in name else 0.0))
        m.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight)
        ids = torch.arange(0, V, 3)
        m.d2t.copy_(ids - torch.arange(ids.numel()))
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        m.t2d.copy_(t2d)
    m.save_pretrained(str(out))
    (out / "config.py").unlink(missing_ok=True)  # the auto_map copy of speculators' config class: not needed
    features = torch.randn(1, T, 3 * 32, generator=g)
    tokens = torch.randint(0, V, (1, T), generator=g)
    positions = torch.arange(T)[None]
    mask = torch.zeros(T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    with torch.no_grad():
        emb = m.embed_tokens(tokens)
        x = torch.cat([emb, m.fc(features)], dim=-1)
        rope = m.rotary_emb(x, positions)
        h1 = m.layers[0](hidden_states=x, attention_mask=mask[None, None], position_ids=positions, position_embeddings=rope)
        h2 = m.layers[0](hidden_states=torch.cat([emb, h1], dim=-1), attention_mask=mask[None, None],
                         position_ids=positions, position_embeddings=rope)
        logits1, logits2 = m.lm_head(m.norm(h1)), m.lm_head(m.norm(h2))
    save_file({"features": features, "tokens": tokens, "h1": h1, "h2": h2, "logits1": logits1, "logits2": logits2},
              str(data / "speculators_eagle3_expected.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
