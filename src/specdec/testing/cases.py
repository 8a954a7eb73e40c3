"""Per-node cases: random laws, child-kind mixes, and the one-node program whose
exact law the per-node suite enumerates (docs/extending.md, "Which suite a rule needs").

A per-node case is a root with children of one :class:`Mix` (sampled, drawn
i.i.d. or without replacement from a law ``q'``, and/or deterministic top-K of
the draft row ``q``) and leaves below: :func:`node_program` draws the sampled
children through the random source, builds the tree and verifies it, so
:func:`exact_node_law` is the exact law of the first emitted token, which must
be the target's ``p``. The per-node suite checks the root only: an error in what
a rule does below depth 1 (a bonus drawn from ``p`` instead of the residual at a
deeper node) needs the whole-tree suite (:mod:`specdec.testing.shapes`).

Example:
    >>> import specdec
    >>> case = make_node_case(seed=0, V=3, mix=Mix(2, SampleMode.IID, 0))
    >>> law = run_node_case(specdec.get("verifier", "rejection-iid")(), case)
    >>> bool((law.first_token - case.p).abs().max() < 1e-12)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from specdec.rng import RandomSource
from specdec.testing.enumerate import exact_law
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.verify.base import Verifier

__all__ = [
    "ALL_MIXES", "STYLES", "Mix", "NodeCase", "NodeLaw", "build_root_tree", "draw_children", "exact_node_law",
    "feasible", "leaf_rows", "make_node_case", "node_program", "random_law", "run_node_case", "supports",
    "top_tokens",
]

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
    """The exact :class:`NodeLaw` of a :func:`node_program` over a vocabulary of ``V`` tokens."""
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


def run_node_case(verifier: Verifier, case: NodeCase, **kwargs: Any) -> NodeLaw:
    """The exact :class:`NodeLaw` of ``verifier`` on ``case`` (``kwargs``: :func:`node_program`'s)."""
    return exact_node_law(node_program(verifier, case.p, case.q_prime, case.mix, case.det, **kwargs), case.V)
