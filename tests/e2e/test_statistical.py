"""Layer 3 of docs/concepts.md ("How losslessness is proved"): end-to-end statistical losslessness.

Every registered method runs through the real generation loop
(:class:`specdec.SpeculativeGenerator`) on Markov-table target and draft
models whose law is known exactly; the empirical law of the first three new
tokens is compared with the target's by a seeded chi-square test.

The same harness must reject broken methods: the mutants below are real,
common bugs, and each fails the test (``test_harness_catches_mutant``).
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingConfig
from specdec.generate import SpeculativeGenerator
from specdec.registry import get, list_registered
from specdec.testing import MarkovLM, chi_square_test, random_markov_logits

V = 4
NUM_TOKENS = 3
PROMPT = [0, 1]
SAMPLES = 1500
ALPHA = 1e-3

# Small trees so the runs stay fast; the trees still branch, prune and compete.
SMALL_OPTIONS = {
    "sd": {"depth": 3},
    "specinfer": {"expansion": (2, 2)},
    "sequoia": {"num_nodes": 6, "max_depth": 3, "acceptance": (0.6, 0.2, 0.1)},
    "eagle2": {"K": 3, "depth": 3, "N": 5},
    "eagle3": {"K": 3, "depth": 3, "N": 5},
    "rheo": {"K": 2, "m": 1, "M": 4, "depth": 3, "N": 5},  # 1 top-1 slot + 1 sampled slot
    "sampled-dynamic": {"K": 2, "M": 4, "depth": 3, "N": 5},  # 2 sampled slots (wor)
    "ddtree": {"budget": 5, "depth": 3, "sampled": 1},  # top-k best-first + 1 sampled slot per node
    "ddtree-match": {"budget": 5, "depth": 3},
}

SAMPLINGS = {
    "T1": SamplingConfig(temperature=1.0),
    "T0.6-topk3-topp0.9": SamplingConfig(temperature=0.6, top_k=3, top_p=0.9),
    "T1-topp0.8": SamplingConfig(temperature=1.0, top_p=0.8),
    "T0.6": SamplingConfig(temperature=0.6),
}


def make_models() -> tuple[MarkovLM, MarkovLM]:
    g = torch.Generator().manual_seed(1234)
    target_logits = random_markov_logits(V, 2, g, scale=1.5, zero_fraction=0.15)
    noise = torch.randn(target_logits.shape, generator=g, dtype=torch.float64)
    draft_logits = torch.where(torch.isfinite(target_logits), target_logits + noise, target_logits)
    draft_logits[0, 1] = torch.tensor([2.0, 2.0, 1.0, 0.0])  # ties at the prompt: q(0) = q(1)
    draft_logits[1, 0] = torch.tensor([9.0, -9.0, -9.0, -9.0])  # a near one-hot row
    return MarkovLM(target_logits), MarkovLM(draft_logits)


def sample_first_tokens(gen: SpeculativeGenerator, sampling: SamplingConfig, n: int = SAMPLES) -> list[tuple[int, ...]]:
    out = []
    for seed in range(n):
        result = gen.generate(PROMPT, NUM_TOKENS, sampling=sampling, seed=seed)
        out.append(tuple(result.tokens))
    return out


def generator_for(method: str, target: MarkovLM, draft: MarkovLM) -> SpeculativeGenerator:
    return SpeculativeGenerator(target=target, draft=draft, method=method, **SMALL_OPTIONS.get(method, {}))


# T=1 and the warped law (temperature, top-k and top-p together) run by default;
# top-p alone and temperature alone are the slow suite's (about 2 minutes more)
DEFAULT_SAMPLINGS = ("T1", "T0.6-topk3-topp0.9")
SAMPLING_PARAMS = [
    pytest.param(s, marks=() if s in DEFAULT_SAMPLINGS else pytest.mark.slow, id=s) for s in SAMPLINGS
]


@pytest.mark.parametrize("sampling_id", SAMPLING_PARAMS)
@pytest.mark.parametrize("method", list_registered("method"))
def test_method_is_lossless(method: str, sampling_id: str) -> None:
    sampling = SAMPLINGS[sampling_id]
    target, draft = make_models()
    law = target.joint_law(PROMPT, NUM_TOKENS, sampling)
    gen = generator_for(method, target, draft)
    result = chi_square_test(sample_first_tokens(gen, sampling), law)
    assert result.unexpected == 0, f"{method} emitted a token sequence of probability 0"
    assert result.p_value > ALPHA, f"{method} at {sampling_id}: chi2={result.statistic:.1f} dof={result.dof} p={result.p_value:.2e}"


# every slot sampled (the sampled-dynamic method: RheoSampling's construction with m = K, docs/trees.md): the
# settings measured in docs/rheo_results.md, through the same loop (the whole-tree enumeration is in tests/trees)
EVERY_SLOT = {
    "displaced": {"K": 3, "M": 4, "depth": 3, "N": 8, "proxy": "displaced"},  # siblings kept: wor matters
    "geometric": {"K": 2, "M": 4, "depth": 3, "N": 5, "proxy": "geometric", "proxy_scale": 0.5},
    # a measured-looking table (docs/trees.md, "Proxies"): weak draws lifted far above their displaced weight
    "calibrated": {"K": 3, "M": 4, "depth": 3, "N": 8, "proxy": "calibrated",
                   "calibration": ((0.02, 0.05, 0.1, 0.3, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9),)},  # every draw: one row
}


@pytest.mark.parametrize("sampling_id", [pytest.param("T1"),
                                         pytest.param("T0.6-topk3-topp0.9", marks=pytest.mark.slow)])
@pytest.mark.parametrize("proxy", sorted(EVERY_SLOT))
def test_every_slot_sampled_is_lossless(proxy: str, sampling_id: str) -> None:
    sampling = SAMPLINGS[sampling_id]
    target, draft = make_models()
    law = target.joint_law(PROMPT, NUM_TOKENS, sampling)
    gen = SpeculativeGenerator(target=target, draft=draft, method="sampled-dynamic", **EVERY_SLOT[proxy])
    result = chi_square_test(sample_first_tokens(gen, sampling), law)
    assert result.unexpected == 0
    assert result.p_value > ALPHA, f"sampled-dynamic {proxy} at {sampling_id}: chi2={result.statistic:.1f} p={result.p_value:.2e}"


def test_autoregressive_baseline_is_the_reference() -> None:
    sampling = SAMPLINGS["T0.6-topk3-topp0.9"]
    target, _ = make_models()
    law = target.joint_law(PROMPT, NUM_TOKENS, sampling)
    samples = [tuple(specdec.autoregressive_generate(target, PROMPT, NUM_TOKENS, sampling, seed=s).tokens)
               for s in range(SAMPLES)]
    assert chi_square_test(samples, law).p_value > ALPHA


# --------------------------------------------------------------------------
# Mutants: deliberately broken methods that the same harness must reject.
# --------------------------------------------------------------------------
import attrs  # noqa: E402

from specdec.rng import RandomSource  # noqa: E402
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw  # noqa: E402
from specdec.trees import OneTreeBuilder, build_tree  # noqa: E402
from specdec.trees.chain import ChainTreeBuilder  # noqa: E402
from specdec.verify.base import NodeOutcome, Verifier  # noqa: E402


class RatioOnTopKVerifier(Verifier):
    """BROKEN: verifies top-K (deterministic) children with a ``p/q`` ratio,
    using the child's draft probability ``q(x)`` (its weight) as if ``x`` had
    been sampled from ``q``."""

    registry_name = "mutant-ratio-on-topk"
    supported_kinds = frozenset({NodeKind.DETERMINISTIC, NodeKind.SAMPLED})
    supported_modes = frozenset()

    def verify_node(self, tree, node, p_node, rng: RandomSource) -> NodeOutcome:
        P = p_node.clone()
        for child in tree.children(node):
            x, q_x = int(tree.tokens[child]), float(tree.weights[child])
            if q_x > 0 and rng.bernoulli(min(1.0, float(P[x]) / q_x)):
                return NodeOutcome(accepted_child=child)
            P[x] = 0.0
            P = P / P.sum()
        return NodeOutcome(bonus_token=rng.categorical(P))


@attrs.frozen
class MisreportedLawChain(OneTreeBuilder, ChainTreeBuilder):
    """BROKEN: draws each draft from ``q`` but records a sharpened law
    (``q**(1/0.6)`` renormalised), as when the draft samples at one temperature
    and reports another."""

    def build(self, root_token, draft, sampling, rng) -> DraftTree:
        tree = build_tree(ChainTreeBuilder(depth=self.depth), root_token, draft, sampling, rng)
        laws = []
        for law in tree.laws:
            sharp = law.probs ** (1 / 0.6)
            laws.append(SparseLaw(law.indices, sharp / sharp.sum(), law.mode))
        return attrs.evolve(tree, laws=laws)


class IidRuleOnWorVerifier(get("verifier", "rejection-iid")):
    """BROKEN: SpecInfer's i.i.d. rule (docs/verifiers.md) claimed for siblings drawn without
    replacement, as RheoSampling's ``m > 1`` sampled children are: after a rejection the next
    sibling is treated as a fresh draw from ``q`` instead of from ``q`` without the rejected token."""

    registry_name = "mutant-iid-rule-on-wor"
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})


def _mutant_generator(name: str, target: MarkovLM, draft: MarkovLM) -> SpeculativeGenerator:
    if name.startswith("iid-rule-on-wor-"):  # every slot sampled (sampled-dynamic, EVERY_SLOT), the wrong rule
        gen = SpeculativeGenerator(target=target, draft=draft, method="sampled-dynamic",
                                   **EVERY_SLOT[name.removeprefix("iid-rule-on-wor-")])
        gen.verifier = IidRuleOnWorVerifier()
    elif name == "ratio-on-topk":
        gen = generator_for("eagle2", target, draft)
        gen.verifier = RatioOnTopKVerifier()
    elif name == "misreported-law":
        gen = generator_for("sd", target, draft)
        gen.builder = MisreportedLawChain(depth=3)
    else:  # pragma: no cover
        raise KeyError(name)
    return gen


@pytest.mark.parametrize("mutant", ["ratio-on-topk", "misreported-law", "iid-rule-on-wor-displaced",
                                    "iid-rule-on-wor-geometric", "iid-rule-on-wor-calibrated"])
def test_harness_catches_mutant(mutant: str) -> None:
    """The statistical test has power: each broken method fails it.

    (Subtler bugs, such as RheoSampling's verifier trying the deterministic
    children first on a pruned tree, bias the law by ~1e-2 and are caught by
    the exact whole-tree tests in ``tests/trees`` instead.)"""
    sampling = SAMPLINGS["T1"]
    target, draft = make_models()
    law = target.joint_law(PROMPT, NUM_TOKENS, sampling)
    result = chi_square_test(sample_first_tokens(_mutant_generator(mutant, target, draft), sampling), law)
    assert result.p_value < ALPHA, f"mutant {mutant} passed: p={result.p_value:.3g}"
