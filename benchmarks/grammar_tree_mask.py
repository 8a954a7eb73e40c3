"""Masking a 60-node draft tree under a JSON grammar: xgrammar's tree traversal against per-node fills (issue 58).

SmolLM2-135M-Instruct's tokenizer (V = 49,152) and xgrammar's built-in JSON grammar. Each tree
has 60 nodes (the root and 59 draft nodes, depth 6, the shape of the ``eagle3`` / ``rheo``
budget-60 trees), grown from a JSON prefix: each node's children are tokens the grammar allows
after its path (one in ten is a token it refuses, as a draft's mistakes are). The tree's rows
([60, V] float32 logits) go through ``specdec.processors.process_tree_logits``, the step's own
route, three ways:

- ``per-depth calls``: the processor hidden behind a plain callable, so it is called once per
  depth with each node's context (the route before issue 58);
- ``per-node fills``: ``GrammarProcessor(tree_mask="per_node").process_tree`` (the fallback);
- ``traverse_draft_tree``: ``GrammarProcessor.process_tree``'s one native call (the default
  where xgrammar has it).

The three outputs are checked equal. Times are the minimum over the repeats of one tree's
masking (one thread), taken on a shared 2-core CPU while other jobs ran.

    python benchmarks/grammar_tree_mask.py --markdown benchmarks/results/grammar_tree_mask_issue58.md
"""

from __future__ import annotations

import argparse
import importlib.metadata
import random
import time
from collections.abc import Callable

import torch

from specdec.grammar import GrammarProcessor, _forest
from specdec.processors import process_tree_logits

PREFIXES = ['{"name": "Tom", "age": ', '{"fruits": [{"name": "apple", "price": ', '{"title": "', '[1, 2, ']
LEVELS = (1, 8, 12, 14, 12, 8, 5)  # nodes per depth: 60 in all, depth 6


def allowed_tokens(xgr, matcher, vocab: int) -> list[int]:
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bitmask)
    banned = torch.zeros(1, vocab)
    xgr.apply_token_bitmask_inplace(banned, bitmask)
    return (banned[0] == 0).nonzero().flatten().tolist()


def grow_tree(xgr, grammar, prefix: list[int], rng: random.Random) -> tuple[list[int], list[int]]:
    """``(tokens, parents)`` of a 60-node tree below ``prefix`` (the module docstring)."""
    vocab = grammar.tokenizer_info.vocab_size
    tokens, parents = [prefix[-1]], [-1]
    paths: list[list[int]] = [[]]
    level = [0]
    for size in LEVELS[1:]:
        below = [rng.choice(level) for _ in range(size)]
        nxt = []
        for parent in below:
            matcher = xgr.GrammarMatcher(grammar)
            ok = all(matcher.accept_token(t) for t in prefix + paths[parent])
            allowed = allowed_tokens(xgr, matcher, vocab) if ok and not matcher.is_terminated() else []
            token = rng.choice(allowed) if allowed and rng.random() > 0.1 else rng.randrange(vocab)
            tokens.append(token)
            parents.append(parent)
            paths.append(paths[parent] + [token])
            nxt.append(len(tokens) - 1)
        level = nxt
    return tokens, parents


def tree_tensors(parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``depths [n]`` and ``ancestors [n, n]`` of a parents-first tree."""
    n = len(parents)
    depths = torch.zeros(n, dtype=torch.int64)
    ancestors = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            depths[i] = depths[p] + 1
            ancestors[i] |= ancestors[p]
    return depths, ancestors


def min_time(fn: Callable[[], torch.Tensor], repeats: int) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    assert out is not None
    return best, out


def main() -> None:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from specdec.models.smollm2 import converted_path, find_gguf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(converted_path(find_gguf())), local_files_only=True)
    vocab = len(tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    grammar = xgr.GrammarCompiler(info).compile_builtin_json_grammar()
    rng = random.Random(58)
    gen = torch.Generator().manual_seed(58)
    rows = []
    for text in PREFIXES:
        prefix = tokenizer.encode(text, add_special_tokens=False)
        prompt = [0]  # the prompt; the grammar constrains what follows it
        tokens, parents = grow_tree(xgr, grammar, prefix, rng)
        depths, ancestors = tree_tensors(parents)
        context = torch.tensor(prompt + prefix)  # [L]: its last token the root's
        token_t = torch.tensor(tokens)
        logits = torch.randn(len(tokens), vocab, generator=gen)  # [60, V]
        per_depth_proc = GrammarProcessor(grammar, prompt_length=len(prompt))
        per_node_proc = GrammarProcessor(grammar, prompt_length=len(prompt), tree_mask="per_node")
        native_proc = GrammarProcessor(grammar, prompt_length=len(prompt))

        def run(processor) -> Callable[[], torch.Tensor]:
            return lambda: process_tree_logits(processor, logits, context, token_t, depths, ancestors, len(LEVELS) - 1)

        t_depth, out_depth = min_time(run(lambda ids, s: per_depth_proc(ids, s)), args.repeats)
        t_node, out_node = min_time(run(per_node_proc), args.repeats)
        t_native, out_native = min_time(run(native_proc), args.repeats)
        assert torch.equal(out_node, out_depth) and torch.equal(out_native, out_depth), text
        assert native_proc.whole_tree_calls == args.repeats and native_proc.node_fills == 0
        roots, children = _forest(parents, len(tokens))  # the traversal and its fix-ups alone (the bitmask rows)
        t_bits, _ = min_time(lambda: native_proc._tree_bitmask(prefix, tokens, parents, roots, children), args.repeats)
        refused = int((~out_native.isfinite().any(1)).sum())
        rows.append((text, t_depth, t_node, t_native, t_bits, refused))
        print(rows[-1], flush=True)
    version = importlib.metadata.version("xgrammar")
    lines = [f"SmolLM2-135M-Instruct's tokenizer (V = {vocab:,}), xgrammar {version}'s built-in JSON grammar; "
             f"60-node trees (depth 6) grown along the grammar from each JSON prefix; one thread; "
             f"min over {args.repeats} repeats of one tree's masking through `process_tree_logits` "
             "(the three outputs checked bit-identical).", "",
             "| prefix | rows refused | per-depth calls (before) ms | per-node fills ms | traverse_draft_tree ms | "
             "of which the traversal ms | speed-up vs before | vs per-node |", "|---|---|---|---|---|---|---|---|"]
    for text, t_depth, t_node, t_native, t_bits, refused in rows:
        lines.append(f"| `{text}` | {refused} | {1e3 * t_depth:.2f} | {1e3 * t_node:.2f} | {1e3 * t_native:.2f} | "
                     f"{1e3 * t_bits:.2f} | {t_depth / t_native:.2f}x | {t_node / t_native:.2f}x |")
    lines += ["", "The traversal column is the native call with its fix-ups (the rows as xgrammar bitmasks); the rest of "
              "the whole-tree time is the copy of the rows and writing -inf into them (xgrammar's CPU kernel, slower "
              "the more tokens a row bans; the other routes write the same entries with torch's masked_fill)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("# Masking a 60-node tree: traverse_draft_tree vs per-node fills (issue 58)\n\n" + text +
                     "\nCommand: `python benchmarks/grammar_tree_mask.py --markdown "
                     "benchmarks/results/grammar_tree_mask_issue58.md` (a shared 2-core CPU while other jobs ran: "
                     "the ratios, not the absolute times, are the figure)\n")


if __name__ == "__main__":
    main()
