"""The ``specdec`` command line.

Subcommands:

- ``specdec list [ROLE] [--pattern GLOB]``: the registered strategies of each
  registry role (``tree``, ``verifier``, ``draft``, ``target``, ``method``).
- ``specdec demo``: a small self-contained demonstration that needs no model
  download, on a toy target and a toy draft (two
  :class:`~specdec.models.CallableLM` bigram tables over a tiny vocabulary).
  Part 1 generates with every registered method and prints tau, the
  acceptance by depth and whether, at temperature 0, the output equals plain
  autoregressive decoding token for token. Part 2 drafts random trees with
  the child kinds each registered verifier supports, verifies them, and prints
  the acceptance statistics and how far the empirical law of the first
  emitted token is from the target's exact law, next to the 95th percentile
  of that distance for as many direct draws from the target.
- ``specdec bench``: the side-by-side benchmark on a real model, defined in
  :mod:`specdec.bench.cli`.
- ``specdec train-eagle``, ``specdec train-draft``, ``specdec regen-data``:
  training draft heads, distilled draft LMs and self-distillation data,
  defined in :mod:`specdec.train.cli` (they keep their own parsers).

Words: *accepted* = draft tokens the verifier kept; *bonus* = the one token
the verifier draws from the target at the end of a step; *tau* = tokens
emitted per target forward = accepted + 1 (the bonus is counted).

``list`` and ``demo`` exit with status 0 on success, 1 when there is nothing
to show (a pattern that matches no name: for the demo, a ``--methods`` or
``--verifiers`` glob that matches no registered name, checked before anything
runs; ``none`` skips that part on purpose) or when the demo finds a method that
fails or is not greedy-exact, and 2 on bad input, with a one-line message on
stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

import specdec
from specdec.errors import SpecDecError, UnsupportedTreeError
from specdec.models.callable import CallableLM
from specdec.registry import ROLES, get, list_registered
from specdec.rng import RandomSource, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.step import speculative_step
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier

__all__ = ["main", "build_parser", "DemoRow", "MethodRow", "run_demo", "run_method_demo", "demo_tree", "toy_models"]


# ---------------------------------------------------------------- arguments
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):  # also rejects NaN
        raise argparse.ArgumentTypeError(f"temperature must be finite and >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``specdec`` command."""
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Lossless tree speculative decoding: list strategies, run the demo.",
    )
    parser.add_argument("--version", action="version", version=f"specdec {specdec.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p_list = sub.add_parser(
        "list",
        help="list registered strategies",
        description="List the registered strategies, per registry role.",
    )
    p_list.add_argument("role", nargs="?", choices=ROLES, metavar="ROLE",
                        help=f"one of: {', '.join(ROLES)} (default: all roles)")
    p_list.add_argument("--pattern", default="*", metavar="GLOB",
                        help="only names matching this glob, e.g. 'rejection-*' (default: *)")
    p_list.set_defaults(func=_cmd_list)

    p_demo = sub.add_parser(
        "demo",
        help="verify random draft trees on a toy model with every verifier",
        description=(
            "On a toy target and draft (bigram tables, no download): generate with every registered "
            "method, then verify random draft trees with every registered verifier, and print "
            "acceptance statistics. tau = tokens emitted per target forward, bonus included."
        ),
    )
    p_demo.add_argument("--trees", type=_positive_int, default=400, help="trees per verifier (default: 400)")
    p_demo.add_argument("--vocab", type=_positive_int, default=12, help="toy vocabulary size, >= 2 (default: 12)")
    p_demo.add_argument("--depth", type=_positive_int, default=3, help="tree depth (default: 3)")
    p_demo.add_argument("--width", type=_positive_int, default=2, help="children per expanded node (default: 2)")
    p_demo.add_argument("--temperature", type=_temperature, default=1.0,
                        help="sampling temperature; verifiers that need T=0 always run at 0 (default: 1.0)")
    p_demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p_demo.add_argument("--verifiers", default="*", metavar="GLOB",
                        help="only verifiers matching this glob (default: *); 'none' skips part 2; a glob that "
                             "matches no verifier is an error (exit 1)")
    p_demo.add_argument("--methods", default="*", metavar="GLOB",
                        help="only methods matching this glob (default: *); 'none' skips part 1; a glob that "
                             "matches no method is an error (exit 1)")
    p_demo.add_argument("--max-new-tokens", type=_positive_int, default=48,
                        help="tokens generated per method in part 1 (default: 48)")
    p_demo.set_defaults(func=_cmd_demo)

    from specdec.bench.cli import add_bench_parser  # `specdec bench` (docs/bench.md)

    add_bench_parser(sub)

    # training commands keep their own parsers (specdec.train.cli): listed here
    # for `specdec --help`, dispatched with every argument in main()
    for name, summary in (("train-eagle", "train an EAGLE-2/3 draft head for a target (docs/eagle.md)"),
                          ("train-draft", "distil a small independent draft LM from a target (docs/eagle.md)"),
                          ("regen-data", "regenerate training answers with the target (self-distillation data, "
                                         "docs/eagle.md)")):
        sub.add_parser(name, help=summary, description=summary, add_help=False)  # dispatched in main()
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``specdec`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("train-eagle", "train-draft", "regen-data"):  # own parsers take every argument
        from specdec.train.cli import regen_data_main, train_draft_main, train_eagle_main

        entry = {"train-eagle": train_eagle_main, "train-draft": train_draft_main, "regen-data": regen_data_main}
        return int(entry[argv[0]](argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SpecDecError as exc:
        print(f"specdec {args.command}: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------- list
def _summary(obj: Any) -> str:
    description = getattr(obj, "description", None)
    if isinstance(description, str) and description:
        return description
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def _cmd_list(args: argparse.Namespace) -> int:
    roles = [args.role] if args.role else list(ROLES)
    found = 0
    for role in roles:
        names = list_registered(role, args.pattern)
        found += len(names)
        if not names and args.role is None:
            continue
        print(f"{role} ({len(names)}):")
        width = max((len(n) for n in names), default=0)
        for name in names:
            print(f"  {name:<{width}}  {_summary(get(role, name))}".rstrip())
    if not found:
        where = f"role {args.role!r}" if args.role else "any role"
        print(f"specdec list: no registered name in {where} matches {args.pattern!r}", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------- demo
def toy_models(vocab_size: int, seed: int) -> tuple[CallableLM, CallableLM]:
    """A toy ``(target, draft)`` pair: bigram logit tables over ``vocab_size`` tokens.

    The draft's table is the target's plus Gaussian noise, so the draft is good
    but not perfect, as in real speculative decoding.

    Example:
        >>> target, draft = toy_models(5, seed=0)
        >>> target.prefill([1]); tuple(target.score_tree(DraftTree.chain(1, [], [], 5)).shape)
        (1, 5)
    """
    gen = torch.Generator().manual_seed(seed)
    table = 2.0 * torch.randn(vocab_size, vocab_size, generator=gen, dtype=torch.float64)
    noisy = table + 0.8 * torch.randn(vocab_size, vocab_size, generator=gen, dtype=torch.float64)

    def lookup(t: torch.Tensor) -> Callable[[list[list[int]]], torch.Tensor]:
        return lambda prefixes: t[[prefix[-1] for prefix in prefixes]]

    return CallableLM(lookup(table), vocab_size), CallableLM(lookup(noisy), vocab_size)


def _recipe(verifier: Verifier, greedy: bool) -> str:
    """Which kind of children the demo drafts for ``verifier``."""
    kinds = verifier.supported_kinds
    if NodeKind.DETERMINISTIC in kinds and (greedy or NodeKind.SAMPLED not in kinds):
        return "deterministic"
    if NodeKind.DETERMINISTIC in kinds:
        return "mixed"
    if NodeKind.SAMPLED in kinds:
        return "sampled-wor" if SampleMode.WITHOUT_REPLACEMENT in verifier.supported_modes else "sampled-iid"
    raise UnsupportedTreeError(f"verifier {verifier.registry_name!r} declares no supported child kind")


def _children(q: torch.Tensor, recipe: str, width: int, rng: RandomSource) -> list[tuple[int, NodeKind, SparseLaw | None]]:
    """The children of one node with draft law ``q`` ``[V]``, per ``recipe``.

    Returns ``(token, kind, law)`` triples; ``law`` is the exact law a sampled
    child was drawn from (docs/verifiers.md: the verifier needs exactly that law).
    """
    order = torch.sort(q, descending=True, stable=True).indices
    support = int((q > 0).sum())
    if recipe == "deterministic":
        return [(int(t), NodeKind.DETERMINISTIC, None) for t in order[: min(width, support)]]
    if recipe == "mixed":  # RheoSampling slots: top-(width-1) deterministic + 1 draw from q'
        top = [int(t) for t in order[: min(width - 1, support)]]
        out: list[tuple[int, NodeKind, SparseLaw | None]] = [(t, NodeKind.DETERMINISTIC, None) for t in top]
        rest = q.clone()
        rest[top] = 0.0
        if float(rest.sum()) > 0:
            q_prime = rest / rest.sum()
            law = SparseLaw.from_dense(q_prime, SampleMode.IID)
            out.append((rng.categorical(q_prime), NodeKind.SAMPLED, law))
        return out
    if recipe == "sampled-iid":
        law = SparseLaw.from_dense(q, SampleMode.IID)
        return [(rng.categorical(q), NodeKind.SAMPLED, law) for _ in range(width)]
    if recipe == "sampled-wor":
        law = SparseLaw.from_dense(q, SampleMode.WITHOUT_REPLACEMENT)
        remaining, out = q.clone(), []
        for _ in range(min(width, support)):
            token = rng.categorical(remaining / remaining.sum())
            remaining[token] = 0.0
            out.append((token, NodeKind.SAMPLED, law))
        return out
    raise ValueError(f"unknown recipe {recipe!r}")


def demo_tree(
    root_token: int, draft: CallableLM, sampling: SamplingConfig, recipe: str, depth: int, width: int,
    rng: RandomSource,
) -> DraftTree:
    """A full tree of ``depth`` levels, ``width`` children per node, drafted level by level.

    The draft must have been :meth:`~specdec.models.CallableLM.begin`-ed on a
    context ending in ``root_token``.
    """
    asm = TreeAssembler(root_token, draft.vocab_size)
    level = [(0, draft.root_distribution(sampling))]  # (node, q after node)
    for _ in range(depth):
        parents, tokens = [], []
        for node, q in level:
            for token, kind, law in _children(q, recipe, width, rng):
                weight = float(q[token])
                if kind == NodeKind.SAMPLED:
                    child = asm.add_sampled(node, token, law, weight)
                else:
                    child = asm.add_deterministic(node, token, weight)
                parents.append(node)
                tokens.append(token)
                assert child == len(asm) - 1
        if not tokens:
            break
        first = len(asm) - len(tokens)
        laws = draft.expand(parents, tokens, sampling)
        level = [(first + i, laws[i]) for i in range(len(tokens))]
    return asm.build()


@attrs.frozen
class DemoTreeBuilder(TreeBuilder):
    """:func:`demo_tree` as a :class:`~specdec.trees.base.TreeBuilder`, so the
    demo verifies its trees with the generation step (:func:`specdec.step.speculative_step`)."""

    recipe: str
    depth: int
    width: int

    @property
    def max_nodes(self) -> int:
        return sum(self.width**d for d in range(self.depth + 1))

    @property
    def max_depth(self) -> int:
        return self.depth

    def build(self, root_token: int, draft: Any, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        return demo_tree(root_token, draft, sampling, self.recipe, self.depth, self.width, rng)


@attrs.frozen
class DemoRow:
    """What the demo measured for one verifier.

    Attributes:
        verifier: registry name.
        recipe: the kind of tree drafted (``deterministic``, ``mixed``,
            ``sampled-iid``, ``sampled-wor``), or the reason it was skipped.
        temperature: the temperature used (0 for verifiers that need it).
        trees: number of trees verified (0 if skipped).
        tau: mean tokens emitted per tree = per target forward, bonus included.
        depth1_acceptance: fraction of trees whose first level accepted a token.
        tv_first_token: total-variation distance between the empirical law of
            the first emitted token and the target's exact law.
        tv_reference: the 95th percentile of the same distance for as many
            direct draws from the target (200 simulated samples): a lossless
            verifier's distance exceeds it about one time in twenty.
        seconds: wall time of drafting + verifying.
        lossless: the verifier's own claim.
        skipped: why the verifier was not run, else None.
    """

    verifier: str
    recipe: str
    temperature: float
    trees: int
    tau: float
    depth1_acceptance: float
    tv_first_token: float
    tv_reference: float
    seconds: float
    lossless: bool
    skipped: str | None = None


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def run_demo(
    trees: int = 400, vocab: int = 12, depth: int = 3, width: int = 2, temperature: float = 1.0,
    seed: int = 0, verifiers: str = "*",
) -> list[DemoRow]:
    """Verify ``trees`` random draft trees with each registered verifier matching ``verifiers``.

    Every verifier sees trees drafted on the same toy models and prompt, with
    the child kinds it declares it supports (see ``_recipe``); verifiers that
    need one-hot targets run at temperature 0.

    Raises:
        InvalidConfigError: bad sizes or temperature.
    """
    if vocab < 2:
        raise specdec.InvalidConfigError(f"the demo needs a vocabulary of at least 2 tokens, got {vocab}")
    for name, value in (("trees", trees), ("depth", depth), ("width", width)):
        if value < 1:
            raise specdec.InvalidConfigError(f"{name} must be >= 1, got {value}")
    rows = []
    prompt = [0]
    for name in list_registered("verifier", verifiers):
        verifier: Verifier = get("verifier", name)()
        greedy = verifier.requires_greedy or temperature == 0
        sampling = SamplingConfig(temperature=0.0 if greedy else temperature)
        target, draft = toy_models(vocab, seed)
        target.prefill(prompt)
        p_root = process_logits(target.score_tree(DraftTree.chain(prompt[-1], [], [], vocab)), sampling)[0]
        rng = TorchRandom.seeded(seed)
        try:
            recipe = _recipe(verifier, greedy)
        except UnsupportedTreeError as exc:
            rows.append(DemoRow(name, "-", sampling.temperature, 0, 0, 0, 0, 0, 0, verifier.lossless, str(exc)))
            continue
        counts = torch.zeros(vocab, dtype=torch.float64)
        emitted = accepted_first = 0
        start = time.perf_counter()
        builder = DemoTreeBuilder(recipe, depth, width)
        try:
            for _ in range(trees):
                draft.begin(prompt)
                target.prefill(prompt)
                outcome, _ = speculative_step(target, draft, builder, verifier, sampling, rng, prompt[-1])
                result = outcome.result
                counts[result.tokens[0]] += 1
                emitted += len(result.tokens)
                accepted_first += result.num_accepted >= 1
        except UnsupportedTreeError as exc:
            rows.append(DemoRow(name, recipe, sampling.temperature, 0, 0, 0, 0, 0, 0, verifier.lossless, str(exc)))
            continue
        seconds = time.perf_counter() - start
        # the sampling noise of a lossless verifier: TV of `trees` direct draws from p, 95th percentile
        noise = torch.Generator().manual_seed(seed + 1)
        direct = torch.multinomial(p_root.expand(200, vocab), trees, replacement=True, generator=noise)
        tvs = sorted(_tv(torch.bincount(row, minlength=vocab).to(torch.float64), p_root) for row in direct)
        rows.append(DemoRow(
            verifier=name, recipe=recipe, temperature=sampling.temperature, trees=trees,
            tau=emitted / trees, depth1_acceptance=accepted_first / trees,
            tv_first_token=_tv(counts, p_root), tv_reference=tvs[189],
            seconds=seconds, lossless=verifier.lossless,
        ))
    return rows


@attrs.frozen
class MethodRow:
    """What the demo measured for one method.

    Attributes:
        method: registry name.
        temperature: sampling temperature of the run.
        new_tokens: tokens generated.
        target_forwards: target forwards over trees (one per step).
        tau: tokens emitted per target forward, bonus included.
        acceptance_by_depth: per depth, P(draft accepted | a draft was tested there).
        greedy_matches: at temperature 0, whether the method's output equals
            plain autoregressive decoding token for token.
        seconds: wall time of the run at ``temperature``.
        error: the error message if the method failed, else None.
    """

    method: str
    temperature: float
    new_tokens: int = 0
    target_forwards: int = 0
    tau: float = 0.0
    acceptance_by_depth: tuple[float, ...] = ()
    greedy_matches: bool = False
    seconds: float = 0.0
    error: str | None = None


def run_method_demo(
    max_new_tokens: int = 48, vocab: int = 12, temperature: float = 1.0, seed: int = 0, methods: str = "*",
) -> list[MethodRow]:
    """Generate with every registered method matching ``methods`` on the toy models.

    Each method runs once at ``temperature`` (statistics) and once at
    temperature 0, where its output must equal
    :func:`specdec.autoregressive_generate` token for token. A method that
    raises gets a row with ``error`` set (the demo then exits non-zero).
    """
    if vocab < 2:
        raise specdec.InvalidConfigError(f"the demo needs a vocabulary of at least 2 tokens, got {vocab}")
    from specdec.generate import SpeculativeGenerator, autoregressive_generate

    prompt = [0]
    greedy = SamplingConfig(temperature=0.0)
    target, draft = toy_models(vocab, seed)
    reference = autoregressive_generate(target, prompt, max_new_tokens, sampling=greedy, seed=seed).tokens
    rows = []
    for name in list_registered("method", methods):
        start = time.perf_counter()
        try:
            target, draft = toy_models(vocab, seed)
            gen = SpeculativeGenerator(target=target, draft=draft, method=name)
            out = gen.generate(prompt, max_new_tokens, sampling=SamplingConfig(temperature=temperature), seed=seed)
            seconds = time.perf_counter() - start
            matches = gen.generate(prompt, max_new_tokens, sampling=greedy, seed=seed).tokens == reference
        except Exception as exc:  # noqa: BLE001 - a demo reports every failure, then exits non-zero
            rows.append(MethodRow(name, temperature, error=f"{type(exc).__name__}: {exc}"))
            continue
        stats = out.stats
        rows.append(MethodRow(
            method=name, temperature=temperature, new_tokens=stats.new_tokens,
            target_forwards=stats.target_forwards, tau=stats.tau,
            acceptance_by_depth=tuple(stats.acceptance_by_depth), greedy_matches=matches, seconds=seconds,
        ))
    return rows


SKIP = "none"
"""``specdec demo --methods none`` / ``--verifiers none`` skips that part of the demo."""


def _unmatched_patterns(args: argparse.Namespace) -> list[str]:
    """One phrase per demo glob (``--methods``, ``--verifiers``) that matches no registered name (``none`` aside)."""
    out = []
    for flag, role, pattern in (("--methods", "method", args.methods), ("--verifiers", "verifier", args.verifiers)):
        if pattern != SKIP and not list_registered(role, pattern):
            out.append(f"no registered {role} matches {pattern!r} (registered {role}s: "
                       f"{', '.join(list_registered(role)) or 'none'}; {flag} {SKIP} skips that part)")
    return out


def _cmd_demo(args: argparse.Namespace) -> int:
    # a glob that matches nothing would silently skip its part: refuse it before anything runs
    unmatched = _unmatched_patterns(args)
    if unmatched:
        print(f"specdec demo: {' and '.join(unmatched)}", file=sys.stderr)
        return 1
    if args.methods == SKIP and args.verifiers == SKIP:
        print(f"specdec demo: nothing to run (--methods {SKIP} and --verifiers {SKIP})", file=sys.stderr)
        return 1
    # the toy models use tiny tensors: extra threads only add hand-off latency
    torch.set_num_threads(1)
    method_rows = (run_method_demo(args.max_new_tokens, args.vocab, args.temperature, args.seed, args.methods)
                   if args.methods != SKIP else [])
    rows = (run_demo(args.trees, args.vocab, args.depth, args.width, args.temperature, args.seed, args.verifiers)
            if args.verifiers != SKIP else [])
    print(f"specdec demo: a toy bigram target and a noisy copy of it as draft, V={args.vocab}, seed {args.seed}.")
    print("The toy models cost nothing to run, so times here say nothing about real speedups: see tau.")
    print("tau = tokens emitted per target forward (accepted drafts + 1 bonus).")
    failed = 0
    if method_rows:
        print()
        print(f"Part 1: generation, {args.max_new_tokens} new tokens per method at T={args.temperature:g}; "
              "'=AR@T0': at T=0 the output")
        print("equals plain autoregressive decoding token for token (it must, for a lossless method).")
        print()
        header = f"{'method':<12}{'tau':>7}{'fwd':>6}  {'acceptance by depth':<36}{'=AR@T0':>7}{'s':>7}"
        print(header)
        print("-" * len(header))
        for m in method_rows:
            if m.error:
                failed += 1
                print(f"{m.method:<12}FAILED: {m.error}")
                continue
            acc = " ".join(f"{a:.2f}" for a in m.acceptance_by_depth[:8])
            print(f"{m.method:<12}{m.tau:>7.3f}{m.target_forwards:>6}  {acc:<36}"
                  f"{'yes' if m.greedy_matches else 'NO':>7}{m.seconds:>7.2f}")
            failed += not m.greedy_matches
    if not rows:
        return 1 if failed else 0
    print()
    print(f"Part 2: verifiers alone, {args.trees} random full trees of depth {args.depth} x width {args.width} each.")
    print("TV(1st) = total variation between the first emitted token's empirical law and the target's")
    print("exact law; TV(ref95) = 95th percentile of that distance for as many direct draws from the target")
    print("(pure sampling noise: a lossless verifier exceeds it about one time in twenty).")
    print()
    header = f"{'verifier':<16}{'tree':<15}{'T':>5}{'tau':>7}{'acc@1':>7}{'TV(1st)':>9}{'TV(ref95)':>10}{'ms/tree':>9}  lossless"
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.skipped:
            print(f"{r.verifier:<16}skipped: {r.skipped}")
            continue
        print(f"{r.verifier:<16}{r.recipe:<15}{r.temperature:>5.2g}{r.tau:>7.3f}{r.depth1_acceptance:>7.3f}"
              f"{r.tv_first_token:>9.4f}{r.tv_reference:>10.4f}{1000 * r.seconds / r.trees:>9.2f}  "
              f"{'yes' if r.lossless else 'NO'}")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
