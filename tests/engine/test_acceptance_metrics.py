"""Per-position acceptance metrics (issue 59, deliverable 4): per request, the steps whose tree drafted a node at
each depth and the steps that accepted a token there, with tau; in GenerationStats, in the stream chunks and in
BatchOutput, equal to the counts replayed by hand from each step's tree and decision, with no host read added."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.engine.loop import RowsRequest, decode_rows
from specdec.engine.records import Roles
from specdec.engine.stats import AcceptanceCounts, BatchChunk, StepTally, StreamChunk
from specdec.models import CallableLM
from specdec.request import GenerateOptions, stream_request
from specdec.rng import TorchRandom
from specdec.testing.counter import StepCounter
from specdec.verify.base import VerifyResult

V = 6
_g = torch.Generator().manual_seed(11)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
PROMPTS = [[1, 2], [3], [4, 5, 0], [2, 2]]
EOS = 0
CASES = {  # a chain with a confidence stop (its depth varies), a dynamic tree, a static tree walked by its path rule
    "sd-confidence": {"method": "sd", "depth": 4, "confidence": 0.45},
    "eagle2": {"method": "eagle2", "K": 2, "depth": 3, "N": 4},
    "sequoia-traversal": {"method": "sequoia", "verifier": "traversal", "num_nodes": 5, "max_depth": 3,
                          "acceptance": (0.5, 0.2, 0.1)},
}


def _lm(table: torch.Tensor) -> CallableLM:
    return CallableLM(lambda ps: table[[p[-1] for p in ps]], vocab_size=V)


def _generator(case: str, draft: torch.Tensor = DRAFT) -> specdec.SpeculativeGenerator:
    return specdec.SpeculativeGenerator(target=_lm(TARGET), draft=_lm(draft), **CASES[case])


def _deepest(parents: list[int]) -> int:
    """The depth of a tree's deepest node, from its parent list (parents precede children)."""
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return max(depth)


class _NoTables(TorchRandom):
    """A torch source that declares it draws no uniform tables: the loop verifies by the verifier's walk."""

    draws_tables = False


def _replay(gen, prompts, sampling, seeds, *, off_by: int = 0, walk: bool = False):
    """Run the engine loop step by step and count by hand, from each step's host tree and decision:
    per row, ``drafted[d]`` (the tree had a node at depth d + 1) and ``accepted[d]`` (the step accepted a token
    at depth d + 1). ``off_by`` shifts the drafted depth: the deliberately wrong count. Returns the hand counts
    and the loop's own tallies. ``walk``: the verifier's walk verifies (sources without tables)."""
    B = len(prompts)
    request = GenerateOptions(16, sampling, None, seeds, EOS, None).resolve(prompts, gen.target.device, batch=B > 1)
    tallies = [StepTally() for _ in prompts]
    dec = gen._decoder()
    if walk:
        rows = RowsRequest(prompts, sampling, [_NoTables.seeded(s) for s in seeds], 16, eos=[EOS], named=B > 1)
        reports = decode_rows(Roles(dec.target, dec.draft, dec.builder, dec.verifier), rows, tallies)
    else:
        reports = stream_request(dec, prompts, request, tallies, what="test", batch=B > 1)
    drafted: list[list[int]] = [[0] * 8 for _ in prompts]
    accepted: list[list[int]] = [[0] * 8 for _ in prompts]
    steps, emitted = [0] * B, [0] * B
    for report in reports:
        outcome = report.outcome
        for b, r in enumerate(report.rows):
            deepest = _deepest(outcome.tree.tree(b).parents.tolist()) + off_by
            num = int((outcome.decision.accepted[b] >= 0).sum())  # the decision's accepted path
            for d in range(deepest):
                drafted[r][d] += 1
            for d in range(num):
                accepted[r][d] += 1
            steps[r] += 1
            emitted[r] += num + 1
    hand = [AcceptanceCounts(steps[r], emitted[r], tuple(drafted[r]), tuple(accepted[r])) for r in range(B)]
    return hand, tallies


def _same(got: AcceptanceCounts, want: AcceptanceCounts) -> bool:
    """Equal counts, the per-depth lists compared with trailing zeros dropped."""
    def trim(xs):
        xs = list(xs)
        while xs and xs[-1] == 0:
            xs.pop()
        return xs
    return (got.steps, got.emitted, trim(got.drafted), trim(got.accepted)) == (
        want.steps, want.emitted, trim(want.drafted), trim(want.accepted))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_counts_equal_the_hand_counts_with_rows_leaving_early(case, temperature):
    gen = _generator(case)
    sampling = specdec.SamplingConfig(temperature=temperature)
    seeds = [40 + b for b in range(len(PROMPTS))]
    hand, tallies = _replay(gen, PROMPTS, sampling, seeds)
    assert len({t.steps for t in tallies}) > 1  # rows left the batch at different steps (EOS, length)
    for r, tally in enumerate(tallies):
        assert _same(tally.counts(), hand[r]), (case, r, tally.counts(), hand[r])
    # the public forms of the same run: BatchOutput, the stream's chunks
    out = gen.generate_batch(PROMPTS, 16, sampling, seeds, EOS)
    assert out.acceptance_by_row == tuple(t.counts() for t in tallies)
    last: dict[int, AcceptanceCounts] = {}
    for chunk in gen.stream_batch(PROMPTS, 16, sampling, seeds, EOS):
        assert isinstance(chunk, BatchChunk) and isinstance(chunk, dict) and set(chunk.acceptance) == set(chunk)
        last.update(chunk.acceptance)
    assert tuple(last[r] for r in range(len(PROMPTS))) == out.acceptance_by_row


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_generation_counts_equal_the_hand_counts(case):
    gen = _generator(case)
    sampling = specdec.SamplingConfig(temperature=1.0)
    for seed, prompt in enumerate(PROMPTS):
        hand, _ = _replay(gen, [prompt], sampling, [seed])
        stats = gen.generate(prompt, 16, sampling, seed=seed, eos_token_id=EOS).stats
        assert _same(stats.acceptance, hand[0]), (case, seed, stats.acceptance, hand[0])
        assert stats.acceptance.tau == stats.tau == hand[0].emitted / hand[0].steps
        chunks = list(gen.stream(prompt, 16, sampling, seed=seed, eos_token_id=EOS))
        assert all(isinstance(c, StreamChunk) and isinstance(c, list) for c in chunks)
        assert [c.acceptance.steps for c in chunks] == list(range(1, len(chunks) + 1))  # counts so far, per step
        assert chunks[-1].acceptance == stats.acceptance
        assert sum(chunks, []) == gen.generate(prompt, 16, sampling, seed=seed, eos_token_id=EOS).tokens


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_walk_path_counts_equal_the_hand_counts(case):
    gen = _generator(case)
    hand, tallies = _replay(gen, PROMPTS, specdec.SamplingConfig(temperature=1.0), [3, 4, 5, 6], walk=True)
    assert {t.kernel_path for t in tallies} == {"torch"} and len({t.steps for t in tallies}) > 1
    for r, tally in enumerate(tallies):
        assert _same(tally.counts(), hand[r]), (case, r, tally.counts(), hand[r])


def test_an_off_by_one_depth_count_fails_the_comparison():
    """Power: the comparison catches drafted counts one depth too deep or too shallow, and drafted counted as the
    walk's tested depths (the conditional counts) instead of the tree's."""
    gen = _generator("sd-confidence")
    sampling = specdec.SamplingConfig(temperature=1.0)
    seeds = [40 + b for b in range(len(PROMPTS))]
    for off_by in (1, -1):
        wrong, tallies = _replay(gen, PROMPTS, sampling, seeds, off_by=off_by)
        assert not all(_same(t.counts(), w) for t, w in zip(tallies, wrong)), off_by
    _, tallies = _replay(gen, PROMPTS, sampling, seeds)
    assert any(t.depth_drafted[: len(t.depth_attempted)] != t.depth_attempted for t in tallies)
    # the confidence stop varies the depth: drafted is not just "steps at every depth"
    assert any(len(set(t.depth_drafted)) > 1 for t in tallies)


def test_known_laws_at_greedy_decoding():
    """T = 0, a draft whose argmax is the target's at every context: every drafted token is accepted (acceptance 1
    at every position, tau = depth + 1); a draft whose argmax never is: none is (acceptance 0, tau = 1)."""
    sampling = specdec.SamplingConfig(temperature=0.0)
    same = specdec.SpeculativeGenerator(target=_lm(TARGET), draft=_lm(TARGET), method="sd", depth=3)
    stats = same.generate([1, 2], 12, sampling).stats
    assert stats.depth_drafted == (stats.steps,) * 3 and stats.depth_accepted == (stats.steps,) * 3
    assert stats.acceptance_by_position == (1.0, 1.0, 1.0) and stats.tau == 4.0
    wrong = TARGET.clone()
    wrong[torch.arange(V), TARGET.argmax(-1)] = -1e9  # the target's greedy token is never the draft's
    never = specdec.SpeculativeGenerator(target=_lm(TARGET), draft=_lm(wrong), method="sd", depth=3)
    stats = never.generate([1, 2], 12, sampling).stats
    assert stats.depth_drafted == (stats.steps,) * 3 and sum(stats.depth_accepted) == 0
    assert stats.acceptance_by_position == (0.0, 0.0, 0.0) and stats.tau == 1.0
    plain = specdec.autoregressive_generate(_lm(TARGET), [1, 2], 5, sampling=sampling).stats
    assert plain.depth_drafted == () and plain.acceptance_by_position == () and plain.tau == 1.0


def test_the_counts_add_no_host_read_to_the_step():
    """The drafted depth rides the step's one read (one more column): one read per step at the step's site, no
    read anywhere for the counts, the stream chunks' counts included."""
    gen = _generator("eagle2")
    sampling = specdec.SamplingConfig(temperature=1.0)
    gen.generate([1, 2], 4, sampling, seed=1)
    with StepCounter(ops=False) as counter:
        chunks = list(gen.stream([1, 2], 16, sampling, seed=0))
        counts = [c.acceptance.acceptance_by_position for c in chunks]
    sites = counter.sync_sites["step"]
    reads = {site: n for (kind, site), n in sites.items() if kind == "read"}
    steps = len(chunks)
    assert sum(n for site, n in reads.items() if "engine/step.py" in site) == steps, counter.report()
    assert not any("stats.py" in site or "engine/loop.py" in site or "generate.py" in site for site in reads), reads
    assert len(counts) == steps


def test_drafted_counts_cover_the_tested_depths():
    """A tested depth was drafted: a row's drafted count is at least its tested depths, even from a tree batch
    whose depths are wrong (the step path does not validate them; StepOptions(validate=True) does)."""
    tally = StepTally()
    tally.record(VerifyResult((1, 2), (5, 6, 7), 2), 3, 0.0, 0.0, 0.0, tree_depth=1)
    tally.record(VerifyResult((1,), (5, 6), 2), 4, 0.0, 0.0, 0.0, tree_depth=3)
    assert tally.counts() == AcceptanceCounts(2, 5, (2, 2, 1), (2, 1, 0), (2, 2, 0))


def test_counts_and_stats_as_dicts():
    c = AcceptanceCounts(4, 9, (4, 3, 1), (3, 2, 0), (4, 3, 2))
    assert c.tau == 2.25 and c.acceptance_by_position == (0.75, 2 / 3, 0.0)
    assert c.as_dict()["acceptance_by_position"] == [0.75, 2 / 3, 0.0]
    assert AcceptanceCounts().tau == 0.0 and StreamChunk([1, 2]).acceptance == AcceptanceCounts()
    assert StreamChunk([1, 2]) == [1, 2] and BatchChunk({0: [1]}) == {0: [1]}
