"""The ``specdec demo`` toy demonstration: what it runs and measures (:mod:`specdec.cli` prints it).

On a toy target and a toy draft (two :class:`~specdec.models.CallableLM`
bigram tables over a tiny vocabulary, no download), :func:`run_method_demo`
generates with every registered method (tau, acceptance by depth, and
whether at temperature 0 the output equals plain autoregressive decoding),
and :func:`run_demo` drafts random trees with the child kinds each
registered verifier supports (:func:`demo_tree`), verifies them with the
generation loop's step and measures how far the first emitted token's
empirical law is from the target's exact law: the total-variation distance,
and a chi-square goodness-of-fit test (:func:`specdec.testing.chi_square_test`)
whose p-value gives the verdict at a stated significance level, with the
test's power. A verifier's own ``lossless`` flag is reported as declared,
never as the verdict.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import torch

import specdec
from specdec.engine.loop import RowsRequest, decode_rows
from specdec.engine.step import Roles
from specdec.errors import UnsupportedTreeError
from specdec.generate import SpeculativeGenerator, autoregressive_generate
from specdec.models.callable import CallableLM
from specdec.registry import get, list_registered
from specdec.rng import RandomSource, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing.statistical import chi_square_test
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.trees.base import OneTreeBuilder
from specdec.verify.base import Verifier

__all__ = [
    "DEFAULT_ALPHA",
    "METHOD_DRAFT_NOISE",
    "POWER",
    "VERIFIER_DRAFT_NOISE",
    "DemoRow",
    "DemoTreeBuilder",
    "MethodRow",
    "detectable_tv",
    "run_demo",
    "run_method_demo",
    "demo_tree",
    "toy_models",
]

DEFAULT_ALPHA = 1e-3
"""Family-wise significance level of the demo's tests, split evenly over the verifiers run (Bonferroni)."""

POWER = 0.9
"""The probability of a FAIL at which the demo states its test's power (:func:`detectable_tv`)."""

METHOD_DRAFT_NOISE = 0.8
"""Part 1's draft: the target's logit table plus this much Gaussian noise (good, not perfect)."""

VERIFIER_DRAFT_NOISE = 3.0
"""Part 2's draft, deliberately poor: rejections, residuals and bonuses (where rules differ, and where
a wrong rule shows) happen at most nodes. With the good draft of part 1 the first token is accepted
so often that a rule drawing its bonus from ``p`` instead of the residual passes 400 trees."""


def toy_models(vocab_size: int, seed: int, noise: float = METHOD_DRAFT_NOISE) -> tuple[CallableLM, CallableLM]:
    """A toy ``(target, draft)`` pair: bigram logit tables over ``vocab_size`` tokens.

    The target's logits are ``2 N(0, 1)``; the draft's are the target's plus
    ``noise N(0, 1)``, so by default the draft is good but not perfect, as in
    real speculative decoding.

    Example:
        >>> target, draft = toy_models(5, seed=0)
        >>> target.prefill([1]); tuple(target.score_tree(DraftTree.chain(1, [], [], 5)).shape)
        (1, 5)
    """
    gen = torch.Generator().manual_seed(seed)
    table = 2.0 * torch.randn(vocab_size, vocab_size, generator=gen, dtype=torch.float64)
    noisy = table + noise * torch.randn(vocab_size, vocab_size, generator=gen, dtype=torch.float64)

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
    if NodeKind.SAMPLED in kinds and not verifier.supported_modes:  # chains only (block verification)
        return "sampled-chain"
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
    if recipe == "sampled-chain":  # one draw per node, whatever the width
        return [(rng.categorical(q), NodeKind.SAMPLED, SparseLaw.from_dense(q, SampleMode.IID))]
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
                if law is not None:  # a sampled child (kind SAMPLED), with the law it was drawn from
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
class DemoTreeBuilder(OneTreeBuilder):
    """:func:`demo_tree` as a :class:`~specdec.trees.base.OneTreeBuilder`, so the
    demo verifies its trees with the generation loop's step (:func:`specdec.engine.loop.decode_rows`, one step per tree)."""

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
        declared_lossless: the verifier's own claim (:attr:`Verifier.lossless
            <specdec.verify.base.Verifier.lossless>`), shown beside the verdict, never as it.
        p_value: the p-value of the chi-square goodness-of-fit test of the first
            emitted tokens against the target's exact law
            (:func:`~specdec.testing.chi_square_test`; 0 when a token of
            probability 0 was emitted); NaN if skipped.
        alpha: the test's significance level: the demo's family-wise level
            divided by the number of verifiers run (Bonferroni).
        detectable_tv: the test's power: a first-token law at least this far
            (total variation, on the test's bins) from the target's fails with
            probability about :data:`POWER` or more (:func:`detectable_tv`).
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
    declared_lossless: bool
    p_value: float = math.nan
    alpha: float = DEFAULT_ALPHA
    detectable_tv: float = 1.0
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        """The test did not reject the target's law (``p_value >= alpha``); False if skipped."""
        return self.skipped is None and self.p_value >= self.alpha

    @property
    def failed(self) -> bool:
        """A verifier declared lossless failed its test: the demo exits non-zero."""
        return self.skipped is None and self.declared_lossless and not self.passed

    @property
    def verdict(self) -> str:
        """``pass``; ``FAIL``; ``lossy (declared)`` for a verifier that fails and
        declares itself lossy; ``skipped``."""
        if self.skipped is not None:
            return "skipped"
        if self.passed:
            return "pass"
        return "FAIL" if self.declared_lossless else "lossy (declared)"


def detectable_tv(p: torch.Tensor, n: int, dof: int, alpha: float, power: float = POWER) -> float:
    """The power of the demo's test: the total-variation distance from ``p`` beyond which
    a law fails the chi-square test of ``n`` draws at level ``alpha`` with probability
    ``power`` or more (1.0 when no distance is guaranteed).

    Under a law at chi-square divergence ``D`` from ``p``, Pearson's statistic is about
    a noncentral chi-square with ``dof`` degrees of freedom and noncentrality ``n * D``;
    ``D >= 4 TV^2`` (Cauchy-Schwarz), so a TV of ``sqrt(lambda* / (4 n))`` suffices,
    ``lambda*`` the noncentrality at which the test's power is ``power``. TV is that of
    the test's bins (tokens expected fewer than 5 times are pooled). With one bin
    (``dof = 0``) only tokens of probability 0 are caught: for a one-hot ``p``, every
    deviation, with probability ``1 - (1 - TV)^n``.

    Example:
        >>> round(detectable_tv(torch.tensor([1.0, 0.0, 0.0]), 400, 0, 1e-3), 4)
        0.0057
        >>> 0.1 < detectable_tv(torch.full((12,), 1 / 12), 400, 11, 1e-3) < 0.2
        True
    """
    if dof <= 0:
        one_hot = int((p > 0).sum()) == 1
        return 1.0 - (1.0 - power) ** (1.0 / n) if one_hot else 1.0
    crit = _chi2_isf(alpha, dof)
    lo, hi = 0.0, 1.0
    while _ncx2_sf(crit, dof, hi) < power:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _ncx2_sf(crit, dof, mid) < power else (lo, mid)
    return min(1.0, math.sqrt(hi / (4 * n)))


def _chi2_sf(x: float, dof: float) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def _chi2_isf(alpha: float, dof: int) -> float:
    """The chi-square critical value: ``sf(x) = alpha``."""
    lo, hi = 0.0, float(dof) + 10.0
    while _chi2_sf(hi, dof) > alpha:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _chi2_sf(mid, dof) > alpha else (lo, mid)
    return hi


def _ncx2_sf(x: float, dof: int, lam: float) -> float:
    """Upper tail of the noncentral chi-square: a Poisson(``lam / 2``) mixture of central ones."""
    if lam <= 0:
        return _chi2_sf(x, dof)
    half = lam / 2
    j = torch.arange(int(half + 12 * math.sqrt(half) + 30), dtype=torch.float64)
    weights = torch.exp(-half + j * math.log(half) - torch.lgamma(j + 1))
    tails = torch.special.gammaincc(dof / 2 + j, torch.full_like(j, x / 2))
    return float((weights * tails).sum())


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def run_demo(
    trees: int = 400, vocab: int = 12, depth: int = 3, width: int = 2, temperature: float = 1.0,
    seed: int = 0, verifiers: str = "*", alpha: float = DEFAULT_ALPHA, draft_noise: float = VERIFIER_DRAFT_NOISE,
) -> list[DemoRow]:
    """Verify ``trees`` random draft trees with each registered verifier matching ``verifiers``.

    Every verifier sees trees drafted on the same toy models (:func:`toy_models`
    with ``draft_noise``: by default a poor draft, :data:`VERIFIER_DRAFT_NOISE`)
    and prompt, with the child kinds it declares it supports (see ``_recipe``);
    verifiers that need one-hot targets run at temperature 0. Each row's first emitted tokens
    are tested against the target's exact law (chi-square goodness of fit) at
    level ``alpha / m``, ``m`` the number of verifiers run (Bonferroni: a
    lossless verifier among them fails with probability at most ``alpha``).

    Raises:
        InvalidConfigError: bad sizes, temperature or ``alpha``.
    """
    if vocab < 2:
        raise specdec.InvalidConfigError(f"the demo needs a vocabulary of at least 2 tokens, got {vocab}")
    for name, value in (("trees", trees), ("depth", depth), ("width", width)):
        if value < 1:
            raise specdec.InvalidConfigError(f"{name} must be >= 1, got {value}")
    if not 0 < alpha < 1:
        raise specdec.InvalidConfigError(f"alpha must be in (0, 1), got {alpha}")
    rows: list[DemoRow] = []
    tested: list[tuple[int, torch.Tensor, int]] = []  # (row index, p_root, the test's dof)
    prompt = [0]
    for name in list_registered("verifier", verifiers):
        verifier: Verifier = get("verifier", name)()
        greedy = verifier.requires_greedy or temperature == 0
        sampling = SamplingConfig(temperature=0.0 if greedy else temperature)
        target, draft = toy_models(vocab, seed, draft_noise)
        target.prefill(prompt)
        p_root = process_logits(target.score_tree(DraftTree.chain(prompt[-1], [], [], vocab)), sampling)[0]
        rng = TorchRandom.seeded(seed)
        def skipped(recipe: str, why: UnsupportedTreeError) -> DemoRow:
            return DemoRow(verifier=name, recipe=recipe, temperature=sampling.temperature, trees=0, tau=0.0,
                           depth1_acceptance=0.0, tv_first_token=0.0, tv_reference=0.0, seconds=0.0,
                           declared_lossless=verifier.lossless, skipped=str(why))

        try:
            recipe = _recipe(verifier, greedy)
        except UnsupportedTreeError as exc:
            rows.append(skipped("-", exc))
            continue
        counts = torch.zeros(vocab, dtype=torch.float64)
        firsts: list[int] = []
        emitted = accepted_first = 0
        start = time.perf_counter()
        builder = DemoTreeBuilder(recipe, depth, width)
        try:
            for _ in range(trees):  # one step of the engine loop per tree
                (report,) = decode_rows(Roles(target, draft, builder, verifier),
                                        RowsRequest([prompt], sampling, [rng], None, max_steps=1, what="specdec demo"))
                result = report.outcome.result
                counts[result.tokens[0]] += 1
                firsts.append(result.tokens[0])
                emitted += len(result.tokens)
                accepted_first += result.num_accepted >= 1
        except UnsupportedTreeError as exc:
            rows.append(skipped(recipe, exc))
            continue
        seconds = time.perf_counter() - start
        # the sampling noise of a lossless verifier: TV of `trees` direct draws from p, 95th percentile
        noise = torch.Generator().manual_seed(seed + 1)
        direct = torch.multinomial(p_root.expand(200, vocab), trees, replacement=True, generator=noise)
        tvs = sorted(_tv(torch.bincount(row, minlength=vocab).to(torch.float64), p_root) for row in direct)
        law: dict[Hashable, float] = {token: float(prob) for token, prob in enumerate(p_root.tolist())}
        test = chi_square_test(firsts, law)
        # the test's bins (and so its dof) depend on the law and n only: read them from a draw in the support
        dof = test.dof if not test.unexpected else chi_square_test([int(p_root.argmax())] * trees, law).dof
        tested.append((len(rows), p_root, dof))
        rows.append(DemoRow(
            verifier=name, recipe=recipe, temperature=sampling.temperature, trees=trees,
            tau=emitted / trees, depth1_acceptance=accepted_first / trees,
            tv_first_token=_tv(counts, p_root), tv_reference=tvs[189],
            seconds=seconds, declared_lossless=verifier.lossless, p_value=test.p_value,
        ))
    level = alpha / max(1, len(tested))
    for i, p_root, dof in tested:
        rows[i] = attrs.evolve(rows[i], alpha=level, detectable_tv=detectable_tv(p_root, trees, dof, level))
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
