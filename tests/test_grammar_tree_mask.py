"""A whole draft tree masked by xgrammar's ``traverse_draft_tree`` (issue 58, item 6).

``GrammarProcessor.process_tree`` masks every node of a tree in one native call where the
installed xgrammar has ``GrammarMatcher.traverse_draft_tree``, else (or with
``tree_mask="per_node"``) by one mask fill per node. Both paths must give exactly the masks of
the processor called on each node's own context, one row at a time (the reference, independent
of the tree code), and the masks the per-depth route of ``specdec.processors`` gave before:

- random trees of several shapes (chains, bushes, deep narrow trees; deterministic and sampled
  children, repeated sibling tokens, nodes below a refused node, stop tokens after the end, the
  root already ended, a refused root) on three grammars, one of them xgrammar's JSON grammar,
  and a padded LM head whose extra ids a draft may propose;
- real ``TreeBatch`` rows (padding slots included) through ``process_batch_row``;
- which path ran is said (``tree_mask_path``, counters, one INFO log), the fallback is forced
  by ``tree_mask="per_node"`` and by an xgrammar without the traversal; a mutant of the native
  path's after-the-end rule fails the comparison.
"""

from __future__ import annotations

import logging
import random

import pytest
import torch

xgr = pytest.importorskip("xgrammar")

import specdec.grammar as grammar_module  # noqa: E402
from specdec.errors import InvalidConfigError, MalformedTreeError  # noqa: E402
from specdec.grammar import GrammarProcessor, has_tree_traversal  # noqa: E402
from specdec.processors import TreeLogitsProcessor, node_parents, process_batch_row, process_tree_logits  # noqa: E402
from specdec.tree import SampleMode, SparseLaw, TreeAssembler  # noqa: E402
from specdec.tree_batch import TreeBatch  # noqa: E402

pytestmark = pytest.mark.skipif(not has_tree_traversal(), reason="the installed xgrammar has no traverse_draft_tree")

BRACES = (["a", "b", "c", "ab", "bc", "{", "}", "</s>"], 'root ::= "{" ("a" | "b" "c" | "ab")* "}" ("{" "a"* "}")*', 7)
PAIRS = (["a", "b", "ab", "</s>"], 'root ::= ("ab" | "a" "b")+', 3)
JSON_VOCAB = ["{", "}", '"', "a", "b", ":", ",", " ", "1", "2", "[", "]", "true", "null", '":', "</s>"]


def compile_grammar(case: str):
    if case == "json":
        info = xgr.TokenizerInfo(JSON_VOCAB, vocab_type=xgr.VocabType.RAW, stop_token_ids=[15])
        return xgr.GrammarCompiler(info).compile_builtin_json_grammar()
    vocab, ebnf, stop = BRACES if case == "braces" else PAIRS
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[stop])
    return xgr.GrammarCompiler(info).compile_grammar(ebnf)


def row_by_row(grammar, generated: list[int], tokens: list[int], parents: list[int], vocab_size: int) -> torch.Tensor:
    """``[n, V]`` bool: each node's allowed tokens from the processor called on its own context
    (``[prompt] + generated + path``), a fresh processor per node."""
    rows = []
    for i in range(len(tokens)):
        path, node = [], i
        while parents[node] >= 0:
            path.append(tokens[node])
            node = parents[node]
        context = [0] + generated + path[::-1]
        processor = GrammarProcessor(grammar, prompt_length=1, vocab_size=vocab_size)
        rows.append(processor(torch.tensor([context]), torch.zeros(1, vocab_size))[0].isfinite())
    return torch.stack(rows)


def random_tree(rng: random.Random, vocab: int, shape: str) -> tuple[list[int], list[int]]:
    """``(tokens, parents)`` of a random forest shape; slot 0 the root, a few padding slots
    (parent -1) at the end; sibling tokens repeat; ids up to ``vocab`` (past the tokenizer's
    when the LM head is padded)."""
    n = rng.randint(6, 24)
    parents = [-1]
    for i in range(1, n):
        if shape == "chain":
            parents.append(i - 1)
        elif shape == "bush":
            parents.append(rng.randrange(min(i, 3)))
        else:  # a random tree: deeper and narrower the later a node comes
            parents.append(rng.randrange(max(0, i - 4), i))
    tokens = [rng.randrange(vocab) for _ in range(n)]
    for i in range(1, n):  # repeated tokens: a node often copies an earlier sibling's
        earlier = [j for j in range(1, i) if parents[j] == parents[i]]
        if earlier and rng.random() < 0.3:
            tokens[i] = tokens[rng.choice(earlier)]
    pad = rng.randint(0, 2)
    return tokens + [rng.randrange(vocab) for _ in range(pad)], parents + [-1] * pad


def shuffled(tokens: list[int], parents: list[int], rng: random.Random) -> tuple[list[int], list[int]]:
    """The same tree with its slots permuted (children may come before their parents)."""
    perm = list(range(len(tokens)))
    rng.shuffle(perm)
    where = {old: new for new, old in enumerate(perm)}
    return [tokens[old] for old in perm], [where[parents[old]] if parents[old] >= 0 else -1 for old in perm]


def grammatical_prefix(grammar, rng: random.Random, length: int) -> list[int]:
    """A random prefix the grammar accepts (stop tokens after its end included)."""
    matcher, out = xgr.GrammarMatcher(grammar), []
    bitmask = xgr.allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)
    stops = list(grammar.tokenizer_info.stop_token_ids)
    for _ in range(length):
        if matcher.is_terminated():
            out.append(stops[0])
            continue
        matcher.fill_next_token_bitmask(bitmask)
        banned = torch.zeros(1, grammar.tokenizer_info.vocab_size)
        xgr.apply_token_bitmask_inplace(banned, bitmask)
        allowed = (banned[0] == 0).nonzero().flatten().tolist()
        token = rng.choice(allowed)
        assert matcher.accept_token(token)
        out.append(token)
    return out


def tree_along_grammar(grammar, case: str, rng: random.Random, vocab: int, n: int) -> tuple[list[int], list[int]]:
    """A tree whose nodes mostly follow the grammar (deep accepted paths, leaning to the stop
    token and closing brackets: the end), with a few refused tokens (their subtrees refused)."""
    stops = list(grammar.tokenizer_info.stop_token_ids)
    tokens, parents = [0], [-1]
    paths: list[list[int]] = [[]]
    for _ in range(1, n):
        parent = rng.randrange(len(tokens))
        token = rng.randrange(vocab)
        if rng.random() < 0.75:  # a token the grammar allows after the parent's path, when there is one
            prefix = paths[parent]
            matcher = xgr.GrammarMatcher(grammar)
            if all(matcher.accept_token(t) for t in prefix) and not matcher.is_terminated():
                bitmask = xgr.allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)
                matcher.fill_next_token_bitmask(bitmask)
                banned = torch.zeros(1, grammar.tokenizer_info.vocab_size)
                xgr.apply_token_bitmask_inplace(banned, bitmask)
                allowed = (banned[0] == 0).nonzero().flatten().tolist()
                closing = [t for t in allowed if t in stops or (case == "json" and JSON_VOCAB[t] in "}]")]
                token = rng.choice(closing if closing and rng.random() < 0.5 else allowed or [token])
            elif matcher.is_terminated():
                token = grammar.tokenizer_info.stop_token_ids[0]
        tokens.append(token)
        parents.append(parent)
        paths.append(paths[parent] + [token])
    return tokens, parents


CASES = [(case, pad) for case in ("braces", "pairs", "json") for pad in (0, 2)]


@pytest.mark.parametrize("case,pad", CASES, ids=[f"{c}-pad{p}" for c, p in CASES])
def test_both_paths_equal_the_row_by_row_masks_on_random_trees(case, pad):
    grammar = compile_grammar(case)
    vocab = grammar.tokenizer_info.vocab_size + pad
    native = GrammarProcessor(grammar, prompt_length=1, vocab_size=vocab)
    per_node = GrammarProcessor(grammar, prompt_length=1, vocab_size=vocab, tree_mask="per_node")
    assert native.tree_mask_path == "traverse_draft_tree" and per_node.tree_mask_path == "per_node"
    rng = random.Random(f"{case}-{pad}")
    seen = {"refused subtree": 0, "ended": 0, "repeated": 0, "root ended": 0, "root refused": 0}
    for trial in range(30):
        if trial % 2 == 1:
            tokens, parents = tree_along_grammar(grammar, case, rng, vocab, rng.randint(8, 30))
        else:
            tokens, parents = random_tree(rng, vocab, ("chain", "bush", "random")[trial // 2 % 3])
        if trial % 4 == 3:
            tokens, parents = shuffled(tokens, parents, rng)
        generated = grammatical_prefix(grammar, rng, rng.choice([0, 1, 2, 3, 5, 8]))
        if trial == 5:
            generated = generated + [rng.randrange(vocab)]  # maybe a refused root
        expected = row_by_row(grammar, generated, tokens, parents, vocab)  # [n, V]
        got_native = native.tree_allowed(generated, tokens, parents)
        got_per_node = per_node.tree_allowed(generated, tokens, parents)
        assert torch.equal(got_native, expected), (case, trial, generated, tokens, parents)
        assert torch.equal(got_per_node, expected), (case, trial, generated, tokens, parents)
        dtype = (torch.float32, torch.float64, torch.bfloat16)[trial % 3]  # xgrammar's kernel, torch's unpacking
        scores = native.process_tree(torch.zeros(len(tokens), vocab, dtype=dtype), torch.tensor([0] + generated),
                                     torch.tensor(tokens), torch.tensor(parents))
        assert torch.equal(scores.isfinite(), expected), (case, trial, dtype)
        # what the trees covered
        stops = set(grammar.tokenizer_info.stop_token_ids)
        empty = ~expected.any(1)
        seen["refused subtree"] += sum(1 for i, p in enumerate(parents) if p >= 0 and empty[p] and parents[p] >= 0)
        only_stops = expected.any(1) & (expected.sum(1) == len(stops))
        seen["ended"] += int(sum(1 for i, p in enumerate(parents) if p >= 0 and tokens[i] in stops and only_stops[i]))
        seen["repeated"] += len(parents) - len({(p, t) for p, t in zip(parents, tokens)})
        seen["root ended"] += bool(expected[0].any() and expected[0].sum() == len(stops) and generated
                                   and generated[-1] in stops)
        seen["root refused"] += bool(empty[0])
    assert native.whole_tree_calls > 0 and native.node_fills == 0
    assert per_node.whole_tree_calls == 0 and per_node.node_fills > 0
    assert seen["refused subtree"] > 0 and seen["repeated"] > 0, seen
    assert seen["ended"] > 0 and seen["root ended"] > 0 and seen["root refused"] > 0, seen


def test_the_native_paths_after_the_end_rule_is_needed():
    """Mutant: without giving the stop tokens to the nodes after the grammar's end (xgrammar
    leaves their rows empty), the comparison fails: the tests above have power there."""
    grammar = compile_grammar("braces")
    tokens, parents = [0, 6, 7, 7, 0], [-1, 0, 1, 2, 1]  # "}" then "</s>" "</s>": the grammar ends at node 2
    generated = [5, 0]  # "{", "a"
    expected = row_by_row(grammar, generated, tokens, parents, 8)
    assert expected[2].tolist() == [False] * 7 + [True] and expected[3].tolist() == [False] * 7 + [True]
    assert torch.equal(GrammarProcessor(grammar, prompt_length=1).tree_allowed(generated, tokens, parents), expected)
    mutant = GrammarProcessor(grammar, prompt_length=1)
    mutant.stop_ids = []  # no node is ever "ended": its rows stay xgrammar's (empty)
    assert not torch.equal(mutant.tree_allowed(generated, tokens, parents), expected)


def _tree_batch(rng: random.Random, vocab: int) -> TreeBatch:
    """Three host trees of different sizes (padding slots in the smaller ones): deterministic
    children and i.i.d. sampled children (repeats possible) under random parents."""
    law = SparseLaw.from_dense(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64), SampleMode.IID)
    trees = []
    for size in (5, 12, 9):
        asm = TreeAssembler(root_token=rng.randrange(vocab), vocab_size=vocab)
        laws: dict[int, SparseLaw] = {}
        used: dict[int, set[int]] = {}
        for _ in range(size - 1):
            parent = rng.randrange(len(asm))
            if rng.random() < 0.5:
                token = rng.randrange(vocab)
                if token in used.setdefault(parent, set()):
                    continue
                used[parent].add(token)
                asm.add_deterministic(parent, token, weight=1.0)
            else:
                asm.add_sampled(parent, rng.randrange(vocab), laws.setdefault(parent, law), weight=1.0)
        trees.append(asm.build())
    return TreeBatch.from_trees(trees)


@pytest.mark.parametrize("dtype,pad", [(torch.float32, 0), (torch.float64, 0), (torch.float32, 2), (torch.bfloat16, 2)])
def test_tree_batches_through_process_batch_row_equal_the_per_depth_route(dtype, pad):
    """``process_batch_row`` on real tree batches: the whole-tree path (xgrammar's kernel for
    float32 / bfloat16 rows, the bits unpacked in torch for float64), the per-node fallback and
    the per-depth route (the processor hidden behind a plain callable: one call per depth, as
    before issue 58) give bit-identical logits; a padded LM head's columns are banned."""
    grammar = compile_grammar("braces")
    vocab = 8 + pad
    rng = random.Random(58 + pad)
    gen = torch.Generator().manual_seed(58)
    for _ in range(6):
        tree = _tree_batch(rng, vocab)
        prefix = grammatical_prefix(grammar, rng, rng.choice([1, 2, 4]))
        context = torch.tensor([0] + prefix)  # [L]: the prompt, then the generated tokens; the root's token last
        logits = torch.randn(tree.batch_size, tree.tokens.shape[1], vocab, generator=gen).to(dtype)  # [B, n, V]
        native = GrammarProcessor(grammar, prompt_length=1, vocab_size=vocab)
        per_node = GrammarProcessor(grammar, prompt_length=1, vocab_size=vocab, tree_mask="per_node")
        per_depth = GrammarProcessor(grammar, prompt_length=1, vocab_size=vocab)
        for b in range(tree.batch_size):
            assert torch.equal(node_parents(tree.depths[b], tree.ancestors[b]), tree.parents[b])  # padding: -1
            before = logits[b].clone()
            want = process_batch_row(lambda ids, s: per_depth(ids, s), logits[b], context, tree, b)
            assert torch.equal(process_batch_row(native, logits[b], context, tree, b), want)
            assert torch.equal(process_batch_row(per_node, logits[b], context, tree, b), want)
            assert torch.equal(logits[b], before)  # the caller's logits are untouched
            if pad:
                assert want[:, 8:].isneginf().all()
        assert native.whole_tree_calls == tree.batch_size and native.node_fills == 0
        assert per_depth.whole_tree_calls == 0


def test_which_path_runs_is_said(caplog, monkeypatch):
    grammar = compile_grammar("pairs")
    monkeypatch.setattr(grammar_module, "_logged", set())
    with caplog.at_level(logging.INFO, logger="specdec.grammar"):
        GrammarProcessor(grammar)
        GrammarProcessor(grammar)  # said once per process
        forced = GrammarProcessor(grammar, tree_mask="per_node")
    said = [r.getMessage() for r in caplog.records if r.name == "specdec.grammar"]
    assert said == ["specdec.grammar: draft trees are masked by traverse_draft_tree (one native call of xgrammar's "
                    "GrammarMatcher.traverse_draft_tree per tree)",
                    "specdec.grammar: draft trees are masked by per-node fills (tree_mask='per_node')"]
    assert forced.tree_mask_path == "per_node"


def test_an_xgrammar_without_the_traversal_falls_back_and_says_so(caplog, monkeypatch):
    """The fallback forced as an older xgrammar would: per-node fills, said at INFO naming why;
    asking for the traversal then is an error naming the argument."""
    grammar = compile_grammar("braces")
    monkeypatch.setattr(grammar_module, "has_tree_traversal", lambda: False)
    monkeypatch.setattr(grammar_module, "_logged", set())
    with caplog.at_level(logging.INFO, logger="specdec.grammar"):
        processor = GrammarProcessor(grammar, prompt_length=1)
    assert processor.tree_mask_path == "per_node"
    assert "has no GrammarMatcher.traverse_draft_tree" in caplog.text and "per-node fills" in caplog.text
    tokens, parents = [0, 5, 0, 6, 7], [-1, 0, 1, 1, 3]
    assert torch.equal(processor.tree_allowed([], tokens, parents), row_by_row(grammar, [], tokens, parents, 8))
    assert processor.whole_tree_calls == 0 and processor.node_fills == 5
    with pytest.raises(InvalidConfigError, match="tree_mask='traverse_draft_tree', but the installed xgrammar"):
        GrammarProcessor(grammar, tree_mask="traverse_draft_tree")


def test_bad_tree_mask_and_bad_parents_are_refused():
    grammar = compile_grammar("braces")
    with pytest.raises(InvalidConfigError, match="tree_mask must be one of auto, traverse_draft_tree, per_node"):
        GrammarProcessor(grammar, tree_mask="native")
    processor = GrammarProcessor(grammar, prompt_length=1)
    with pytest.raises(MalformedTreeError, match="parents has 2 entries for 3 node tokens"):
        processor.tree_allowed([], [0, 1, 2], [-1, 0])
    with pytest.raises(MalformedTreeError, match=r"parents\[1\] = 5 is not another node's slot"):
        processor.tree_allowed([], [0, 1, 2], [-1, 5, 0])
    with pytest.raises(MalformedTreeError, match="parents has a cycle: 2 of 3 nodes"):
        processor.tree_allowed([], [0, 1, 2], [-1, 2, 1])
    with pytest.raises(InvalidConfigError, match="committed context of length 1 is shorter than the prompt"):
        GrammarProcessor(grammar, prompt_length=2).process_tree(torch.zeros(1, 8), torch.tensor([0]),
                                                                torch.tensor([0]), torch.tensor([-1]))


class _WrongRows(TreeLogitsProcessor):
    """A tree processor that returns one row too few."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores

    def process_tree(self, scores, context, tokens, parents):
        return scores[1:]


def test_a_tree_processor_is_called_once_and_its_shape_checked():
    assert isinstance(GrammarProcessor(compile_grammar("pairs")), TreeLogitsProcessor)
    assert not isinstance(lambda ids, s: s, TreeLogitsProcessor)

    class Undeclared:  # a process_tree method alone declares nothing: it is called per depth
        def __call__(self, input_ids, scores):
            return scores

        def process_tree(self, scores, context, tokens, parents):
            raise AssertionError("an undeclared processor's process_tree was called")

    tokens3, depths3 = torch.tensor([3, 0, 1]), torch.tensor([0, 1, 2])
    ancestors3 = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    out = process_tree_logits(Undeclared(), torch.zeros(3, 4), torch.tensor([0, 3]), tokens3, depths3, ancestors3, 2)
    assert out.shape == (3, 4)
    tokens, depths = torch.tensor([3, 0, 1]), torch.tensor([0, 1, 2])
    ancestors = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    with pytest.raises(InvalidConfigError, match=r"process_tree returned \(2, 4\) for scores of shape \(3, 4\)"):
        process_tree_logits(_WrongRows(), torch.zeros(3, 4), torch.tensor([0, 3]), tokens, depths, ancestors, 2)


def test_a_stop_token_in_a_words_sign_bit():
    """Stop id 31: the after-the-end rows set bit 31 of word 0, the int32 sign bit."""
    vocab = ["a", "b", "ab"] + [f"x{i}" for i in range(28)] + ["</s>"]
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[31])
    grammar = xgr.GrammarCompiler(info).compile_grammar('root ::= ("ab" | "a" "b")+')
    tokens, parents = [0, 2, 31, 31, 0, 31], [-1, 0, 1, 2, 1, 0]
    expected = row_by_row(grammar, [], tokens, parents, 32)
    assert expected[2].nonzero().flatten().tolist() == [31] and expected[3].nonzero().flatten().tolist() == [31]
    processor = GrammarProcessor(grammar, prompt_length=1)
    assert torch.equal(processor.tree_allowed([], tokens, parents), expected)
    scores = processor.process_tree(torch.zeros(6, 32), torch.tensor([0]), torch.tensor(tokens), torch.tensor(parents))
    assert torch.equal(scores.isfinite(), expected)
