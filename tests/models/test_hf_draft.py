"""HFDraft: root and tree-level logits equal plain forwards over the
corresponding prefixes, across steps and commits; KV reuse of committed tree
nodes is exact; errors are clear."""

from __future__ import annotations

import random

import pytest
import torch
from hf_model_helpers import VOCAB, make_tiny_llama, plain_logits, tolerance

from specdec.drafts.hf import HFDraft
from specdec.errors import ContextOverflowError, VocabMismatchError
from specdec.models.hf_common import check_vocab_match
from specdec.registry import get
from specdec.sampling import SamplingConfig


def draft_steps(model, draft: HFDraft, seed: int, steps: int, tol: float) -> dict[str, int]:
    """Random steps: root, 1-4 tree levels of random shape, commit of emitted
    tokens that follow a tree path for a random length (then diverge or stop).
    Every logit row is compared with a plain forward. Returns counters."""
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 8))]
    draft.begin(prompt)
    context = list(prompt)
    counts = {"reused": 0, "pending": 0}
    for _ in range(steps):
        root = draft.root_logits()
        assert root.shape == (VOCAB,)
        assert float((root.double() - plain_logits(model, context)).abs().max()) < tol
        assert draft.cache_length == len(context)
        paths: list[list[int]] = [[]]  # node id -> tokens below the root
        newest = [0]
        for _level in range(rng.randrange(1, 5)):
            parents, tokens = [], []
            for p in newest:
                for t in rng.sample(range(VOCAB), rng.randrange(1, 4)):
                    parents.append(p)
                    tokens.append(t)
            logits = draft.tree_logits(parents, tokens)
            assert logits.shape == (len(tokens), VOCAB)
            first = len(paths)
            for p, t in zip(parents, tokens):
                paths.append(paths[p] + [t])
            for j in range(len(tokens)):
                ref = plain_logits(model, context + paths[first + j])
                assert float((logits[j].double() - ref).abs().max()) < tol
            newest = rng.sample(range(first, len(paths)), min(2, len(paths) - first))
        # emitted = a tree path's prefix, then maybe a token off the tree
        path = rng.choice(paths)
        emitted = path[: rng.randrange(0, len(path) + 1)] + [rng.randrange(VOCAB)]
        before = len(context)
        draft.commit(emitted)
        context += emitted
        reused = draft.cache_length - before
        assert 0 <= reused <= len(emitted) - 1
        counts["reused"] += reused
        counts["pending"] += len(emitted) - reused
        assert draft.committed_tokens == tuple(context)
    return counts


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_draft_logits_equal_plain_forwards_across_commits(impl, dtype):
    model = make_tiny_llama(impl, dtype, seed=5)
    counts = draft_steps(model, HFDraft(model), seed=17, steps=8, tol=tolerance(dtype))
    assert counts["reused"] > 0  # committed tree nodes' KV were kept and reused


def test_harness_catches_a_broken_kv_reuse():
    """Keeping the first tree slots instead of the matched nodes' slots is caught."""
    model = make_tiny_llama("sdpa", torch.float64, seed=5)

    def prefix_compactor(tensors, keep_index):
        return [t[..., : keep_index.numel(), :] for t in tensors]

    with pytest.raises(AssertionError):
        draft_steps(model, HFDraft(model, kv_compactor=prefix_compactor), seed=17, steps=8, tol=1e-5)


def test_tree_logits_without_root_logits_first():
    model = make_tiny_llama("sdpa", torch.float64)
    draft = HFDraft(model)
    draft.begin([4, 5, 6])
    logits = draft.tree_logits([0], [7])  # the root is cached implicitly
    assert float((logits[0] - plain_logits(model, [4, 5, 6, 7])).abs().max()) < 1e-9
    assert float((draft.root_logits() - plain_logits(model, [4, 5, 6])).abs().max()) < 1e-9


def test_commit_keeps_only_the_matching_path_and_leaves_the_last_token_pending():
    model = make_tiny_llama("sdpa", torch.float64)
    draft = HFDraft(model)
    draft.begin([1, 2])
    draft.root_logits()
    draft.tree_logits([0, 0], [10, 11])  # nodes 1, 2
    draft.tree_logits([2, 1], [12, 13])  # nodes 3 (11->12), 4 (10->13)
    assert draft.num_tree_nodes == 4 and draft.cache_length == 6
    draft.commit([11, 12])  # whole emission is in the tree: 11 reused, 12 pending
    assert draft.num_tree_nodes == 0 and draft.cache_length == 3
    assert float((draft.root_logits() - plain_logits(model, [1, 2, 11, 12])).abs().max()) < 1e-9
    draft.tree_logits([0], [20])
    draft.commit([21, 22])  # off the tree: nothing reused
    assert draft.cache_length == 4
    assert float((draft.root_logits() - plain_logits(model, [1, 2, 11, 12, 21, 22])).abs().max()) < 1e-9


def test_empty_commit_drops_the_tree_and_keeps_the_root():
    model = make_tiny_llama("sdpa", torch.float64)
    draft = HFDraft(model)
    draft.begin([1, 2, 3])
    root = draft.root_logits()
    draft.tree_logits([0, 0], [5, 6])
    draft.commit([])
    assert draft.cache_length == 3 and draft.num_tree_nodes == 0
    assert torch.equal(draft.root_logits(), root)
    assert float((draft.tree_logits([0], [9])[0] - plain_logits(model, [1, 2, 3, 9])).abs().max()) < 1e-9


def test_processed_laws_through_the_base_class():
    model = make_tiny_llama("sdpa", torch.float32)
    draft = HFDraft(model)
    draft.begin([3, 4])
    q = draft.root_distribution(SamplingConfig(temperature=0.8, top_k=5))
    assert q.shape == (VOCAB,) and abs(float(q.sum()) - 1) < 1e-5 and int((q > 0).sum()) == 5
    assert draft.expand([0], [q.argmax().item()], SamplingConfig(temperature=1.0)).shape == (1, VOCAB)
    assert draft.tree_logits([], []).shape == (0, VOCAB)


def test_registered():
    assert get("draft", "hf") is HFDraft


# ----------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors():
    draft = HFDraft(make_tiny_llama(max_positions=12))
    with pytest.raises(RuntimeError, match="before begin"):
        draft.root_logits()
    with pytest.raises(ValueError, match="at least one token"):
        draft.begin([])
    with pytest.raises(ContextOverflowError):
        draft.begin(list(range(13)))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        draft.begin([-1])
    draft.begin(list(range(10)))
    draft.root_logits()
    with pytest.raises(ValueError, match="unknown parent"):
        draft.tree_logits([1], [3])
    with pytest.raises(ValueError, match="2 parents but 1 tokens"):
        draft.tree_logits([0, 0], [3])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        draft.tree_logits([0], [VOCAB])
    draft.tree_logits([0], [3])  # node 1 at position 10
    draft.tree_logits([1, 1], [4, 5])  # nodes 2, 3 at position 11: fine
    with pytest.raises(ContextOverflowError, match="position 12"):
        draft.tree_logits([2], [6])  # position 12: beyond 0..11
    assert draft.num_tree_nodes == 3
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        draft.commit([VOCAB])
    draft.commit([3, 4, 5])
    with pytest.raises(ContextOverflowError):
        draft.root_logits()  # context of 13 tokens


def test_vocab_mismatch_is_detected():
    target = HFDraft(make_tiny_llama())
    other = HFDraft(make_tiny_llama(vocab=VOCAB + 3))
    check_vocab_match(target, HFDraft(make_tiny_llama(seed=4)))
    with pytest.raises(VocabMismatchError, match="V = 97.*V = 100"):
        check_vocab_match(target, other)


def test_from_pretrained_loads_a_local_folder(tmp_path):
    from specdec.targets.hf import HFTarget

    model = make_tiny_llama("sdpa", torch.float32, seed=9)
    model.save_pretrained(tmp_path)
    draft = HFDraft.from_pretrained(str(tmp_path), dtype=torch.float64, logits_device=None)
    target = HFTarget.from_pretrained(str(tmp_path), dtype=torch.float64, attn_implementation="eager")
    assert target.model.config._attn_implementation == "eager"
    draft.begin([1, 2, 3])
    target.prefill([1, 2, 3])
    from specdec.tree import DraftTree

    root = target.score_tree(DraftTree.chain(3, [], [], vocab_size=VOCAB))[0]
    assert root.dtype == torch.float64 == draft.root_logits().dtype
    assert float((root - draft.root_logits()).abs().max()) < 1e-5
    assert float((root.float() - plain_logits(model, [1, 2, 3]).float()).abs().max()) < 1e-4


# ------------------------------------------------------------- rows mode (issue 15)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_rows_mode_logits_equal_plain_forwards_of_every_row(dtype):
    """begin_rows with ragged prompts: each row's root and tree-level logits
    equal plain forwards over that row's prefixes, across commits of ragged
    lengths and rows leaving the batch (keep_rows)."""
    model = make_tiny_llama("sdpa", dtype, seed=2)
    tol = tolerance(dtype)
    rng = random.Random(5)
    draft = HFDraft(model)
    contexts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (1, 6, 3, 9)]
    draft.begin_rows(contexts)
    assert draft.rows_mode
    for step in range(4):
        B = len(contexts)
        root = draft.root_rows_logits()
        assert root.shape == (B, VOCAB)
        for b in range(B):
            assert float((root[b].double() - plain_logits(model, contexts[b])).abs().max()) < tol, (step, b)
        paths = [[[]] for _ in range(B)]
        newest = [[0] for _ in range(B)]
        for _level in range(3):
            k = 3
            parents = [[rng.choice(newest[b]) for _ in range(k)] for b in range(B)]
            tokens = [[rng.randrange(VOCAB) for _ in range(k)] for b in range(B)]
            logits = draft.tree_rows_logits(torch.tensor(parents), torch.tensor(tokens))
            assert logits.shape == (B, k, VOCAB)
            for b in range(B):
                first = len(paths[b])
                for p, t in zip(parents[b], tokens[b]):
                    paths[b].append(paths[b][p] + [t])
                for j in range(k):
                    ref = plain_logits(model, contexts[b] + paths[b][first + j])
                    assert float((logits[b, j].double() - ref).abs().max()) < tol, (step, b, j)
                newest[b] = list(range(first, len(paths[b])))
        emitted = []
        for b in range(B):
            path = rng.choice(paths[b])
            emitted.append(path[: rng.randrange(0, len(path) + 1)] + [rng.randrange(VOCAB)])
        draft.commit_rows(emitted)
        for b in range(B):
            contexts[b] += emitted[b]
        assert draft.committed_rows == tuple(tuple(c) for c in contexts)
        if step == 1:  # rows 0 and 2 leave
            draft.keep_rows([1, 3])
            contexts = [contexts[1], contexts[3]]
    draft.begin([1, 2, 3])  # back to one sequence
    assert not draft.rows_mode
    assert float((draft.root_logits().double() - plain_logits(model, [1, 2, 3])).abs().max()) < tol


def test_rows_mode_bad_input():
    draft = HFDraft(make_tiny_llama("sdpa", torch.float32))
    with pytest.raises(RuntimeError, match="outside rows mode"):
        draft.root_rows_logits()
    with pytest.raises(ValueError, match="at least one prompt"):
        draft.begin_rows([])
    draft.begin_rows([[1], [2, 3]])
    with pytest.raises(ValueError, match=r"must both be \[2, k\]"):
        draft.tree_rows_logits(torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="3 rows of emitted tokens for 2 rows"):
        draft.commit_rows([[1], [2], [3]])
    with pytest.raises(ValueError, match="keep_rows"):
        draft.keep_rows([0, 0])


# --------------------------------------------------------------- proposal vocabulary

PROPOSAL = torch.tensor([0, 3, 4, 10, 11, 12, 40, 41, 60, 77, 96])


@pytest.mark.parametrize(("dtype", "cpu_linear"), [(torch.float64, "auto"), (torch.float32, True), (torch.float32, False)])
def test_proposal_vocabulary_logits_are_the_heads_rows(dtype, cpu_linear):
    """HFDraft(proposal_ids=...): the forwards apply only the LM head's rows of the vocabulary:
    ``*_proposal_logits`` are the plain forward's logits at those ids, and ``root_logits`` /
    ``tree_logits`` the same with ``-inf`` elsewhere; one sequence and rows mode, across commits.
    With the CPU linear dispatch on (float32), the ``[Vd, H]`` rows go through it (their plan is
    among the draft's ``linear_plans``); off, through ``F.linear``."""
    model = make_tiny_llama("sdpa", dtype, seed=3)
    tol = tolerance(dtype)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[PROPOSAL] = False
    draft = HFDraft(model, proposal_ids=PROPOSAL.tolist(), cpu_linear=cpu_linear)
    assert torch.equal(draft.proposal_ids, PROPOSAL)
    head_shape = (len(PROPOSAL), model.config.hidden_size)
    assert (head_shape in draft.linear_plans) == (cpu_linear is True)

    def same(row: torch.Tensor, context: list[int], full: bool) -> None:
        ref = plain_logits(model, context)
        got = row[PROPOSAL] if full else row
        assert float((got.double() - ref[PROPOSAL]).abs().max()) < tol
        if full:
            assert row.shape == (VOCAB,) and torch.isneginf(row[outside]).all()
        else:
            assert row.shape == (len(PROPOSAL),)

    rng = random.Random(1)
    context = [5, 9, 2]
    draft.begin(context)
    for _step in range(3):
        same(draft.root_proposal_logits(), context, False)
        same(draft.root_logits(), context, True)
        tokens = rng.sample(range(VOCAB), 3)
        logits = draft.tree_proposal_logits([0, 0, 0], tokens)
        for j, t in enumerate(tokens):
            same(logits[j], context + [t], False)
        deeper = draft.tree_logits([1], [7])
        same(deeper[0], context + [tokens[0], 7], True)
        emitted = [tokens[0], 7, rng.randrange(VOCAB)]
        draft.commit(emitted)
        context += emitted
    rows = [[1, 2], [3, 4, 5, 6]]
    draft.begin_rows(rows)
    for b, row in enumerate(draft.root_rows_logits(proposal=True)):
        same(row, rows[b], False)
    for b, row in enumerate(draft.root_rows_logits()):
        same(row, rows[b], True)
    level = draft.tree_rows_logits(torch.zeros(2, 2, dtype=torch.int64), torch.tensor([[8, 9], [10, 11]]), proposal=True)
    for b, toks in enumerate(([8, 9], [10, 11])):
        for j, t in enumerate(toks):
            same(level[b, j], rows[b] + [t], False)
    level = draft.tree_rows_logits(torch.tensor([[1], [2]]), torch.tensor([[12], [13]]))
    same(level[0, 0], rows[0] + [8, 12], True)
    same(level[1, 0], rows[1] + [11, 13], True)


class _Undeclared(HFDraft):
    """The same logits, ``-inf`` outside the vocabulary, with no proposal vocabulary declared:
    the builders rank, draw and record over all ``V`` columns."""

    @property
    def proposal_ids(self):
        return None


@pytest.mark.parametrize("method", ["sd", "specinfer", "eagle2", "rheo", "sequoia"])
def test_a_proposal_vocabulary_gives_the_trees_and_tokens_of_the_full_width_law(method):
    """Generation with a draft over its proposal vocabulary emits exactly what the full-width
    law (``-inf`` outside it) emits, with the same seeds, at T = 1 and at T = 0.7 with top-k;
    at T = 0 both give the target's greedy output."""
    import specdec

    target = make_tiny_llama("sdpa", torch.float32, seed=4)
    model = make_tiny_llama("sdpa", torch.float32, seed=5, layers=1)
    from specdec.targets.hf import HFTarget

    reduced = HFDraft(model, proposal_ids=PROPOSAL)
    full = _Undeclared(model, proposal_ids=PROPOSAL)
    opts = {"sequoia": {"num_nodes": 6, "max_depth": 3, "acceptance": [0.5, 0.2, 0.1]}}.get(method, {})
    outs = []
    for draft in (reduced, full):
        gen = specdec.SpeculativeGenerator(target=HFTarget(target), draft=draft, method=method, **opts)
        per = []
        for sampling in (specdec.SamplingConfig(temperature=1.0), specdec.SamplingConfig(temperature=0.7, top_k=20),
                         specdec.SamplingConfig(temperature=0.0)):
            per.append(gen.generate([3, 1, 4, 1], 12, sampling, seed=11).tokens)
        outs.append(per)
    assert outs[0] == outs[1]
    greedy = specdec.autoregressive_generate(HFTarget(target), [3, 1, 4, 1], 12, specdec.SamplingConfig(temperature=0.0))
    assert outs[0][2] == greedy.tokens


def test_bad_proposal_ids_are_refused():
    from specdec.errors import InvalidConfigError

    model = make_tiny_llama("sdpa", torch.float32)
    for bad in ([3, 2], [0, 0, 1], [-1, 2], [1, VOCAB], []):
        with pytest.raises(InvalidConfigError, match="proposal_ids must be distinct ascending token ids"):
            HFDraft(model, proposal_ids=bad)
