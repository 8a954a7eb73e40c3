"""Exact-law scaling (issue 43, goal 2): the literal chained program against ExactLaws.

The literal form is the one the guide used to show (every step of the run inside one
``exact_law``; its branches multiply across steps); ExactLaws enumerates each step once
per context (builder draws, then verifier draws per distinct tree) and composes.

    python benchmarks/exact_laws.py                 # ExactLaws only
    python benchmarks/exact_laws.py --literal 300   # also the literal program, each capped at 300 s

Prints one markdown row per case: the law's outcomes, the error against the target's law,
the branches run, and the wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import torch

import specdec
from specdec.sampling import process_logits
from specdec.testing import ExactLaws, MarkovLM, exact_law, random_markov_logits
from specdec.trees import build_tree

CASES = (  # (label, tree, options, verifier, tokens)
    ("static(expansion=(2,1)), 2 tokens", "static", {"expansion": (2, 1), "mode": "iid"}, "rejection-iid", 2),
    ("chain depth 3, 3 tokens", "chain", {"depth": 3}, "rejection-iid", 3),
)
SAMPLINGS = {"T=0.9 top-k 2": specdec.SamplingConfig(temperature=0.9, top_k=2),
             "T=0.9": specdec.SamplingConfig(temperature=0.9)}
V, PROMPT = 3, [0, 1]


def models() -> tuple[MarkovLM, MarkovLM]:
    gen = torch.Generator().manual_seed(0)  # the guide's models
    return (MarkovLM(random_markov_logits(V, order=2, generator=gen, scale=1.0)),
            MarkovLM(random_markov_logits(V, order=2, generator=gen, scale=1.0)))


def literal(tree: str, options: dict, verifier: str, tokens: int, sampling, out) -> None:
    target, draft = models()
    builder, rule = specdec.get("tree", tree)(**options), specdec.get("verifier", verifier)()
    runs = [0]

    def program(rng):
        runs[0] += 1
        ctx, emitted = list(PROMPT), []
        target.prefill(ctx)
        draft.begin(ctx)
        while len(emitted) < tokens:
            t = build_tree(builder, ctx[-1], draft, sampling, rng)
            result = rule.verify(t, process_logits(target.score_tree(t), sampling), rng)
            target.accept(result.accepted_nodes, result.bonus_token)
            draft.commit(result.tokens)
            emitted += result.tokens
            ctx += result.tokens
        return tuple(emitted[:tokens])

    start = time.perf_counter()
    law = exact_law(program, max_branches=10**8)
    truth = target.joint_law(PROMPT, tokens, sampling)
    error = max(abs(law.get(k, 0.0) - truth.get(k, 0.0)) for k in set(law) | set(truth))
    out.put((len(law), error, runs[0], time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--literal", type=float, default=0.0, metavar="SECONDS",
                        help="also run the literal program, capped at SECONDS each (0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| case | sampling | form | outcomes | max error | branches | seconds |")
    print("|---|---|---|---|---|---|---|")
    for label, tree, options, verifier, tokens in CASES:
        for sname, sampling in SAMPLINGS.items():
            target, draft = models()
            start = time.perf_counter()
            laws = ExactLaws(specdec.get("tree", tree)(**options), specdec.get("verifier", verifier)(),
                             target, draft, sampling)
            gap = laws.check(PROMPT, tokens)
            seconds = time.perf_counter() - start
            print(f"| {label} | {sname} | ExactLaws.token_law | {len(laws.token_law(PROMPT, tokens))} | "
                  f"{gap.error:.1e} | {laws.branches} | {seconds:.2f} |", flush=True)
            if args.literal > 0:
                queue: multiprocessing.Queue = multiprocessing.Queue()
                proc = multiprocessing.Process(target=literal, args=(tree, options, verifier, tokens, sampling, queue))
                start = time.perf_counter()
                proc.start()
                proc.join(args.literal)
                if proc.is_alive():
                    proc.terminate()
                    print(f"| {label} | {sname} | literal program | - | - | - | > {args.literal:.0f} (stopped) |",
                          flush=True)
                else:
                    n, error, runs, seconds = queue.get()
                    print(f"| {label} | {sname} | literal program | {n} | {error:.1e} | {runs} | {seconds:.2f} |",
                          flush=True)


if __name__ == "__main__":
    main()
