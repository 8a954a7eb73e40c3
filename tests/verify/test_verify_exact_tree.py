"""Layer 2 of docs/concepts.md, "How losslessness is proved": exact, whole tree.

The target and the draft are fixed random conditional tables ``p(. | prefix)``
and ``q(. | prefix)`` over a vocabulary of 3 or 4 tokens (rows include zeros,
one-hot rows and ``q(top1) = 1/2`` ties). A small static builder, local to
this test, drafts a depth-2 tree from the root (token 0): per level either
sampled children (i.i.d. or without replacement, from the draft row), top-K
deterministic children, or a RheoSampling-style mix (top-K deterministic set
``S`` plus sampled children from ``q' = norm(q restricted minus S)``). The
verifier then runs on the target rows of every node's path.

Every builder draw and every verifier branch is enumerated exactly through one
:class:`~specdec.testing.EnumeratingRandom`. A step emits 1 to 3 tokens; the
step's law is completed to the first 3 tokens with the target's own
conditionals (what the next steps would do, as each starts from the target
law given its context), and the joint law of the first 3 tokens must equal
the target's ``p(x1) p(x2 | x1) p(x3 | x1, x2)`` to 1e-9. A mutant (rule 3 on
without-replacement draws) is shown to fail the same check.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import attrs
import pytest
import torch

from specdec.registry import get, list_registered
from specdec.rng import RandomSource
from specdec.testing import exact_law
from specdec.tree import DraftTree, SampleMode, SparseLaw, TreeAssembler
from specdec.verify.base import Verifier
from verify_cases import STYLES, Mix, draw_children, random_law, supports, top_tokens
from verify_mutants import Rule3OnWithoutReplacement

F64 = torch.float64
ROOT = 0
N_TOKENS = 3  # joint law of the first 3 emitted tokens (depth 2 + bonus)


class Table:
    """A fixed random conditional table ``prefix -> [V]`` law (memoised)."""

    def __init__(self, seed: int, V: int, greedy: bool = False) -> None:
        self.seed, self.V, self.greedy = seed, V, greedy
        self.rows: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.rows:
            code = 0
            for t in prefix:
                code = code * (self.V + 1) + t + 1
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + code)
            style = "onehot" if self.greedy else STYLES[(code + self.seed) % len(STYLES)]
            self.rows[prefix] = random_law(gen, self.V, style)
        return self.rows[prefix]


@attrs.frozen
class Shape:
    """A static depth-2 tree shape: the children mix of the root and of each level-1 node."""

    label: str
    levels: tuple[Mix, Mix]
    V: int


IID, WOR = SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT
SHAPES = (
    Shape("chain-2", (Mix(1, IID, 0), Mix(1, IID, 0)), 4),
    Shape("iid-2x1", (Mix(2, IID, 0), Mix(1, IID, 0)), 4),
    Shape("iid-2x2", (Mix(2, IID, 0), Mix(2, IID, 0)), 3),
    Shape("wor-2x2", (Mix(2, WOR, 0), Mix(2, WOR, 0)), 3),
    Shape("wor-3x1", (Mix(3, WOR, 0), Mix(1, WOR, 0)), 4),
    Shape("det-2x2", (Mix(0, IID, 2), Mix(0, IID, 2)), 4),
    Shape("det-3x1", (Mix(0, IID, 3), Mix(0, IID, 1)), 4),
    Shape("rheo-1s1d", (Mix(1, IID, 1), Mix(1, IID, 1)), 4),
    Shape("rheo-1s2d", (Mix(1, WOR, 2), Mix(1, WOR, 1)), 4),
    Shape("mixed-2wor1d", (Mix(2, WOR, 1), Mix(1, WOR, 1)), 4),
)
TABLE_SEEDS = (0, 1, 2)


def draw_level(rng: RandomSource, q: torch.Tensor, mix: Mix) -> tuple[list[int], torch.Tensor | None, list[int]]:
    """One node's children: (sampled tokens, their law q' or None, deterministic tokens)."""
    det = top_tokens(q, mix.K)
    if not mix.k:
        return [], None, det
    q_prime = q.clone()
    q_prime[det] = 0
    support = int((q_prime > 0).sum())
    if support == 0:  # q is concentrated on S: no sampled slot (as in RheoSampling)
        return [], None, det
    q_prime = q_prime / q_prime.sum()
    k = min(mix.k, support) if mix.mode == WOR else mix.k
    return draw_children(rng, q_prime, k, mix.mode), q_prime, det


def make_program(verifier: Verifier, shape: Shape, target: Table, draft: Table):
    """``rng -> first <= 3 emitted tokens`` for one speculative step."""
    V = shape.V
    cache: dict[tuple, tuple[DraftTree, torch.Tensor]] = {}

    def program(rng: RandomSource) -> tuple[int, ...]:
        # 1. the builder's draws (a nested, hashable record of the tree)
        root_kids = draw_level(rng, draft((ROOT,)), shape.levels[0])
        level1 = root_kids[0] + root_kids[2]
        second = tuple(
            (tuple(s), tuple(d), None if law is None else tuple(law.tolist()))
            for s, law, d in (draw_level(rng, draft((ROOT, x)), shape.levels[1]) for x in level1)
        )
        key = (tuple(root_kids[0]), tuple(root_kids[2]), second)
        if key not in cache:
            cache[key] = assemble(V, root_kids, second, shape, target)
        tree, rows = cache[key]
        # 2. the verifier's draws
        return verifier.verify(tree, rows, rng).tokens[:N_TOKENS]

    return program


def assemble(V: int, root_kids, second, shape: Shape, target: Table) -> tuple[DraftTree, torch.Tensor]:
    asm = TreeAssembler(ROOT, V)
    paths = {0: (ROOT,)}

    def add_children(node: int, sampled, law_probs, det, mode) -> list[int]:
        kids = []
        if sampled:
            law = SparseLaw.from_dense(torch.as_tensor(law_probs, dtype=F64), mode)
            kids += [asm.add_sampled(node, x, law, weight=1.0) for x in sampled]
        kids += [asm.add_deterministic(node, x, weight=1.0) for x in det]
        return kids

    s0, law0, d0 = root_kids
    level1 = add_children(0, s0, None if law0 is None else law0.tolist(), d0, shape.levels[0].mode)
    tokens = s0 + d0
    for node, tok in zip(level1, tokens):
        paths[node] = (ROOT, tok)
    for node, (s, d, law) in zip(level1, second):
        for kid, tok in zip(add_children(node, list(s), law, list(d), shape.levels[1].mode), list(s) + list(d)):
            paths[kid] = paths[node] + (tok,)
    tree = asm.build()
    rows = torch.stack([target(paths[i]) for i in range(tree.num_nodes)])
    return tree, rows


def joint_law(step_law: dict[tuple[int, ...], float], target: Table, V: int) -> torch.Tensor:
    """Complete each emitted prefix to 3 tokens with the target's conditionals."""
    out = torch.zeros((V,) * N_TOKENS, dtype=F64)
    for prefix, prob in step_law.items():
        for rest in itertools.product(range(V), repeat=N_TOKENS - len(prefix)):
            seq = tuple(prefix) + rest
            w = prob
            for i in range(len(prefix), N_TOKENS):
                w *= float(target((ROOT,) + seq[:i])[seq[i]])
            out[seq] += w
    return out


def target_joint(target: Table, V: int) -> torch.Tensor:
    return joint_law({(): 1.0}, target, V)


def shape_supported(cls: type[Verifier], shape: Shape) -> bool:
    return all(supports(cls, mix) for mix in shape.levels)


def _cases():
    out = []
    for name in list_registered("verifier"):
        cls = get("verifier", name)
        for shape in SHAPES:
            if shape_supported(cls, shape):
                out.append(pytest.param(name, shape, id=f"{name}-{shape.label}-V{shape.V}"))
    return out


def run_tree_case(verifier: Verifier, shape: Shape, seed: int, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    target = Table(seed, shape.V, greedy=greedy)
    draft = Table(seed + 100, shape.V)
    law = exact_law(make_program(verifier, shape, target, draft))
    return joint_law(law, target, shape.V), target_joint(target, shape.V)


@pytest.mark.parametrize("name, shape", _cases())
def test_joint_law_of_first_tokens_is_target(name: str, shape: Shape) -> None:
    cls = get("verifier", name)
    for seed in TABLE_SEEDS:
        got, want = run_tree_case(cls(), shape, seed, greedy=cls.requires_greedy)
        err = float((got - want).abs().max())
        assert err < 1e-9, f"table seed {seed}: joint law off by {err:.3g}"


def test_whole_tree_check_catches_rule3_on_wor() -> None:
    shape = next(s for s in SHAPES if s.label == "wor-2x2")
    worst = 0.0
    for seed in TABLE_SEEDS:
        got, want = run_tree_case(Rule3OnWithoutReplacement(), shape, seed, greedy=False)
        worst = max(worst, float((got - want).abs().max()))
    assert worst > 1e-6, worst


def test_every_verifier_has_a_whole_tree_case() -> None:
    covered = defaultdict(int)
    for param in _cases():
        covered[param.values[0]] += 1
    assert set(covered) == set(list_registered("verifier"))
