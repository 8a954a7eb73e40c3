"""Exact laws of speculative generation that scale: one step, then many tokens by composition.

:class:`ExactLaws` runs the real tree builder and the real verifier on Markov
target and draft models (:class:`~specdec.testing.MarkovLM`), with every random
draw enumerated by :func:`~specdec.testing.exact_law`:

- :meth:`ExactLaws.step_law`: the law of the tokens one speculative step emits
  from a context. The builder's draws are enumerated first (the law of the
  trees it drafts), then the verifier's on each distinct tree, which is the
  same law as enumerating both in one program (the verifier draws only after
  the tree is built) at the cost of one tree scoring per distinct tree.
- :meth:`ExactLaws.token_law`: the law of the next ``L`` tokens, composing
  steps: ``sum_t P(step emits t) law(next L - |t| tokens | context + t)``,
  memoised per context. Markov models see only their last ``order`` tokens, so
  the memo is keyed on those and the cost grows with the number of distinct
  contexts, not with the number of random branches of ``L`` chained steps. Any
  other draft (a plug-in's, built by its declared factory) is keyed on the whole
  context: exact all the same, with less sharing.
- :meth:`ExactLaws.completed_law`: one step completed with the target's own
  conditionals (what the later steps must produce when they are exact); if it
  equals the target's law from every context, generation is exact by induction.

:func:`compare_laws` says where a measured law first departs from the target's:
the first token position whose conditional law differs, after which prefix,
with the expected and the measured law of that token.

Example:
    >>> import specdec
    >>> from specdec.testing import markov_pair
    >>> target, draft = markov_pair(3, seed=0, order=2)
    >>> builder = specdec.get("tree", "static")(expansion=(2, 1), mode="iid")
    >>> laws = ExactLaws(builder, specdec.get("verifier", "rejection-iid")(), target, draft,
    ...                  specdec.SamplingConfig(temperature=1.0))
    >>> gap = laws.check([0, 1], num_tokens=2)
    >>> gap.error < 1e-12
    True
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import torch

from specdec._deprecation import Renamed, deprecated_aliases
from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing.enumerate import exact_law
from specdec.testing.markov import MarkovLM
from specdec.tree import DraftTree
from specdec.trees.base import TreeBuilder, build_tree
from specdec.verify.base import Verifier

__all__ = ["ExactLaws", "LawGap", "compare_laws", "sparse_markov_pair", "tree_key"]

RENAMED = (Renamed("random_tables", "sparse_markov_pair", since="0.1.0", removed_in="0.2.0"),)
"""Names of this module kept as deprecated aliases (:mod:`specdec._deprecation`)."""
if not TYPE_CHECKING:  # type checkers see the new names only
    __getattr__ = deprecated_aliases(__name__, globals(), RENAMED)

Law = dict[tuple[int, ...], float]


def tree_key(tree: DraftTree) -> Hashable:
    """A hashable record of everything a verifier reads from ``tree``: tokens,
    parents, kinds, draw order and every recorded law (support, probabilities, mode)."""
    laws = tuple((tuple(law.indices.tolist()), tuple(law.probs.tolist()), law.mode.value) for law in tree.laws)
    return (tuple(tree.tokens.tolist()), tuple(tree.parents.tolist()), tuple(tree.kinds.tolist()),
            tuple(tree.draw_order.tolist()), tuple(tree.law_index.tolist()), laws)


@attrs.frozen
class LawGap:
    """How a measured law of the next tokens compares with the target's.

    Attributes:
        error: the largest ``|measured - expected|`` over outcomes (0 up to rounding when exact).
        mass: the measured law's total mass.
        position: the first token position (0-based) whose conditional law differs by more
            than the tolerance, or -1 when none does.
        prefix: the emitted tokens before that position, on the prefix where it differs most.
        expected: the target's law of the token at ``position`` after ``prefix`` (``[V]``).
        measured: the measured conditional law of that token (``[V]``).
    """

    error: float
    mass: float
    position: int = -1
    prefix: tuple[int, ...] = ()
    expected: tuple[float, ...] = ()
    measured: tuple[float, ...] = ()

    def describe(self, context: Sequence[int] = ()) -> str:
        """One paragraph: the error and, where the laws differ, the first token that differs."""
        head = f"max |measured - expected| = {self.error:.3g} (total mass {self.mass:.6f})"
        if self.position < 0:
            return head
        where = list(context) + list(self.prefix)
        return (f"{head}; token {self.position + 1} after context {where} differs: "
                f"expected {_fmt(self.expected)}, measured {_fmt(self.measured)}")


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _marginal(law: Mapping[tuple[int, ...], float], length: int) -> Law:
    out: Law = defaultdict(float)
    for seq, prob in law.items():
        out[seq[:length]] += prob
    return out


def compare_laws(measured: Mapping[tuple[int, ...], float], expected: Mapping[tuple[int, ...], float],
                 vocab_size: int, tol: float = 1e-9) -> LawGap:
    """Compare two laws of token tuples of one length and localise the first difference.

    The first position ``d`` at which the marginal laws of the first ``d + 1``
    tokens differ by more than ``tol`` is reported, on the prefix of ``d``
    tokens whose joint ``(prefix, token)`` masses differ most in total.
    """
    keys = set(measured) | set(expected)
    error = max((abs(measured.get(k, 0.0) - expected.get(k, 0.0)) for k in keys), default=0.0)
    mass = float(sum(measured.values()))
    length = max((len(k) for k in keys), default=0)
    for d in range(length):
        got, want = _marginal(measured, d + 1), _marginal(expected, d + 1)
        gaps: dict[tuple[int, ...], float] = defaultdict(float)
        for key in set(got) | set(want):
            gaps[key[:d]] += abs(got.get(key, 0.0) - want.get(key, 0.0))
        prefix, worst = max(gaps.items(), key=lambda kv: kv[1], default=((), 0.0))
        if worst <= tol:
            continue
        rows = []
        for law in (want, got):
            row = [law.get(prefix + (t,), 0.0) for t in range(vocab_size)]
            total = sum(row)
            rows.append(tuple(r / total for r in row) if total > 0 else tuple(row))
        return LawGap(error, mass, d, prefix, rows[0], rows[1])
    return LawGap(error, mass)


class ExactLaws:
    """Exact laws of speculative generation with ``builder`` and ``verifier`` on Markov models.

    Args:
        builder: the tree builder (its trees by :func:`~specdec.trees.base.build_tree`).
        verifier: the verifier (its :meth:`~specdec.verify.base.Verifier.verify`).
        target: the target, a :class:`~specdec.testing.MarkovLM` (its exact law is known).
        draft: the draft: a :class:`~specdec.testing.MarkovLM`, or any
            :class:`~specdec.drafts.base.DraftModel` whose laws depend on the context it
            was begun with and the tree's nodes only (it is begun afresh on every context).
        sampling: the sampling configuration of the run.
        max_branches: the enumeration limit of one builder or verifier law
            (:class:`~specdec.testing.TooManyBranchesError` beyond it).
        on_tree: called with every tree the builder drafts (to observe them, e.g. count ties).

    Raises:
        InvalidConfigError: the models' vocabularies differ.
        InvalidDistributionError: the verifier cannot serve ``sampling``.
    """

    def __init__(self, builder: TreeBuilder, verifier: Verifier, target: MarkovLM, draft: OneRowDraft,
                 sampling: SamplingConfig, *, max_branches: int = 200_000,
                 on_tree: Callable[[DraftTree], None] | None = None) -> None:
        if target.vocab_size != draft.vocab_size:
            raise InvalidConfigError(f"target vocabulary {target.vocab_size} != draft vocabulary {draft.vocab_size}")
        verifier.check_sampling(sampling)
        self.builder, self.verifier = builder, verifier
        self.target, self.draft = target, draft
        self.sampling = sampling
        self.max_branches = max_branches
        self.on_tree = on_tree
        self.order = max(target.order, draft.order) if isinstance(draft, MarkovLM) else None
        """Tokens of context the models read (the memo's key), None: the whole context (a draft that is not Markov)."""
        self.vocab_size = target.vocab_size
        self.branches = 0
        """Programs run so far (builder and verifier enumerations together)."""
        self._steps: dict[tuple[int, ...], Law] = {}
        self._chained: dict[tuple[tuple[int, ...], int], Law] = {}

    def _key(self, context: Sequence[int]) -> tuple[int, ...]:
        if self.order is None:
            if not context:
                raise InvalidConfigError("a context needs at least one token")
            return tuple(int(t) for t in context)
        if len(context) < self.order:
            raise InvalidConfigError(f"a context needs at least {self.order} tokens for order-{self.order} models")
        return tuple(int(t) for t in context[-self.order:])

    # ------------------------------------------------------------ one step
    def tree_law(self, context: Sequence[int]) -> tuple[dict[Hashable, float], dict[Hashable, DraftTree]]:
        """The law of the tree the builder drafts after ``context``: ``({tree_key: prob}, {tree_key: tree})``."""
        trees: dict[Hashable, DraftTree] = {}
        ctx = list(context)

        def build(rng: RandomSource) -> Hashable:
            self.branches += 1
            self.draft.begin(ctx)
            tree = build_tree(self.builder, ctx[-1], self.draft, self.sampling, rng)
            if self.on_tree is not None:
                self.on_tree(tree)
            key = tree_key(tree)
            trees.setdefault(key, tree)
            return key

        return exact_law(build, max_branches=self.max_branches), trees

    def verify_law(self, context: Sequence[int], tree: DraftTree) -> Law:
        """The law of the tokens the verifier emits on ``tree`` drafted after ``context``."""
        self.target.prefill(list(context))
        p = process_logits(self.target.score_tree(tree), self.sampling)

        def verify(rng: RandomSource) -> tuple[int, ...]:
            self.branches += 1
            tokens = tuple(self.verifier.verify(tree, p, rng).tokens)
            if not tokens:
                raise InvalidConfigError(f"verifier {self.verifier.registry_name!r} emitted no token")
            return tokens

        return exact_law(verify, max_branches=self.max_branches)

    def step_law(self, context: Sequence[int]) -> Law:
        """The exact law of the tokens one speculative step emits after ``context`` (memoised)."""
        key = self._key(context)
        if key not in self._steps:
            law: Law = defaultdict(float)
            tree_probs, trees = self.tree_law(context)
            for tkey, prob in tree_probs.items():
                for tokens, p_tokens in self.verify_law(context, trees[tkey]).items():
                    law[tokens] += prob * p_tokens
            self._steps[key] = dict(law)
        return self._steps[key]

    # ---------------------------------------------------------- many tokens
    def token_law(self, context: Sequence[int], num_tokens: int) -> Law:
        """The exact law of the next ``num_tokens`` tokens generated speculatively
        after ``context`` (steps composed, memoised per context)."""
        if num_tokens <= 0:
            return {(): 1.0}
        ctx = list(context)
        memo = (self._key(ctx), num_tokens)
        if memo not in self._chained:
            out: Law = defaultdict(float)
            for tokens, prob in self.step_law(ctx).items():
                head = tokens[:num_tokens]
                for tail, prob2 in self.token_law(ctx + list(head), num_tokens - len(head)).items():
                    out[head + tail] += prob * prob2
            self._chained[memo] = dict(out)
        return self._chained[memo]

    def completed_law(self, context: Sequence[int], num_tokens: int) -> Law:
        """One step's law after ``context``, completed to ``num_tokens`` tokens with the target's conditionals."""
        ctx = list(context)
        out: Law = defaultdict(float)
        for tokens, prob in self.step_law(ctx).items():
            head = tokens[:num_tokens]
            for tail, prob2 in self.target_law(ctx + list(head), num_tokens - len(head)).items():
                out[head + tail] += prob * prob2
        return dict(out)

    def target_law(self, context: Sequence[int], num_tokens: int) -> Law:
        """The target's own law of the next ``num_tokens`` tokens (what an exact method produces)."""
        if num_tokens <= 0:
            return {(): 1.0}
        return self.target.joint_law(list(context), num_tokens, self.sampling)

    def check(self, context: Sequence[int], num_tokens: int, *, chained: bool = True) -> LawGap:
        """:func:`compare_laws` of :meth:`token_law` (``chained``) or :meth:`completed_law`
        with :meth:`target_law`."""
        measured = self.token_law(context, num_tokens) if chained else self.completed_law(context, num_tokens)
        return compare_laws(measured, self.target_law(context, num_tokens), self.vocab_size)


def sparse_markov_pair(vocab_size: int, seed: int, *, ties: bool = False) -> tuple[MarkovLM, MarkovLM]:
    """An order-2 target and draft pair over ``vocab_size`` tokens with exact zeros in some rows;
    ``ties``: the draft's rows include one-hot rows, rows with ``q(top1) = 1/2`` and equal top pairs
    (where deterministic top-K selection and sampled slots meet).

    Called ``random_tables`` before 0.1.0 (it returns models, not tables, like :func:`markov_pair`);
    that name is a deprecated alias until 0.2.0."""
    g = torch.Generator().manual_seed(seed)
    tables = []
    for _ in range(2):
        raw = torch.rand(vocab_size, vocab_size, vocab_size, generator=g, dtype=torch.float64) + 0.05
        drop = torch.rand(raw.shape, generator=g, dtype=torch.float64) < 0.25
        keep = torch.nn.functional.one_hot(raw.argmax(-1), vocab_size).bool()
        raw = raw.masked_fill(drop & ~keep, 0.0)
        tables.append(raw / raw.sum(-1, keepdim=True))
    if ties:
        draft = tables[1]
        for a in range(vocab_size):
            for b in range(vocab_size):
                kind = (a * vocab_size + b + seed) % 4
                row = torch.zeros(vocab_size, dtype=torch.float64)
                if kind == 0:
                    row[(a + b) % vocab_size] = 1.0
                elif kind == 1:
                    row[0] = 0.5
                    row[1:] = 0.5 / (vocab_size - 1)
                    row = row.roll((a + 2 * b) % vocab_size)
                elif kind == 2:
                    row[b % vocab_size] = 0.5
                    row[(b + 1) % vocab_size] = 0.5
                else:
                    continue
                draft[a, b] = row
    logs = [torch.where(t > 0, t.log(), torch.full_like(t, float("-inf"))) for t in tables]
    return MarkovLM(logs[0]), MarkovLM(logs[1])
