"""The T = 0 decision from the rows' argmax (``specdec.verify.greedy_decision.decide_greedy``)
against the general decision, field for field.

For every registered verifier with a fused rule and every tree shape the verifier accepts
(the builders of ``test_verify_fast.CASES``: chains, static iid / without-replacement trees,
EAGLE's deterministic trees, RheoSampling's mixed trees), several trees at once, the greedy
decision must equal both general forms (every node at once on the one-hot rows, and the walk)
on logits whose argmax often hits a child, with tied maxima and with NaN / +inf / all -inf
rows (flagged only where visited). A variant that accepts a child the rule does not test
fails the comparison.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from specdec.errors import UnsupportedTreeError
from specdec.registry import get, list_registered
from specdec.sampling import SamplingConfig, greedy_law, row_is_bad
from specdec.verify.decision import TreeDecision
from specdec.verify.fast import decide_from_logits, decide_tree_batch, decide_tree_walk
from specdec.verify.greedy_decision import decide_greedy

from test_verify_fast import CASES
from test_verify_walk import _batch as walk_batch

GREEDY = SamplingConfig(temperature=0.0)
FIELDS = ("accepted", "num_accepted", "tokens", "bonus", "attempted", "bad_visited", "stop")
FUSED = [n for n in list_registered("verifier") if get("verifier", n)().fused is not None]
BUILDERS = {name: builder for name, builder, _ in CASES}


def _batch(builder, seeds, vocab: int = 6, special: bool = False):
    """``B`` trees of ``builder``; logits whose argmax is a child's token at about 60% of the
    nodes; with ``special``, tied maxima and NaN / +inf / all -inf rows too."""
    trees, batch, _, _ = walk_batch(builder, seeds, vocab)  # the walk tests' trees; logits of our own
    g = torch.Generator().manual_seed(5000 + seeds[0])
    B, n = batch.tokens.shape
    logits = torch.randn(B, n, vocab, generator=g, dtype=torch.float64)
    for b, tree in enumerate(trees):
        for node in range(tree.num_nodes):
            kids = [int(tree.tokens[c]) for c in tree.children(node)]
            if kids and torch.rand(1, generator=g).item() < 0.6:
                logits[b, node, kids[int(torch.randint(len(kids), (1,), generator=g))]] += 6.0
    if special:
        logits[0, 0, :] = 1.0  # every token tied at the root of the first tree: the first one counts
        if n > 1:
            logits[-1, 1, 2] = float("nan")
        if n > 2:
            logits[-1, 2, :] = float("-inf")
        if n > 3:
            logits[0, 3, 1] = float("inf")
    u = torch.rand(B, batch.node_slots, batch.max_children + 1, generator=g, dtype=torch.float64)
    return batch, logits, u


def _fields(fields) -> dict[str, list]:
    decision = fields if isinstance(fields, TreeDecision) else TreeDecision(*fields)
    return {f: getattr(decision, f).tolist() for f in FIELDS}


def _supported(verifier, batch) -> bool:
    try:
        verifier.check_batch(batch)
    except UnsupportedTreeError:
        return False
    return True


@pytest.mark.parametrize("verifier_name", FUSED)
def test_the_greedy_decision_equals_the_general_one(verifier_name):
    verifier = get("verifier", verifier_name)()
    shapes = 0
    for builder_name, builder in BUILDERS.items():
        compared = accepted = 0
        for start in range(0, 48, 4):
            batch, logits, u = _batch(builder, list(range(start, start + 4)), special=start % 8 == 0)
            if not _supported(verifier, batch):  # the rule does not verify these trees (check_batch refuses)
                break
            got = _fields(decide_greedy(verifier.fused, batch, logits))
            every = _fields(decide_tree_batch(verifier.fused, batch, greedy_law(logits), u, row_is_bad(logits)))
            walk = _fields(decide_tree_walk(verifier.fused, batch, logits, u, GREEDY))
            assert got == every == walk, f"{builder_name}, seeds {start}..{start + 3}"
            for rows in ("auto", "all", "path"):  # the step's verification takes it, whatever its rows
                assert _fields(decide_from_logits(verifier.fused, batch, logits, u, GREEDY, rows=rows)) == got
            compared += 1
            accepted += sum(got["num_accepted"])
        if compared:
            shapes += 1
            assert accepted > 8, builder_name  # the decisions went below the root
    assert shapes >= 2


def _mutant_differs(mutant_rule) -> int:
    differs = 0
    for verifier_name in FUSED:
        verifier = get("verifier", verifier_name)()
        for builder in BUILDERS.values():
            for start in range(0, 24, 4):
                batch, logits, u = _batch(builder, list(range(start, start + 4)))
                if not _supported(verifier, batch):
                    break
                want = _fields(decide_tree_batch(verifier.fused, batch, greedy_law(logits), u, row_is_bad(logits)))
                differs += _fields(decide_greedy(mutant_rule(verifier.fused), batch, logits)) != want
    return differs


def test_a_decision_that_tests_other_children_is_caught():
    """Power: the same decision under a rule that does not match deterministic children
    (rule 5 off), or that only rejects (rules 3/4 alone), differs from the general decision
    for some registered rule and tree. (A rule testing every child decides as the real rules
    on every tree they accept: the trees they refuse are where the rules' test sets differ.)"""
    assert _mutant_differs(lambda rule: attrs.evolve(rule, match_deterministic=False)) > 0
    assert _mutant_differs(lambda rule: attrs.evolve(rule, rejection=True, match_deterministic=False)) > 0
