"""The conformance suites: the cases that prove one registered verifier, tree builder or method.

Each suite yields :class:`Case` objects, each a named, seeded check that
returns None when it passes and a :class:`Failure` (what was expected, what was
measured, and where) when it does not; :mod:`specdec.testing.conformance`
runs them and reports. Suites (docs/extending.md, "Which suite a rule needs"):

- ``per-node``: the verifier at a root with every child mix it declares
  (:mod:`specdec.testing.cases`), vocabularies of 2 to 4 tokens, laws with
  zeros, one-hot rows and ties: the first emitted token's exact law must be ``p``.
- ``whole-tree``: trees of every shape the verifier declares, two and three
  levels deep (:data:`~specdec.testing.shapes.SHAPES`), at T=1, at T=0.8 with
  top-k and top-p, and at T=0: one step completed with the target's
  conditionals must give the target's exact law of ``depth + 1`` tokens
  (:class:`~specdec.testing.laws.ExactLaws`). Errors below depth 1 show here.
- ``composition``: with every registered partner the plug-in declares
  compatible (a builder whose kinds and sibling modes the verifier supports, or
  the other way round): the exact law of two tokens, steps chained.
- ``statistical``: the real generation loop (:meth:`~specdec.SpeculativeGenerator.generate_batch`,
  the engine's dispatch; a row's tokens are those of its prompt and seed alone,
  which the ``batch`` suite checks) on order-2 Markov models, a seeded
  chi-square test of the first three tokens at T=1 and with top-k/top-p warping.
- ``greedy``: at T=0 the output equals plain greedy decoding token for token.
- ``batch``: ``generate_batch`` of three ragged prompts equals each prompt
  generated alone with its seed. When ``generate_batch`` refuses a builder without
  a batch form (:meth:`~specdec.trees.base.TreeBuilder.grows_batches` False) or a
  draft without a rows mode, by name, the case is *skipped* (:class:`Skipped`:
  reported as SKIP with the reason, never as a pass); its statistical suite then
  generates seed by seed.
- ``laws`` and ``rows`` (drafts, :mod:`specdec.testing.draft_suites`): the draft's
  laws are laws, its commit agrees with a fresh begin, and its rows mode answers
  each row as the draft answers that row alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.errors import InvalidConfigError
from specdec.generate import SpeculativeGenerator, autoregressive_generate
from specdec.methods import Method
from specdec.registry import get, list_registered
from specdec.sampling import SamplingConfig
from specdec.testing.cases import ALL_MIXES, feasible, make_node_case, run_node_case, supports
from specdec.testing.laws import ExactLaws, sparse_markov_pair
from specdec.testing.markov import MarkovLM, random_markov_logits
from specdec.testing.shapes import SHAPES, shape_supported
from specdec.testing.statistical import chi_square_test
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier

__all__ = ["SUITES", "Case", "Failure", "Skipped", "SuiteSettings", "method_cases", "tree_cases", "verifier_cases"]

SUITES = ("per-node", "whole-tree", "composition", "statistical", "greedy", "batch", "laws", "rows")
"""Every suite, in the order the cases run."""

T1 = SamplingConfig(temperature=1.0)
WARPED = SamplingConfig(temperature=0.8, top_k=2, top_p=0.9)
GREEDY = SamplingConfig(temperature=0.0)
SAMPLINGS: Mapping[str, SamplingConfig] = {"T1": T1, "T0.8-topk2-topp0.9": WARPED, "T0": GREEDY}
CONTEXT = (0, 1)
EXACT_TOL = 1e-9


@attrs.frozen
class Failure:
    """Why a case failed.

    Attributes:
        message: what was checked and what went wrong, with the node or token
            position, the expected and the measured law where there are laws.
    """

    message: str


@attrs.frozen
class Skipped:
    """Why a case could not run (a builder without a batch form, a draft without a rows mode):
    reported as SKIP with the reason; neither a pass nor a failure.

    Attributes:
        reason: what could not run, and why.
    """

    reason: str


@attrs.frozen
class Case:
    """One named check of a plug-in.

    Attributes:
        suite: the suite it belongs to (one of :data:`SUITES`).
        id: a stable, readable id (suite, configuration, seed).
        check: runs the case: None when it passes, a :class:`Failure` when it fails, a
            :class:`Skipped` when it cannot run.
    """

    suite: str
    id: str
    check: Callable[[], Failure | Skipped | None] = attrs.field(repr=False)


@attrs.frozen
class SuiteSettings:
    """How much of each suite to run.

    Attributes:
        node_seeds: random per-node cases per (mix, vocabulary).
        table_seeds: random Markov tables per whole-tree shape and sampling.
        samples: generations per statistical test.
        alpha: significance level of each statistical test.
        suites: run only these suites (None: all of :data:`SUITES`).
    """

    node_seeds: int = 8
    table_seeds: int = 2
    samples: int = 1500
    alpha: float = 1e-3
    suites: tuple[str, ...] | None = attrs.field(default=None, converter=lambda s: None if s is None else tuple(s))

    def __attrs_post_init__(self) -> None:
        unknown = sorted(set(self.suites or ()) - set(SUITES))
        if unknown:
            raise InvalidConfigError(f"unknown suite(s) {', '.join(unknown)}; suites are: {', '.join(SUITES)}")

    def runs(self, suite: str) -> bool:
        """Whether ``suite`` is selected."""
        return self.suites is None or suite in self.suites

    @classmethod
    def quick(cls, suites: Sequence[str] | None = None) -> SuiteSettings:
        """Fewer seeds and samples (less time, less power)."""
        return cls(node_seeds=3, table_seeds=1, samples=600, suites=None if suites is None else tuple(suites))


def _fmt(t: torch.Tensor | Sequence[float]) -> str:
    return "[" + ", ".join(f"{float(v):.4f}" for v in t) + "]"


def _samplings(verifier: Verifier | type[Verifier]) -> list[str]:
    return ["T0"] if verifier.requires_greedy else list(SAMPLINGS)


def _fits(builder: TreeBuilder, verifier: type[Verifier]) -> bool:
    """The builder emits only kinds and sibling modes the verifier declares."""
    kinds = {int(k) for k in verifier.supported_kinds}
    modes = builder.sibling_modes
    return {int(k) for k in builder.produces} <= kinds and (modes is None or set(modes) <= set(verifier.supported_modes))


# ------------------------------------------------------------------ verifiers
def _per_node(name: str, cls: type[Verifier], mix: Any, V: int, seed: int) -> Callable[[], Failure | None]:
    def check() -> Failure | None:
        case = make_node_case(seed, V, mix, greedy=cls.requires_greedy)
        law = run_node_case(cls(), case)
        err = float((law.first_token - case.p).abs().max())
        if err < 1e-12:
            return None
        return Failure(f"root node with children {mix.label} (deterministic {case.det}, sampled from "
                       f"q' = {_fmt(case.q_prime)}), V={V}: the first emitted token's law must be p = {_fmt(case.p)}, "
                       f"measured {_fmt(law.first_token)} (max error {err:.3g})")
    return check


def _exact(builder: Callable[[], TreeBuilder], verifier: Callable[[], Verifier], sampling: SamplingConfig,
           V: int, seed: int, num_tokens: int, chained: bool, what: str) -> Callable[[], Failure | None]:
    def check() -> Failure | None:
        target, draft = sparse_markov_pair(V, seed, ties=seed % 2 == 1)
        gap = ExactLaws(builder(), verifier(), target, draft, sampling).check(CONTEXT, num_tokens, chained=chained)
        if gap.error <= EXACT_TOL and abs(gap.mass - 1.0) <= EXACT_TOL:
            return None
        return Failure(f"{what}: the law of the first {num_tokens} tokens is not the target's: "
                       f"{gap.describe(CONTEXT)}")
    return check


def verifier_cases(name: str, settings: SuiteSettings = SuiteSettings()) -> Iterator[Case]:
    """The cases of the registered verifier ``name``: per-node, whole-tree, composition and end-to-end."""
    cls: type[Verifier] = get("verifier", name)
    for mix in ALL_MIXES:
        if not supports(cls, mix):
            continue
        for V in (2, 3, 4):
            if feasible(mix, V):
                for seed in range(settings.node_seeds):
                    yield Case("per-node", f"per-node {mix.label} V={V} seed={seed}", _per_node(name, cls, mix, V, seed))
    for shape in SHAPES:
        if not shape_supported(cls, shape.levels):
            continue
        for sid in _samplings(cls):
            for seed in range(settings.table_seeds):
                yield Case("whole-tree", f"whole-tree {shape.label} V={shape.vocab_size} {sid} seed={seed}",
                           _exact(shape.builder, cls, SAMPLINGS[sid], shape.vocab_size, seed,
                                  len(shape.levels) + 1, False, f"tree shape {shape.label}"))
    partners = [t for t in list_registered("tree") if any(_fits(get("tree", t)(**o), cls)
                                                          for o in get("tree", t).example_options[:1])]
    for tree in partners:
        options = dict(get("tree", tree).example_options[0])
        for sid in _samplings(cls)[:1] + (["T0"] if not cls.requires_greedy else []):
            yield Case("composition", f"composition tree={tree} {options} {sid}",
                       _exact(functools.partial(get("tree", tree), **options), cls, SAMPLINGS[sid], 3, 0, 2, True,
                              f"tree {tree!r} {options} with verifier {name!r}"))
    if partners:
        tree = max(partners, key=lambda t: (len(get("tree", t)(**get("tree", t).example_options[0]).produces), t))
        yield from _end_to_end(tree, name, dict(get("tree", tree).example_options[0]), settings,
                               greedy_only=cls.requires_greedy)


# --------------------------------------------------------------- tree builders
def tree_cases(name: str, settings: SuiteSettings = SuiteSettings()) -> Iterator[Case]:
    """The cases of the registered tree builder ``name``: every example option set with its
    default verifier (whole step exactly, two chained steps), every fitting registered
    verifier (two chained steps), and end-to-end."""
    cls: type[TreeBuilder] = get("tree", name)
    first: dict[str, Any] = {}
    for options in cls.example_options or ({},):
        opts = dict(options)
        make = (lambda o=opts: cls(**o))
        builder = make()
        default_name = builder.default_verifier
        default = get("verifier", default_name)
        first = first or {"options": opts, "verifier": default_name}
        for sid in _samplings(default):
            for seed in range(settings.table_seeds):
                yield Case("whole-tree", f"whole-tree {opts} verifier={default_name} {sid} seed={seed}",
                           _exact(make, default, SAMPLINGS[sid], 3, seed, min(builder.max_depth + 1, 4), False,
                                  f"tree {name!r} {opts} with its default verifier {default_name!r}"))
                yield Case("whole-tree", f"chained {opts} verifier={default_name} {sid} seed={seed}",
                           _exact(make, default, SAMPLINGS[sid], 3, seed, 2, True,
                                  f"tree {name!r} {opts} with {default_name!r}, two steps chained"))
    options, default_name = first["options"], first["verifier"]
    for verifier in list_registered("verifier"):
        vcls = get("verifier", verifier)
        if verifier == default_name or not _fits(cls(**options), vcls):
            continue
        sid = _samplings(vcls)[0]
        yield Case("composition", f"composition verifier={verifier} {options} {sid}",
                   _exact(lambda: cls(**options), vcls, SAMPLINGS[sid], 3, 0, 2, True,
                          f"tree {name!r} {options} with verifier {verifier!r}"))
    yield from _end_to_end(name, default_name, options, settings,
                           greedy_only=get("verifier", default_name).requires_greedy)


# ------------------------------------------------------------------- methods
def method_cases(name: str, settings: SuiteSettings = SuiteSettings()) -> Iterator[Case]:
    """The cases of the registered method ``name``: its builder (with the method's defaults
    replaced by the builder's first example options, to keep trees small) and verifier, exactly
    over one step and two chained steps, then end-to-end."""
    method: Method = get("method", name)
    tree_cls = get("tree", method.tree)
    verifier_cls = get("verifier", method.verifier)
    options = dict(tree_cls.example_options[0]) if tree_cls.example_options else dict(method.defaults)
    for sid in _samplings(verifier_cls):
        yield Case("whole-tree", f"method {name} chained {options} {sid}",
                   _exact(lambda: tree_cls(**options), verifier_cls, SAMPLINGS[sid], 3, 0, 2, True,
                          f"method {name!r} (tree {method.tree!r} {options}, verifier {method.verifier!r})"))
    yield from _end_to_end(method.tree, method.verifier, options, settings, greedy_only=verifier_cls.requires_greedy)


# ---------------------------------------------------------------- end to end
def _models() -> tuple[MarkovLM, MarkovLM]:
    """Order-2 target and draft over 4 tokens, the draft a noisy copy of the target with a tie
    and a near one-hot row (as the repository's own end-to-end tests)."""
    g = torch.Generator().manual_seed(1234)
    target = random_markov_logits(4, 2, g, scale=1.5, zero_fraction=0.15)
    noise = torch.randn(target.shape, generator=g, dtype=torch.float64)
    draft = torch.where(torch.isfinite(target), target + noise, target)
    draft[0, 1] = torch.tensor([2.0, 2.0, 1.0, 0.0])
    draft[1, 0] = torch.tensor([9.0, -9.0, -9.0, -9.0])
    return MarkovLM(target), MarkovLM(draft)


MakeDraft = Callable[[MarkovLM], DraftModel]
"""Builds the draft of an end-to-end case for the toy target (a plug-in draft's declared factory)."""


def _generator(tree: str, verifier: str, options: Mapping[str, Any],
               make_draft: MakeDraft | None = None) -> tuple[SpeculativeGenerator, MarkovLM]:
    target, markov_draft = _models()
    draft = markov_draft if make_draft is None else make_draft(target)
    return SpeculativeGenerator(target=target, draft=draft, method=None, tree=tree, verifier=verifier,
                                **dict(options)), target


def _statistical(tree: str, verifier: str, options: Mapping[str, Any], sid: str,
                 settings: SuiteSettings) -> Callable[[], Failure | None]:
    def check() -> Failure | None:
        gen, target = _generator(tree, verifier, options)
        sampling = SAMPLINGS[sid]
        samples: list[tuple[int, ...]] = []
        if not gen.builder.grows_batches(sampling):  # no batch form: one generation per seed (slower)
            samples = [tuple(gen.generate(list(CONTEXT), 3, sampling=sampling, seed=s).tokens)
                       for s in range(settings.samples)]
        else:
            for start in range(0, settings.samples, 500):  # a batch row = its prompt and seed alone
                seeds = list(range(start, min(start + 500, settings.samples)))
                batch = gen.generate_batch([list(CONTEXT)] * len(seeds), 3, sampling=sampling, seeds=seeds)
                samples += [tuple(row) for row in batch.tokens]
        law: dict[Hashable, float] = {seq: prob for seq, prob in target.joint_law(list(CONTEXT), 3, sampling).items()}
        result = chi_square_test(samples, law)
        if result.p_value >= settings.alpha:
            return None
        return Failure(f"tree {tree!r} {dict(options)} with verifier {verifier!r} through SpeculativeGenerator."
                       f"generate_batch, {settings.samples} seeded rows: the first 3 tokens fail the chi-square test against the "
                       f"target's law (p-value {result.p_value:.3g} < alpha {settings.alpha:g}; "
                       f"statistic {result.statistic:.1f}, {result.dof} degrees of freedom)")
    return check


def _greedy(tree: str, verifier: str, options: Mapping[str, Any],
            make_draft: MakeDraft | None = None) -> Callable[[], Failure | None]:
    def check() -> Failure | None:
        gen, target = _generator(tree, verifier, options, make_draft)
        for prompt in ([0, 1], [2, 3, 1], [3, 0]):
            got = gen.generate(prompt, 12, sampling=GREEDY, seed=0).tokens
            want = autoregressive_generate(target, prompt, 12, sampling=GREEDY, seed=0).tokens
            if list(got) != list(want):
                return Failure(f"tree {tree!r} {dict(options)} with verifier {verifier!r} at T=0 after {prompt}: "
                               f"emitted {list(got)}, greedy decoding gives {list(want)}")
        return None
    return check


def _batch(tree: str, verifier: str, options: Mapping[str, Any], sid: str,
           make_draft: MakeDraft | None = None) -> Callable[[], Failure | Skipped | None]:
    def check() -> Failure | Skipped | None:
        gen, _ = _generator(tree, verifier, options, make_draft)
        prompts, seeds = [[0, 1], [2, 3, 1], [3, 0, 0, 2]], [5, 6, 7]
        try:
            batch = gen.generate_batch(prompts, 8, sampling=SAMPLINGS[sid], seeds=seeds)
        except InvalidConfigError as exc:
            # a declared limit, refused by name: the rows cannot be checked (SKIP, never a pass)
            builder, draft = type(gen.builder).__name__, type(gen.draft).__name__
            if not gen.builder.grows_batches(SAMPLINGS[sid]) and builder in str(exc):
                return Skipped(f"tree {tree!r} ({builder}) has no batch form: generate_batch refuses it ({exc})")
            if gen.draft is not None and not gen.draft.supports_rows and draft in str(exc):
                return Skipped(f"the draft ({draft}) has no rows mode: generate_batch refuses it ({exc})")
            raise
        for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
            alone = gen.generate(prompt, 8, sampling=SAMPLINGS[sid], seed=seed).tokens
            if list(batch.tokens[row]) != list(alone):
                return Failure(f"tree {tree!r} {dict(options)} with verifier {verifier!r}, {sid}: batch row {row} "
                               f"(prompt {prompt}, seed {seed}) emitted {list(batch.tokens[row])}, the same prompt "
                               f"and seed alone {list(alone)}")
        return None
    return check


def _end_to_end(tree: str, verifier: str, options: Mapping[str, Any], settings: SuiteSettings,
                *, greedy_only: bool) -> Iterator[Case]:
    """The statistical, greedy and batch cases of ``tree`` with ``verifier`` on the toy models."""
    label = f"tree={tree} {dict(options)} verifier={verifier}"
    if not greedy_only:
        for sid in ("T1", "T0.8-topk2-topp0.9"):
            yield Case("statistical", f"statistical {label} {sid}", _statistical(tree, verifier, options, sid, settings))
    yield Case("greedy", f"greedy {label}", _greedy(tree, verifier, options))
    yield Case("batch", f"batch {label} {'T0' if greedy_only else 'T1'}",
               _batch(tree, verifier, options, "T0" if greedy_only else "T1"))
