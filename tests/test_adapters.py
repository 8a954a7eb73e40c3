"""Per-tree authoring in the batch contract (specdec.adapters): a builder that writes only a host
``build`` runs in batches, per-request sampling and the serving feed; each row equals its batch-1 run."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path

import pytest
import torch

import specdec
from specdec.adapters import DraftRowCopies, TargetRowCopies, host_feed, row_sources_of, rows_draft, rows_target
from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.targets.base import OneRowTarget, TargetModel
from specdec.errors import InvalidConfigError
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing.markov import markov_pair
from specdec.registry import unregister
from specdec.trees.feed import DraftSpec, TreeFeed

OUTSIDE = Path(__file__).parent / "conformance" / "outside"


@pytest.fixture(scope="module", autouse=True)
def nucleus():
    """The outside builder as written from the docs (tests/conformance/outside/good_nucleus.py), registered
    for this module's tests only (so the registry-parametrised suites do not pick it up)."""
    sys.path.insert(0, str(OUTSIDE))
    try:
        module = importlib.import_module("good_nucleus")
        yield module.NucleusBuilder
    finally:
        unregister("tree", "outside-nucleus")
        sys.modules.pop("good_nucleus", None)
        sys.path.remove(str(OUTSIDE))

PROMPTS = [[3, 4], [5, 6, 7, 8, 9, 10, 11], [12]]  # ragged
V = 16


def _gen(width=(2, 1), top_p=0.9):
    target, draft = markov_pair(V, seed=5)
    return specdec.SpeculativeGenerator(target, draft, None, tree="outside-nucleus", verifier="rejection-iid",
                                        width=width, top_p=top_p)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outside_builder_runs_in_batches_row_equals_batch_one(temperature):
    sampling = SamplingConfig(temperature=temperature)
    seeds = [11, 12, 13]
    out = _gen().generate_batch(PROMPTS, 12, sampling, seeds)
    for b, prompt in enumerate(PROMPTS):
        single = _gen().generate(prompt, 12, sampling, seed=seeds[b])
        assert list(out.tokens[b]) == single.tokens, f"row {b}"


def test_outside_builder_per_request_sampling_rows_equal_batch_one():
    configs = [SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=4)]
    seeds = [1, 2, 3]
    out = _gen().generate_batch(PROMPTS, 10, configs, seeds)
    for b, prompt in enumerate(PROMPTS):
        assert list(out.tokens[b]) == _gen().generate(prompt, 10, configs[b], seed=seeds[b]).tokens, f"row {b}"


def test_host_feed_merges_rows_into_one_draft_call_per_round(nucleus):
    """Rows asking different node counts share each draft call (fillers are not live)."""
    target, draft = markov_pair(V, seed=2)
    draft.begin_rows([[1], [2]])
    roots = torch.tensor([1, 2])
    rng = RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)])
    feed = TreeFeed(nucleus(width=(3, 1), top_p=0.99), roots, SamplingConfig(temperature=1.0), rng, DraftSpec(V))
    calls = 0
    while feed.request is not None:
        r = feed.request
        calls += 1
        feed.give(r.level, draft.request_logits(r))
    assert calls == 2  # the root, then one expansion round for both rows
    tree = feed.tree
    assert tree.batch_size == 2 and tree.tokens[:, 0].tolist() == [1, 2]


def test_host_feed_needs_one_source_per_row():
    with pytest.raises(InvalidConfigError, match="one random source per row"):
        row_sources_of(TorchRandom.seeded(0), 2)


def test_a_builder_error_reaches_the_caller_and_the_worker_ends(nucleus):
    class Broken(nucleus):
        def build(self, root_token, draft, sampling, rng):
            draft.expand([0], [root_token], sampling)
            raise RuntimeError("broken builder")

    target, draft = markov_pair(V, seed=2)
    draft.begin_rows([[1], [2]])
    rng = RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)])
    build = host_feed(Broken().build, torch.tensor([1, 2]), DraftSpec(V), SamplingConfig(temperature=1.0), rng)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(RuntimeError, match="broken builder"):
        request = next(build)
        while True:
            request = build.send(draft.request_logits(request))
    after = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("specdec-host-build") for n in after - before)


def test_an_abandoned_build_releases_its_workers(nucleus):
    target, draft = markov_pair(V, seed=2)
    draft.begin_rows([[1], [2]])
    rng = RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)])
    build = host_feed(nucleus(width=(2, 1, 1)).build, torch.tensor([1, 2]), DraftSpec(V),
                      SamplingConfig(temperature=1.0), rng)
    request = next(build)
    build.send(draft.request_logits(request))  # the workers now wait for their first expansion
    build.close()
    assert not any(t.name.startswith("specdec-host-build") and t.is_alive() for t in threading.enumerate())


class OneRowBigram(OneRowDraft):
    """A one-row draft as the docs' per-tree contract writes one (no rows mode): logits after token a
    are ``table[a]``; it keeps its committed context and this step's tree nodes."""

    def __init__(self, table):
        self.table, self.context, self.nodes = table, [], []

    @property
    def vocab_size(self):
        return self.table.shape[0]

    def begin(self, prompt_ids, target_hidden=None):
        self.context, self.nodes = list(prompt_ids), []

    def root_logits(self):
        return self.table[self.context[-1]]

    def tree_logits(self, parents, tokens):
        self.nodes.extend(int(t) for t in tokens)
        return self.table[torch.as_tensor(tokens, dtype=torch.int64)]

    def commit(self, tokens, target_hidden=None):
        self.context.extend(tokens)
        self.nodes = []


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_one_row_draft_serves_a_batch_row_equals_batch_one(temperature):
    """A draft without a rows mode runs in generate_batch as one copy per row (DraftRowCopies)."""
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    sampling, seeds = SamplingConfig(temperature=temperature), [5, 6, 7]

    def gen():
        target, _ = markov_pair(V, seed=5)
        return specdec.SpeculativeGenerator(target, OneRowBigram(table), "sd", depth=3)

    draft_before = OneRowBigram(table)
    out = gen().generate_batch(PROMPTS, 10, sampling, seeds)
    for b, prompt in enumerate(PROMPTS):
        assert list(out.tokens[b]) == gen().generate(prompt, 10, sampling, seed=seeds[b]).tokens, f"row {b}"
    assert draft_before.context == []


def test_row_copies_keep_each_rows_own_state():
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    proto = OneRowBigram(table)
    rows = DraftRowCopies(proto)
    rows.begin_rows([[1, 2], [3]])
    assert torch.equal(rows.root_rows_logits(), table[[2, 3]])
    rows.commit_rows([[4], [5, 6]])
    rows.keep_rows([1])
    assert rows.rows[0].context == [3, 5, 6] and proto.context == []
    assert rows_draft(proto, 1) is proto and isinstance(rows_draft(proto, 2), DraftRowCopies)


class OneRowBigramTarget(OneRowTarget):
    """A one-row target as the docs' per-tree contract writes one (no batch mode): logits after
    token a are ``table[a]``."""

    def __init__(self, table):
        self.table, self.context = table, []

    @property
    def vocab_size(self):
        return self.table.shape[0]

    def prefill(self, prompt_ids):
        self.context = list(prompt_ids)

    def score_tree(self, tree):
        return self.table[tree.tokens]

    def accept(self, accepted_nodes, bonus_token):
        self.context.append(bonus_token)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_one_row_target_and_draft_serve_a_batch_row_equals_batch_one(temperature):
    """Both roles without a batch mode (TargetRowCopies, DraftRowCopies): each row equals its batch-1 run."""
    g = torch.Generator().manual_seed(9)
    t_table, d_table = torch.randn(V, V, generator=g, dtype=torch.float64), torch.randn(V, V, generator=g, dtype=torch.float64)
    sampling, seeds = SamplingConfig(temperature=temperature), [3, 4, 5]

    def gen():
        return specdec.SpeculativeGenerator(OneRowBigramTarget(t_table), OneRowBigram(d_table), "specinfer")

    out = gen().generate_batch(PROMPTS, 9, sampling, seeds)
    for b, prompt in enumerate(PROMPTS):
        assert list(out.tokens[b]) == gen().generate(prompt, 9, sampling, seed=seeds[b]).tokens, f"row {b}"
    rows = TargetRowCopies(OneRowBigramTarget(t_table))
    rows.prefill_batch([[1], [2, 3]])
    assert rows_target(rows.prototype, 1) is rows.prototype and rows.prototype.context == []
