"""The serving call's default cost and failure codes (issue 58, deliverables 2 and 5).

- The default call (``check_trees=True``) checks the trees on the device and makes at most 2
  host reads (it makes 1) for every registered method, drafted through the serving feed, with 4
  rows of 4 sampling configurations; before, the host check read every node.
- One bad row in a good batch is flagged with its code (1: the rule cannot serve it; 2: an id
  outside the vocabulary; 3: a bad draft law; 4: non-finite target logits; 5: a grammar that
  allows no token), emits nothing, and the other rows are bit-identical to the batch without it.
- The device check agrees with the host check (``TreeBatch.tree`` + ``Verifier.check_tree``) on
  the trees of every builder and on broken copies of them; a tensor that is no tree raises,
  naming the row.
- ``engine_feed`` records sparse laws by default, the full ones when asked.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from specdec.engine.serving import FLAG_CAUSES, SERVING_LAW_TOP_K, engine_feed, verify_for_engine
from specdec.engine.tree_checks import check_batch_on_device
from specdec.errors import InvalidConfigError, MalformedTreeError, UnsupportedTreeError
from specdec.registry import get, list_registered
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing.counter import StepCounter
from specdec.tree import NodeKind
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import DraftSpec
from tests.engine._serving_cases import DRAFT, TARGET, build

V = 12
CONFIGS4 = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9),
            SamplingConfig(temperature=1.2, top_k=5), SamplingConfig(temperature=0.0)]
OUTPUTS = ("accepted", "tokens", "num_accepted", "num_emitted")


def _streams(seeds):
    return RowStreams([TorchRandom.seeded(s) for s in seeds])


def _fed(builder, configs, laws="sparse", top_k=SERVING_LAW_TOP_K, seed=0) -> TreeBatch:
    B = len(configs)
    roots = torch.tensor([(3 * b + 1) % V for b in range(B)])
    feed = engine_feed(builder, roots, configs, _streams([seed + b for b in range(B)]), DraftSpec(V), laws=laws,
                       top_k=top_k)
    while (request := feed.request) is not None:
        feed.give(request.level, DRAFT[roots] if request.level == 0 else DRAFT[request.tokens])
    return feed.tree


def _reads(counter: StepCounter) -> int:
    return sum(k for (kind, _), k in counter.sync_sites["step"].items() if kind == "read")


@pytest.mark.parametrize("method", list_registered("method"))
def test_the_default_call_reads_the_host_at_most_twice(method):
    builder, verifier = get("method", method).build()
    tree = _fed(builder, CONFIGS4)
    logits = TARGET[tree.tokens]
    verify_for_engine(tree, logits, verifier, CONFIGS4, _streams(range(10, 14)))  # warm-up
    with StepCounter(ops=False) as counter:
        out = verify_for_engine(tree, logits, verifier, CONFIGS4, _streams(range(10, 14)))
    assert _reads(counter) <= 2, counter.report()
    assert out.path == "tensor"
    with StepCounter(ops=False) as counter:  # check_trees=False: no read at all
        verify_for_engine(tree, logits, verifier, CONFIGS4, _streams(range(10, 14)), check_trees=False)
    assert _reads(counter) == 0, counter.report()


# ------------------------------------------------------------ one bad row in a good batch
def _good(case="static-wor/rejection-wor"):
    tree, _, verifier, configs, _ = build(case, "torch", 0)
    tree = attrs.evolve(tree, draft_bad=None)
    return tree, TARGET[tree.tokens].clone(), verifier, configs


def _break(kind: str, tree: TreeBatch, logits: torch.Tensor, row: int):
    """``tree`` and ``logits`` with row ``row`` broken as ``kind`` says, and the grammar mask (or None)."""
    allowed = None
    if kind == "target":
        logits[row, 0] = float("inf")
    elif kind == "draft":  # the root's law does not sum to 1
        probs = tree.law_probs.clone()
        probs[row, 0] = probs[row, 0] * 0.5
        tree = attrs.evolve(tree, law_probs=probs)
    elif kind == "law-id":
        ids = tree.law_ids.clone()
        ids[row, 0, -1] = V + 5
        tree = attrs.evolve(tree, law_ids=ids)
    elif kind == "grammar":  # the grammar allows no token after the root; the other rows a mask of their own
        allowed = torch.ones(tree.batch_size, tree.node_slots, V, dtype=torch.bool)
        allowed[:, :, 7] = False
        allowed[row, 0] = False
    elif kind == "unsupported":  # deterministic children (the last node's siblings, ranked) for rejection-wor
        parent = tree.parents[row, int(tree.num_nodes[row]) - 1]
        kinds = tree.kinds.clone()
        kinds[row][tree.parents[row] == parent] = int(NodeKind.DETERMINISTIC)
        tree = attrs.evolve(tree, kinds=kinds)
    return tree, logits, allowed


CODES = {"unsupported": 1, "law-id": 2, "draft": 3, "target": 4, "grammar": 5}


@pytest.mark.parametrize("case", ["static-wor/rejection-wor", "static-wor/walking-wor"])  # tensor path, walk
@pytest.mark.parametrize("kind", sorted(CODES))
def test_one_bad_row_is_flagged_with_its_code_and_the_others_are_untouched(kind, case):
    clean, logits, verifier, configs = _good(case)
    B, row = clean.batch_size, 5
    tree, logits, allowed = _break(kind, clean, logits, row)
    seeds = list(range(40, 40 + B))
    out = verify_for_engine(tree, logits, verifier, configs, _streams(seeds), allowed=allowed)
    code = CODES[kind]
    assert out.flag.tolist() == [code if b == row else 0 for b in range(B)]
    assert out.bad.tolist() == [b == row for b in range(B)]
    assert int(out.num_emitted[row]) == 0 and (out.tokens[row] == -1).all() and (out.accepted[row] == -1).all()
    reason = out.reasons()[row]
    assert reason is not None and reason.startswith(f"row {row}: {FLAG_CAUSES[code]}")
    others = torch.tensor([b for b in range(B) if b != row])
    without = verify_for_engine(clean.select_rows(others), logits.index_select(0, others), verifier,
                                [configs[b] for b in others.tolist()], _streams([seeds[b] for b in others.tolist()]),
                                allowed=None if allowed is None else allowed.index_select(0, others))
    for field in OUTPUTS:
        assert torch.equal(getattr(out, field).index_select(0, others), getattr(without, field)), field
    assert not without.bad.any()


def test_an_unsupported_row_names_what_the_rule_cannot_verify():
    clean, logits, verifier, configs = _good()
    tree, logits, _ = _break("unsupported", clean, logits, 2)
    reason = verify_for_engine(tree, logits, verifier, configs, _streams(range(8))).reasons()[2]
    assert reason == ("row 2: refused: the rule cannot serve this row: verifier 'rejection-wor' cannot verify "
                      "deterministic children losslessly; it supports ['sampled'] children, several drawn ['wor']")


def test_a_grammar_row_is_told_from_a_bad_target_row():
    """Power of the grammar code: the same visited node, its raw logits NaN, is code 4, not 5."""
    clean, logits, verifier, configs = _good()
    tree, logits, allowed = _break("grammar", clean, logits, 1)
    assert allowed is not None
    logits[1, 0] = float("nan")
    out = verify_for_engine(tree, logits, verifier, configs, _streams(range(8)), allowed=allowed)
    assert out.flag.tolist() == [4 if b == 1 else 0 for b in range(8)]


def test_a_grammar_mask_masks_the_target():
    """A mask that bans a token: no row emits it (the rows' target law is the masked one)."""
    clean, logits, verifier, configs = _good()
    allowed = torch.ones(clean.batch_size, clean.node_slots, V, dtype=torch.bool)
    banned = 7
    allowed[..., banned] = False
    for trial in range(6):
        out = verify_for_engine(clean, logits, verifier, configs, _streams(range(10 * trial, 10 * trial + 8)),
                                allowed=allowed)
        bonus = out.tokens.gather(1, (out.num_emitted - 1).clamp_min(0).view(-1, 1))
        assert not (bonus == banned).any()


def test_a_bad_grammar_mask_is_refused_by_name():
    clean, logits, verifier, configs = _good()
    with pytest.raises(InvalidConfigError, match=r"allowed must be a \[B, n, V\]"):
        verify_for_engine(clean, logits, verifier, configs, _streams(range(8)),
                          allowed=torch.ones(clean.batch_size, clean.node_slots, V - 1, dtype=torch.bool))
    with pytest.raises(InvalidConfigError, match=r"allowed must be a \[B, n, V\]"):
        verify_for_engine(clean, logits, verifier, configs, _streams(range(8)),
                          allowed=torch.ones(clean.batch_size, clean.node_slots, V))


# ------------------------------------------------------------ the device check against the host check
BUILDERS = {
    "static-iid": ("static", {"expansion": (3, 2), "mode": "iid"}),
    "static-wor": ("static", {"expansion": (3, 2), "mode": "wor"}),
    "chain": ("chain", {"depth": 3}),
    "eagle": ("eagle", {}),
    "rheo": ("rheo", {"K": 3, "m": 1, "B": 2, "depth": 2, "N": 5, "M": 4}),
    "sequoia": ("sequoia", {"num_nodes": 5, "max_depth": 3, "acceptance": (0.5, 0.3, 0.2)}),
}


def _host(tree: TreeBatch, verifier, b: int) -> str | None:
    """The host check of row ``b``: what it raises, or None."""
    try:
        verifier.check_tree(attrs.evolve(tree, host_trees=None).tree(b))
    except (MalformedTreeError, UnsupportedTreeError) as exc:
        return type(exc).__name__
    return None


def _device(tree: TreeBatch, verifier, b: int) -> str | None:
    """The device check of row ``b``: what the host check would raise (a raise naming another row: "other")."""
    try:
        c = check_batch_on_device(tree, verifier)
    except MalformedTreeError as exc:
        return "MalformedTreeError" if f"row {b} " in str(exc) else "other"
    if bool(c.unsupported[b]):
        return "UnsupportedTreeError"
    return "MalformedTreeError" if bool(c.law_bad[b] | c.outside[b]) else None


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_device_check_agrees_with_the_host_check_on_every_builder(name):
    kind, options = BUILDERS[name]
    tree = _fed(get("tree", kind)(**options), CONFIGS4[:3], laws="dense")
    for verifier_name in list_registered("verifier"):
        verifier = get("verifier", verifier_name)()
        c = check_batch_on_device(tree, verifier)
        assert not c.law_bad.any() and not c.outside.any() and not c.malformed.any()
        for b in range(tree.batch_size):
            assert _device(tree, verifier, b) == _host(tree, verifier, b), (name, verifier_name, b)


def _mutations(tree: TreeBatch) -> dict[str, TreeBatch]:
    """Broken copies of row 1 of a static-iid batch (3, 2): each breaks one invariant the host checks."""
    def edit(field: str, fn) -> TreeBatch:
        t = getattr(tree, field).clone()
        fn(t)
        return attrs.evolve(tree, **{field: t})

    def law_at(t, value):  # the root's law, at its first child's token
        column = (tree.law_ids[1, 0] == tree.tokens[1, 1]).nonzero()[0, 0]
        t[1, 0, column] = value if value is not None else -t[1, 0, column]

    return {
        "parent after child": edit("parents", lambda t: t.__setitem__((1, 1), 5)),
        "root not a root": edit("kinds", lambda t: t.__setitem__((1, 0), int(NodeKind.SAMPLED))),
        "kind none": edit("kinds", lambda t: t.__setitem__((1, 2), 7)),
        "draw orders repeat": edit("draw_order", lambda t: t.__setitem__((1, 2), 0)),
        "law sums to 2": edit("law_probs", lambda t: t.__setitem__((1, 0), t[1, 0] * 2)),
        "law negative": edit("law_probs", lambda t: law_at(t, None)),
        "child outside its law": edit("law_probs", lambda t: law_at(t, 0.0)),
        "law id outside": edit("law_ids", lambda t: t.__setitem__((1, 0, 0), V)),
        "weight NaN": edit("weights", lambda t: t.__setitem__((1, 1), float("nan"))),
        "token outside": edit("tokens", lambda t: t.__setitem__((1, 2), -4)),
    }


@pytest.mark.parametrize("laws", ["dense", "sparse"])
def test_the_device_check_catches_what_the_host_check_catches(laws):
    tree = _fed(get("tree", "static")(expansion=(3, 2), mode="iid"), CONFIGS4[:3], laws=laws, top_k=6)
    verifier = get("verifier", "rejection-iid")()
    assert _device(tree, verifier, 1) is None and _host(tree, verifier, 1) is None
    for what, broken in _mutations(tree).items():
        host = _host(broken, verifier, 1)
        assert host is not None, what
        assert _device(broken, verifier, 1) == host or (host, _device(broken, verifier, 1)) == (
            "MalformedTreeError", "UnsupportedTreeError"), what
        for b in (0, 2):  # the other rows: untouched
            assert _device(broken, verifier, b) in (None, "other"), (what, b)


def test_a_tensor_that_is_no_tree_raises_naming_the_row():
    clean, logits, verifier, configs = _good()
    parents = clean.parents.clone()
    parents[3, 2] = 6  # a parent after its child
    with pytest.raises(MalformedTreeError, match=r"row 3 is not a tree: a node's parent is not an earlier node"):
        verify_for_engine(attrs.evolve(clean, parents=parents), logits, verifier, configs, _streams(range(8)))


# ------------------------------------------------------------ the serving feed's laws
def test_the_serving_feed_records_sparse_laws_unless_asked():
    builder = get("tree", "static")(expansion=(3, 2), mode="iid")
    assert builder.proposal_top_k == 0  # generate's default is unchanged: the full law
    sparse = _fed(builder, CONFIGS4[:2], top_k=4)
    dense = _fed(builder, CONFIGS4[:2], laws="dense")
    assert sparse.law_ids.shape[-1] == 4 and dense.law_ids.shape[-1] == V
    own = _fed(get("tree", "static")(expansion=(3, 2), mode="iid", proposal_top_k=3), CONFIGS4[:2], top_k=4)
    assert own.law_ids.shape[-1] == 3  # a builder's own width is kept
    with pytest.raises(InvalidConfigError, match="laws must be 'sparse' or 'dense'"):
        _fed(builder, CONFIGS4[:2], laws="full")
    with pytest.raises(InvalidConfigError, match="top_k must be a positive integer"):
        _fed(builder, CONFIGS4[:2], top_k=0)
