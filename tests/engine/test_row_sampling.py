"""Per-row sampling in generation (issue 45, item 3): ``generate_batch(..., sampling=[...])``.

Every row of a batch of 8 rows with 8 (temperature, top-k, top-p) settings, greedy among them,
emits what its batch-1 generation with its own setting and seed emits, token for token, for
every registered method (toy order-1 models, whose logits do not depend on the batch); one step
of a mixed batch is exact for each row's own setting (enumeration of the row's draws through the
engine's step); and the grouped build, the stacked tree batch and the merged draft numbering
are checked against the per-group builds they stand for.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from tests.engine._per_row import CONFIGS, first_two, gap, target_law
from specdec import SamplingConfig
from specdec.engine.loop import run_rows
from specdec.engine.row_sampling import RowSampling, build_groups, group_sources
from specdec.errors import InvalidConfigError
from specdec.models.callable import CallableLM
from specdec.registry import get, list_registered
from specdec.rng import RowStreams, TorchRandom
from specdec.testing import exact_law
from specdec.tree_batch import TreeBatch
from specdec.trees import build_tree, build_trees

V = 6
PROMPTS = [[1, 2], [3], [4, 5, 0], [2], [5, 1, 1, 3], [0], [3, 4], [1]]
_g = torch.Generator().manual_seed(5)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # order 1: logits after token a = TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)

OPTIONS = {  # small trees over V = 6 (every registered method; a plug-in gets its defaults)
    "sd": {"depth": 3},
    "specinfer": {"expansion": (2, 1)},
    "sequoia": {"num_nodes": 5, "max_depth": 3, "acceptance": (0.5, 0.2, 0.1)},
    "eagle2": {"K": 2, "depth": 3, "N": 5},
    "eagle3": {"K": 2, "depth": 3, "N": 5},
    "rheo": {"K": 3, "m": 1, "depth": 3, "N": 6},
    "sampled-dynamic": {"K": 2, "depth": 2, "N": 5},
}


def _lm(table: torch.Tensor) -> CallableLM:
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=V)


def _generator(method: str, options: dict | None = None, **extra) -> specdec.SpeculativeGenerator:
    return specdec.SpeculativeGenerator(target=_lm(TARGET), draft=_lm(DRAFT), method=method,
                                        **(OPTIONS.get(method, {}) if options is None else options), **extra)


@pytest.mark.parametrize("random", ["torch", "counter"])
@pytest.mark.parametrize("method", list_registered("method"))
def test_every_row_equals_its_batch_one_run_with_its_own_sampling(method, random):
    seeds = [40 + b for b in range(len(PROMPTS))]
    out = _generator(method, random=random).generate_batch(PROMPTS, 10, CONFIGS, seeds)
    single = _generator(method, random=random)
    for b, prompt in enumerate(PROMPTS):
        ref = single.generate(prompt, 10, CONFIGS[b], seed=seeds[b])
        assert list(out.tokens[b]) == ref.tokens, (method, b, CONFIGS[b])


def test_one_configuration_for_every_row_is_not_what_the_rows_asked_for():
    """Power: the batch run under row 0's configuration differs from the per-row batch."""
    seeds = list(range(len(PROMPTS)))
    mixed = _generator("rheo").generate_batch(PROMPTS, 10, CONFIGS, seeds)
    shared = _generator("rheo").generate_batch(PROMPTS, 10, [CONFIGS[0]] * len(PROMPTS), seeds)
    assert mixed.tokens[0] == shared.tokens[0]  # row 0 asked for that configuration
    assert sum(mixed.tokens[b] != shared.tokens[b] for b in range(1, len(PROMPTS))) >= 4


SMALL = {  # trees small enough to enumerate a row's every draw through the whole step
    "sd": {"depth": 2},
    "specinfer": {"expansion": (2,)},
    "eagle3": {"K": 2, "depth": 2, "N": 3},
    "rheo": {"K": 2, "m": 1, "depth": 2, "N": 3},
}
STEP_CONFIGS = [CONFIGS[0], CONFIGS[1], CONFIGS[5]]  # greedy, T = 1, T = 0.8 with top-k 3 and top-p 0.9


def _step_law(method: str, row: int, configs: list[SamplingConfig]) -> dict[tuple[int, int], float]:
    """Exact law of row ``row``'s first two tokens out of one step of the mixed batch (its draws
    enumerated, the other rows' from fixed seeds); one emitted token is completed with the
    target's conditional under the row's configuration."""
    gen = _generator(method, SMALL[method])
    prompts = [[b % V] for b in range(len(configs))]

    def program(rng):
        sources = [rng if b == row else TorchRandom.seeded(300 + b) for b in range(len(configs))]
        report = next(iter(run_rows(gen.target, gen.draft, gen.builder, gen.verifier, prompts, configs, sources,
                                    max_new_tokens=None, max_steps=1, kernel="torch")))
        return tuple(report.kept[row])

    return first_two(exact_law(program), TARGET, configs[row])


@pytest.mark.parametrize("method", sorted(SMALL))
def test_one_mixed_step_is_exact_for_every_rows_own_sampling(method):
    configs = STEP_CONFIGS
    for row in range(len(configs)):
        assert gap(_step_law(method, row, configs), target_law(TARGET, row % V, configs[row])) < 1e-9, (method, row)


def test_a_row_verified_under_another_rows_configuration_is_caught(monkeypatch):
    """Power: verifying every group with the first group's configuration breaks the rows' laws."""
    import specdec.engine.step as step

    real = step._decide

    def first_config(verification, verifier, tree, logits, sampling, *args):
        return real(verification, verifier, tree, logits, CONFIGS[0], *args)

    monkeypatch.setattr(step, "_decide", first_config)
    assert gap(_step_law("specinfer", 1, STEP_CONFIGS), target_law(TARGET, 1, STEP_CONFIGS[1])) > 0.05


@pytest.mark.parametrize("method", ["specinfer", "eagle3", "rheo", "sd"])
def test_the_grouped_build_is_each_groups_own_build(method):
    """build_groups: each row's tree equals the one its group's build grows alone (one draft call
    per level for all rows, the groups' node ids renumbered in the merged requests)."""
    gen = _generator(method)
    rows = RowSampling.of(CONFIGS, len(CONFIGS))
    roots = torch.tensor([b % V for b in range(len(CONFIGS))])
    prompts = [[int(r)] for r in roots]
    draft = gen.draft
    draft.begin_rows(prompts, None)
    seeds = [70 + b for b in range(len(CONFIGS))]
    merged = build_groups(gen.builder, roots, draft, rows,
                          group_sources(RowStreams([TorchRandom.seeded(s) for s in seeds]), rows.group_rows()))
    for config, index in rows.groups:
        alone = _lm(DRAFT)
        ix = index.tolist()
        alone.begin_rows([prompts[i] for i in ix], None)
        own = build_trees(gen.builder, roots[index], alone, config, RowStreams([TorchRandom.seeded(seeds[i]) for i in ix]))
        for j, b in enumerate(ix):
            n = int(own.num_nodes[j])
            assert int(merged.num_nodes[b]) == n
            assert torch.equal(merged.tokens[b, :n], own.tokens[j, :n]), (method, b)
            assert torch.equal(merged.parents[b, :n], own.parents[j, :n])
            assert torch.equal(merged.kinds[b, :n], own.kinds[j, :n])
            assert torch.equal(merged.ancestors[b, :n, :n], own.ancestors[j, :n, :n])
            assert merged.tree(b).tokens.tolist() == own.tree(j).tokens.tolist()


def test_scatter_rows_pads_like_from_trees_and_select_rows_inverts_it():
    builder = get("tree", "static")(expansion=(2, 1))
    chain = get("tree", "chain")(depth=1)
    a = TreeBatch.from_trees([build_tree(builder, 1, _begun(1), CONFIGS[1], TorchRandom.seeded(1))])
    c = TreeBatch.from_trees([build_tree(chain, 2, _begun(2), CONFIGS[0], TorchRandom.seeded(2)),
                              build_tree(chain, 3, _begun(3), CONFIGS[0], TorchRandom.seeded(3))])
    merged = TreeBatch.scatter_rows([(torch.tensor([1]), a), (torch.tensor([0, 2]), c)], 3)
    merged.validate()
    ref = TreeBatch.from_trees([c.tree(0), a.tree(0), c.tree(1)], node_slots=merged.node_slots)
    for field in ("tokens", "parents", "depths", "kinds", "num_nodes", "ancestors", "law_ids", "law_probs"):
        assert torch.equal(getattr(merged, field), getattr(ref, field)[..., : getattr(merged, field).shape[-1]]
                           if field.startswith("law") else getattr(ref, field)), field
    back = merged.select_rows(torch.tensor([0, 2]))
    assert torch.equal(back.tokens[:, : c.node_slots], c.tokens)
    assert merged.max_children == max(a.max_children, c.max_children)


def _begun(root: int) -> CallableLM:
    lm = _lm(DRAFT)
    lm.begin([root])
    return lm


def test_bad_per_row_sampling_is_refused_before_any_forward():
    gen = _generator("eagle3")
    with pytest.raises(InvalidConfigError, match="7 configurations for 8 rows"):
        gen.generate_batch(PROMPTS, 4, CONFIGS[:7])
    with pytest.raises(InvalidConfigError, match="row 2: sampling must be a SamplingConfig"):
        gen.generate_batch(PROMPTS, 4, [*CONFIGS[:2], 0.7, *CONFIGS[3:]])
    with pytest.raises(InvalidConfigError, match="must be a SamplingConfig or one SamplingConfig per row"):
        gen.generate_batch(PROMPTS, 4, "greedy")


def test_rows_leaving_keep_their_own_configurations():
    """Rows stop at their own EOS; the rows that stay keep their configurations (and a batch
    left with one configuration goes on as a uniform batch)."""
    seeds = [7 + b for b in range(len(PROMPTS))]
    full = _generator("eagle3").generate_batch(PROMPTS, 12, CONFIGS, seeds)
    eos = full.tokens[2][1]
    stopped = _generator("eagle3").generate_batch(PROMPTS, 12, CONFIGS, seeds, eos_token_id=eos)
    for b in range(len(PROMPTS)):
        cut = next((i + 1 for i, t in enumerate(full.tokens[b]) if t == eos), None)
        assert list(stopped.tokens[b]) == list(full.tokens[b][:cut]), b


def test_the_batched_baseline_takes_one_configuration_per_row_too():
    from specdec.batch import autoregressive_generate_batch

    seeds = [90 + b for b in range(len(PROMPTS))]
    out = autoregressive_generate_batch(_lm(TARGET), PROMPTS, 8, CONFIGS, seeds)
    for b, prompt in enumerate(PROMPTS):
        ref = specdec.autoregressive_generate(_lm(TARGET), prompt, 8, CONFIGS[b], seed=seeds[b])
        assert list(out.tokens[b]) == ref.tokens, b


@pytest.mark.parametrize("method,version", [("eagle3", 3), ("rheo", 3), ("eagle2", 2)])
def test_feature_draft_rows_equal_their_batch_one_run_with_their_own_sampling(method, version):
    """An EAGLE head (a feature draft: each node's features gathered by its parent's draft id, so
    the merged numbering must address the right nodes) on a float64 tiny Llama: 4 ragged rows
    with 4 settings, each equal to its batch-1 generation token for token."""
    from tests.test_batch import ROW_PROMPTS, _eagle_generator, _eagle_pair

    model, head = _eagle_pair(version)
    configs = [CONFIGS[1], CONFIGS[0], CONFIGS[5], CONFIGS[3]]
    seeds = [11, 12, 13, 14]
    out = _eagle_generator(model, head, method).generate_batch(ROW_PROMPTS, 12, configs, seeds)
    single = _eagle_generator(model, head, method)
    for b, prompt in enumerate(ROW_PROMPTS):
        assert list(out.tokens[b]) == single.generate(prompt, 12, configs[b], seed=seeds[b]).tokens, (method, b)


@pytest.mark.parametrize("method,options", [("eagle2", {"K": 2, "depth": 3, "N": 5}), ("specinfer", {"expansion": (2, 2, 1)}),
                                            ("sd", {"depth": 3, "confidence": 0.3, "random": "counter"})])
def test_draft_lm_rows_equal_their_batch_one_run_with_their_own_sampling(method, options):
    """An independent Hugging Face draft LM in rows mode (its tree nodes cached by draft id):
    4 ragged rows with 4 settings, each equal to its batch-1 generation (float64 models). The
    confidence-stopped chain with ``random="counter"``: its draws are keyed, so how deep the other
    rows' chains go does not move a row's stream (with ``"torch"`` streams it does: docs)."""
    from tests.test_batch import PROMPTS as LM_PROMPTS
    from tests.test_batch import _lm_generator

    gen = _lm_generator(method, **options)
    configs = [CONFIGS[4], CONFIGS[0], CONFIGS[6], CONFIGS[1]][: len(LM_PROMPTS)]
    seeds = [21, 22, 23, 24][: len(LM_PROMPTS)]
    out = gen().generate_batch(LM_PROMPTS, 10, configs, seeds)
    single = gen()
    for b, prompt in enumerate(LM_PROMPTS):
        assert list(out.tokens[b]) == single.generate(prompt, 10, configs[b], seed=seeds[b]).tokens, (method, b)


@pytest.mark.parametrize("method", ["eagle3", "rheo", "specinfer", "sd"])
def test_a_serving_engine_feeds_rows_of_their_own_sampling(method):
    """TreeFeed given one configuration per row: the engine answers the merged requests (one per
    level, over all rows) from its own bookkeeping and gets the trees specdec's own draft builds
    (build_groups), field for field; bad per-row input is refused by name."""
    from specdec.trees.feed import DraftSpec, TreeFeed

    gen = _generator(method)
    roots = torch.tensor([b % V for b in range(len(CONFIGS))])
    seeds = [80 + b for b in range(len(CONFIGS))]
    draft = _lm(DRAFT)
    draft.begin_rows([[int(r)] for r in roots], None)
    rows = RowSampling.of(CONFIGS, len(CONFIGS))
    own = build_groups(gen.builder, roots, draft, rows,
                       group_sources(RowStreams([TorchRandom.seeded(s) for s in seeds]), rows.group_rows()))
    feed = TreeFeed(gen.builder, roots, CONFIGS, RowStreams([TorchRandom.seeded(s) for s in seeds]), DraftSpec(V))
    while feed.request is not None:
        r = feed.request
        assert r.rows == len(CONFIGS)
        feed.give(r.level, DRAFT[roots] if r.level == 0 else DRAFT[r.tokens])  # order 1: the node's token
    tree = feed.tree
    for field in ("tokens", "parents", "kinds", "num_nodes", "ancestors", "law_ids", "law_probs"):
        assert torch.equal(getattr(tree, field), getattr(own, field)), field
    with pytest.raises(InvalidConfigError, match="one per row"):
        TreeFeed(gen.builder, roots, CONFIGS[:3], RowStreams([TorchRandom.seeded(s) for s in seeds]), DraftSpec(V))
    with pytest.raises(InvalidConfigError, match="one random source per row"):
        TreeFeed(gen.builder, roots, CONFIGS, TorchRandom.seeded(0), DraftSpec(V))
