"""Shared helpers of the verifier tests: random laws, child-kind mixes, and
the per-node program whose exact law the tests enumerate.

Lives beside the tests (not in conftest.py) so that test modules can import
it by name; pytest's default import mode puts this folder on ``sys.path``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from specdec.rng import RandomSource
from specdec.testing import exact_law
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.verify.base import Verifier
from specdec.verify.residual import kseq_beta, kseq_rho

F64 = torch.float64

# -------------------------------------------------------------- random laws
STYLES = ("dense", "zeros", "onehot", "tie")


def random_law(gen: torch.Generator, V: int, style: str, min_support: int = 1) -> torch.Tensor:
    """A ``[V]`` float64 distribution of the given style.

    ``dense``: all positive; ``zeros``: about half the entries exactly 0;
    ``onehot``: a single 1; ``tie``: the top token has exactly 1/2 and another
    token too, or 1/2 plus the rest spread. At least ``min_support`` entries
    are positive (``onehot`` is widened to a ``tie``-like law when needed).
    """
    if style == "onehot" and min_support <= 1:
        out = torch.zeros(V, dtype=F64)
        out[int(torch.randint(V, (1,), generator=gen))] = 1.0
        return out
    if style in ("tie", "onehot"):
        perm = torch.randperm(V, generator=gen)
        out = torch.zeros(V, dtype=F64)
        if min_support <= 2 and bool(torch.rand((), generator=gen) < 0.5):
            out[perm[0]] = 0.5
            out[perm[1]] = 0.5
            return out
        out[perm[0]] = 0.5
        rest = torch.rand(V - 1, generator=gen, dtype=F64) + 0.05
        out[perm[1:]] = 0.5 * rest / rest.sum()
        return out
    w = torch.rand(V, generator=gen, dtype=F64) + 1e-3
    if style == "zeros":
        keep = torch.rand(V, generator=gen) < 0.5
        order = torch.randperm(V, generator=gen)
        keep[order[: max(min_support, 1)]] = True
        w = torch.where(keep, w, torch.zeros_like(w))
    return w / w.sum()


def top_tokens(q: torch.Tensor, K: int) -> list[int]:
    """The top-``K`` tokens of ``q`` by the total order (-q, token index)."""
    order = sorted(range(q.numel()), key=lambda t: (-float(q[t]), t))
    return order[:K]


# ------------------------------------------------------------ child mixes
@attrs.frozen
class Mix:
    """The children of the root in a per-node case.

    Attributes:
        k: number of sampled children.
        mode: how they were drawn.
        K: number of deterministic children.
    """

    k: int
    mode: SampleMode
    K: int

    @property
    def label(self) -> str:
        parts = []
        if self.k:
            parts.append(f"{self.k}{self.mode.value}")
        if self.K:
            parts.append(f"{self.K}det")
        return "+".join(parts)


ALL_MIXES: tuple[Mix, ...] = (
    *(Mix(k, mode, 0) for mode in SampleMode for k in (1, 2, 3)),
    *(Mix(0, SampleMode.IID, K) for K in (1, 2, 3)),
    Mix(1, SampleMode.IID, 1),
    Mix(1, SampleMode.IID, 2),
    Mix(2, SampleMode.WITHOUT_REPLACEMENT, 1),
    Mix(2, SampleMode.IID, 1),
)


def supports(cls: type[Verifier], mix: Mix) -> bool:
    """Whether ``cls`` declares support for ``mix`` (mirrors ``Verifier.check_tree``)."""
    if mix.k and NodeKind.SAMPLED not in cls.supported_kinds:
        return False
    if mix.K and NodeKind.DETERMINISTIC not in cls.supported_kinds:
        return False
    return not (mix.k > 1 and mix.mode not in cls.supported_modes)


def feasible(mix: Mix, V: int) -> bool:
    """Whether ``mix`` can be drawn over a vocabulary of ``V`` tokens."""
    return mix.K <= V and (mix.mode != SampleMode.WITHOUT_REPLACEMENT or mix.k <= V)


# ------------------------------------------------------ per-node program
def draw_children(rng: RandomSource, q_prime: torch.Tensor, k: int, mode: SampleMode) -> list[int]:
    """Draw ``k`` children from ``q_prime`` through ``rng`` (i.i.d. or without replacement)."""
    out: list[int] = []
    q = q_prime.clone()
    for _ in range(k):
        x = rng.categorical(q)
        out.append(x)
        if mode == SampleMode.WITHOUT_REPLACEMENT:
            q[x] = 0
            q = q / q.sum()
    return out


def build_root_tree(
    V: int, sampled: list[int], q_prime: torch.Tensor, mode: SampleMode, det: list[int]
) -> DraftTree:
    """Root (token 0) with the given sampled children (law ``q_prime``) then deterministic ones."""
    asm = TreeAssembler(root_token=0, vocab_size=V)
    if sampled:
        law = SparseLaw.from_dense(q_prime, mode)
        for x in sampled:
            asm.add_sampled(0, x, law, weight=1.0)
    for x in det:
        asm.add_deterministic(0, x, weight=1.0)
    return asm.build()


def leaf_rows(n: int, V: int, p_root: torch.Tensor) -> torch.Tensor:
    """``[n, V]`` rows: ``p_root`` at the root, one-hot rows elsewhere (no extra branching)."""
    rows = torch.zeros(n, V, dtype=F64)
    rows[:, 0] = 1.0
    rows[0] = p_root
    return rows


def node_program(
    verifier: Verifier,
    p: torch.Tensor,
    q_prime: torch.Tensor,
    mix: Mix,
    det: list[int],
    reorder: Callable[[list[int]], list[int]] | None = None,
) -> Callable[[RandomSource], tuple[int, bool]]:
    """The program ``rng -> (first emitted token, root child accepted?)``: draw
    the sampled children from ``q_prime`` through ``rng``, build the tree, verify.

    ``reorder`` (mutants only) permutes the drawn children before building.
    """
    V = p.numel()
    cache: dict[tuple[int, ...], tuple[DraftTree, torch.Tensor]] = {}

    def program(rng: RandomSource) -> tuple[int, bool]:
        sampled = draw_children(rng, q_prime, mix.k, mix.mode)
        if reorder is not None:
            sampled = reorder(sampled)
        key = tuple(sampled)
        if key not in cache:
            tree = build_root_tree(V, sampled, q_prime, mix.mode, det)
            cache[key] = (tree, leaf_rows(tree.num_nodes, V, p))
        tree, rows = cache[key]
        result = verifier.verify(tree, rows, rng)
        return result.tokens[0], result.num_accepted > 0

    return program


@attrs.frozen
class NodeLaw:
    """Exact outcome of a per-node case."""

    first_token: torch.Tensor  # [V] law of the first emitted token
    acceptance: float  # probability that a root child is accepted


def exact_node_law(program: Callable[[RandomSource], tuple[int, bool]], V: int) -> NodeLaw:
    law = exact_law(program)
    first = torch.zeros(V, dtype=F64)
    acc = 0.0
    for (tok, accepted), prob in law.items():
        first[tok] += prob
        if accepted:
            acc += prob
    return NodeLaw(first, acc)


@attrs.frozen
class NodeCase:
    """A random per-node case: target row, proposal law, deterministic set."""

    V: int
    p: torch.Tensor
    q: torch.Tensor  # the draft row (deterministic children are its top-K)
    q_prime: torch.Tensor  # the law the sampled children are drawn from
    det: list[int]
    mix: Mix
    greedy: bool


def make_node_case(seed: int, V: int, mix: Mix, greedy: bool = False) -> NodeCase:
    """Seeded random case; styles of ``p``, ``q`` and ``q'`` vary with the seed."""
    gen = torch.Generator().manual_seed(seed * 7919 + V * 131 + mix.k * 17 + mix.K)
    p_style = "onehot" if greedy else STYLES[seed % len(STYLES)]
    q_style = STYLES[(seed // len(STYLES)) % len(STYLES)]
    p = random_law(gen, V, p_style)
    q = random_law(gen, V, q_style, min_support=mix.K)
    det = top_tokens(q, mix.K)
    need = mix.k if mix.mode == SampleMode.WITHOUT_REPLACEMENT else 1
    rest = q.clone()
    rest[det] = 0
    if mix.K and seed % 2 == 0 and int((rest > 0).sum()) >= need:
        # RheoSampling's q' = norm(q restricted minus S)
        q_prime = rest / rest.sum()
    else:
        q_prime = random_law(gen, V, STYLES[(seed // 3) % len(STYLES)], min_support=need)
    return NodeCase(V, p, q, q_prime, det, mix, greedy)


def closed_form_acceptance(name: str, case: NodeCase) -> float | None:
    """docs/verifiers.md's closed-form acceptance at the node, where one is stated."""
    p, qp, det, mix = case.p, case.q_prime, case.det, case.mix
    pS = float(p[det].sum()) if det else 0.0
    if name == "greedy":
        if mix.k:
            return None
        return 1.0 if int(p.argmax()) in det else 0.0  # rule 1
    if mix.k == 0 and name in ("match", "mixed"):
        return pS  # rule 2
    if mix.k == 1 and name == "match":  # rule 2 with S plus one child y ~ q': E[p(S + {y})]
        not_S = torch.ones_like(p, dtype=torch.bool)
        not_S[det] = False
        return pS + float((qp * p)[not_S].sum())
    if mix.k == 1:
        not_S = torch.ones_like(p, dtype=torch.bool)
        not_S[det] = False
        mins = torch.minimum(p, qp)
        if name == "mixed":  # rule 5, one sampled child
            return pS + float(mins[not_S].sum())
        if mix.K == 0 and name in ("rejection-iid", "rejection-wor", "kseq"):
            return float(mins.sum())  # rule 3/4, single child
    if name == "kseq" and mix.K == 0:
        support = torch.nonzero(qp > 0).flatten()
        rho = kseq_rho(p[support], qp[support], mix.k)
        beta = kseq_beta(p[support], qp[support], rho)
        return 1.0 - (1.0 - beta) ** mix.k
    return None


CLOSED_FORMS = {
    "greedy": lambda mix: mix.k == 0,
    "match": lambda mix: mix.k <= 1,
    "mixed": lambda mix: mix.k <= 1,
    "rejection-iid": lambda mix: mix.k == 1,
    "rejection-wor": lambda mix: mix.k == 1,
    "kseq": lambda mix: True,
}


def has_closed_form(name: str, mix: Mix) -> bool:
    """Whether :func:`closed_form_acceptance` covers ``name`` on ``mix`` (when supported)."""
    rule = CLOSED_FORMS.get(name)
    return bool(rule and rule(mix))


def run_node_case(verifier: Verifier, case: NodeCase, **kwargs: Any) -> NodeLaw:
    return exact_node_law(node_program(verifier, case.p, case.q_prime, case.mix, case.det, **kwargs), case.V)
