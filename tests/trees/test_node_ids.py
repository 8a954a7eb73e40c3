"""Node ids (docs/concepts.md, "Node ids"): every registered tree builder numbers its
trees level by level, each node's children in test order, and passes draft ids (the
draft's own numbering: nodes in the order given to ``expand``) to the draft model."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

import specdec
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing import markov_pair
from specdec.testing.markov import MarkovLM
from specdec.tree import DraftTree
from specdec.trees import build_tree

V = 5
PROMPT = [0, 1]

CASES = [
    pytest.param(name, options, id=f"{name}-{i}")
    for name in specdec.list_registered("tree")
    for i, options in enumerate(specdec.get("tree", name).example_options)
]


class PathDraft(MarkovLM):
    """A draft that numbers its step's nodes as a DraftModel does (root 0, then 1, 2, ...
    in the order they are passed to ``tree_logits``) and records each draft node's
    path below the root, so the test can tell which paths the builder expanded."""

    def _numbered(self, parents: list[int], tokens: list[int]) -> list[int]:
        """The draft ids the new nodes get: the next ones, in call order."""
        return list(range(len(self.paths), len(self.paths) + len(tokens)))

    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        super().begin(prompt_ids, target_hidden)
        self.paths: dict[int, tuple[int, ...]] = {0: ()}

    def root_logits(self) -> torch.Tensor:
        self.paths = {0: ()}
        return super().root_logits()

    def tree_logits(self, parents, tokens) -> torch.Tensor:
        if isinstance(parents, torch.Tensor):
            parents, tokens = parents.tolist(), tokens.tolist()
        parents, tokens = [int(p) for p in parents], [int(t) for t in tokens]
        for parent in parents:
            assert parent in self.paths, f"expand: parent {parent} is not a draft id of this step"
        ids = self._numbered(parents, tokens)
        for node, parent, token in zip(ids, parents, tokens, strict=True):
            self.paths[node] = self.paths[parent] + (token,)
        # the law after each node is the law after its recorded path (what the numbering says it is)
        return self._logits([self.draft_context + list(self.paths[node]) for node in ids])


class ReversedIds(PathDraft):
    """Broken variant: numbers the nodes of one call in reverse order."""

    def _numbered(self, parents: list[int], tokens: list[int]) -> list[int]:
        return super()._numbered(parents, tokens)[::-1]


def node_id_violations(tree: DraftTree, expanded: set[tuple[int, ...]]) -> list[str]:
    """What breaks docs/concepts.md's node-id order in ``tree`` (empty: nothing)."""
    bad = []
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    depths = tree.depths.tolist()
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.num_nodes):
        paths.append(paths[parents[i]] + (tokens[i],))
        if not parents[i] < i:
            bad.append(f"node {i}: parent {parents[i]} is not a smaller id")
        if depths[i] < depths[i - 1]:
            bad.append(f"node {i}: depth {depths[i]} after depth {depths[i - 1]} (not level by level)")
    for node in range(tree.num_nodes):
        children = list(tree.children(node))  # sampled in draw order, then deterministic by rank
        if children != sorted(children):
            bad.append(f"node {node}: children {children} (test order) are not numbered in that order")
        if children and paths[node] not in expanded:
            bad.append(f"node {node} (path {paths[node]}) has children but the draft never expanded its path")
    return bad


def build(name: str, options: dict, draft: PathDraft, temperature: float, seed: int) -> DraftTree:
    builder = specdec.get("tree", name)(**options)
    draft.begin(PROMPT)
    return build_tree(builder, PROMPT[-1], draft, SamplingConfig(temperature=temperature), TorchRandom.seeded(seed))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize(("name", "options"), CASES)
def test_every_registered_builder_follows_the_node_id_order(name, options, temperature):
    for seed in range(4):
        _, d = markov_pair(V, seed=seed)
        draft = PathDraft(d.table)
        tree = build(name, options, draft, temperature, seed)
        assert tree.num_nodes > 1
        # ddtree's children come from per-position laws (docs/trees.md, "ddtree"), not from the law after
        # their parent's path: only the order is checked (every path counts as expanded)
        expanded = set(draft.paths.values()) if name not in POSITION_LAWS else _all_paths(tree)
        assert node_id_violations(tree, expanded) == [], (name, options, seed)


POSITION_LAWS = {"ddtree"}
"""Builders whose children's laws are per-position (a parallel draft's), not per-path."""


def _all_paths(tree: DraftTree) -> set[tuple[int, ...]]:
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.num_nodes):
        paths.append(paths[parents[i]] + (tokens[i],))
    return set(paths)


def test_a_draft_numbering_its_nodes_otherwise_is_caught():
    """The check can fail: with a draft that numbers each call's nodes in reverse, a
    builder that expands several nodes per call expands other paths than its nodes'."""
    name, options = "static", {"expansion": (2, 1, 1), "mode": "wor"}  # two nodes expanded in one call, then their children
    caught = 0
    for seed in range(4):
        _, d = markov_pair(V, seed=seed)
        draft = ReversedIds(d.table)
        tree = build(name, options, draft, 1.0, seed)
        caught += any("never expanded its path" in v for v in node_id_violations(tree, set(draft.paths.values())))
    assert caught > 0


def test_a_tree_numbered_out_of_order_is_caught():
    from specdec.tree import SparseLaw, SampleMode, TreeAssembler

    law = SparseLaw(torch.tensor([1, 2]), torch.tensor([0.5, 0.5], dtype=torch.float64), SampleMode.WITHOUT_REPLACEMENT)
    asm = TreeAssembler(root_token=0, vocab_size=3)
    a = asm.add_sampled(0, token=1, law=law, weight=0.5)
    _ = asm.add_deterministic(a, token=0, weight=0.5)  # depth 2 ...
    _ = asm.add_sampled(0, token=2, law=law, weight=0.5)  # ... before depth 1
    violations = node_id_violations(asm.build(), {(), (1,)})
    assert any("not level by level" in v for v in violations)
