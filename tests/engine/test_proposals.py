"""An engine's own proposals in its own layouts (specdec.engine.proposals).

- The conversions equal ``TreeBatch.from_trees`` field by field, and verification equals the padded
  ``verify_for_engine`` path draw for draw (same seeds, same decisions), for vLLM-layout chains
  (dense, sparse and deterministic laws) and SGLang-layout trees (i.i.d., without replacement,
  deterministic top-k). Power: an off-by-one in the ragged offsets and a parent mix-up fail them.
- Exact by enumeration for every (rule, proposal kind) the declarations accept: the proposer's
  draws and the verifier's are enumerated and the law of the first two tokens is the target's.
  Power: a law stored one slot off fails it.
- Rules that need more than was given are refused by name before any work; bad input raises,
  naming the argument, before anything is drawn.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import torch

from specdec.engine import proposal_layouts as L
from specdec.engine import proposals as P
from specdec.engine.layouts import retrieve_arrays
from specdec.engine.proposals import (
    ChainProposals,
    DraftLaws,
    TreeProposals,
    check_rule,
    serving_rules,
    verify_chain_proposals,
    verify_tree_proposals,
)
from specdec.engine.serving import verify_for_engine
from specdec.errors import InvalidConfigError, InvalidDistributionError, UnsupportedTreeError
from specdec.penalties import Penalties
from specdec.registry import get
from specdec.rng import RandomSource, RowStreams, TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import exact_law
from specdec.testing.counter import StepCounter
from specdec.tree import SampleMode, SparseLaw, TreeAssembler
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import DraftSpec, TreeFeed
from tests.engine._per_row import first_two, gap, target_law

V = 10
_g = torch.Generator().manual_seed(58)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # logits after token a: TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
HOT = SamplingConfig(temperature=1.0)
COLD = SamplingConfig(temperature=0.0)
FIELDS = ("tokens", "parents", "depths", "kinds", "draw_order", "weights", "num_nodes", "law_wor", "ancestors")


def _streams(seeds):
    return RowStreams([TorchRandom.seeded(s) for s in seeds])


def _q(token: int, table: torch.Tensor = DRAFT) -> torch.Tensor:
    return process_logits(table[token], HOT)


# ----------------------------------------------------------------- vLLM layout
def _chains(counts, law: str, seed: int, table=DRAFT):
    """Reference chains (host trees) and their vLLM layout: each draft drawn from the draft's law
    after its parent's token; ``law`` is "dense", "sparse" (top-3 support) or "none" (greedy drafter)."""
    gen = torch.Generator().manual_seed(seed)
    trees, tokens, dense, ids, probs = [], [], [], [], []
    for b, c in enumerate(counts):
        asm, node, last = TreeAssembler(b % table.shape[0], table.shape[0]), 0, b % table.shape[0]
        for _ in range(c):
            q = process_logits(table[last], HOT)
            if law == "none":
                t = int(q.argmax())
                node = asm.add_deterministic(node, t, 1.0)
            else:
                if law == "sparse":
                    top = torch.topk(q, 3).indices.sort().values
                    q = torch.zeros_like(q).index_copy_(0, top, q[top] / q[top].sum())
                t = int(torch.multinomial(q, 1, generator=gen))
                support = (q > 0).nonzero().flatten()
                node = asm.add_sampled(node, t, SparseLaw(support, q[support], SampleMode.IID), 1.0)
                dense.append(q)
                keep = support if law == "sparse" else torch.arange(3)
                ids.append(torch.cat([support, torch.full((3 - support.numel(),), -1)]) if law == "sparse" else keep)
                probs.append(q[support] if law == "sparse" else q[keep])
            tokens.append(t)
            last = t
        trees.append(asm.build())
    ref = TreeBatch.from_trees(trees, max_children=1, max_depth=max(counts))
    laws = None if law == "none" else DraftLaws(torch.stack(dense)) if law == "dense" else \
        DraftLaws(torch.stack(probs), torch.stack(ids).to(torch.int32))
    proposals = ChainProposals(torch.tensor(tokens, dtype=torch.int32), torch.tensor(counts).cumsum(0), laws,
                               root_tokens=ref.tokens[:, 0])
    return ref, proposals


def _flat_logits(ref: TreeBatch, table=TARGET) -> torch.Tensor:
    """``[T + B, V]``: each row's root and draft positions, vLLM's order."""
    return torch.cat([table[ref.tokens[b, : int(ref.num_nodes[b])]] for b in range(ref.batch_size)])


CHAIN_RULES = [r for r in serving_rules("chain") if r != "greedy"]


@pytest.mark.parametrize("law", ["dense", "sparse", "none"])
def test_chains_convert_to_the_padded_tree_batch(law):
    ref, proposals = _chains([2, 0, 3, 1], law, seed=1)
    tree = P.chain_tree_batch(proposals, V)
    for name in FIELDS:
        assert torch.equal(getattr(tree, name), getattr(ref, name)), name
    assert (tree.max_children, tree.max_depth, tree.max_sampled) == (ref.max_children, ref.max_depth, ref.max_sampled)
    for b in range(4):  # the same laws, dense
        for i in range(int(ref.num_nodes[b])):
            want = torch.zeros(V, dtype=torch.float64).scatter_add_(0, ref.law_ids[b, i].clamp_min(0),
                                                                      torch.where(ref.law_ids[b, i] >= 0, ref.law_probs[b, i], 0.0))
            got = torch.zeros(V, dtype=torch.float64).scatter_add_(0, tree.law_ids[b, i].clamp_min(0),
                                                                     torch.where(tree.law_ids[b, i] >= 0, tree.law_probs[b, i], 0.0))
            assert torch.equal(got, want), (b, i)


def _chain_cases():
    for law in ("dense", "sparse"):
        for rule in CHAIN_RULES:
            yield law, rule, HOT
        yield law, "greedy", COLD
    for rule in serving_rules("deterministic"):
        yield "none", rule, COLD if rule == "greedy" else HOT


def _chain_mismatches(law, rule, config) -> int:
    """Trials where the vLLM-layout call decides otherwise than the padded path (same seeds)."""
    wrong = 0
    for trial in range(4):
        ref, proposals = _chains([2, 0, 3, 1], law, seed=10 + trial)
        seeds = [100 * trial + b for b in range(4)]
        want = verify_for_engine(ref, TARGET[ref.tokens], rule, config, _streams(seeds))
        got = verify_chain_proposals(proposals, _flat_logits(ref), rule, config, _streams(seeds), prefix_lens=[4, 5, 6, 7])
        S = ref.max_depth
        wrong += not (torch.equal(got.output_token_ids, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)
                      and got.output_token_ids.shape == (4, S + 1) and torch.equal(got.kv.src, torch.where(
                          want.accepted >= 0, torch.tensor([4, 5, 6, 7]).view(4, 1) + want.accepted, -1)))
    return wrong


@pytest.mark.parametrize("law,rule,config", list(_chain_cases()))
def test_chains_decide_as_the_padded_path_draw_for_draw(law, rule, config):
    assert _chain_mismatches(law, rule, config) == 0


def test_an_off_by_one_in_the_ragged_offsets_is_caught(monkeypatch):
    monkeypatch.setattr(L, "_chain_starts", lambda cu, counts: (cu - counts + 1).clamp_max(int(cu[-1]) - 1))
    assert _chain_mismatches("dense", "rejection-iid", HOT) > 0


# ----------------------------------------------------------------- SGLang layout
def _feed_trees(builder: str, options, seeds, config=HOT, table=DRAFT) -> TreeBatch:
    roots = torch.tensor([(3 * s + 1) % table.shape[0] for s in range(len(seeds))])
    feed = TreeFeed(get("tree", builder)(**options), roots, config, _streams(seeds), DraftSpec(table.shape[0]))
    while (request := feed.request) is not None:
        feed.give(request.level, table[roots] if request.level == 0 else table[request.tokens])
    return feed.tree


def _retrieve(ref: TreeBatch, *, draw_order="tensor", sparse=False, flat=True, bounds=True) -> TreeProposals:
    """The SGLang layout of a tree batch: retrieve arrays, flat tokens, each node's children's law."""
    arrays = retrieve_arrays(ref)
    laws = None
    if bool((ref.kinds == 2).any()):
        B, n, Vt = ref.batch_size, ref.node_slots, ref.vocab_size
        if sparse:
            laws = DraftLaws(ref.law_probs.reshape(B * n, -1), ref.law_ids.reshape(B * n, -1))
            has = (ref.law_ids >= 0).any(-1).reshape(-1)
            laws = DraftLaws(torch.where(has.unsqueeze(-1), laws.probs, torch.nn.functional.one_hot(
                torch.zeros(B * n, dtype=torch.int64), laws.probs.shape[-1]).double()),
                torch.where(has.unsqueeze(-1), laws.ids, torch.where(torch.arange(laws.ids.shape[-1]) == 0, 0, -1)))
        else:
            dense = torch.zeros(B, n, Vt, dtype=torch.float64).scatter_add_(
                2, ref.law_ids.clamp_min(0), torch.where(ref.law_ids >= 0, ref.law_probs, 0.0))
            laws = DraftLaws(dense if not flat else dense.reshape(B * n, Vt))
    mode = "wor" if bool(ref.law_wor.any()) else "iid"
    order = ref.draw_order if draw_order == "tensor" else draw_order
    return TreeProposals(ref.tokens.reshape(-1) if flat else ref.tokens, arrays.retrieve_index, arrays.next_token,
                         arrays.next_sibling, laws, mode=mode, draw_order=order,
                         max_children=ref.max_children if bounds else None, max_depth=ref.max_depth if bounds else None)


TREES = {
    "iid": ("static", {"expansion": (3, 2), "mode": "iid"}),
    "wor": ("static", {"expansion": (3, 2), "mode": "wor"}),
    "deterministic": ("eagle", {}),
}


def _tree_cases():
    for kind, _ in TREES.items():
        for rule in serving_rules(kind):
            yield kind, rule, COLD if rule == "greedy" else HOT


def _tree_mismatches(kind, rule, config, validate=True, **layout) -> int:
    wrong = 0
    for trial in range(3):
        seeds = [10 * trial + b for b in range(3)]
        ref = _feed_trees(*TREES[kind], seeds, config if config.greedy else HOT)
        proposals = _retrieve(ref, **layout)
        logits = TARGET[ref.tokens]  # [B, n, V]
        want = verify_for_engine(ref, logits, rule, config, _streams([s + 7 for s in seeds]))
        got = verify_tree_proposals(proposals, logits.reshape(-1, V), rule, config, _streams([s + 7 for s in seeds]),
                                    prefix_lens=[3, 4, 5], validate=validate)
        n = ref.node_slots
        index = torch.cat([torch.arange(3).view(3, 1) * n, torch.where(want.accepted >= 0, torch.arange(3).view(3, 1) * n
                                                                        + want.accepted, -1)], 1)
        wrong += not (torch.equal(got.tokens, want.tokens) and torch.equal(got.accept_length, want.num_accepted)
                      and torch.equal(got.accept_index, index) and torch.equal(got.verification.flag, want.flag))
    return wrong


@pytest.mark.parametrize("kind", sorted(TREES))
def test_retrieve_arrays_convert_back_to_the_tree_batch(kind):
    ref = _feed_trees(*TREES[kind], [0, 1, 2])
    for layout in ({}, {"flat": False}, {"draw_order": "siblings"}, {"bounds": False}):
        tree = P.tree_tree_batch(_retrieve(ref, **layout), V)
        for name in FIELDS:  # weights: the builder's construction weights, which engines do not pass (1 on nodes)
            if name != "weights":
                assert torch.equal(getattr(tree, name), getattr(ref, name)), (name, layout)
        bounds = (tree.max_children, tree.max_depth, tree.max_sampled)
        if layout.get("bounds", True):
            assert bounds == (ref.max_children, ref.max_depth, ref.max_sampled)
        else:  # the trees' own, read back
            assert bounds[1:] == (ref.max_depth, ref.max_sampled) and bounds[0] == int(ref.tree(0).num_nodes and max(
                len(ref.tree(b).children(i)) for b in range(3) for i in range(int(ref.num_nodes[b]))))


@pytest.mark.parametrize("kind,rule,config", list(_tree_cases()))
def test_trees_decide_as_the_padded_path_draw_for_draw(kind, rule, config):
    assert _tree_mismatches(kind, rule, config) == 0


def test_sparse_laws_decide_as_the_padded_path():
    assert _tree_mismatches("wor", "rejection-wor", HOT, sparse=True) == 0
    assert _tree_mismatches("iid", "mixed", HOT, sparse=True, flat=False) == 0


def test_a_parent_mix_up_is_caught(monkeypatch):
    real = L._tree_parents

    def mixed_up(nxt, sib, valid):  # a sibling's parent taken from its previous sibling's slot
        parents, rank, incoming = real(nxt, sib, valid)
        return torch.where(rank > 0, parents + rank, parents).clamp_max(torch.arange(nxt.shape[1]) - 1), rank, incoming

    monkeypatch.setattr(L, "_tree_parents", mixed_up)
    assert _tree_mismatches("iid", "rejection-iid", HOT, validate=False, draw_order="siblings") > 0
    with pytest.raises(InvalidConfigError, match="not a tree|max_children"):  # and the checks see it
        _tree_mismatches("iid", "rejection-iid", HOT, draw_order="siblings")


# ----------------------------------------------------------------- exact by enumeration
EV = 3  # the enumeration's vocabulary
_e = torch.Generator().manual_seed(5)
E_TARGET = torch.randn(EV, EV, generator=_e, dtype=torch.float64) * 1.5
E_DRAFT = E_TARGET + torch.randn(EV, EV, generator=_e, dtype=torch.float64)


def _draw(rng: RandomSource, q: torch.Tensor, k: int, mode: str) -> list[int]:
    out, q = [], q.clone()
    for _ in range(k):
        t = rng.categorical(q)
        out.append(t)
        if mode == "wor":
            q[t] = 0.0
            q = q / q.sum()
    return out


def _proposed_tree(rng: RandomSource, kind: str, root: int, sort: bool = False) -> TreeBatch:
    """The engine's proposer: two children of the root (drawn, or the draft's top-2), the first with one child."""
    asm = TreeAssembler(root, EV)
    q0 = process_logits(E_DRAFT[root], HOT)
    mode = SampleMode.WITHOUT_REPLACEMENT if kind == "wor" else SampleMode.IID
    if kind == "deterministic":
        for rank, t in enumerate(torch.topk(q0, 2).indices.tolist()):
            c = asm.add_deterministic(0, t, 1.0)
            if rank == 0:
                asm.add_deterministic(c, int(process_logits(E_DRAFT[t], HOT).argmax()), 1.0)
        return TreeBatch.from_trees([asm.build()])
    law0 = SparseLaw.from_dense(q0, mode)
    drawn = _draw(rng, q0, 2, kind)
    kids = [asm.add_sampled(0, t, law0, 1.0) for t in (sorted(drawn) if sort else drawn)]
    for c in kids[:1]:  # the first child has a child
        q = process_logits(E_DRAFT[int(asm.tokens[c])], HOT)
        asm.add_sampled(c, _draw(rng, q, 1, kind)[0], SparseLaw.from_dense(q, mode), 1.0)
    return TreeBatch.from_trees([asm.build()])


def _tree_law(kind: str, rule: str, config: SamplingConfig, root: int = 1, sort: bool = False):
    def program(rng):
        ref = _proposed_tree(rng, kind, root, sort)
        proposals = _retrieve_small(ref, kind)
        out = verify_tree_proposals(proposals, E_TARGET[ref.tokens], rule, config, rng)
        k = int(out.accept_length[0]) + 1
        return tuple(out.tokens[0, :k].tolist())

    return first_two(exact_law(program), E_TARGET, config)


def _retrieve_small(ref: TreeBatch, kind: str) -> TreeProposals:
    arrays = retrieve_arrays(ref)
    laws = None
    if kind != "deterministic":
        dense = torch.zeros(1, ref.node_slots, EV, dtype=torch.float64).scatter_add_(
            2, ref.law_ids.clamp_min(0), torch.where(ref.law_ids >= 0, ref.law_probs, 0.0))
        laws = DraftLaws(dense.view(-1, EV))
    return TreeProposals(ref.tokens.view(-1), arrays.retrieve_index, arrays.next_token, arrays.next_sibling, laws,
                         mode="wor" if kind == "wor" else "iid", draw_order="siblings")


def _chain_law(rule: str, config: SamplingConfig, deterministic: bool, root: int = 1):
    def program(rng):
        tokens, laws, last = [], [], root
        for _ in range(2):
            q = process_logits(E_DRAFT[last], HOT)
            last = int(q.argmax()) if deterministic else rng.categorical(q)
            tokens.append(last)
            laws.append(q)
        proposals = ChainProposals(torch.tensor(tokens), torch.tensor([2]), None if deterministic else DraftLaws(torch.stack(laws)),
                                   root_tokens=torch.tensor([root]))
        logits = E_TARGET[torch.tensor([root, *tokens])]  # [T + B, V]
        out = verify_chain_proposals(proposals, logits, rule, config, rng)
        k = int(out.num_accepted[0]) + 1
        return tuple(out.output_token_ids[0, :k].tolist())

    return first_two(exact_law(program), E_TARGET, config)


def _exact_cases():
    for kind in ("chain", "deterministic-chain", "iid", "wor", "deterministic"):
        for rule in serving_rules("deterministic" if kind.startswith("deterministic") else kind):
            yield kind, rule


@pytest.mark.parametrize("kind,rule", list(_exact_cases()))
def test_exact_by_enumeration_for_every_rule_and_kind(kind, rule):
    config = COLD if rule == "greedy" else SamplingConfig(temperature=0.9)
    if kind in ("chain", "deterministic-chain"):
        got = _chain_law(rule, config, deterministic=kind != "chain")
    else:
        got = _tree_law(kind, rule, config)
    assert gap(got, target_law(E_TARGET, 1, config)) < 1e-9


def test_a_law_one_slot_off_is_caught_by_the_enumeration(monkeypatch):
    real = L._chain_batch

    def shifted(*args):  # the second draft's law read one row off (the first draft's)
        tree = real(*args)
        ids, probs = tree.law_ids.clone(), tree.law_probs.clone()
        ids[:, 1], probs[:, 1] = ids[:, 0], probs[:, 0]
        return attrs.evolve(tree, law_ids=ids, law_probs=probs)

    monkeypatch.setattr(L, "_chain_batch", shifted)
    config = SamplingConfig(temperature=0.9)
    assert gap(_chain_law("rejection-iid", config, deterministic=False), target_law(E_TARGET, 1, config)) > 1e-3


def test_siblings_tested_out_of_their_draws_order_are_caught_by_the_enumeration(monkeypatch):
    real = P.tree_tree_batch

    def reversed_draws(*args, **kwargs):  # the root's two sampled children tested in reverse draw order
        tree = real(*args, **kwargs)
        flip = (tree.parents == 0) & (tree.kinds == 2)
        return attrs.evolve(tree, draw_order=torch.where(flip, 1 - tree.draw_order, tree.draw_order))

    monkeypatch.setattr(P, "tree_tree_batch", reversed_draws)
    config = SamplingConfig(temperature=0.9)
    assert gap(_tree_law("wor", "rejection-wor", config), target_law(E_TARGET, 1, config)) > 1e-3


def test_iid_siblings_out_of_their_draws_order_bias_rule_3_so_the_order_is_required():
    """Why rule 3 needs the draws' order too: i.i.d. draws listed sorted (a proposer's own order)
    and declared as drawn are not verified exactly; ``match`` is (it never reads ``q'``)."""
    config = SamplingConfig(temperature=0.9)
    assert gap(_tree_law("iid", "rejection-iid", config, sort=True), target_law(E_TARGET, 1, config)) > 1e-3
    assert gap(_tree_law("iid", "match", config, sort=True), target_law(E_TARGET, 1, config)) < 1e-9
    assert "rejection-iid" not in serving_rules("iid", order_known=False)


def test_rows_without_drafts():
    for laws in (DraftLaws(torch.zeros(0, V, dtype=torch.float64)), None):
        proposals = ChainProposals(torch.zeros(0, dtype=torch.int32), torch.tensor([0, 0]), laws, root_tokens=torch.tensor([1, 2]))
        ref = TreeBatch.from_trees([TreeAssembler(1, V).build(), TreeAssembler(2, V).build()])
        want = verify_for_engine(ref, TARGET[ref.tokens], "match", HOT, _streams([0, 1]))
        got = verify_chain_proposals(proposals, TARGET[torch.tensor([1, 2])], "match", HOT, _streams([0, 1]))
        assert got.output_token_ids.shape == (2, 1) and torch.equal(got.output_token_ids, want.tokens)


# ----------------------------------------------------------------- refusals and bad input
def test_the_declarations_choose_the_rules():
    assert serving_rules("deterministic") == ["greedy", "match", "mixed"]
    assert set(serving_rules("chain")) >= {"block", "greedy", "kseq", "match", "mixed", "rejection-iid", "rejection-wor",
                                           "traversal"}
    assert serving_rules("iid") == ["greedy", "kseq", "match", "mixed", "rejection-iid", "traversal"]
    assert serving_rules("wor") == ["greedy", "match", "mixed", "rejection-wor", "traversal"]
    assert serving_rules("wor", order_known=False) == ["greedy", "match"]


def test_a_rule_that_needs_more_is_refused_by_name_before_any_work():
    ref = _feed_trees(*TREES["wor"], [0, 1, 2])
    source = TorchRandom.seeded(3)
    state = source.generator.get_state().clone()
    for proposals, rule, needs in [
        (_retrieve(ref, draw_order=None), "rejection-wor", "draw_order"),
        (_retrieve(ref), "rejection-iid", "'wor'"),
        (_retrieve(_feed_trees(*TREES["deterministic"], [0, 1, 2])), "rejection-wor", "deterministic"),
    ]:
        with pytest.raises(UnsupportedTreeError, match=f"'{rule}'.*{needs}"):
            verify_tree_proposals(proposals, TARGET[proposals.draft_tokens.view(3, -1)], rule, HOT,
                                  RowStreams([source] * 3))
    assert torch.equal(source.generator.get_state(), state)
    _, chains = _chains([1, 2], "none", seed=0)
    with pytest.raises(UnsupportedTreeError, match="'block' cannot serve deterministic"):
        verify_chain_proposals(chains, torch.zeros(5, V), "block", HOT, _streams([0, 1]))
    with pytest.raises(UnsupportedTreeError, match="'kseq'"):
        check_rule("kseq", "wor")


def _bad_chain(**change):
    ref, proposals = _chains([2, 1], "dense", seed=0)
    logits = change.pop("target_logits", _flat_logits(ref))
    return attrs.evolve(proposals, **change), logits


CHAIN_BAD = {
    "offsets short": ({"cu_num_draft_tokens": torch.tensor([2, 2])}, InvalidConfigError, "cu_num_draft_tokens"),
    "offsets decrease": ({"cu_num_draft_tokens": torch.tensor([3, 2]), "draft_token_ids": torch.tensor([1, 2]),
                          "target_logits": torch.zeros(4, V), "laws": DraftLaws(torch.full((2, V), 1 / V, dtype=torch.float64))},
                         InvalidConfigError, "cu_num_draft_tokens"),
    "token outside": ({"draft_token_ids": torch.tensor([1, V, 2])}, InvalidConfigError, "draft_token_ids"),
    "not a law": ({"laws": DraftLaws(torch.full((3, V), 0.2, dtype=torch.float64))}, InvalidDistributionError, "laws.probs"),
    "law misses its token": ({"laws": DraftLaws(torch.eye(V, dtype=torch.float64)[[9, 9, 9]])}, InvalidDistributionError, "laws"),
    "sparse id outside": ({"laws": DraftLaws(torch.ones(3, 1, dtype=torch.float64), torch.full((3, 1), V))},
                          InvalidConfigError, "laws.ids"),
    "vocabulary": ({"laws": DraftLaws(torch.full((3, V + 1), 1 / (V + 1), dtype=torch.float64))}, InvalidConfigError,
                   "laws.probs has vocabulary"),
    "logit rows": ({"target_logits": torch.zeros(4, V)}, InvalidConfigError, "target_logits must have 5 rows"),
    "too long": ({"max_spec_len": 1}, InvalidConfigError, "max_spec_len"),
}


@pytest.mark.parametrize("case", sorted(CHAIN_BAD))
def test_bad_chain_input_is_refused_naming_it_before_any_draw(case):
    change, error, what = CHAIN_BAD[case]
    proposals, logits = _bad_chain(**dict(change))
    source = TorchRandom.seeded(1)
    state = source.generator.get_state().clone()
    with pytest.raises(error, match=what.replace("[", r"\[")):
        verify_chain_proposals(proposals, logits, "rejection-iid", HOT, RowStreams([source, TorchRandom.seeded(2)]))
    assert torch.equal(source.generator.get_state(), state)


def _bad_tree(what: str):
    ref = _feed_trees(*TREES["iid"], [0, 1])
    proposals = _retrieve(ref)
    logits = TARGET[ref.tokens]
    nxt, sib = proposals.retrieve_next_token.clone(), proposals.retrieve_next_sibling.clone()
    if what == "parent after child":
        nxt[0, 1], nxt[0, 4] = -1, 1  # node 1 becomes the child of slot 4
        sib[0, 1] = -1
        return attrs.evolve(proposals, retrieve_next_token=nxt, retrieve_next_sibling=sib), logits
    if what == "reached twice":
        sib[0, 4] = 2
        return attrs.evolve(proposals, retrieve_next_sibling=sib), logits
    if what == "token outside":
        tokens = proposals.draft_tokens.clone()
        tokens[3] = -2
        return attrs.evolve(proposals, draft_tokens=tokens), logits
    if what == "not a law":
        return attrs.evolve(proposals, laws=DraftLaws(proposals.laws.probs * 2)), logits
    if what == "logit rows":
        return proposals, logits[:, :-1]
    if what == "vocabulary":
        return proposals, torch.cat([logits, logits[..., :1]], -1)
    if what == "draw order":
        return attrs.evolve(proposals, draw_order=torch.zeros_like(ref.draw_order)), logits
    raise AssertionError(what)


TREE_BAD = {
    "parent after child": (InvalidConfigError, "not a tree"),
    "reached twice": (InvalidConfigError, "not a tree"),
    "token outside": (InvalidConfigError, "draft_tokens"),
    "not a law": (InvalidDistributionError, "laws.probs"),
    "logit rows": (InvalidConfigError, "target_logits must be"),
    "vocabulary": (InvalidConfigError, "vocabular"),
    "draw order": (InvalidConfigError, "draw_order"),
}


@pytest.mark.parametrize("case", sorted(TREE_BAD))
def test_bad_tree_input_is_refused_naming_it_before_any_draw(case):
    error, what = TREE_BAD[case]
    proposals, logits = _bad_tree(case)
    source = TorchRandom.seeded(1)
    state = source.generator.get_state().clone()
    with pytest.raises(error, match=what):
        verify_tree_proposals(proposals, logits, "rejection-iid", HOT, RowStreams([source, TorchRandom.seeded(2)]))
    assert torch.equal(source.generator.get_state(), state)


def test_host_reads_one_to_validate_none_without():
    ref, proposals = _chains([2, 1], "dense", seed=0)
    proposals = attrs.evolve(proposals, max_spec_len=2)
    logits = _flat_logits(ref)
    for validate, most in ((True, 1), (False, 0)):
        verify_chain_proposals(proposals, logits, "rejection-iid", HOT, _streams([0, 1]), validate=validate)
        with StepCounter() as counter:
            verify_chain_proposals(proposals, logits, "rejection-iid", HOT, _streams([0, 1]), validate=validate)
        reads = [site for kind, site in counter.sync_sites["step"] if kind == "read"]
        assert len(reads) == most, counter.report()


# ----------------------------------------------------------------- the docs' runners
PAGE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


@pytest.mark.parametrize("marker", ["vllm-runner", "sglang-runner"])
def test_the_docs_runners_run_in_at_most_40_lines_of_public_api(marker):
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)^```", PAGE.read_text(), re.DOTALL | re.MULTILINE)
    assert match, f"docs/serving.md lost its {marker} example"
    lines = [line for line in match.group(1).splitlines() if line.strip()]
    body = [line for line in lines if not line.startswith(("import ", "from "))]
    assert len(body) <= 40, len(body)
    scope: dict = {}
    exec(compile(match.group(1), str(PAGE), "exec"), scope)
    assert all(len(seq) >= 6 for seq in scope["sequences"])  # every request emitted at least one token per step


# ----------------------------------------------------------------- the engine's sampling fields
def test_the_engine_sampling_fields_pass_through_both_layouts():
    """logit bias, penalties (each node's path) and log-probs reach the one executor from both
    layouts: the decisions and log-probs equal verify_for_engine's on the padded tree with the same
    fields, and the fields change the decisions (else the comparison would prove nothing)."""
    from specdec.penalties import Penalties

    bias = [{1: 4.0, 2: -9.0}, None, {0: 3.0}, {5: 6.0}]
    moved = 0
    for trial in range(4):
        ref, proposals = _chains([2, 0, 3, 1], "dense", seed=40 + trial)
        pen = Penalties.of([[0, 1]] * 4, [[2, 3]] * 4, V, presence=[1.5] * 4, frequency=[0.5] * 4)
        seeds = [50 * trial + b for b in range(4)]
        fields = {"logit_bias": bias, "penalties": pen, "logprobs": 2}
        want = verify_for_engine(ref, TARGET[ref.tokens], "rejection-iid", HOT, _streams(seeds), **fields)
        got = verify_chain_proposals(proposals, _flat_logits(ref), "rejection-iid", HOT, _streams(seeds), **fields)
        assert torch.equal(got.output_token_ids, want.tokens)
        assert torch.equal(got.verification.logprobs.nan_to_num(9.0), want.logprobs.nan_to_num(9.0))
        assert torch.equal(got.verification.top_ids, want.top_ids)
        plain = verify_chain_proposals(proposals, _flat_logits(ref), "rejection-iid", HOT, _streams(seeds))
        moved += not torch.equal(plain.output_token_ids, got.output_token_ids)

        tseeds = [10 * trial + b for b in range(3)]
        tref = _feed_trees(*TREES["wor"], tseeds)
        tpen = Penalties.of([[0, 1]] * 3, [[2, 3]] * 3, V, presence=[1.5] * 3)
        tfields = {"logit_bias": bias[:3], "penalties": tpen, "logprobs": 1}
        twant = verify_for_engine(tref, TARGET[tref.tokens], "rejection-wor", HOT, _streams(tseeds), **tfields)
        tgot = verify_tree_proposals(_retrieve(tref), TARGET[tref.tokens].reshape(-1, V), "rejection-wor", HOT,
                                     _streams(tseeds), **tfields)
        assert torch.equal(tgot.tokens, twant.tokens) and torch.equal(tgot.accept_length, twant.num_accepted)
        assert torch.equal(tgot.verification.logprobs.nan_to_num(9.0), twant.logprobs.nan_to_num(9.0))
    assert moved > 0
