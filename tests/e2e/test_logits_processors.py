"""Logits processors per tree node (docs/generation.md, "Logits processors").

Exact layer: every registered method's step (:func:`specdec.step.speculative_step`
with an enumerating source, so every draw of builder and verifier is walked,
``specdec.testing.exact_law``) is chained step after step inside ONE
enumeration, the committed context growing by the emitted tokens as in the
generation loop; the law of the first tokens must equal the *processed*
target law (the processor called autoregressively on the sequence so far),
for context-dependent processors: a repetition penalty, a no-repeat n-gram
ban, and a processor that bans tokens after some contexts. The broken variant
that applies the processor with the parent's context instead of the node's
(``node_contexts`` replaced) fails it.

Statistical layer: the real loop (``SpeculativeGenerator.generate``, seeded
``TorchRandom``, the verifiers' parallel rules) against the same exact law by
a chi-square test, which rejects the parent-context mutant.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

import specdec
import specdec.processors as processors_module
from specdec.drafts import ProcessedDraft
from specdec.errors import InvalidConfigError
from specdec.methods import resolve_method
from specdec.registry import get, list_registered
from specdec.sampling import SamplingConfig, process_logits
from specdec.engine import run_rows
from specdec.testing import MarkovLM, chi_square_test, exact_law, random_markov_logits

V = 4
PROMPT = (0, 1)
EXACT = 1e-9
T1 = SamplingConfig(temperature=1.0)
WARPED = SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)
GREEDY = SamplingConfig(temperature=0.0)


class BanAfterContexts:
    """Bans token ``(a + b) % V`` after a context ending ``a b`` when the context
    holds an even number of 2s, and token 3 whenever the context contains 0 twice."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        twos_even = ((input_ids == 2).sum(1) % 2 == 0)  # [b]
        banned = (input_ids[:, -2] + input_ids[:, -1]) % V  # [b]
        out = scores.clone()
        rows = torch.arange(scores.shape[0])
        out[rows, banned] = torch.where(twos_even, torch.full_like(out[rows, banned], float("-inf")), out[rows, banned])
        zeros = (input_ids == 0).sum(1) >= 2
        out[:, 3] = torch.where(zeros, torch.full_like(out[:, 3], float("-inf")), out[:, 3])
        return out


class NoImmediateRepeat:
    """Bans the context's last token (a ban that depends on the node's own token)."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        out[torch.arange(scores.shape[0]), input_ids[:, -1]] = float("-inf")
        return out


PROCESSORS = {
    "repetition": lambda: LogitsProcessorList([RepetitionPenaltyLogitsProcessor(2.5)]),
    "no-repeat-2gram": lambda: LogitsProcessorList([NoRepeatNGramLogitsProcessor(2)]),
    "ban-after": lambda: BanAfterContexts(),
}


MODEL_SEED = 10  # a table where every processor changes even the greedy law


def models(seed: int = MODEL_SEED, *, draft_is_target: bool = False) -> tuple[MarkovLM, MarkovLM]:
    """Order-2 target and draft over V = 4; the draft's rows are sparse (fewer branches to
    enumerate), or (``draft_is_target``) the target's raw table cut to its two largest logits per
    row: the draft then proposes what the unprocessed target favours, so deep nodes are accepted
    and their processed rows are used."""
    g = torch.Generator().manual_seed(seed)
    target = random_markov_logits(V, 2, g, scale=1.5)
    draft = random_markov_logits(V, 2, g, scale=1.5, zero_fraction=0.5)
    if draft_is_target:
        second = target.topk(2, dim=-1).values[..., -1:]
        draft = target.masked_fill(target < second, float("-inf"))
    return MarkovLM(target), MarkovLM(draft)


def small_method(name: str):
    """The method's builder with its tree builder's first example options (at most 8 nodes) and its verifier."""
    from specdec.methods import compose

    method = resolve_method(name)
    options = dict(get("tree", method.tree).example_options[0])
    return compose(method.tree, method.verifier, options)


def processed_law(target: MarkovLM, processor, sampling: SamplingConfig, num_tokens: int) -> dict:
    """The law autoregressive decoding with ``processor`` gives the next ``num_tokens`` tokens
    (the processor called on the sequence so far, one row; independent of specdec's tree code)."""
    law: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(V), repeat=num_tokens):
        ctx, prob = list(PROMPT), 1.0
        for tok in seq:
            row = processor(torch.tensor([ctx]), target.table[tuple(ctx[-2:])].unsqueeze(0).clone())
            prob *= float(process_logits(row[0], sampling)[tok])
            if prob == 0.0:
                break
            ctx.append(tok)
        if prob > 0.0:
            law[seq] = prob
    return law


def speculative_law(name: str, processor, sampling: SamplingConfig, num_tokens: int, *, draft_processor=None,
                    **model_options) -> dict:
    """The law of the first ``num_tokens`` tokens of the real step, chained in one enumeration
    (``draft_processor``: the draft wrapped in a :class:`~specdec.drafts.ProcessedDraft`)."""
    target, draft = models(**model_options)
    if draft_processor is not None:
        draft = ProcessedDraft(draft, draft_processor)
    builder, verifier = small_method(name)

    def program(rng):
        reports = run_rows(target, draft, builder, verifier, [list(PROMPT)], sampling, [rng], max_new_tokens=num_tokens,
                           logits_processor=processor)
        return tuple(t for report in reports for t in report.kept[0])

    return exact_law(program)


def deviation(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def parent_context(context: torch.Tensor, paths: torch.Tensor, depth: int) -> torch.Tensor:
    """The mutant: a depth-``d`` node processed in its parent's context (its own token left out)."""
    n = paths.shape[0]
    return torch.cat([context.view(1, -1).expand(n, -1), paths[:, : max(depth - 1, 0)]], dim=1)


NUM_TOKENS = 2  # the second token's law reads the depth-1 nodes' processed rows
METHODS = list_registered("method")


@pytest.mark.parametrize("sampling", [T1, GREEDY], ids=["T1", "T0"])
@pytest.mark.parametrize("proc_name", list(PROCESSORS))
@pytest.mark.parametrize("method", METHODS)
def test_every_method_gives_the_processed_target_law_exactly(method, proc_name, sampling):
    processor = PROCESSORS[proc_name]()
    target, _ = models()
    reference = processed_law(target, processor, sampling, NUM_TOKENS)
    assert deviation(processed_law(target, lambda ids, s: s, sampling, NUM_TOKENS), reference) > 1e-2  # it matters
    law = speculative_law(method, processor, sampling, NUM_TOKENS)
    assert abs(math.fsum(law.values()) - 1.0) < 1e-9
    assert deviation(law, reference) < EXACT, f"{method} {proc_name}: {deviation(law, reference):.3e}"


@pytest.mark.parametrize("method", ["rheo", "sd", "sequoia"])
def test_warped_sampling_after_processors_is_exact(method):
    processor = PROCESSORS["repetition"]()
    target, _ = models()
    law = speculative_law(method, processor, WARPED, NUM_TOKENS)
    assert deviation(law, processed_law(target, processor, WARPED, NUM_TOKENS)) < EXACT


@pytest.mark.parametrize("method", METHODS)
def test_the_parent_context_mutant_is_caught(method, monkeypatch):
    """Processing each node in its parent's context is lossy, and the exact test sees it: the
    same setting passes with the real code and fails with the mutant, for every method.
    (A repetition penalty alone can hide the mutant where every drafted token already occurs
    in the context, as with these 4-token tables; a ban on the node's own token cannot.)"""
    processor = NoImmediateRepeat()
    target, _ = models(draft_is_target=True)
    reference = processed_law(target, processor, T1, NUM_TOKENS)
    assert deviation(speculative_law(method, processor, T1, NUM_TOKENS, draft_is_target=True), reference) < EXACT
    monkeypatch.setattr(processors_module, "node_contexts", parent_context)
    law = speculative_law(method, processor, T1, NUM_TOKENS, draft_is_target=True)
    assert deviation(law, reference) > 1e-2, f"{method}: the mutant went unnoticed"


# ---------------------------------------------------------------- the real loop, statistically

SAMPLES = 600
ALPHA = 1e-3


def sample(method: str, processor, n: int = SAMPLES, **model_options) -> list[tuple[int, ...]]:
    target, draft = models(**model_options)
    options = {"sd": {"depth": 3}, "specinfer": {"expansion": (2, 2)}}.get(method, {"K": 3, "depth": 3, "N": 5}
                                                                          if method != "sequoia" else {})
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="torch", **options)
    return [tuple(gen.generate(list(PROMPT), NUM_TOKENS, T1, seed=s, logits_processor=processor).tokens) for s in range(n)]


@pytest.mark.parametrize("method", ["rheo", "specinfer"])
def test_the_generation_loop_samples_the_processed_law(method):
    processor = PROCESSORS["repetition"]()
    target, _ = models()
    result = chi_square_test(sample(method, processor), processed_law(target, processor, T1, NUM_TOKENS))
    assert result.p_value > ALPHA, result


def test_the_generation_loop_rejects_the_parent_context_mutant(monkeypatch):
    processor = NoImmediateRepeat()
    target, _ = models(draft_is_target=True)
    law = processed_law(target, processor, T1, NUM_TOKENS)
    assert chi_square_test(sample("rheo", processor, 400, draft_is_target=True), law).p_value > ALPHA
    monkeypatch.setattr(processors_module, "node_contexts", parent_context)
    result = chi_square_test(sample("rheo", processor, 400, draft_is_target=True), law)
    assert result.p_value < ALPHA, result


# ---------------------------------------------------------------- greedy equality, API


@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_autoregressive_with_processors(method):
    target, draft = models()
    processor = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0), NoRepeatNGramLogitsProcessor(3)])
    ref = specdec.autoregressive_generate(target, [0, 1], 24, GREEDY, logits_processor=processor)
    plain = specdec.autoregressive_generate(target, [0, 1], 24, GREEDY)
    assert ref.tokens != plain.tokens
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel="torch")
    assert gen.generate([0, 1], 24, GREEDY, logits_processor=processor).tokens == ref.tokens
    streamed = [t for chunk in gen.stream([0, 1], 24, GREEDY, logits_processor=processor) for t in chunk]
    assert streamed == ref.tokens


def test_bad_processors_are_refused():
    target, draft = models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd")
    with pytest.raises(InvalidConfigError, match="callable"):
        gen.generate([0, 1], 4, logits_processor=3)
    with pytest.raises(InvalidConfigError, match="returned"):
        gen.generate([0, 1], 4, logits_processor=lambda ids, s: s[:, :-1])
    with pytest.raises(InvalidConfigError, match="logits_processor must be a callable"):  # batches apply them too
        gen.generate_batch([[0, 1], [1, 2]], 4, logits_processor=3)


def test_node_paths_follow_the_tree():
    # root 0; 1 <- 0, 2 <- 0, 3 <- 1, 4 <- 3
    tokens = torch.tensor([9, 5, 6, 7, 8])
    parents = [-1, 0, 0, 1, 3]
    depths = torch.tensor([0, 1, 1, 2, 3])
    anc = torch.zeros(5, 5, dtype=torch.bool)
    for i in range(5):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parents[j]
    paths = processors_module.node_paths(tokens, depths, anc, 3)
    assert paths.tolist() == [[0, 0, 0], [5, 0, 0], [6, 0, 0], [5, 7, 0], [5, 7, 8]]
    ctx = processors_module.node_contexts(torch.tensor([1, 9]), paths, 2)
    assert ctx[3].tolist() == [1, 9, 5, 7]


def test_processors_run_before_the_fused_kernel():
    """kernel="triton" (here under Triton's interpreter) takes the processed logits: with one
    counter-based stream it emits the torch path's tokens and log-probabilities, processor on."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    target, draft = models()
    processor = PROCESSORS["repetition"]()
    outs = {}
    for kernel in ("torch", "triton"):
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", kernel=kernel, random="counter",
                                           K=2, depth=3, N=4, M=4)
        outs[kernel] = [gen.generate(list(PROMPT), 10, T1, seed=s, logits_processor=processor, return_logprobs=True)
                        for s in range(3)]
        assert outs[kernel][0].stats.kernel_path == kernel
    for a, b in zip(outs["torch"], outs["triton"]):
        assert a.tokens == b.tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-9
    plain = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", kernel="torch", random="counter",
                                         K=2, depth=3, N=4, M=4)
    assert any(plain.generate(list(PROMPT), 10, T1, seed=s).tokens != outs["torch"][s].tokens for s in range(3))


# ---------------------------------------------------------------- the draft processed too


@pytest.mark.parametrize("proc_name", ["repetition", "no-immediate-repeat"])
@pytest.mark.parametrize("method", METHODS)
def test_a_processed_draft_keeps_the_processed_target_law_exactly(method, proc_name):
    """``ProcessedDraft``: the draft's q is the processed draft law (each node in its own context);
    the builders record it and the verifiers correct for it, so the law is the processed target's.
    The draft keeps two tokens per row and each processor bans at most one (a processor that bans
    every token of a draft row makes it no law, which the step refuses)."""
    processor = PROCESSORS[proc_name]() if proc_name in PROCESSORS else NoImmediateRepeat()
    target, _ = models()
    law = speculative_law(method, processor, T1, NUM_TOKENS, draft_processor=processor, draft_is_target=True)
    assert deviation(law, processed_law(target, processor, T1, NUM_TOKENS)) < EXACT


def test_a_processed_draft_processes_each_node_in_its_own_context():
    _, draft = models()
    wrapped = ProcessedDraft(draft, NoImmediateRepeat())
    wrapped.begin([0, 1])
    root = wrapped.root_logits()
    assert root[1] == float("-inf") and torch.equal(root[[0, 2, 3]], draft.root_logits()[[0, 2, 3]])
    level1 = wrapped.tree_logits([0, 0], [2, 3])  # nodes 1, 2
    level2 = wrapped.tree_logits([2, 1], [0, 1])  # nodes 3 (path 3 0), 4 (path 2 1)
    for row, token in zip([*level1, *level2], [2, 3, 0, 1]):
        assert row[token] == float("-inf")  # banned: the node's own token
        assert (row > float("-inf")).sum() >= 1
    seen = []
    probe = ProcessedDraft(draft, lambda ids, s: (seen.append(ids.tolist()), s)[1])
    probe.begin([0, 1])
    probe.root_logits()
    probe.tree_logits([0, 0], [2, 3])
    probe.tree_logits([2], [1])
    probe.commit([3, 1])
    probe.root_logits()
    assert seen == [[[0, 1]], [[0, 1, 2], [0, 1, 3]], [[0, 1, 3, 1]], [[0, 1, 3, 1]]]


def test_a_processed_draft_refuses_bad_input():
    _, draft = models()
    with pytest.raises(InvalidConfigError, match="OneRowDraft"):
        ProcessedDraft(object(), NoImmediateRepeat())
    with pytest.raises(InvalidConfigError, match="callable"):
        ProcessedDraft(draft, 3)
    with pytest.raises(InvalidConfigError, match="empty"):
        ProcessedDraft(draft, LogitsProcessorList([]))
    bad = ProcessedDraft(draft, lambda ids, s: s[:, :-1])
    bad.begin([0, 1])
    with pytest.raises(InvalidConfigError, match="returned"):
        bad.root_logits()
