"""The model-free prompt-lookup draft (``NgramDraft``, registry ``draft/ngram``; docs/drafts.md).

- the matching rule is transformers' ``PromptLookupCandidateGenerator``: with
  ``branches=1`` the greedy chain is its candidate, token for token;
- the law of every node is a probability law over ``V`` (one-hot, or spread
  over the distinct matched continuations), a function of the committed
  context and the node's path only;
- losslessness, exactly: every registered tree builder (each of its
  ``example_options``) with every verifier it composes with, on the per-node
  path (``builder.build`` + ``verifier.verify``) and on the step path
  (``speculative_step`` + ``commit_step``, what ``generate`` runs), every
  random draw enumerated by :func:`specdec.testing.exact_law` over several
  steps: the law of the first tokens equals the target's to 1e-9, at T = 1,
  T = 0.7 with top-k / top-p, and T = 0; a lossy verifier mutant (the bonus
  drawn from ``p`` instead of the residual, "a one-hot draft needs no
  residual") is shown to fail the same check;
- greedy equality with the target's own greedy decoding for every method,
  and batched generation (rows mode) equal to one-prompt generation per row.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
from specdec.drafts.ngram import NgramDraft, ngram_matches
from specdec.errors import InvalidConfigError, UnsupportedTreeError
from specdec.generate import autoregressive_generate
from specdec.methods import compose
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig, process_logits
from specdec.engine import run_rows
from specdec.testing import MarkovLM, exact_law
from specdec.testing.markov import random_markov_logits
from specdec.tree import DraftTree
from specdec.verify.base import NodeOutcome
from specdec.verify.rejection import RejectionIIDVerifier
from specdec.verify.residual import rejection_accept_prob
from specdec.trees import build_tree

T1 = SamplingConfig(temperature=1.0)
WARPED = SamplingConfig(temperature=0.7, top_k=2, top_p=0.9)
GREEDY = SamplingConfig(temperature=0.0)
EXACT = 1e-9


# ------------------------------------------------------------ the matching rule
def transformers_candidate(ids: list[int], num_tokens: int, max_ngram: int) -> list[int]:
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = PromptLookupCandidateGenerator(num_output_tokens=num_tokens, max_matching_ngram_size=max_ngram,
                                         max_length=10_000)
    out, _ = gen.get_candidates(torch.tensor([ids]))
    return out[0, len(ids):].tolist()


def greedy_chain(draft: NgramDraft, ids: list[int], depth: int) -> list[int]:
    draft.begin(ids)
    token = int(draft.root_distribution(GREEDY).argmax())
    chain = [token]
    for level in range(1, depth):
        token = int(draft.expand([level - 1], [token], GREEDY)[0].argmax())
        chain.append(token)
    return chain


@pytest.mark.parametrize("max_ngram", [1, 2, 3])
def test_the_greedy_chain_is_transformers_prompt_lookup_candidate(max_ngram):
    """On random token sequences over a small vocabulary (so that n-grams repeat),
    the ``branches=1`` chain starts with exactly transformers' candidate tokens;
    where transformers finds no match, the draft repeats the last token."""
    gen = torch.Generator().manual_seed(max_ngram)
    draft = NgramDraft(vocab_size=6, max_ngram=max_ngram)
    matched = 0
    for _ in range(300):
        L = int(torch.randint(2, 30, (1,), generator=gen))
        ids = torch.randint(0, 6, (L,), generator=gen).tolist()
        expected = transformers_candidate(ids, 6, max_ngram)
        chain = greedy_chain(draft, ids, 6)
        if expected:
            assert chain[: len(expected)] == expected, (ids, expected, chain)
            matched += 1
        else:
            assert chain[0] == ids[-1], (ids, chain)
    assert matched > 200  # the setting does exercise matches


def test_ngram_matches_prefers_the_longest_ngram_and_keeps_left_to_right_order():
    seq = np.array([1, 2, 3, 9, 2, 3, 7, 2, 3])
    assert ngram_matches(seq, 2).tolist() == [3, 6]  # "2 3" at 1 and 4: continuations 9 and 7
    assert ngram_matches(seq, 3).tolist() == [3, 6]  # no earlier "7 2 3": falls back to the 2-gram
    assert ngram_matches(np.array([4, 5]), 2).tolist() == []  # the 1-gram "5" never occurred before
    assert ngram_matches(np.array([5, 5]), 2).tolist() == [1]  # overlaps are matches
    assert ngram_matches(seq, 3, min_ngram=3).tolist() == []


def test_the_law_spreads_over_the_distinct_continuations_weighted_by_count():
    # after "1 2": continuations 3 (twice), 4 (once), 5 (once), in that order of appearance
    ids = [1, 2, 3, 0, 1, 2, 4, 0, 1, 2, 3, 0, 1, 2, 5, 0, 1, 2]
    q = NgramDraft(vocab_size=8, max_ngram=2, branches=8)
    q.begin(ids)
    law = q.root_distribution(T1)
    assert torch.allclose(law, torch.tensor([0, 0, 0, 0.5, 0.25, 0.25, 0, 0]), atol=1e-7)
    two = NgramDraft(vocab_size=8, max_ngram=2, branches=2)
    two.begin(ids)
    assert torch.allclose(two.root_distribution(T1), torch.tensor([0, 0, 0, 2 / 3, 1 / 3, 0, 0, 0]), atol=1e-7)
    one = NgramDraft(vocab_size=8, max_ngram=2)
    one.begin(ids)
    assert one.root_distribution(T1).tolist() == [0, 0, 0, 1, 0, 0, 0, 0]  # the first match's continuation
    # processed like any draft: temperature sharpens counts as count ** (1 / T)
    sharp = q.root_distribution(SamplingConfig(temperature=0.5))
    assert torch.allclose(sharp[3:6], torch.tensor([4.0, 1.0, 1.0]) / 6, atol=1e-7)
    # a child follows the matches it spells; a child off every match looks up its own sequence
    assert q.expand([0], [4], T1).argmax().item() == 0  # "1 2 4" was followed by 0
    assert q.expand([0], [6], T1).argmax().item() == 6  # "2 6" / "6" never seen: repeat the last token


def test_the_law_of_a_node_depends_only_on_the_context_and_its_path():
    """The same node law whether its siblings and ancestors' laws were asked for or not,
    and in rows mode the same as one row alone."""
    ids = [0, 1, 2, 0, 1, 3, 1, 2, 0, 1]
    a, b = NgramDraft(vocab_size=4, branches=3), NgramDraft(vocab_size=4, branches=3)
    a.begin(ids)
    b.begin(ids)
    a.root_logits()
    la = a.tree_logits([0, 0, 1], [2, 3, 0])  # node 3's parent is node 1 (token 2)
    lb = b.tree_logits([0, 0, 1], [2, 3, 0])  # no root law asked first
    assert torch.equal(la, lb)
    rows = NgramDraft(vocab_size=4, branches=3)
    rows.begin_rows([ids, [3, 3, 2]])
    assert torch.equal(rows.root_rows_logits()[0], b.root_logits())
    got = rows.tree_rows_logits(torch.tensor([[0, 0, 1], [0, 0, 1]]), torch.tensor([[2, 3, 0], [2, 3, 0]]))
    assert torch.equal(got[0], la)
    solo = NgramDraft(vocab_size=4, branches=3)
    solo.begin([3, 3, 2])
    assert torch.equal(got[1], solo.tree_logits([0, 0, 1], [2, 3, 0]))
    rows.commit_rows([[1, 2], [3]])
    rows.keep_rows([1])
    solo.commit([3])
    assert torch.equal(rows.root_rows_logits()[0], solo.root_logits())


def test_bad_input_raises_clearly():
    with pytest.raises(InvalidConfigError, match="max_ngram"):
        NgramDraft(vocab_size=4, max_ngram=0)
    with pytest.raises(InvalidConfigError, match="min_ngram"):
        NgramDraft(vocab_size=4, max_ngram=2, min_ngram=3)
    with pytest.raises(InvalidConfigError, match="branches"):
        NgramDraft(vocab_size=4, branches=True)
    d = NgramDraft(vocab_size=4)
    with pytest.raises(RuntimeError, match="begin"):
        d.root_logits()
    with pytest.raises(ValueError, match="at least one token"):
        d.begin([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        d.begin([0, 4])
    d.begin([0, 1])
    with pytest.raises(ValueError, match="unknown parent"):
        d.tree_logits([3], [1])
    assert specdec.get("draft", "ngram") is NgramDraft


# ------------------------------------------------------------ exact losslessness
V = 3
PROMPT = (0, 1, 2, 0, 1, 1, 2, 0, 2, 2, 1)  # repeats: several distinct continuations of 1-grams and 2-grams
NUM_TOKENS = 3


def markov_target(seed: int = 5) -> MarkovLM:
    g = torch.Generator().manual_seed(seed)
    return MarkovLM(random_markov_logits(V, 2, g, scale=1.5, zero_fraction=0.2))


def run_steps(builder, verifier, draft, sampling, rng, step_path: bool) -> tuple[int, ...]:
    """The literal generation loop, ``NUM_TOKENS`` tokens, per-node or step path."""
    target = markov_target()
    if step_path:  # the engine's loop (what generate runs)
        reports = run_rows(target, draft, builder, verifier, [PROMPT], sampling, [rng], max_new_tokens=NUM_TOKENS)
        return tuple(t for report in reports for t in report.kept[0])
    target.prefill(PROMPT)
    draft.begin(PROMPT)
    out: list[int] = []
    root = PROMPT[-1]
    while len(out) < NUM_TOKENS:  # the per-node form: host trees, the verifier's walk
        tree = build_tree(builder, root, draft, sampling, rng)
        result = verifier.verify(tree, process_logits(target.score_tree(tree), sampling), rng)
        target.accept(result.accepted_nodes, result.bonus_token)
        draft.commit(result.tokens)
        tokens = result.tokens
        out.extend(tokens)
        root = tokens[-1]
    return tuple(out[:NUM_TOKENS])


def deviation(builder, verifier, draft, sampling, step_path: bool) -> float:
    law = exact_law(lambda rng: run_steps(builder, verifier, draft, sampling, rng, step_path))
    assert abs(sum(law.values()) - 1.0) < 1e-9
    truth = markov_target().joint_law(list(PROMPT), NUM_TOKENS, sampling)
    return max(abs(law.get(k, 0.0) - truth.get(k, 0.0)) for k in set(law) | set(truth))


def pairings() -> list[tuple[str, dict, str]]:
    """Every registered builder (each example option) with every verifier it composes with."""
    cases = []
    for tree in specdec.list_registered("tree"):
        for i, options in enumerate(specdec.get("tree", tree).example_options):
            for ver in specdec.list_registered("verifier"):
                try:
                    compose(tree, ver, dict(options))
                except UnsupportedTreeError:
                    continue
                cases.append((tree, dict(options), ver))
    return cases


PAIRINGS = pairings()


def test_the_pairings_cover_every_builder_and_verifier():
    assert {t for t, _, _ in PAIRINGS} == set(specdec.list_registered("tree"))
    assert {v for _, _, v in PAIRINGS} == set(specdec.list_registered("verifier"))


def exact_cases() -> list:
    """(tree, options, verifier, branches, sampling) cases: in the default suite every
    pairing with the one-hot draft at T = 1 and T = 0 and with the spread draft at T = 0,
    and every builder with its default verifier (first example option) with the spread
    draft at T = 1 and T = 0.7 + top-k + top-p; the rest of the cross product is ``slow``
    (all pass: enumerating a spread law over several steps takes minutes on a small CPU)."""
    cases = []
    defaults = {(t, v) for t in specdec.list_registered("tree") for v in [specdec.get("tree", t).default_verifier]}
    firsts = {t: dict(specdec.get("tree", t).example_options[0]) for t in specdec.list_registered("tree")}
    for tree, options, ver in PAIRINGS:
        for branches in (1, 2):
            for name, sampling in (("T1", T1), ("T0.7-topk-topp", WARPED), ("T0", GREEDY)):
                if specdec.get("verifier", ver).requires_greedy and not sampling.greedy:
                    continue  # the greedy verifier refuses T > 0 before any forward (tested in tests/verify)
                fast = (branches == 1 and name != "T0.7-topk-topp") or name == "T0" or (
                    (tree, ver) in defaults and options == firsts[tree])
                marks = () if fast else (pytest.mark.slow,)
                ident = f"{tree}-{PAIRINGS.index((tree, options, ver))}-{ver}-q{branches}-{name}"
                cases.append(pytest.param(tree, options, ver, branches, sampling, marks=marks, id=ident))
    return cases


@pytest.mark.parametrize("tree,options,ver,branches,sampling", exact_cases())
def test_every_builder_and_verifier_is_exact_with_the_ngram_draft(tree, options, ver, branches, sampling):
    """``q{branches}``: the draft's law is one-hot (1) or spread over up to 2 continuations."""
    builder, verifier = compose(tree, ver, options)
    verifier.check_sampling(sampling)
    draft = NgramDraft(vocab_size=V, max_ngram=2, branches=branches)
    dev = deviation(builder, verifier, draft, sampling, step_path=False)
    assert dev < EXACT, f"{tree} {options} + {ver}: deviation {dev:.3e}"


@pytest.mark.parametrize("sampling", [T1, GREEDY], ids=["T1", "T0"])
@pytest.mark.parametrize("branches", [1, 2], ids=["q1", "q2"])
@pytest.mark.parametrize("method", specdec.list_registered("method"))
def test_every_method_is_exact_on_the_step_path(method, branches, sampling):
    """What ``generate`` runs (the tensor builders' ``build_batch``, ``commit_step``),
    with each method's builder at its first example option."""
    m = specdec.get("method", method)
    options = dict(specdec.get("tree", m.tree).example_options[0])
    builder, verifier = compose(m.tree, m.verifier, options)
    draft = NgramDraft(vocab_size=V, max_ngram=2, branches=branches)
    dev = deviation(builder, verifier, draft, sampling, step_path=True)
    assert dev < EXACT, f"{method}: deviation {dev:.3e}"


class BonusFromP(RejectionIIDVerifier):
    """Lossy: "a one-hot draft needs no residual": accept the drafted ``x`` with
    probability ``min(1, p(x) / q(x)) = p(x)``, but on rejection draw the bonus from
    ``p`` itself (``x`` can come back), instead of ``norm([p - q]+)``."""

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        P = p_node / p_node.sum()
        for child in tree.sampled_children(node):
            q = tree.law_of(child).dense(tree.vocab_size, dtype=P.dtype)
            if rng.bernoulli(rejection_accept_prob(P, q, int(tree.tokens[child]))):
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token=rng.categorical(P))


def test_the_exact_check_rejects_a_lossy_verifier_with_the_ngram_draft():
    builder, _ = compose("chain", "rejection-iid", {"depth": 2})
    draft = NgramDraft(vocab_size=V, max_ngram=2)
    assert deviation(builder, BonusFromP(), draft, T1, step_path=False) > 1e-3


# ------------------------------------------------------------ end to end
def repetitive_target(vocab: int = 12, seed: int = 3) -> MarkovLM:
    """An order-2 target that mostly repeats a cycle (so prompt lookup is accepted often)."""
    g = torch.Generator().manual_seed(seed)
    logits = random_markov_logits(vocab, 2, g, scale=1.0)
    for a in range(vocab):
        for b in range(vocab):
            logits[a, b, (b + 1) % vocab] += 4.0
    return MarkovLM(logits)


PROMPT_E2E = [0, 1, 2, 3, 4, 5, 0, 1, 2, 7, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1]


@pytest.mark.parametrize("method", specdec.list_registered("method"))
def test_greedy_generation_equals_the_target_greedy_decoding(method):
    target = repetitive_target()
    expected = autoregressive_generate(target, PROMPT_E2E, 40, sampling=GREEDY).tokens
    for branches in (1, 3):
        gen = specdec.SpeculativeGenerator(target=target, draft=NgramDraft(vocab_size=12, branches=branches),
                                           method=method)
        out = gen.generate(PROMPT_E2E, 40, sampling=GREEDY)
        assert out.tokens == expected, (method, branches)
        assert out.stats.tau > 1.5, (method, branches, out.stats.tau)  # the lookup is accepted


@pytest.mark.parametrize("method", ["sd", "specinfer", "rheo"])
@pytest.mark.parametrize("sampling", [GREEDY, T1], ids=["T0", "T1"])
def test_batched_rows_equal_one_prompt_generation(method, sampling):
    """Rows mode: each row of ``generate_batch`` equals its own ``generate`` with its seed,
    token for token (so its law is the target's, by the exact tests above)."""
    target = repetitive_target()
    prompts = [PROMPT_E2E, [3, 4, 5, 3, 4], PROMPT_E2E[5:]]
    gen = specdec.SpeculativeGenerator(target=target, draft=NgramDraft(vocab_size=12, branches=3), method=method)
    batch = gen.generate_batch(prompts, 24, sampling, seeds=[7, 8, 9])
    for row, (prompt, seed) in enumerate(zip(prompts, [7, 8, 9])):
        assert list(batch.tokens[row]) == gen.generate(prompt, 24, sampling, seed=seed).tokens, row


# ------------------------------------------------------------ bench rows
def test_bench_rows_sd_and_specinfer_at_ngram():
    """``specdec bench --methods sd@ngram,specinfer@ngram``: the rows parse, run one prompt at a
    time and batched, reproduce the baseline at T = 0 and accept lookups."""
    from specdec.bench.budget import Budget
    from specdec.bench.models import NGRAM_OPTIONS, BenchModels
    from specdec.bench.runner import BenchConfig, aggregate, batch_refusal, parse_rows, run_bench

    rows = parse_rows("sd@ngram,specinfer@ngram", ["lm", "ngram"])
    assert [(r.name, r.method, r.draft) for r in rows[1:]] == [("sd@ngram", "sd", "ngram"),
                                                               ("specinfer@ngram", "specinfer", "ngram")]
    assert all(batch_refusal(r) is None for r in rows)
    target = repetitive_target()
    models = BenchModels(target=target, targets={"ngram": target}, drafts={"ngram": NgramDraft(12, **NGRAM_OPTIONS)},
                         tokenize=lambda text: [len(w) % 12 for w in text.split()], eos_token_id=None)
    prompts = [PROMPT_E2E, PROMPT_E2E[4:]]
    for batch_size in (1, 2):
        config = BenchConfig(rows, (0.0, 1.0), (0,), max_new_tokens=16, budget=Budget(8, 4), warmup=False,
                             batch_size=batch_size)
        records = aggregate(run_bench(models, config, prompts), rows, config.temperatures, budget=config.budget)
        for rec in records:
            if rec["temperature"] == 0:
                assert rec["matches_autoregressive"] == 1.0, (batch_size, rec["method"])
            if rec["kind"] == "speculative":
                assert rec["tau"] > 1.5, (batch_size, rec["method"], rec["temperature"], rec["tau"])


def test_load_bench_models_makes_the_ngram_draft(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_helpers import save_model

    from specdec.bench.models import load_bench_models

    folder = save_model(tmp_path / "target", seed=0, layers=1)
    models = load_bench_models(str(folder), "truncated:1", {2: "none", 3: "none"}, need_kinds=frozenset({"lm", "ngram"}))
    draft = models.drafts["ngram"]
    assert isinstance(draft, NgramDraft) and draft.vocab_size == models.target.vocab_size
    assert models.targets["ngram"] is models.target and "prompt lookup" in models.descriptions["ngram"]
    assert "ngram" not in load_bench_models(str(folder), "truncated:1", {2: "none", 3: "none"}).drafts
