"""HFTarget: tree forwards equal plain forwards, KV compaction is exact, errors are clear."""

from __future__ import annotations

import random

import pytest
import torch
from hf_model_helpers import VOCAB, make_tiny_llama, plain_hidden, plain_logits, random_tree, tolerance

import specdec.models.hf_cache as hf_cache
import specdec.models.hf_common as hf_common
import specdec.models.hf_forward as hf_forward
from specdec.errors import ContextOverflowError, VocabMismatchError
from specdec.registry import get
from specdec.targets.hf import HFTarget
from specdec.tree import DraftTree, TreeAssembler

IMPLS = ["eager", "sdpa"]


def random_path(rng: random.Random, tree: DraftTree) -> list[int]:
    """A random accepted path from the root (possibly empty: everything rejected)."""
    path, node = [], 0
    while tree.children(node) and rng.random() < 0.75:
        node = rng.choice(tree.children(node))
        path.append(node)
    return path


def tree_errors(model, target: HFTarget, tree: DraftTree, logits: torch.Tensor) -> float:
    """Max |tree logits - plain forward over (context + path)| over every node."""
    context = list(target.committed_tokens)
    worst = 0.0
    for node in range(tree.num_nodes):
        sequence = context + [int(tree.tokens[i]) for i in tree.path_to(node)]
        worst = max(worst, float((logits[node].double() - plain_logits(model, sequence)).abs().max()))
    return worst


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("impl", IMPLS)
def test_score_tree_equals_plain_forward_at_every_node(impl, dtype):
    model = make_tiny_llama(impl, dtype, seed=1)
    target = HFTarget(model)
    rng = random.Random(7)
    target.prefill([rng.randrange(VOCAB) for _ in range(9)])
    for _step in range(4):
        tree = random_tree(rng, target.committed_tokens[-1], size=rng.randrange(1, 16))
        logits = target.score_tree(tree)
        assert logits.shape == (tree.num_nodes, VOCAB)
        assert logits.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert tree_errors(model, target, tree, logits) < tolerance(dtype)
        target.accept(random_path(rng, tree), rng.randrange(VOCAB))


@pytest.mark.parametrize("impl", IMPLS)
def test_kv_cache_after_many_steps_equals_fresh_forward(impl):
    """30 steps with random accepted paths (full rejections included): after
    every accept the next root's logits, and the cache itself, equal those of
    a fresh forward over the whole accepted sequence."""
    model = make_tiny_llama(impl, torch.float64, seed=2)
    target = HFTarget(model)
    rng = random.Random(11)
    target.prefill([3, 1, 4, 1, 5])
    rejections = 0
    for step in range(30):
        tree = random_tree(rng, target.committed_tokens[-1], size=rng.randrange(0, 12))
        logits = target.score_tree(tree)
        context = list(target.committed_tokens)
        assert float((logits[0].double() - plain_logits(model, context)).abs().max()) < 1e-5
        path = random_path(rng, tree)
        rejections += not path
        target.accept(path, rng.randrange(VOCAB))
        assert target.committed_tokens == tuple(context + [int(tree.tokens[i]) for i in path]) + target.committed_tokens[-1:]
        assert target.cache_length == len(target.committed_tokens) - 1
        if step % 10 == 9:  # the compacted cache equals a fresh prefill's cache
            fresh = HFTarget(model)
            fresh.prefill(target.committed_tokens)
            for mine, ref in zip(target._cache.tensors(), fresh._cache.tensors(), strict=True):
                assert mine.shape == ref.shape
                assert float((mine - ref).abs().max()) < 1e-5
    assert rejections >= 3  # the run exercised full rejections


def run_steps(target: HFTarget, model, seed: int, steps: int = 6) -> float:
    """Worst root-logit error over ``steps`` random steps (for the broken-variant checks)."""
    rng = random.Random(seed)
    target.prefill([rng.randrange(VOCAB) for _ in range(6)])
    worst = 0.0
    for _ in range(steps):
        tree = random_tree(rng, target.committed_tokens[-1], size=10)
        logits = target.score_tree(tree)
        worst = max(worst, tree_errors(model, target, tree, logits))
        target.accept(tree.path_to(tree.num_nodes - 1), rng.randrange(VOCAB))
    return worst


def test_harness_catches_broken_compaction():
    """A compactor that keeps a contiguous prefix instead of the accepted path is caught."""
    model = make_tiny_llama("sdpa", torch.float64, seed=3)

    def prefix_compactor(tensors, keep_index):
        return [t[..., : keep_index.numel(), :] for t in tensors]

    assert run_steps(HFTarget(model), model, seed=5) < 1e-5
    assert run_steps(HFTarget(model, kv_compactor=prefix_compactor), model, seed=5) > 1e-2


@pytest.mark.parametrize("impl", IMPLS)
def test_harness_catches_wrong_positions(impl, monkeypatch):
    """Positions by node index instead of past + depth are caught."""
    model = make_tiny_llama(impl, torch.float64, seed=3)
    real = hf_common.forward_tokens

    def index_positions(model_, cache, tokens, positions, allowed=None, **kw):
        start = int(torch.as_tensor(positions).min())
        return real(model_, cache, tokens, list(range(start, start + len(tokens))), allowed, **kw)

    monkeypatch.setattr("specdec.targets.hf.forward_tokens", index_positions)
    assert run_steps(HFTarget(model), model, seed=6) > 1e-2


def test_harness_catches_boolean_mask_on_eager(monkeypatch):
    """The reason for float masks: a 4D boolean mask is added to the scores by
    the eager path (True -> +1, False -> 0), silently wrong; the test sees it."""
    model = make_tiny_llama("eager", torch.float64, seed=3)
    monkeypatch.setattr(hf_forward, "additive_mask", lambda allowed, dtype: allowed[None, None])
    try:
        error = run_steps(HFTarget(model), model, seed=6)
    except Exception:  # a transformers version that rejects boolean masks also counts as caught
        return
    assert error > 1e-2


def test_one_token_prompt_caches_nothing():
    model = make_tiny_llama("sdpa", torch.float64)
    target = HFTarget(model)
    target.prefill([42])
    assert target.cache_length == 0
    tree = DraftTree.chain(42, [], [], vocab_size=VOCAB)
    logits = target.score_tree(tree)
    assert float((logits[0] - plain_logits(model, [42])).abs().max()) < 1e-9
    target.accept([], 7)
    assert target.cache_length == 1 and target.committed_tokens == (42, 7)


def test_rescoring_discards_the_previous_tree():
    model = make_tiny_llama("sdpa", torch.float64)
    target = HFTarget(model)
    rng = random.Random(0)
    target.prefill([1, 2, 3, 4])
    first = random_tree(rng, 4, 8)
    target.score_tree(first)
    second = random_tree(rng, 4, 5)
    logits = target.score_tree(second)
    assert target.cache_length == 3 + second.num_nodes
    assert tree_errors(model, target, second, logits) < 1e-5
    target.accept(second.path_to(second.num_nodes - 1), 9)
    assert target.cache_length == len(target.committed_tokens) - 1


@pytest.mark.parametrize("impl", IMPLS)
def test_hidden_state_capture(impl):
    model = make_tiny_llama(impl, torch.float64, seed=4)
    target = HFTarget(model, capture_layers=(0, 1, -1))
    assert target.capture_layers == (0, 1, 2)
    prompt = [5, 9, 11, 2, 7]
    target.prefill(prompt)
    ref = plain_hidden(model, prompt[:-1])
    hidden = target.hidden_states()
    assert hidden.shape == (4, 3, 64)
    for j, layer in enumerate((0, 1, 2)):
        assert float((hidden[:, j] - ref[layer]).abs().max()) < 1e-5
    tree = random_tree(random.Random(3), prompt[-1], 9)
    target.score_tree(tree)
    hidden = target.hidden_states()
    assert hidden.shape == (tree.num_nodes, 3, 64)
    for node in range(tree.num_nodes):
        states = plain_hidden(model, prompt + [int(tree.tokens[i]) for i in tree.path_to(node)])
        for j, layer in enumerate((0, 1, 2)):
            assert float((hidden[node, j] - states[layer][-1]).abs().max()) < 1e-5
    assert HFTarget(model).hidden_states() is None


def test_one_token_prompt_capture_is_empty():
    target = HFTarget(make_tiny_llama(), capture_layers=(2,))
    target.prefill([3])
    assert target.hidden_states().shape == (0, 1, 64)


def test_registered_and_reports_model_facts():
    assert get("target", "hf") is HFTarget
    target = HFTarget(make_tiny_llama(max_positions=64))
    assert target.vocab_size == VOCAB and target.max_length == 64


# ----------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors():
    model = make_tiny_llama(max_positions=16)
    target = HFTarget(model)
    with pytest.raises(RuntimeError, match="before prefill"):
        target.score_tree(DraftTree.chain(1, [], [], vocab_size=VOCAB))
    with pytest.raises(ValueError, match="at least one token"):
        target.prefill([])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        target.prefill([1, VOCAB])
    with pytest.raises(ContextOverflowError):
        target.prefill(list(range(17)))
    target.prefill(list(range(10)))
    with pytest.raises(RuntimeError, match="before score_tree"):
        target.accept([], 1)
    with pytest.raises(ValueError, match="root token"):
        target.score_tree(DraftTree.chain(3, [], [], vocab_size=VOCAB))
    with pytest.raises(VocabMismatchError):
        target.score_tree(DraftTree.chain(9, [], [], vocab_size=VOCAB + 1))
    deep = TreeAssembler(9, VOCAB)
    node = 0
    for t in range(7):  # root at position 9, depth 7 -> position 16 >= 16
        node = deep.add_deterministic(node, t, 0.5)
    with pytest.raises(ContextOverflowError, match="position 16"):
        target.score_tree(deep.build())
    asm = TreeAssembler(9, VOCAB)
    a = asm.add_deterministic(0, 1, 0.5)
    b = asm.add_deterministic(0, 2, 0.4)
    c = asm.add_deterministic(a, 3, 0.3)
    target.score_tree(asm.build())
    for bad in ([0], [a, b], [c], [b, c], [7]):
        with pytest.raises(ValueError, match="not a path"):
            target.accept(bad, 1)
    with pytest.raises(ValueError, match="bonus_token"):
        target.accept([], VOCAB)
    target.accept([], 1)  # still usable after the rejected calls
    assert target.committed_tokens[-1] == 1 and target.cache_length == 10
    with pytest.raises(ValueError, match="capture_layers"):
        HFTarget(model, capture_layers=(3,))


# ------------------------------------------------------------ architectures
def tiny_architecture(name: str, impl: str):
    import transformers

    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
    )
    configs = {
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
        "gemma": lambda: transformers.GemmaConfig(**common, head_dim=16),
        "phi3": lambda: transformers.Phi3Config(**common, pad_token_id=0),
        "gpt2": lambda: transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=0.2,
            bos_token_id=0, eos_token_id=0,
        ),
        "mistral-sliding": lambda: transformers.MistralConfig(**common, sliding_window=8),
    }
    torch.manual_seed(0)
    config = configs[name]()
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval().double()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arch", ["qwen2", "mistral", "gemma", "phi3", "gpt2", "mistral-sliding"])
def test_other_architectures_without_forked_modeling_code(arch, impl):
    model = tiny_architecture(arch, impl)
    if getattr(model, "_supports_cache_class", True) is False:  # GPT-2 in old transformers
        with pytest.raises(NotImplementedError, match="Cache object"):
            HFTarget(model).prefill([1, 2])
        return
    assert run_steps(HFTarget(model), model, seed=8, steps=2) < 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_small_trees_scored_padded_equal_unpadded(impl, monkeypatch):
    """On CPU trees of 2-3 nodes are scored padded to 4 tokens (a faster matrix
    path); logits, captured features and the cache after accept must equal the
    unpadded forward's, and the padding must really reach the model."""
    model = make_tiny_llama(impl, torch.float64, seed=5)
    padded, plain = HFTarget(model, capture_layers=(1, -1)), HFTarget(model, capture_layers=(1, -1), min_tree_tokens=1)
    assert padded.min_tree_tokens == 4
    sizes: list[int] = []
    real = hf_common.forward_tokens

    def spy(model_, cache, tokens, *args, **kwargs):
        sizes.append(len(tokens))
        return real(model_, cache, tokens, *args, **kwargs)

    monkeypatch.setattr("specdec.targets.hf.forward_tokens", spy)
    rng = random.Random(5)
    prompt = [rng.randrange(VOCAB) for _ in range(7)]
    padded.prefill(prompt)
    plain.prefill(prompt)
    for step in range(12):
        tree = random_tree(rng, padded.committed_tokens[-1], size=1 + step % 3)  # 2..4 nodes, root included
        sizes.clear()
        a, b = padded.score_tree(tree), plain.score_tree(tree)
        assert sizes == [max(tree.num_nodes, 4) if tree.num_nodes > 1 else 1, tree.num_nodes]
        # (not bit-equal: HF computes rotary angles in float32, and the BLAS path depends on the row count)
        assert a.shape == b.shape and float((a - b).abs().max()) < 1e-5
        assert padded.hidden_states().shape == plain.hidden_states().shape
        assert float((padded.hidden_states() - plain.hidden_states()).abs().max()) < 1e-5
        path, bonus = random_path(rng, tree), rng.randrange(VOCAB)
        padded.accept(path, bonus)
        plain.accept(path, bonus)
        assert padded.cache_length == plain.cache_length == len(plain.committed_tokens) - 1
        for mine, ref in zip(padded._cache.tensors(), plain._cache.tensors(), strict=True):
            assert float((mine - ref).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="min_tree_tokens"):
        HFTarget(model, min_tree_tokens=0)


def test_generation_reserves_the_kv_slabs_once(monkeypatch):
    """The generator sizes the target's and the draft's preallocated caches
    from its bound (prompt + new tokens + depth): with a minimum far below
    it, no slab grows during generation, and the next generation reuses them."""
    import specdec
    from specdec.drafts.hf import HFDraft

    monkeypatch.setattr(hf_cache, "MIN_CAPACITY", 4)
    grown = []
    original = hf_common.KVSlab.grow
    monkeypatch.setattr(hf_common.KVSlab, "grow", lambda self, needed: (grown.append(needed), original(self, needed)))
    target = HFTarget(make_tiny_llama("sdpa", torch.float64, seed=0))
    draft = HFDraft(make_tiny_llama("sdpa", torch.float64, seed=1))
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="specinfer")
    out = gen.generate([5, 6, 7], 24, specdec.SamplingConfig(temperature=1.0), seed=0)
    assert len(out.tokens) == 24 and grown == []
    slabs = [s.buf.data_ptr() for s in target._cache.slabs + draft._cache.slabs]
    gen.generate([8, 9], 20, specdec.SamplingConfig(temperature=1.0), seed=1)
    assert [s.buf.data_ptr() for s in target._cache.slabs + draft._cache.slabs] == slabs and grown == []


def test_a_device_map_target_runs_through_the_hooks_with_one_slab_per_device():
    """What of a ``device_map`` target runs on a CPU: accelerate's dispatch
    hooks around every layer (here all on the CPU), ``hf_device_map`` read for
    the slab's layer count, greedy tokens equal to the plain model's. The
    split over two GPUs is in ``benchmarks/gpu_check.py`` (``multi_gpu``)."""
    accelerate = pytest.importorskip("accelerate")
    import specdec
    from specdec.drafts.hf import HFDraft

    layers = 3
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    device_map.update({f"model.layers.{i}": "cpu" for i in range(layers)})
    assert hf_cache._layers_per_device(type("M", (), {"hf_device_map": device_map})()) == {"cpu": layers}
    outs = []
    for split in (False, True):
        model = make_tiny_llama("sdpa", torch.float64, seed=0, layers=layers)
        if split:
            model = accelerate.dispatch_model(model, device_map=device_map)
            model.hf_device_map = device_map
        target = HFTarget(model, capture_layers=(1, 3))
        draft = HFDraft(make_tiny_llama("sdpa", torch.float64, seed=1))
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="specinfer")
        outs.append(gen.generate([5, 6, 7], 16, specdec.SamplingConfig(temperature=0.0), seed=0).tokens)
        assert len(target._cache.slabs) == 1 and target._cache.slabs[0].slots == layers
        assert target.hidden_states().shape[1:] == (2, 64)
    assert outs[0] == outs[1]
