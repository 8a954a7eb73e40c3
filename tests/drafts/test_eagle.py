"""EAGLE-2 / EAGLE-3 heads as drafts: shapes, tree drafting vs chains, cache catch-up,
training-time-test consistency, bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec.drafts.eagle import (
    Eagle2Draft,
    Eagle3Draft,
    EagleConfig,
    EagleDraft,
    eagle3_target_layers,
    hf_feature_fn,
    make_draft,
)
from specdec.errors import InvalidConfigError, VocabMismatchError
from specdec.registry import get
from specdec.train.trainer import eagle3_ttt_forward, new_head
from specdec.trees import build_tree
from specdec.trees.dynamic import dynamic_reference

V = 61


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=V, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def _head(target, version):
    vocab = torch.arange(1, V, 2) if version == 3 else None
    head = new_head(target, version, draft_vocab=vocab, seed=version)
    with torch.no_grad():  # random, non-trivial weights everywhere
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return head


def _draft(target, version):
    head = _head(target, version)
    return make_draft(head, feature_fn=hf_feature_fn(target, head.config.target_layers))


PROMPT = [3, 14, 15, 9, 26, 5]


@pytest.mark.parametrize("version", [2, 3])
def test_registered_and_shapes(target, version):
    d = _draft(target, version)
    assert type(d) is get("draft", f"eagle{version}")
    d.begin(PROMPT)
    assert d.committed_pairs == len(PROMPT) - 1
    assert d.root_logits().shape == (V,)
    out = d.tree_logits([0, 0, 0], [1, 2, 3])
    assert out.shape == (3, V)
    assert d.tree_logits([1, 3], [4, 5]).shape == (2, V)
    assert d.tree_logits([], []).shape == (0, V)


def test_eagle3_logits_outside_draft_vocab_are_impossible(target):
    d = _draft(target, 3)
    d.begin(PROMPT)
    root = d.root_logits()
    in_vocab = torch.zeros(V, dtype=torch.bool)
    in_vocab[torch.arange(1, V, 2)] = True
    assert torch.isneginf(root[~in_vocab]).all() and torch.isfinite(root[in_vocab]).all()
    q = d.root_distribution(__import__("specdec").SamplingConfig(temperature=1.0))
    assert q[~in_vocab].sum() == 0 and abs(q.sum().item() - 1) < 1e-5


@pytest.mark.parametrize("version", [2, 3])
def test_tree_level_equals_chain(target, version):
    """Drafting a whole level in one forward with the tree mask gives what each
    node's chain alone gives: siblings and cousins do not leak into each other."""
    d = _draft(target, version)
    d.begin(PROMPT)
    d.root_logits()
    lvl1 = d.tree_logits([0, 0, 0], [7, 8, 9])  # nodes 1, 2, 3
    lvl2 = d.tree_logits([1, 3, 1, 2], [10, 11, 12, 13])  # nodes 4..7
    lvl3 = d.tree_logits([7, 4], [20, 21])  # nodes 8, 9
    for path, want in [([7, 10, 21], lvl3[1]), ([8, 13, 20], lvl3[0]), ([9, 11], lvl2[1]), ([7, 12], lvl2[2]),
                       ([8], lvl1[1])]:
        chain = _draft(target, version)
        chain.head.load_state_dict(d.head.state_dict())
        chain.begin(PROMPT)
        chain.root_logits()
        got = None
        for i, tok in enumerate(path):
            got = chain.tree_logits([i], [tok])[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("version", [2, 3])
def test_commit_catches_up_to_fresh_begin(target, version):
    """After a step, the cache equals one built from scratch on the longer context
    (tree pairs, made from draft features, are replaced by target-feature pairs)."""
    d = _draft(target, version)
    fn = hf_feature_fn(target, d.target_layers)
    d.begin(PROMPT)
    d.root_logits()
    d.tree_logits([0, 0], [30, 31])
    d.tree_logits([1], [32])
    accepted, bonus = [30, 32], 40
    ctx = PROMPT + accepted
    feats = fn(ctx)  # features at root (PROMPT[-1]) and accepted nodes
    d.commit(accepted + [bonus], target_hidden=feats[len(PROMPT) - 1:])
    fresh = _draft(target, version)
    fresh.head.load_state_dict(d.head.state_dict())
    fresh.begin(ctx + [bonus])
    assert d.committed_pairs == fresh.committed_pairs == len(ctx)
    torch.testing.assert_close(d.root_logits(), fresh.root_logits(), atol=1e-4, rtol=1e-4)
    # and the next tree drafts identically
    torch.testing.assert_close(d.tree_logits([0], [2]), fresh.tree_logits([0], [2]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("version", [2, 3])
def test_kv_buffer_is_written_in_place_and_grows_exactly(target, version, monkeypatch):
    """The head's keys and values live in one preallocated buffer: a reserved
    draft never reallocates over a step; a draft whose buffer is far too small
    grows it mid-tree and drafts exactly what the reserved one drafts."""
    import specdec.drafts.eagle.draft as draft_module

    fn = hf_feature_fn(target, _draft(target, version).target_layers)
    outs = {}
    for capacity in ("reserved", "tiny"):
        if capacity == "tiny":
            monkeypatch.setattr(draft_module, "MIN_CAPACITY", 2)
        d = _draft(target, version)
        if capacity == "tiny":  # the same head
            d.head.load_state_dict(outs["reserved"][1])
        if capacity == "reserved":
            d.reserve(64)
        d.begin(PROMPT)
        buffer = d._kv.data_ptr()
        got = [d.root_logits(), d.tree_logits([0, 0], [30, 31]), d.tree_logits([1, 2, 1], [32, 33, 34])]
        d.commit([30, 32, 40], target_hidden=fn(PROMPT + [30, 32])[len(PROMPT) - 1 :])
        got += [d.root_logits(), d.tree_logits([0], [2])]
        assert (d._kv.data_ptr() == buffer) == (capacity == "reserved")
        outs[capacity] = (got, d.head.state_dict())
    for a, b in zip(outs["reserved"][0], outs["tiny"][0], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _padded_features(fn, contexts):
    """``[B, S, L, H]`` features of every row's tokens, zero padded."""
    feats = [fn(c) if c else None for c in contexts]
    width = max(1, *(f.shape[0] for f in feats if f is not None))
    like = next(f for f in feats if f is not None)
    out = torch.zeros(len(contexts), width, *like.shape[1:], dtype=like.dtype)
    for b, f in enumerate(feats):
        if f is not None:
            out[b, : f.shape[0]] = f
    return out


@pytest.mark.parametrize("version", [2, 3])
def test_rows_mode_drafts_what_each_row_drafts_alone(target, version):
    """Rows of different lengths in one buffer: root logits, each tree level,
    a commit of different lengths per row and a row leaving the batch all give
    what the row's own single-mode draft gives."""
    prompts = [PROMPT, [7], [2, 9, 4]]
    d = _draft(target, version)
    fn = hf_feature_fn(target, d.target_layers)
    d.begin_rows(prompts, _padded_features(fn, [p[:-1] for p in prompts]))
    assert d.rows_mode and d.batch_size == 3
    singles = []
    for p in prompts:
        one = _draft(target, version)
        one.head.load_state_dict(d.head.state_dict())
        one.begin(p)
        singles.append(one)

    def close(batched, wanted):
        torch.testing.assert_close(batched, wanted, atol=1e-5, rtol=1e-5)

    root = d.root_rows_logits()
    lvl1 = d.tree_rows_logits(torch.tensor([[0, 0], [0, 0], [0, 0]]), torch.tensor([[30, 31], [5, 6], [7, 8]]))
    lvl2 = d.tree_rows_logits(torch.tensor([[1, 2], [2, 2], [1, 1]]), torch.tensor([[32, 33], [9, 10], [11, 12]]))
    for b, one in enumerate(singles):
        close(root[b], one.root_logits())
        close(lvl1[b], one.tree_logits([0, 0], [[30, 31], [5, 6], [7, 8]][b]))
        close(lvl2[b], one.tree_logits([[1, 2], [2, 2], [1, 1]][b], [[32, 33], [9, 10], [11, 12]][b]))
    if version == 3:
        close(d.root_rows_logits(proposal=True)[0], singles[0].root_proposal_logits())
    emitted = [[30, 32, 40], [6], [7, 11]]  # accepted + bonus, per row
    accepted = [[30, 32], [], [7]]
    contexts = [p + a for p, a in zip(prompts, accepted)]
    feats = [fn(c)[len(p) - 1 :] for c, p in zip(contexts, prompts)]
    hidden = torch.zeros(3, 3, *feats[0].shape[1:], dtype=feats[0].dtype)
    for b, f in enumerate(feats):
        hidden[b, : f.shape[0]] = f
    d.commit_rows(emitted, hidden)
    for b, one in enumerate(singles):
        one.commit(emitted[b], target_hidden=feats[b])
    root = d.root_rows_logits()
    nxt = d.tree_rows_logits(torch.zeros(3, 1, dtype=torch.long), torch.tensor([[2], [3], [4]]))
    for b, one in enumerate(singles):
        assert one.committed_pairs == d._rpairs[b]
        close(root[b], one.root_logits())
        close(nxt[b], one.tree_logits([0], [[2], [3], [4]][b]))
    d.keep_rows([2, 0])
    root = d.root_rows_logits()
    close(root[0], singles[2].root_logits())
    close(root[1], singles[0].root_logits())


def test_begin_accepts_features_of_whole_prompt_and_one_token_prompt(target):
    d = _draft(target, 2)
    fn = hf_feature_fn(target, d.target_layers)
    d.begin(PROMPT, target_hidden=fn(PROMPT))  # [m, L, H]: last row ignored
    a = d.root_logits()
    d.begin(PROMPT)
    torch.testing.assert_close(a, d.root_logits())
    d.begin([4])
    assert d.root_logits().shape == (V,)


def test_ttt_forward_matches_inference_chains(target):
    """The training-time-test unroll computes exactly what drafting a chain does
    at inference: step j at column i = the depth-j node of the chain rooted at
    pair i whose tokens are the ground truth."""
    head = _head(target, 3)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])
    fn = hf_feature_fn(target, head.config.target_layers)
    feats = fn(ids[0].tolist()).reshape(1, ids.shape[1], -1)
    with torch.no_grad():
        outs = eagle3_ttt_forward(head, feats, ids, steps=3)
    d = make_draft(head, feature_fn=fn)
    toks = ids[0].tolist()
    for i in (0, 3, 5):
        d.begin(toks[: i + 2])  # committed pairs 0..i, root = x_{i+1}
        torch.testing.assert_close(d.root_logits(), head.full_logits(outs[0][0, i]), atol=1e-4, rtol=1e-4)
        got1 = d.tree_logits([0], [toks[i + 2]])[0]
        torch.testing.assert_close(got1, head.full_logits(outs[1][0, i]), atol=1e-4, rtol=1e-4)
        got2 = d.tree_logits([1], [toks[i + 3]])[0]
        torch.testing.assert_close(got2, head.full_logits(outs[2][0, i]), atol=1e-4, rtol=1e-4)


def test_bad_input(target):
    d = _draft(target, 3)
    with pytest.raises(InvalidConfigError):
        d.begin([])
    d.begin(PROMPT)
    d.root_logits()
    with pytest.raises(ValueError):
        d.tree_logits([5], [1])  # unknown parent
    with pytest.raises(ValueError):
        d.tree_logits([0], [V])  # token outside vocabulary
    with pytest.raises(InvalidConfigError):
        d.commit([1, 2])  # no target features
    with pytest.raises(VocabMismatchError):
        d.commit([1, 2], target_hidden=torch.zeros(2, 1, 32))  # one layer, EAGLE-3 needs three
    with pytest.raises(InvalidConfigError):
        Eagle2Draft(d.head)  # version mismatch
    nofeat = Eagle3Draft(d.head)
    with pytest.raises(InvalidConfigError):
        nofeat.begin(PROMPT)
    with pytest.raises(InvalidConfigError):
        EagleConfig(version=4, hidden_size=8, intermediate_size=8, num_attention_heads=2, num_key_value_heads=2,
                    head_dim=4, vocab_size=10, draft_vocab_size=10, target_layers=(1,), target_hidden_size=8)
    assert isinstance(d, EagleDraft)


def test_target_layers():
    assert eagle3_target_layers(30) == (2, 15, 27)
    assert eagle3_target_layers(32) == (2, 16, 29)
    assert eagle3_target_layers(4) == (1, 2, 2)


@pytest.mark.parametrize("version", [2, 3])
def test_greedy_generation_is_exact_with_hf_target(target, version):
    """End to end with the library's HF target (capturing the head's layers): at
    T=0 an EAGLE draft changes nothing in the output."""
    pytest.importorskip("specdec.targets.hf")
    import specdec
    from specdec.targets.hf import HFTarget

    d = _draft(target, version)
    t = HFTarget(target, capture_layers=d.target_layers)
    ref = specdec.autoregressive_generate(HFTarget(target), PROMPT, max_new_tokens=12,
                                          sampling=specdec.SamplingConfig(temperature=0.0))
    gen = specdec.SpeculativeGenerator(target=t, draft=d, method="eagle2" if version == 2 else "eagle3")
    out = gen.generate(PROMPT, max_new_tokens=12, sampling=specdec.SamplingConfig(temperature=0.0))
    assert out.tokens == ref.tokens


@pytest.mark.parametrize("version", [2, 3])
def test_generator_wires_target_features_for_a_raw_hf_model(target, version):
    """Given the Hugging Face model itself, the generator builds a target that
    captures the head's layers and seeds the head with the prompt's features
    (no fallback forward); a pre-built target that captures other layers is refused."""
    import specdec
    from specdec.errors import InvalidConfigError
    from specdec.targets.hf import HFTarget

    head = _head(target, version)
    d = make_draft(head)  # no feature_fn: the prompt's features must come from the target
    gen = specdec.SpeculativeGenerator(target=target, draft=d, method="rheo", K=3, depth=3, N=8)
    assert gen.target.capture_layers == d.target_layers
    greedy = specdec.SamplingConfig(temperature=0.0)
    ref = specdec.autoregressive_generate(target, PROMPT, 12, greedy)
    assert gen.generate(PROMPT, 12, greedy).tokens == ref.tokens
    with pytest.raises(InvalidConfigError, match="hidden states"):
        specdec.SpeculativeGenerator(target=HFTarget(target), draft=d, method="eagle2")


def test_eagle3_proposal_logits_are_the_draft_vocabulary_columns(target):
    d = _draft(target, 3)
    ids = d.proposal_ids
    assert torch.equal(ids, torch.arange(1, V, 2))
    assert _draft(target, 2).proposal_ids is None
    d.begin(PROMPT)
    assert torch.equal(d.root_proposal_logits(), d.root_logits()[ids])
    full = d.tree_logits([0, 0], [1, 2])
    d.begin(PROMPT)
    d.root_logits()
    reduced = d.tree_proposal_logits([0, 0], [1, 2])
    assert reduced.shape == (2, ids.numel()) and torch.equal(reduced, full[:, ids])


@pytest.mark.parametrize("method", ["eagle3", "rheo"])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_eagle3_trees_proposed_in_the_draft_vocabulary_equal_the_full_vocabulary_reference(target, method, temperature):
    """The tensor builders rank and draw an EAGLE-3 head's q over its Vd columns
    and map ids once per level; the per-node reference works over the full
    vocabulary. Same draws, same tree (laws equal to rounding: the softmax sums
    run over Vd and V entries)."""
    import specdec
    from specdec.rng import RandomSource, TorchRandom

    class RowByRow(TorchRandom):
        categorical_rows = RandomSource.categorical_rows

    builder, _ = specdec.methods.resolve_method(method).build(K=3, depth=3, N=8)
    sampling = specdec.SamplingConfig(temperature=temperature, top_k=20 if temperature == 0.7 else 0)
    for seed in range(3):
        d = _draft(target, 3)
        d.begin(PROMPT[: 3 + seed])
        fast = build_tree(builder, PROMPT[2 + seed], d, sampling, RowByRow(torch.Generator().manual_seed(seed)))
        d.begin(PROMPT[: 3 + seed])
        ref = dynamic_reference(builder, PROMPT[2 + seed], d, sampling, RowByRow(torch.Generator().manual_seed(seed)))
        for name in ("tokens", "parents", "kinds", "draw_order", "law_index"):
            assert torch.equal(getattr(fast, name), getattr(ref, name)), name
        assert torch.allclose(fast.weights, ref.weights, rtol=1e-6, atol=0)
        for la, lb in zip(fast.laws, ref.laws, strict=True):
            assert torch.equal(la.indices, lb.indices) and torch.allclose(la.probs, lb.probs, rtol=1e-6, atol=0)
        assert set(fast.tokens[1:].tolist()) <= set(range(1, V, 2))  # only draft-vocabulary tokens are proposed
