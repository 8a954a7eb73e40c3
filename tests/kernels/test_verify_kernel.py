"""The fused verification kernel equals the registered verifiers (rules 2-5)
run with a CounterRandom: same decision at EVERY node (accepted child or bonus
token, and the number of uniforms used), same walk result, same final
position of the source. Run on the CPU by Triton's interpreter (conftest.py).

Vocabularies are the two real ones scaled down by 64 (49152 / 64 = 768,
128256 / 64 = 2004) so that the interpreter stays fast; ``block=128`` runs the
multi-block paths (6 and 16 blocks, the last one partial).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")

from kernel_cases import RULES, random_case  # noqa: E402

from specdec.errors import (  # noqa: E402
    InvalidConfigError,
    InvalidDistributionError,
    UnsupportedTreeError,
    VocabMismatchError,
)
from specdec.rng import CounterRandom, counter_uniform  # noqa: E402
from specdec.kernels.verify_fused import fused_verify, fused_verify_many, node_decisions  # noqa: E402
from specdec.registry import get  # noqa: E402
from specdec.rng import TorchRandom  # noqa: E402
from specdec.sampling import SamplingConfig  # noqa: E402
from specdec.tree import SampleMode, SparseLaw, TreeAssembler  # noqa: E402

V_SMALL, V_LARGE = 49152 // 64, 128256 // 64
T1 = SamplingConfig(temperature=1.0)
TOPK = SamplingConfig(temperature=0.7, top_k=40)


def reference_decisions(verifier, tree, p, seed: int, walk: int) -> dict[int, tuple]:
    """Each node's ``verify_node`` outcome with a CounterRandom at ``(walk, node, 0)``."""
    out = {}
    rng = CounterRandom(seed)
    for node in range(tree.num_nodes):
        rng.set_position(walk, node, 0)
        outcome = verifier.verify_node(tree, node, p[node], rng)
        out[node] = (outcome.accepted_child, outcome.bonus_token, rng.draw)
    return out


def assert_kernel_matches(rule: str, case, seed: int, *, inputs: str = "probs", block: int | None = None) -> int:
    """Every node's decision and the whole walk agree; returns the number of nodes checked."""
    verifier = get("verifier", rule)()
    walk = 3 + seed
    x = case.p if inputs == "probs" else case.logits
    (kernel,) = node_decisions(verifier, [case.tree], x, seed=seed, walks=[walk], inputs=inputs,
                               sampling=case.sampling, block=block)
    expected = reference_decisions(verifier, case.tree, case.p, seed, walk)
    got = {i: (d.accepted_child, d.bonus_token, d.draws) for i, d in kernel.items()}
    assert got == expected
    # the walk: same VerifyResult and the source left at the same key
    rng_ref, rng_ker = CounterRandom(seed, walk=walk - 1), CounterRandom(seed, walk=walk - 1)
    result_ref = verifier.verify(case.tree, case.p, rng_ref)
    result_ker = fused_verify(verifier, case.tree, x, rng_ker, inputs=inputs, sampling=case.sampling, block=block)
    assert result_ker == result_ref
    assert rng_ker.position == rng_ref.position
    return len(got)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("V", [V_SMALL, V_LARGE])
def test_probs_float32_matches_reference(rule: str, V: int) -> None:
    checked = sum(assert_kernel_matches(rule, random_case(rule, V, seed, T1), seed) for seed in range(2))
    assert checked >= 20


@pytest.mark.parametrize("rule", RULES)
def test_probs_float64_matches_reference(rule: str) -> None:
    for seed in range(2):
        assert_kernel_matches(rule, random_case(rule, V_SMALL, 10 + seed, T1, dtype=torch.float64), 10 + seed)


@pytest.mark.parametrize("rule", RULES)
def test_logits_mode_matches_reference(rule: str) -> None:
    """Temperature, top-k and softmax fused (the reference runs process_logits)."""
    for seed, sampling in ((20, TOPK), (21, T1)):
        assert_kernel_matches(rule, random_case(rule, V_LARGE, seed, sampling), seed, inputs="logits")


@pytest.mark.parametrize("rule", RULES)
def test_multi_block_matches_reference(rule: str) -> None:
    assert_kernel_matches(rule, random_case(rule, V_LARGE, 30, T1, max_nodes=8), 30, block=128)
    assert_kernel_matches(rule, random_case(rule, V_SMALL, 31, TOPK, max_nodes=8), 31, inputs="logits", block=128)


@pytest.mark.parametrize("rule", ["rejection-iid", "mixed"])
def test_many_blocks_matches_reference(rule: str) -> None:
    """block=16: 48 and 126 vocabulary blocks, so the scan over the block sums
    that locates the bonus runs over several chunks."""
    assert_kernel_matches(rule, random_case(rule, V_SMALL, 33, T1, max_nodes=5), 33, block=16)
    assert_kernel_matches(rule, random_case(rule, V_LARGE, 34, T1, max_nodes=4), 34, block=16)


def test_top_p_and_bfloat16_logits() -> None:
    """Top-p stays in torch (probs mode); bfloat16 logits are processed in float32 by both paths."""
    case = random_case("mixed", V_SMALL, 40, SamplingConfig(temperature=0.8, top_k=50, top_p=0.9))
    assert_kernel_matches("mixed", case, 40)
    case = random_case("match", V_SMALL, 41, TOPK, dtype=torch.bfloat16)
    assert case.logits.dtype == torch.bfloat16 and case.p.dtype == torch.float32
    assert_kernel_matches("match", case, 41, inputs="logits")


def test_forest_equals_sequential_walks() -> None:
    """Several trees in one launch = verifying them one after another with one source."""
    verifier = get("verifier", "mixed")()
    cases = [random_case("mixed", V_SMALL, 50 + k, T1, max_nodes=8) for k in range(3)]
    rng_ref, rng_ker = CounterRandom(5), CounterRandom(5)
    expected = [verifier.verify(c.tree, c.p, rng_ref) for c in cases]
    got = fused_verify_many(verifier, [c.tree for c in cases], torch.cat([c.p for c in cases]), rng_ker)
    assert got == expected
    assert rng_ker.position == rng_ref.position


def test_deep_acceptance_is_exercised() -> None:
    """Power check: the random cases do reach accepted children several levels deep
    (so the comparisons above are not all about the root's bonus)."""
    depths = []
    for rule in RULES:
        for seed in range(6):
            case = random_case(rule, V_SMALL, seed, T1)
            depths.append(get("verifier", rule)().verify(case.tree, case.p, CounterRandom(seed, walk=2)).num_accepted)
    assert max(depths) >= 2 and sum(d > 0 for d in depths) >= 6


def test_kernel_uniforms_are_the_counter_stream() -> None:
    from specdec.kernels.verify_triton import launch_uniforms

    gen = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2**31 - 1, (3, 300), generator=gen, dtype=torch.int64).to(torch.int32)
    for seed in (0, 123456789, 2**64 - 1):
        u = launch_uniforms(seed, keys[0], keys[1], keys[2])
        ref = [counter_uniform(seed, int(w), int(n), int(d)) for w, n, d in zip(*keys.tolist())]
        assert u.tolist() == ref  # bit for bit


# ------------------------------------------------------------------ errors
def _small_tree():
    asm = TreeAssembler(root_token=0, vocab_size=4)
    law = SparseLaw(torch.tensor([1, 2]), torch.tensor([0.5, 0.5], dtype=torch.float64), SampleMode.IID)
    asm.add_sampled(0, token=1, law=law, weight=0.5)
    asm.add_deterministic(0, token=3, weight=0.5)
    return asm.build()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, on the all -inf row
def test_bad_rows_raise() -> None:
    tree = _small_tree()
    p = torch.full((3, 4), 0.25)
    p[2, 1] = float("nan")
    with pytest.raises(InvalidDistributionError, match="row 2 contains NaN"):
        fused_verify(get("verifier", "mixed")(), tree, p, CounterRandom(0))
    p = torch.full((3, 4), 0.3)
    with pytest.raises(InvalidDistributionError, match="does not sum to 1"):
        fused_verify(get("verifier", "mixed")(), tree, p, CounterRandom(0))
    logits = torch.zeros(3, 4)
    logits[1] = float("-inf")
    with pytest.raises(InvalidDistributionError, match="row 1"):
        fused_verify(get("verifier", "mixed")(), tree, logits, CounterRandom(0), inputs="logits", sampling=T1)
    with pytest.raises(VocabMismatchError):
        fused_verify(get("verifier", "mixed")(), tree, torch.full((3, 5), 0.2), CounterRandom(0))
    with pytest.raises(InvalidDistributionError, match="rows"):
        fused_verify(get("verifier", "mixed")(), tree, torch.full((2, 4), 0.25), CounterRandom(0))


def test_unsupported_inputs_raise() -> None:
    tree = _small_tree()
    p = torch.full((3, 4), 0.25)
    with pytest.raises(UnsupportedTreeError):  # deterministic children under rule 3
        fused_verify(get("verifier", "rejection-iid")(), tree, p, CounterRandom(0))
    with pytest.raises(InvalidConfigError, match="no fused kernel"):
        fused_verify(get("verifier", "kseq")(), tree, p, CounterRandom(0))  # declares no rule (Verifier.fused)
    with pytest.raises(InvalidConfigError, match="CounterRandom"):
        fused_verify(get("verifier", "mixed")(), tree, p, TorchRandom.seeded(0))
    with pytest.raises(InvalidConfigError, match="top-p"):
        fused_verify(get("verifier", "mixed")(), tree, p, CounterRandom(0), inputs="logits",
                     sampling=SamplingConfig(top_p=0.5))
    with pytest.raises(InvalidConfigError, match="block"):
        fused_verify(get("verifier", "mixed")(), tree, p, CounterRandom(0), block=100)
