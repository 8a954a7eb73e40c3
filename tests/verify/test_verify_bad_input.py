"""Bad input to the verifiers raises the specific specdec error, before any
random draw, and no input makes a verifier fail with anything else
(issue 2, item 8). Parametrised over the registry."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from specdec.errors import (
    InvalidDistributionError,
    MalformedTreeError,
    SpecDecError,
    UnsupportedTreeError,
    VocabMismatchError,
)
from specdec.registry import get, list_registered
from specdec.rng import RandomSource, TorchRandom
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler
from specdec.verify.base import Verifier, VerifyResult

VERIFIERS = list_registered("verifier")
V = 4


class NoDraws(RandomSource):
    """Fails the test on any draw: errors must come before randomness."""

    def bernoulli(self, prob):  # pragma: no cover - reaching it is the failure
        raise AssertionError("a random draw happened before the input was rejected")

    def categorical(self, probs):  # pragma: no cover
        raise AssertionError("a random draw happened before the input was rejected")


def supported_tree(cls: type[Verifier], token: int = 1) -> DraftTree:
    """Root -> one child holding ``token``, of a kind ``cls`` supports; the child
    is accepted with probability 1 when ``p[0]`` is one-hot on ``token``."""
    asm = TreeAssembler(root_token=0, vocab_size=V)
    if NodeKind.SAMPLED in cls.supported_kinds:
        law = SparseLaw(torch.tensor([token]), torch.tensor([1.0], dtype=torch.float64), SampleMode.IID)
        asm.add_sampled(0, token, law, weight=1.0)
    else:
        asm.add_deterministic(0, token, weight=1.0)
    return asm.build()


def good_rows(n: int, token: int = 1) -> torch.Tensor:
    rows = torch.zeros(n, V, dtype=torch.float64)
    rows[:, token] = 1.0
    return rows


def _bad_p(kind: str, n: int) -> object:
    p = good_rows(n)
    if kind == "nan":
        p[0, 2] = float("nan")
    elif kind == "inf":
        p[0, 2] = float("inf")
    elif kind == "negative":
        p[0] = torch.tensor([0.5, 0.7, -0.2, 0.0], dtype=torch.float64)
    elif kind == "not-normalised":
        p[0] = torch.tensor([0.0, 0.9, 0.0, 0.0], dtype=torch.float64)
    elif kind == "too-many-rows":
        p = good_rows(n + 1)
    elif kind == "too-few-rows":
        p = good_rows(n - 1)
    elif kind == "one-dimensional":
        p = p[0]
    elif kind == "integer":
        p = p.long()
    elif kind == "not-a-tensor":
        p = p.tolist()
    elif kind == "nan-on-the-path":  # row 1 is reached: its parent accepts it with probability 1
        p[1, 3] = float("nan")
    return p


BAD_P = ["nan", "inf", "negative", "not-normalised", "too-many-rows", "too-few-rows",
         "one-dimensional", "integer", "not-a-tensor"]  # fmt: skip


@pytest.mark.parametrize("name", VERIFIERS)
@pytest.mark.parametrize("kind", BAD_P)
def test_bad_p_raises_invalid_distribution(name: str, kind: str) -> None:
    cls = get("verifier", name)
    tree = supported_tree(cls)
    with pytest.raises(InvalidDistributionError):
        cls().verify(tree, _bad_p(kind, tree.num_nodes), NoDraws())


@pytest.mark.parametrize("name", VERIFIERS)
def test_bad_row_on_the_path_is_detected(name: str) -> None:
    cls = get("verifier", name)
    tree = supported_tree(cls)
    with pytest.raises(InvalidDistributionError, match=r"p\[1\]"):
        cls().verify(tree, _bad_p("nan-on-the-path", tree.num_nodes), TorchRandom.seeded(0))


@pytest.mark.parametrize("name", VERIFIERS)
def test_vocab_mismatch(name: str) -> None:
    cls = get("verifier", name)
    tree = supported_tree(cls)
    p = torch.zeros(tree.num_nodes, V + 1, dtype=torch.float64)
    p[:, 1] = 1.0
    with pytest.raises(VocabMismatchError, match="vocabulary"):
        cls().verify(tree, p, NoDraws())


@pytest.mark.parametrize("name", [n for n in VERIFIERS if get("verifier", n).requires_greedy])
def test_greedy_needs_one_hot_rows(name: str) -> None:
    cls = get("verifier", name)
    tree = supported_tree(cls)
    p = good_rows(tree.num_nodes)
    p[0] = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    with pytest.raises(InvalidDistributionError, match="one-hot"):
        cls().verify(tree, p, NoDraws())


def _unsupported_trees(cls: type[Verifier]) -> list[DraftTree]:
    """Trees with children ``cls`` does not declare, placed below an accepted node
    (the whole tree is checked up front, not only the visited nodes)."""
    trees = []
    for kind in (NodeKind.DETERMINISTIC, NodeKind.SAMPLED):
        for mode in SampleMode:
            asm = TreeAssembler(root_token=0, vocab_size=V)
            first = (asm.add_deterministic(0, 1, 1.0) if NodeKind.DETERMINISTIC in cls.supported_kinds
                     else asm.add_sampled(0, 1, SparseLaw(torch.tensor([1]), torch.tensor([1.0]), mode), 1.0))
            if kind == NodeKind.DETERMINISTIC:
                asm.add_deterministic(first, 2, 1.0)
                asm.add_deterministic(first, 3, 1.0)
                unsupported = kind not in cls.supported_kinds
            else:
                law = SparseLaw(torch.tensor([2, 3]), torch.tensor([0.5, 0.5]), mode)
                asm.add_sampled(first, 2, law, 1.0)
                asm.add_sampled(first, 3, law, 1.0)
                unsupported = kind not in cls.supported_kinds or mode not in cls.supported_modes
            if unsupported:
                trees.append(asm.build())
    return trees


@pytest.mark.parametrize("name", VERIFIERS)
def test_unsupported_children_raise_before_any_draw(name: str) -> None:
    cls = get("verifier", name)
    for tree in _unsupported_trees(cls):
        with pytest.raises(UnsupportedTreeError, match=name):
            cls().verify(tree, good_rows(tree.num_nodes), NoDraws())


def test_unsupported_declarations_are_what_the_rules_need() -> None:
    """The rules whose ratio needs a proposal law refuse deterministic children."""
    for name in ("rejection-iid", "rejection-wor", "kseq"):
        assert NodeKind.DETERMINISTIC not in get("verifier", name).supported_kinds
    assert get("verifier", "rejection-iid").supported_modes == {SampleMode.IID}
    assert get("verifier", "rejection-wor").supported_modes == {SampleMode.WITHOUT_REPLACEMENT}
    assert get("verifier", "kseq").supported_modes == {SampleMode.IID}


# ------------------------------------------------------------- property test
@st.composite
def sparse_laws(draw, vocab: int) -> SparseLaw:
    support = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=vocab, unique=True))
    weights = draw(st.lists(st.floats(1e-6, 1.0), min_size=len(support), max_size=len(support)))
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    probs = torch.tensor(weights, dtype=torch.float64)
    return SparseLaw(torch.tensor(support), (probs / probs.sum()).to(dtype), draw(st.sampled_from(list(SampleMode))))


@st.composite
def trees(draw) -> DraftTree:
    vocab = draw(st.integers(1, 5))
    asm = TreeAssembler(root_token=draw(st.integers(0, vocab - 1)), vocab_size=vocab)
    laws: dict[int, SparseLaw] = {}
    for _ in range(draw(st.integers(0, 6))):
        parent = draw(st.integers(0, len(asm) - 1))
        weight = draw(st.floats(0.0, 1.0))
        if draw(st.booleans()):
            asm.add_deterministic(parent, draw(st.integers(0, vocab - 1)), weight)
        else:
            law = laws.setdefault(parent, draw(sparse_laws(vocab)))
            token = draw(st.sampled_from(law.indices.tolist()))
            asm.add_sampled(parent, token, law, weight)
    try:
        return asm.build()
    except MalformedTreeError:
        assume(False)
        raise


@st.composite
def p_tensors(draw, tree: DraftTree) -> object:
    n, vocab = tree.num_nodes, tree.vocab_size
    shape = draw(st.sampled_from([(n, vocab)] * 4 + [(n + 1, vocab), (n, vocab + 1), (vocab,), (n, 0)]))
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64]))
    numel = 1
    for s in shape:
        numel *= s
    style = draw(st.sampled_from(["distribution", "one-hot", "garbage"]))
    if style == "garbage" or len(shape) != 2 or shape[1] == 0:
        values = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32),
                               min_size=numel, max_size=numel))  # fmt: skip
        return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)
    if style == "one-hot":
        idx = torch.tensor(draw(st.lists(st.integers(0, shape[1] - 1), min_size=shape[0], max_size=shape[0])))
        return torch.zeros(shape, dtype=torch.float64).scatter_(1, idx[:, None], 1.0).to(dtype)
    weights = draw(st.lists(st.floats(0.0, 1.0), min_size=numel, max_size=numel))
    w = torch.tensor(weights, dtype=torch.float64).reshape(shape)
    w[:, 0] += 1e-3
    return (w / w.sum(dim=1, keepdim=True)).to(dtype)


def _check_result(tree: DraftTree, result: VerifyResult) -> None:
    assert len(result.tokens) == len(result.accepted_nodes) + 1
    assert all(0 <= t < tree.vocab_size for t in result.tokens)
    node = 0
    for child, token in zip(result.accepted_nodes, result.tokens):
        assert int(tree.parents[child]) == node
        assert int(tree.tokens[child]) == token
        node = child
    assert result.num_accepted <= result.attempted_depths <= result.num_accepted + 1


@settings(max_examples=200)
@given(data=st.data())
def test_no_input_escapes_with_a_foreign_exception(data) -> None:
    tree = data.draw(trees())
    p = data.draw(p_tensors(tree))
    seed = data.draw(st.integers(0, 2**31 - 1))
    for name in VERIFIERS:
        verifier = get("verifier", name)()
        try:
            result = verifier.verify(tree, p, TorchRandom.seeded(seed))
        except SpecDecError as exc:
            event(f"raised {type(exc).__name__}")
            continue
        event("verified")
        _check_result(tree, result)
