"""One launch of the fused verification kernel for every row of a batch
(issue 15): :func:`~specdec.kernels.verify_fused.fused_verify_batch` and
batched generation with ``kernel="triton"`` / ``random="counter"``.

Row ``b`` of a batch draws from its own counter stream keyed by its seed
(:class:`~specdec.rng.RowStreams` of :class:`~specdec.rng.CounterRandom`), so
the kernel's decisions equal, per row, the batched torch reference
(:func:`~specdec.verify.fast.decide_tree_batch` on ``RowStreams.verify_uniforms``)
and the batch-1 kernel (:func:`~specdec.kernels.verify_fused.fused_verify`)
run with the row's seed; a row's tokens do not depend on the other rows.
Mutants (rows' streams swapped; streams keyed by batch position instead of
the row's seed) fail the same checks. Run by Triton's interpreter on the CPU
(conftest.py): kept small, it is slow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")

from kernel_cases import RULES, random_case  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
from hf_model_helpers import make_tiny_llama  # noqa: E402

import specdec  # noqa: E402
from specdec.kernels import verify_fused  # noqa: E402
from specdec.kernels.verify_fused import fused_verify, fused_verify_batch  # noqa: E402
from specdec.registry import get  # noqa: E402
from specdec.rng import CounterRandom, RowStreams  # noqa: E402
from specdec.sampling import SamplingConfig  # noqa: E402
from specdec.tree_batch import TreeBatch  # noqa: E402
from specdec.verify.fast import decide_tree_batch  # noqa: E402

V = 200
SEEDS = [5, 2**63 + 9, 11]  # one > 2**63: both key words matter
SIZES = (9, 3, 6)  # ragged trees (max nodes)
T09 = SamplingConfig(temperature=0.9)  # not the plain T = 1 cases (their rows make some walks certain)


def _batch(rule: str, sampling: SamplingConfig, dtype: torch.dtype):
    """Three ragged trees of ``rule`` as a TreeBatch, with their padded ``[B, n, V]`` logits and ``p``."""
    cases = [random_case(rule, V, s, sampling, dtype=dtype, max_nodes=m) for s, m in zip(range(3), SIZES)]
    tree = TreeBatch.from_trees([c.tree for c in cases])
    B, n = tree.batch_size, tree.node_slots
    p = torch.zeros(B, n, V, dtype=cases[0].p.dtype)
    logits = torch.zeros(B, n, V, dtype=dtype)
    for b, c in enumerate(cases):  # padding slots: a copy of the root's row (scored, never read)
        k = c.tree.num_nodes
        p[b, :k], p[b, k:] = c.p, c.p[0]
        logits[b, :k], logits[b, k:] = c.logits, c.logits[0]
    return cases, tree, p, logits


def _streams(walk: int) -> RowStreams:
    return RowStreams([CounterRandom(s, walk=walk) for s in SEEDS])


def _rows(decision, b: int) -> tuple[list[int], list[int]]:
    k = int(decision.num_accepted[b])
    return decision.accepted[b, :k].tolist(), decision.tokens[b, : k + 1].tolist()


@pytest.mark.parametrize("rule", RULES)
def test_one_launch_equals_the_torch_reference_and_batch_one_per_row(rule, monkeypatch):
    """Probabilities in (float64): every field of the decision equals the batched
    torch reference with the same row streams, and each row's path and tokens
    equal its own batch-1 kernel walk with its seed; the kernel launches once
    per batch and each row's walk advances by one."""
    verifier = get("verifier", rule)()
    cases, tree, p, _ = _batch(rule, T09, torch.float64)
    launches = []
    original = verify_fused._kernels().launch_decisions
    monkeypatch.setattr(verify_fused._kernels(), "launch_decisions",
                        lambda *a, **k: (launches.append(1), original(*a, **k))[1])
    deep = 0
    for walk in range(2):
        rng = _streams(walk)
        before = len(launches)
        got = fused_verify_batch(verifier.fused, tree, p, rng, block=128)
        assert len(launches) == before + 1  # one launch for every row's nodes
        assert [s.walk for s in rng.sources] == [walk + 1] * 3
        u = _streams(walk).verify_uniforms((3, tree.node_slots, tree.max_children + 1))
        ref = decide_tree_batch(verifier.fused, tree, p, u)
        names = ("accepted", "num_accepted", "tokens", "bonus", "attempted", "bad_visited", "stop")
        for name, expected in zip(names, ref):
            assert torch.equal(getattr(got, name), expected), (rule, walk, name)
        for b, (case, seed) in enumerate(zip(cases, SEEDS)):
            one = fused_verify(verifier, case.tree, case.p, CounterRandom(seed, walk=walk), block=128)
            assert _rows(got, b) == (list(one.accepted_nodes), list(one.tokens)), (rule, walk, b)
            assert int(got.attempted[b]) == one.attempted_depths
        deep += int(got.num_accepted.sum())
    assert deep > 0  # some paths go below the root


def test_logits_mode_with_top_k_equals_batch_one_per_row():
    """Raw float32 logits (softmax and top-k fused) through the mixed rule:
    each row equals its batch-1 kernel walk with its seed."""
    sampling = SamplingConfig(temperature=0.7, top_k=20)
    verifier = get("verifier", "mixed")()
    cases, tree, _, logits = _batch("mixed", sampling, torch.float32)
    for walk in range(2):
        got = fused_verify_batch(verifier.fused, tree, logits, _streams(walk), inputs="logits", sampling=sampling, block=128)
        for b, (case, seed) in enumerate(zip(cases, SEEDS)):
            one = fused_verify(verifier, case.tree, case.logits, CounterRandom(seed, walk=walk), inputs="logits",
                               sampling=sampling, block=128)
            assert _rows(got, b) == (list(one.accepted_nodes), list(one.tokens)), (walk, b)


def test_swapped_row_streams_are_caught(monkeypatch):
    """The power of the per-row checks above (same trees and rows): with the
    rows' keys swapped the kernel's decisions differ from the reference's."""
    verifier = get("verifier", "mixed")()
    cases, tree, p, _ = _batch("mixed", T09, torch.float64)
    walks = range(4)
    refs = [decide_tree_batch(verifier.fused, tree, p,
                              _streams(w).verify_uniforms((3, tree.node_slots, tree.max_children + 1))) for w in walks]
    original = RowStreams.counter_keys  # MUTANT: row b keyed by row B - 1 - b's seed
    monkeypatch.setattr(RowStreams, "counter_keys", lambda self, device="cpu": original(self, device).flip(0))
    differ = 0
    for walk, ref in zip(walks, refs):
        got = fused_verify_batch(verifier.fused, tree, p, _streams(walk), block=128)
        differ += sum(not torch.equal(got.tokens[b], ref[2][b]) for b in range(3))
    assert differ > 0


def test_bad_arguments_are_refused():
    cases, tree, p, _ = _batch("match", SamplingConfig(temperature=1.0), torch.float64)
    from specdec.errors import InvalidConfigError, InvalidDistributionError
    from specdec.rng import TorchRandom

    match = get("verifier", "match")().fused
    with pytest.raises(InvalidConfigError, match="rule must be a FusedRule"):
        fused_verify_batch(get("verifier", "kseq")().fused, tree, p, _streams(0))
    with pytest.raises(InvalidConfigError, match="RowStreams of CounterRandom"):
        fused_verify_batch(match, tree, p, RowStreams([TorchRandom.seeded(s) for s in range(3)]))
    with pytest.raises(InvalidConfigError, match="row streams for a batch of 3"):
        fused_verify_batch(match, tree, p, RowStreams([CounterRandom(1)]))
    with pytest.raises(InvalidDistributionError, match="x must be"):
        fused_verify_batch(match, tree, p[:2], _streams(0))
    with pytest.raises(InvalidConfigError, match="top-k only"):
        fused_verify_batch(match, tree, p, _streams(0), inputs="logits", sampling=SamplingConfig(top_p=0.9))


# ------------------------------------------------------------- generation
PROMPTS = [[3, 4], [5, 6, 7, 8, 9, 10, 11], [12]]
GEN_SEEDS = [21, 22, 23]
NEW = 6


def _generator(kernel: str, random: str = "counter"):
    """A float64 tiny-Llama target and an independent 1-layer draft LM, a small rheo tree (sampled + matched children)."""
    from specdec.drafts.hf import HFDraft
    from specdec.targets.hf import HFTarget

    return specdec.SpeculativeGenerator(target=HFTarget(make_tiny_llama("sdpa", torch.float64, seed=3)),
                                        draft=HFDraft(make_tiny_llama("sdpa", torch.float64, seed=4, layers=1)),
                                        method="rheo", kernel=kernel, random=random, K=2, depth=2, N=3)


_REFERENCE: dict[tuple, list[list[int]]] = {}


def _batch_one(temperature: float, kernel: str = "triton", random: str = "counter") -> list[list[int]]:
    """Each prompt's batch-1 generation with its seed (cached: the interpreter is slow)."""
    key = (temperature, kernel, random)
    if key not in _REFERENCE:
        gen = _generator(kernel, random)
        sampling = SamplingConfig(temperature=temperature)
        _REFERENCE[key] = [gen.generate(p, NEW, sampling, seed=s).tokens for p, s in zip(PROMPTS, GEN_SEEDS)]
    return _REFERENCE[key]


def _batched(temperature: float, kernel: str = "triton", random: str = "counter", order=(0, 1, 2)) -> list[list[int]]:
    out = _generator(kernel, random).generate_batch([PROMPTS[i] for i in order], NEW,
                                                    SamplingConfig(temperature=temperature),
                                                    [GEN_SEEDS[i] for i in order])
    return [list(t) for t in out.tokens]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_kernel_rows_equal_their_batch_one_generation(temperature):
    """kernel="triton", random="counter": one launch per step for all rows
    (ragged prompts); every row equals its batch-1 generation with the same
    kernel, stream and seed, and the batched torch path (same counter streams)
    emits the same tokens."""
    reference = _batch_one(temperature)
    assert _batched(temperature) == reference
    assert _batched(temperature, kernel="torch") == reference


def test_kernel_with_torch_builder_streams_equals_batch_one():
    """kernel="triton", random="torch": the builder draws from the rows'
    TorchRandom streams and the kernel from ``CounterRandom.seeded(seed)`` per
    row, as batch-1 ``kernel="triton"`` does."""
    assert _batched(1.0, random="torch") == _batch_one(1.0, random="torch")


def test_a_rows_tokens_do_not_depend_on_the_other_rows():
    """The same rows in another order and company (seeds travel with their prompts) emit the same tokens."""
    reference = _batch_one(1.0)
    assert _batched(1.0, order=(2, 0)) == [reference[2], reference[0]]


def test_mutant_streams_fail_the_per_row_equality(monkeypatch):
    """The power of the two tests above, at T = 1: rows' streams swapped, or
    keyed by batch position instead of the row's seed, change the rows' tokens."""
    import specdec.request as request_module

    reference = _batch_one(1.0)
    original = RowStreams.counter_keys
    with monkeypatch.context() as m:
        m.setattr(RowStreams, "counter_keys", lambda self, device="cpu": original(self, device).flip(0))
        assert _batched(1.0) != reference

    def by_position(random, seeds):  # MUTANT: stream b keyed by b (its place in the batch), not by seeds[b]
        return [CounterRandom(b) for b in range(len(seeds))]

    monkeypatch.setattr(request_module, "seeded_sources", by_position)
    assert _batched(1.0) != reference
