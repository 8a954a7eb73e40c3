"""What a grammar constraint costs per step (issue 45): SmolLM2-135M-Instruct, 60-node trees.

Each method generates JSON (xgrammar's built-in JSON grammar through
:class:`specdec.grammar.GrammarProcessor`) and, beside it, the same prompts unconstrained, with
the shipped EAGLE-3 head (``eagle3``, ``rheo``: 60 nodes, depth 6) and the shipped draft LM
(``sd``, depth 4). Per step: the time inside the processor (every call timed), the step's
time, tau; the processor's share of the step. The processor runs on the host (xgrammar's
matcher, one rollback and one acceptance of the path per node), so its cost grows with the
tree's nodes and depth, not with the model: on a larger target or a GPU its share shrinks.

    python benchmarks/grammar_cost.py --markdown benchmarks/results/grammar_cost.md
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import specdec
from specdec.bench.models import load_bench_models
from specdec.grammar import GrammarProcessor

PROMPTS = [
    "Describe a cat as a JSON object with its name, age and colour.",
    "Give a JSON list of three fruits with their prices.",
    "Return a JSON object describing a book: title, author, year, genres.",
    "Write a JSON record for a user with id, email and a list of roles.",
]


class Timed:
    """A processor wrapper that sums the time of its calls."""

    def __init__(self, inner: GrammarProcessor) -> None:
        self.inner, self.seconds, self.calls, self.rows = inner, 0.0, 0, 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = self.inner(input_ids, scores)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.rows += int(input_ids.shape[0])
        return out


def main() -> None:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from specdec.models.smollm2 import converted_path, find_gguf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="eagle3,rheo,sd")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = load_bench_models("smollm2", need_kinds=frozenset({"lm", "eagle3"}))
    tokenizer = AutoTokenizer.from_pretrained(str(converted_path(find_gguf())), local_files_only=True)
    vocab = models.target.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    grammar = xgr.GrammarCompiler(info).compile_builtin_json_grammar()
    sampling = specdec.SamplingConfig(temperature=args.temperature)
    rows = []
    for method in args.methods.split(","):
        kind = "lm" if method == "sd" else "eagle3"
        options = {"depth": 4} if method == "sd" else {"N": 60, "depth": 6}
        gen = specdec.SpeculativeGenerator(target=models.targets[kind], draft=models.drafts[kind], method=method,
                                           **options)
        for constrained in (False, True):
            steps = tokens = 0
            wall = proc = 0.0
            calls = 0
            for i, text in enumerate(PROMPTS):
                ids = models.tokenize(text)
                timed = Timed(GrammarProcessor(grammar, prompt_length=len(ids), vocab_size=vocab)) if constrained else None
                start = time.perf_counter()
                out = gen.generate(ids, args.tokens, sampling, seed=i, logits_processor=timed,
                                   eos_token_id=models.eos_token_id)
                wall += time.perf_counter() - start
                steps += out.stats.steps
                tokens += len(out.tokens)
                if timed is not None:
                    proc += timed.seconds
                    calls += timed.calls
            rows.append({"method": method, "grammar": constrained, "steps": steps, "tokens": tokens,
                         "tau": tokens / steps, "ms_per_step": 1e3 * wall / steps,
                         "processor_ms_per_step": 1e3 * proc / steps, "processor_calls_per_step": calls / steps})
            print(rows[-1], flush=True)
    lines = [f"SmolLM2-135M-Instruct, T = {args.temperature}, {len(PROMPTS)} JSON prompts x {args.tokens} tokens, "
             f"{args.threads} thread(s); xgrammar's built-in JSON grammar", "",
             "| method | grammar | tau | ms / step | processor ms / step | processor share | calls / step |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        share = r["processor_ms_per_step"] / r["ms_per_step"]
        lines.append(f"| {r['method']} | {'JSON' if r['grammar'] else 'none'} | {r['tau']:.2f} | {r['ms_per_step']:.1f} | "
                     f"{r['processor_ms_per_step']:.1f} | {share:.1%} | {r['processor_calls_per_step']:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text + "\nCommand: `python benchmarks/grammar_cost.py --markdown benchmarks/results/grammar_cost.md`"
                     " (timings taken on a shared 2-core CPU while other jobs ran: the shares, not the absolute times,"
                     " are the figure)\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
