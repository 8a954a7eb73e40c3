"""Grammar-constrained generation (specdec.grammar.GrammarProcessor, the [grammar] extra).

- Exact: every registered method, at T = 1 and T = 0, gives the law of constrained
  autoregressive decoding of the first two tokens (the step chained inside one enumeration,
  as ``test_logits_processors.py`` does for its processors); the constraint matters (the
  unconstrained law is far from it). The tree is masked by xgrammar's ``traverse_draft_tree``
  where installed; the per-node fallback (``tree_mask="per_node"``) is exact too. The
  parent-context mutant (each node constrained by its parent's path) fails it on both paths.
- Greedy: every method's output equals autoregressive decoding with xgrammar's own Hugging
  Face logits processor, up to the stop token.
- Bad input: a grammar that admits no token at a node the verifier visits raises naming the
  node; scores of another width; the extra's absence is one line naming it.
- Path rules (issue 57): ``block`` on chains (T = 1 and T = 0) and ``traversal`` on static and
  Sequoia trees (T = 1) give the constrained law exactly, although a refused draft node's row is
  all -inf; their tensor forms generate grammatical output (xgrammar's own at T = 0).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

xgr = pytest.importorskip("xgrammar")

import specdec  # noqa: E402
import specdec.processors as processors_module  # noqa: E402
from specdec.engine import run_rows  # noqa: E402
from specdec.errors import InvalidConfigError, InvalidDistributionError  # noqa: E402
from specdec.grammar import GrammarProcessor  # noqa: E402
from specdec.methods import compose  # noqa: E402
from specdec.testing import MarkovLM, exact_law, random_markov_logits  # noqa: E402

from .test_logits_processors import (  # noqa: E402
    GREEDY, METHODS, NUM_TOKENS, PROMPT, T1, deviation, models, processed_law, speculative_law,
)

SMALL_VOCAB = ["a", "b", "ab", "</s>"]  # V = 4, the models of test_logits_processors
SMALL_GRAMMAR = 'root ::= ("ab" | "a" "b")+'  # after "a" only "b"; the end only after a whole "ab"


def small_grammar():
    info = xgr.TokenizerInfo(SMALL_VOCAB, vocab_type=xgr.VocabType.RAW, stop_token_ids=[3])
    return xgr.GrammarCompiler(info).compile_grammar(SMALL_GRAMMAR)


@pytest.mark.parametrize("sampling", [T1, GREEDY], ids=["T1", "T0"])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_gives_the_constrained_law_exactly(method, sampling):
    grammar = small_grammar()
    target, _ = models()
    reference = processed_law(target, GrammarProcessor(grammar, prompt_length=len(PROMPT)), sampling, NUM_TOKENS)
    if sampling is T1:  # the constraint matters (at T = 0 the model's greedy pair "a", "b" happens to be allowed)
        assert deviation(processed_law(target, lambda ids, s: s, sampling, NUM_TOKENS), reference) > 1e-2
    law = speculative_law(method, GrammarProcessor(grammar, prompt_length=len(PROMPT)), sampling, NUM_TOKENS)
    assert abs(math.fsum(law.values()) - 1.0) < 1e-9
    assert deviation(law, reference) < 1e-9, f"{method}: {deviation(law, reference):.3e}"


@pytest.mark.parametrize("method", ["sd", "specinfer", "rheo", "sequoia"])
def test_the_per_node_fallback_gives_the_constrained_law_exactly(method):
    """``tree_mask="per_node"`` (the path without xgrammar's tree traversal) keeps the law too."""
    grammar = small_grammar()
    target, _ = models()
    reference = processed_law(target, GrammarProcessor(grammar, prompt_length=len(PROMPT)), T1, NUM_TOKENS)
    processor = GrammarProcessor(grammar, prompt_length=len(PROMPT), tree_mask="per_node")
    law = speculative_law(method, processor, T1, NUM_TOKENS)
    assert processor.whole_tree_calls == 0 and processor.node_fills > 0
    assert deviation(law, reference) < 1e-9, f"{method}: {deviation(law, reference):.3e}"


_process_tree = GrammarProcessor.process_tree


def _parent_rows(self, scores, context, tokens, parents):
    """The mutant: each node's row masked as its parent's (its own token left out of its context)."""
    banned = _process_tree(self, torch.zeros_like(scores), context, tokens, parents).isinf()  # [n, V]
    own = torch.arange(parents.shape[0], device=parents.device)
    return scores.masked_fill(banned[torch.where(parents >= 0, parents, own)], float("-inf"))


@pytest.mark.parametrize("tree_mask", ["traverse_draft_tree", "per_node"])
def test_the_parent_context_mutant_is_caught(monkeypatch, tree_mask):
    """A whole tree goes to GrammarProcessor.process_tree: masking each node's row in its
    parent's context instead of its own moves the law, on both mask paths."""
    grammar = small_grammar()
    target, _ = models()
    reference = processed_law(target, GrammarProcessor(grammar, prompt_length=len(PROMPT)), T1, NUM_TOKENS)
    monkeypatch.setattr(GrammarProcessor, "process_tree", _parent_rows)
    worst = max(deviation(speculative_law(m, GrammarProcessor(grammar, prompt_length=len(PROMPT), tree_mask=tree_mask),
                                          T1, NUM_TOKENS, draft_is_target=True), reference) for m in ("sd", "eagle3"))
    assert worst > 1e-3


BIG_VOCAB = ["a", "b", "c", "ab", "bc", "{", "}", "</s>"]
BIG_GRAMMAR = 'root ::= "{" ("a" | "b" "c" | "ab")* "}" ("{" "a"* "}")*'


def big_grammar():
    info = xgr.TokenizerInfo(BIG_VOCAB, vocab_type=xgr.VocabType.RAW, stop_token_ids=[7])
    return xgr.GrammarCompiler(info).compile_grammar(BIG_GRAMMAR)


def _until_stop(tokens: list[int]) -> list[int]:
    return tokens[: tokens.index(7) + 1] if 7 in tokens else tokens


@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_xgrammars_own_processor(method):
    grammar = big_grammar()
    differs = 0
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        target = MarkovLM(random_markov_logits(8, 2, g, scale=1.5).float())  # xgrammar's CPU masking takes float32
        draft = MarkovLM(random_markov_logits(8, 2, g, scale=1.5).float())
        ref = specdec.autoregressive_generate(target, [0, 1], 20, GREEDY,
                                              logits_processor=xgr.contrib.hf.LogitsProcessor(grammar)).tokens
        plain = specdec.autoregressive_generate(target, [0, 1], 20, GREEDY).tokens
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method)
        got = gen.generate([0, 1], 20, GREEDY, logits_processor=GrammarProcessor(grammar)).tokens
        assert _until_stop(got) == _until_stop(ref), (seed, got, ref)
        differs += _until_stop(plain) != _until_stop(ref)
    assert differs >= 3  # the grammar changes the output


def test_a_grammar_with_no_token_at_a_visited_node_raises_naming_it():
    """The "generated" part starts inside the prompt, where the grammar refuses the prompt's
    last token: the root's row has no allowed token, and every verifier visits the root."""
    target, draft = models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="sd")
    processor = GrammarProcessor(small_grammar(), prompt_length=1)  # generated = (1,): "b" first is refused
    with pytest.raises(InvalidDistributionError, match="node the verifier visited .* all -inf"):
        gen.generate(list(PROMPT), 4, T1, seed=0, logits_processor=processor)


def test_scores_of_another_width_are_refused():
    processor = GrammarProcessor(small_grammar(), prompt_length=1)
    with pytest.raises(InvalidConfigError, match="scores have 5 columns, the grammar's vocabulary 4"):
        processor(torch.tensor([[3]]), torch.zeros(1, 5))
    padded = GrammarProcessor(small_grammar(), prompt_length=1, vocab_size=6)  # a padded LM head: padding banned
    assert padded(torch.tensor([[3]]), torch.zeros(1, 6)).isfinite().tolist() == [[True, False, True, False, False, False]]


def test_rollback_and_order_of_calls_do_not_matter():
    """The processor is a function of each row's context, whatever was called before."""
    grammar = big_grammar()
    contexts = [[0, 5, 0], [0, 5, 1], [0, 5, 0, 3], [0, 5, 6, 7], [0, 5, 6, 7, 7], [0, 5, 6, 5], [0, 5]]
    fresh = [GrammarProcessor(grammar, prompt_length=1)(torch.tensor([c]), torch.zeros(1, 8)) for c in contexts]
    shared = GrammarProcessor(grammar, prompt_length=1)
    for order in (contexts, contexts[::-1], contexts[2:] + contexts[:2]):
        for c in order:
            got = shared(torch.tensor([c]), torch.zeros(1, 8))
            assert torch.equal(got, fresh[contexts.index(c)]), c


def test_without_the_extra_the_error_names_it():
    code = ("import sys; sys.modules['xgrammar'] = None\n"
            "from specdec.grammar import GrammarProcessor\n"
            "try:\n    GrammarProcessor(None)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "MissingExtraError" in out.stdout and "pip install 'specdec-trees[grammar]'" in out.stdout, out


# ---------------------------------------------------------------- path rules (issue 57)
# A draft node whose token the grammar refuses has an all -inf row; the path rules never accept
# it (its weight is 0) and never read that row: their walks and tensor forms keep the constrained law.
PATH_RULES = {
    "chain/block": ("chain", "block", {"depth": 2}),
    "static/traversal": ("static", "traversal", {"expansion": (2, 1), "mode": "wor"}),
    "sequoia/traversal": ("sequoia", "traversal", {"num_nodes": 3, "max_depth": 2, "acceptance": (0.5, 0.2)}),
}


def _path_rule_law(case: str, sampling) -> dict:
    tree, verifier, options = PATH_RULES[case]
    target, draft = models()
    builder, rule = compose(tree, verifier, options)

    def program(rng):
        reports = run_rows(target, draft, builder, rule, [list(PROMPT)], sampling, [rng], max_new_tokens=NUM_TOKENS,
                           logits_processor=GrammarProcessor(small_grammar(), prompt_length=len(PROMPT)))
        return tuple(t for report in reports for t in report.kept[0])

    return exact_law(program)


@pytest.mark.parametrize("case,sampling", [("chain/block", T1), ("chain/block", GREEDY), ("static/traversal", T1),
                                           ("sequoia/traversal", T1)], ids=["block-T1", "block-T0", "static-T1", "sequoia-T1"])
def test_path_rules_give_the_constrained_law_exactly(case, sampling):
    target, _ = models()
    reference = processed_law(target, GrammarProcessor(small_grammar(), prompt_length=len(PROMPT)), sampling, NUM_TOKENS)
    law = _path_rule_law(case, sampling)
    assert abs(math.fsum(law.values()) - 1.0) < 1e-9
    assert deviation(law, reference) < 1e-9, f"{case}: {deviation(law, reference):.3e}"


def _grammatical(grammar, tokens: list[int]) -> bool:
    matcher = xgr.GrammarMatcher(grammar)
    for token in tokens:
        if not matcher.accept_token(token):
            return False
        if matcher.is_terminated():
            break
    return True


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["T1", "T0"])
@pytest.mark.parametrize("method,options", [("sd", {"verifier": "block", "depth": 4}),
                                            ("sequoia", {"verifier": "traversal"}),
                                            ("specinfer", {"verifier": "traversal", "mode": "wor"})],
                         ids=["sd-block", "sequoia-traversal", "specinfer-traversal"])
def test_path_rules_tensor_forms_generate_under_a_grammar(method, options, temperature):
    """The engine's tensor forms (``block``, ``traversal``): every run completes with grammatical
    output (the forms flagged a refused node's row as a visited bad row and raised); at ``T = 0``
    the output is xgrammar's own processor's."""
    grammar = big_grammar()
    sampling = specdec.SamplingConfig(temperature=temperature)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        target = MarkovLM(random_markov_logits(8, 2, g, scale=1.5).float())
        draft = MarkovLM(random_markov_logits(8, 2, g, scale=1.5).float())
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, **options)
        out = gen.generate([0, 1], 16, sampling, seed=seed, logits_processor=GrammarProcessor(grammar))
        assert out.stats.kernel_path == "torch"
        assert _grammatical(grammar, out.tokens), (seed, out.tokens)
        if temperature == 0.0:
            ref = specdec.autoregressive_generate(target, [0, 1], 16, GREEDY,
                                                  logits_processor=xgr.contrib.hf.LogitsProcessor(grammar)).tokens
            assert _until_stop(out.tokens) == _until_stop(ref), (seed, out.tokens, ref)
