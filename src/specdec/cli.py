"""The ``specdec`` command line.

Subcommands:

- ``specdec list [ROLE] [--pattern GLOB]``: the registered strategies of each
  registry role (``tree``, ``verifier``, ``draft``, ``target``, ``method``),
  each with the first sentence of its description (markup removed) and, for a
  plug-in's, the module that registered it (and, for a name it replaced, the
  module that owned it).
- ``specdec demo``: a small self-contained demonstration that needs no model
  download, on a toy target and a toy draft (two
  :class:`~specdec.models.CallableLM` bigram tables over a tiny vocabulary).
  Part 1 generates with every registered method and prints tau, the
  acceptance by depth and whether, at temperature 0, the output equals plain
  autoregressive decoding token for token. Part 2 drafts random trees with
  the child kinds each registered verifier supports, verifies them, and prints
  the acceptance statistics, how far the empirical law of the first emitted
  token is from the target's exact law (next to the 95th percentile of that
  distance for as many direct draws from the target), and the verdict of a
  chi-square test of that law: its p-value, pass or FAIL at the printed
  significance level, and the test's power. What the demo runs and measures
  is :mod:`specdec.demo`; this module parses and prints.
- ``specdec bench``: the side-by-side benchmark on a real model, defined in
  :mod:`specdec.bench.cli`.
- ``specdec train-eagle``, ``specdec train-draft``, ``specdec regen-data``:
  training draft heads, distilled draft LMs and self-distillation data,
  defined in :mod:`specdec.train.cli` (they keep their own parsers).

``list`` and ``demo`` run on the core install. ``bench`` needs the ``[bench]`` extra and the
training commands the ``[train]`` extra: without it they exit with status 2 and one line naming
``pip install 'specdec-trees[EXTRA]'`` (their ``--help`` needs no extra).

Plug-ins: ``list``, ``demo`` and ``bench`` load every installed plug-in (the
entry-point group ``specdec.plugins``) and each module given with
``--plugin MODULE`` (repeatable; a dotted module name or a ``.py`` file) before
they run (:mod:`specdec.plugins`). A ``--plugin`` module that cannot be loaded
is bad input; an installed one is left out with a warning naming it and how to
skip it (``SPECDEC_SKIP_PLUGINS=NAME,...``; ``SPECDEC_NO_ENTRY_POINTS=1`` leaves
out every installed plug-in). A plug-in that replaces a name another module
registered warns, naming both.

Words: *accepted* = draft tokens the verifier kept; *bonus* = the one token
the verifier draws from the target at the end of a step; *tau* = tokens
emitted per target forward = accepted + 1 (the bonus is counted).

``list`` and ``demo`` exit with status 0 on success, 1 when there is nothing
to show (a pattern that matches no name: for the demo, a ``--methods`` or
``--verifiers`` glob that matches no registered name, checked before anything
runs; ``none`` skips that part on purpose) or when the demo finds a method that
fails or is not greedy-exact, or a verifier declared lossless that fails its
test, and 2 on bad input (a plug-in that cannot be loaded included), with a
one-line message on stderr.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Sequence
from typing import Any

import torch

import specdec
from specdec._extras import require_extra
from specdec.demo import (
    DEFAULT_ALPHA,
    POWER,
    VERIFIER_DRAFT_NOISE,
    DemoRow,
    MethodRow,
    demo_tree,
    run_demo,
    run_method_demo,
    toy_models,
)
from specdec.errors import MissingExtraError, SpecDecError
from specdec.methods import Method
from specdec.plugins import add_plugin_argument, load_plugins, shown_name
from specdec.registry import ROLES, get, list_registered, origin, overrides

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


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"alpha must be in (0, 1), got {text!r}")
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
    add_plugin_argument(p_list)
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
    p_demo.add_argument("--alpha", type=_alpha, default=DEFAULT_ALPHA,
                        help="family-wise significance level of part 2's tests, split over the verifiers run "
                             f"(Bonferroni; default: {DEFAULT_ALPHA:g})")
    add_plugin_argument(p_demo)
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
        if not {"-h", "--help"} & set(argv[1:]):  # the help needs no extra
            try:
                require_extra("train", f"specdec {argv[0]}")
            except MissingExtraError as exc:
                print(f"specdec {argv[0]}: error: {exc}", file=sys.stderr)
                return 2
        return int(entry[argv[0]](argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "bench":  # after parsing: `specdec bench --help` needs no extra
            require_extra("bench", "specdec bench")
        return int(args.func(args))
    except SpecDecError as exc:
        print(f"specdec {args.command}: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------- list
_ABBREVIATIONS = ("e.g.", "i.e.", "i.i.d.", "etc.", "vs.", "cf.", "resp.", "approx.")
_ROLE_MARKUP = re.compile(r":[\w.:-]+:`([^`]+)`")  # :class:`X`, :py:meth:`~a.b`
_SENTENCE_END = re.compile(r"\.(?=\s+[A-Z0-9])")  # a full stop, then the next sentence's capital


def _plain(text: str) -> str:
    """``text`` without its reST / Markdown markup: ``:role:`X``` -> ``X`` (``~a.b.X`` -> ``X``,
    ``title <target>`` -> ``title``), double and single backquotes removed,
    ``[text](url)`` -> ``text``, ``**x**`` / ``*x*`` -> ``x``.

    Example:
        >>> _plain("see :class:`~specdec.tree.DraftTree`, ``p`` and [the docs](docs/x.md)")
        'see DraftTree, p and the docs'
    """
    def role(match: re.Match[str]) -> str:
        inner = match.group(1).strip()
        titled = re.fullmatch(r"(.*?)\s*<[^>]*>", inner)
        if titled:
            return titled.group(1)
        return inner[1:].rsplit(".", 1)[-1] if inner.startswith("~") else inner

    text = _ROLE_MARKUP.sub(role, text)
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r"`([^`]+)`", r"\1", text)
    text = re.sub(r"\[([^\]]+)\]\([^)\s]+\)", r"\1", text)
    text = re.sub(r"\*\*(\S(?:.*?\S)?)\*\*", r"\1", text)
    return re.sub(r"(?<![\w*])\*(\S(?:[^*]*?\S)?)\*(?![\w*])", r"\1", text)


def _first_sentence(paragraph: str) -> str:
    """The first sentence of ``paragraph`` (through its full stop), or all of it when it has one sentence.

    Example:
        >>> _first_sentence("Rule 3 for children drawn i.i.d. from q. Then more, e.g. This.")
        'Rule 3 for children drawn i.i.d. from q.'
    """
    for match in _SENTENCE_END.finditer(paragraph):
        head = paragraph[: match.end()]
        if not head.lower().endswith(_ABBREVIATIONS):
            return head
    return paragraph


def _summary(obj: Any) -> str:
    """One line for ``specdec list``: the first sentence of the object's ``description``
    (a method's) or of its docstring's first paragraph, markup removed.

    Example:
        >>> class Rule:
        ...     \"\"\"Rule 5: sampled children first (rules 3/4 against ``q'``), then
        ...     rule 2 for the others. More text.\"\"\"
        >>> _summary(Rule)
        "Rule 5: sampled children first (rules 3/4 against q'), then rule 2 for the others."
    """
    description = obj.description if isinstance(obj, Method) else None
    text = description if description else inspect.getdoc(obj) or ""
    paragraph = " ".join(line.strip() for line in text.strip().split("\n\n", 1)[0].splitlines())
    return _first_sentence(_plain(paragraph)).strip()


def _cmd_list(args: argparse.Namespace) -> int:
    load_plugins(args.plugins)
    roles = [args.role] if args.role else list(ROLES)
    replaced = {(o.role, o.name): o.owner for o in overrides()}
    found = 0
    for role in roles:
        names = list_registered(role, args.pattern)
        found += len(names)
        if not names and args.role is None:
            continue
        print(f"{role} ({len(names)}):")
        width = max((len(n) for n in names), default=0)
        for name in names:
            module = origin(role, name)
            owner = f", replaces {shown_name(replaced[role, name])}'s" if (role, name) in replaced else ""
            source = ("" if module == "specdec" or module.startswith("specdec.")
                      else f"  [{shown_name(module)}{owner}]")
            print(f"  {name:<{width}}  {_summary(get(role, name))}{source}".rstrip())
    if not found:
        where = f"role {args.role!r}" if args.role else "any role"
        print(f"specdec list: no registered name in {where} matches {args.pattern!r}", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------- demo
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
    load_plugins(args.plugins)
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
    rows = (run_demo(args.trees, args.vocab, args.depth, args.width, args.temperature, args.seed, args.verifiers,
                     alpha=args.alpha) if args.verifiers != SKIP else [])
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
        w = max([12] + [len(m.method) + 2 for m in method_rows])  # a plug-in's long name keeps its column
        header = f"{'method':<{w}}{'tau':>7}{'fwd':>6}  {'acceptance by depth':<36}{'=AR@T0':>7}{'s':>7}"
        print(header)
        print("-" * len(header))
        for m in method_rows:
            if m.error:
                failed += 1
                print(f"{m.method:<{w}}FAILED: {m.error}")
                continue
            acc = " ".join(f"{a:.2f}" for a in m.acceptance_by_depth[:8])
            print(f"{m.method:<{w}}{m.tau:>7.3f}{m.target_forwards:>6}  {acc:<36}"
                  f"{'yes' if m.greedy_matches else 'NO':>7}{m.seconds:>7.2f}")
            failed += not m.greedy_matches
    if not rows:
        return 1 if failed else 0
    print()
    print(f"Part 2: verifiers alone, {args.trees} random full trees of depth {args.depth} x width {args.width} each,")
    print(f"drafted by a deliberately poor draft (the target's logits + {VERIFIER_DRAFT_NOISE:g} N(0,1) noise), so "
          "that")
    print("rejections, residuals and bonuses, where verification rules differ, are frequent.")
    print("TV(1st) = total variation between the first emitted token's empirical law and the target's")
    print("exact law; TV(ref95) = 95th percentile of that distance for as many direct draws from the target")
    print("(pure sampling noise: a lossless verifier exceeds it about one time in twenty).")
    _print_test_header(args, rows)
    print()
    w = max([16] + [len(r.verifier) + 2 for r in rows])
    header = (f"{'verifier':<{w}}{'tree':<14}{'T':>4}{'tau':>7}{'acc@1':>7}{'TV(1st)':>9}{'TV(ref95)':>10}"
              f"{'ms/tree':>9}{'p-value':>10}  {'verdict':<18}declared")
    print(header)
    print("-" * len(header))
    for r in rows:
        declared = "lossless" if r.declared_lossless else "lossy"
        if r.skipped:
            print(f"{r.verifier:<{w}}skipped: {r.skipped} (declared {declared})")
            continue
        print(f"{r.verifier:<{w}}{r.recipe:<14}{r.temperature:>4.2g}{r.tau:>7.3f}{r.depth1_acceptance:>7.3f}"
              f"{r.tv_first_token:>9.4f}{r.tv_reference:>10.4f}{1000 * r.seconds / r.trees:>9.2f}"
              f"{r.p_value:>10.2e}  {r.verdict:<18}{declared}")
    bad = [r.verifier for r in rows if r.failed]
    if bad:
        print()
        print(f"FAILED: {', '.join(bad)}: declared lossless, but the first emitted token does not follow the "
              "target's law (p-value below alpha).")
    return 1 if failed or bad else 0


def _print_test_header(args: argparse.Namespace, rows: Sequence[DemoRow]) -> None:
    """What part 2's p-value and verdict mean: the test, its level and its power."""
    run = [r for r in rows if not r.skipped]
    if not run:
        return
    print(f"p-value = chi-square goodness of fit of the {args.trees} first emitted tokens against that exact law;")
    print(f"verdict FAIL when p-value < alpha = {args.alpha:g} / {len(run)} verifier(s) = {run[0].alpha:.3g} "
          f"(Bonferroni: lossless verifiers")
    print(f"all pass but for about one run in {1 / args.alpha:,.0f} or fewer). Power: a FAIL is at least "
          f"{POWER:.0%} likely")
    for t, tv in sorted({(r.temperature, r.detectable_tv) for r in run}):
        if t == 0:
            print(f"  at T=0 for a verifier whose first token is not argmax p in {tv:.2%} of trees or more,")
        elif tv < 1:
            print(f"  at T={t:g} for a first-token law at total variation >= {tv:.3f} from the target's "
                  "(rare tokens pooled),")
        else:
            print(f"  at T={t:g} for no law at all with {args.trees} trees (too few: give more --trees),")
    print("and smaller errors, or errors below the first token, need the exact tests "
          "(python -m specdec.testing.conformance).")
    print("declared = the verifier's own lossless flag, not a verdict: a verifier declared lossy that fails shows")
    print("'lossy (declared)' and does not fail the run; one declared lossless that fails does (exit status 1).")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
