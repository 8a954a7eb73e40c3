"""The generation loop's kernel switch (``SpeculativeGenerator(kernel=...)``) and
``GenerationStats.kernel_path``.

On the CPU the default (``"auto"``) takes the torch path and gives exactly the
tokens of ``kernel="torch"``. ``kernel="triton"`` runs the fused kernel (here
under Triton's interpreter) and equals the reference verifier run with the
same counter-based stream.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.errors import InvalidConfigError
from specdec.rng import CounterRandom
from specdec.kernels.verify_fused import StepVerifier
from specdec.models import CallableLM
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits
from specdec.testing import MarkovLM, random_markov_logits

V = 6


def models() -> tuple[MarkovLM, MarkovLM]:
    g = torch.Generator().manual_seed(5)
    target = random_markov_logits(V, 2, g, scale=1.5, zero_fraction=0.1)
    draft = torch.where(torch.isfinite(target), target + torch.randn(target.shape, generator=g, dtype=torch.float64),
                        target)
    return MarkovLM(target), MarkovLM(draft)


SMALL = {"rheo": {"K": 3, "depth": 3, "N": 6, "M": 5}, "eagle2": {"K": 3, "depth": 3, "N": 6},
         "sd": {"depth": 3}, "specinfer": {"expansion": (2, 2)},
         "sequoia": {"num_nodes": 6, "max_depth": 3, "acceptance": (0.6, 0.2, 0.1)}}


def generate(kernel: str, method: str = "rheo", seed: int = 3, random: str = "torch", **sampling):
    target, draft = models()
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel=kernel, random=random,
                                       **SMALL.get(method, {}))
    return gen.generate([0, 1], max_new_tokens=12, sampling=SamplingConfig(**sampling), seed=seed)


def test_auto_on_cpu_is_the_torch_path() -> None:
    auto, torch_path = generate("auto"), generate("torch")
    assert auto.tokens == torch_path.tokens
    assert auto.stats.kernel_path == torch_path.stats.kernel_path == "torch"
    assert auto.stats.as_dict()["kernel_path"] == "torch"


def test_bad_kernel_choice() -> None:
    with pytest.raises(InvalidConfigError, match="kernel"):
        generate("cuda")


def test_triton_needs_a_fused_verifier() -> None:
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    with pytest.raises(InvalidConfigError, match="no fused kernel"):
        StepVerifier(get("verifier", "kseq")(), SamplingConfig(), seed=0, kernel="triton")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    import specdec.kernels.verify_fused as fused

    monkeypatch.setattr(fused, "interpreter_enabled", lambda: False)  # as on a machine without the interpreter
    step = StepVerifier(get("verifier", "match")(), SamplingConfig(), seed=0, kernel="triton")
    tree = specdec.DraftTree.chain(0, [], [], vocab_size=3)
    with pytest.raises(InvalidConfigError, match="CUDA"):
        step(tree, torch.zeros(1, 3), TorchRandom.seeded(0))


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.8, top_k=4),
                                      SamplingConfig(temperature=1.0, top_p=0.9)], ids=["logits", "probs"])
def test_step_verifier_triton_equals_reference_on_the_counter_stream(sampling: SamplingConfig) -> None:
    """Both fused modes (softmax + top-k in the kernel; top-p processed in torch)."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    from kernel_cases import random_case

    verifier = get("verifier", "mixed")()
    step = StepVerifier(verifier, sampling, seed=17, kernel="triton")
    reference = CounterRandom(17)
    for seed in range(3):
        case = random_case("mixed", 300, seed, sampling, max_nodes=6)
        got = step(case.tree, case.logits, TorchRandom.seeded(0))
        assert got == verifier.verify(case.tree, process_logits(case.logits, sampling), reference)
    assert step.path_label == "triton"


def test_generation_with_the_triton_kernel() -> None:
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    out = generate("triton", temperature=0.9, top_k=5)
    assert out.stats.kernel_path == "triton"
    assert len(out.tokens) == 12 and all(0 <= t < V for t in out.tokens)
    assert out.stats.tau >= 1.0


def test_autoregressive_baseline_reports_its_path() -> None:
    lm = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 4), vocab_size=4)
    out = specdec.autoregressive_generate(lm, [0], 5, sampling=SamplingConfig(), seed=0)
    assert out.stats.kernel_path == "torch"


COUNTER_CASES = [(m, "T1", dict(temperature=1.0)) for m in ("rheo", "eagle2", "sd", "specinfer", "sequoia")] + [
    ("rheo", "T0.7-topk4", dict(temperature=0.7, top_k=4)),
    ("specinfer", "T0.7-topk4", dict(temperature=0.7, top_k=4)),
    ("rheo", "T0.9-topp0.8", dict(temperature=0.9, top_p=0.8)),
    ("sequoia", "T0.9-topp0.8", dict(temperature=0.9, top_p=0.8)),
]


@pytest.mark.parametrize("method,name,sampling", COUNTER_CASES, ids=[f"{m}-{n}" for m, n, _ in COUNTER_CASES])
def test_one_counter_stream_makes_the_torch_and_triton_paths_emit_the_same_tokens(method, name, sampling) -> None:
    """random="counter": the tensor builders draw from the CounterRandom stream
    (builder keys) and the step path's verification table is the walk's keyed
    uniforms, which the fused kernel draws too; so kernel="torch" (the step
    path) and kernel="triton" (the kernel, here under the interpreter) emit the
    same tokens for a seed."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    for seed in range(2):
        step = generate("torch", method, seed=seed, random="counter", **sampling)
        kernel = generate("triton", method, seed=seed, random="counter", **sampling)
        assert step.stats.kernel_path == "torch" and kernel.stats.kernel_path == "triton"
        assert step.tokens == kernel.tokens, (method, seed)


def test_without_the_shared_stream_the_paths_differ() -> None:
    """The power of the test above: with TorchRandom tables the step path and
    the kernel draw different uniforms, and the emitted tokens differ."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    differ = sum(generate("torch", "rheo", seed=s).tokens != generate("triton", "rheo", seed=s).tokens for s in range(3))
    assert differ > 0


def test_counter_stream_is_lossless_on_the_step_path() -> None:
    """random="counter" through the step path keeps the target's law (seeded chi-square, 600 runs)."""
    from specdec.testing import chi_square_test

    target, draft = models()
    sampling = SamplingConfig(temperature=1.0)
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", kernel="torch", random="counter",
                                       **SMALL["rheo"])
    samples = [tuple(gen.generate([0, 1], 2, sampling=sampling, seed=s).tokens) for s in range(600)]
    result = chi_square_test(samples, target.joint_law([0, 1], 2, sampling))
    assert result.unexpected == 0 and result.p_value > 1e-3, result


def test_random_choice_is_checked() -> None:
    with pytest.raises(InvalidConfigError, match="random"):
        generate("torch", random="philox")


class _ReusesBuilderDraws(CounterRandom):
    """BROKEN: the verification table reuses the builder's first draw table
    (every node's tests read the uniforms its sampled children were drawn with)."""

    def verify_uniforms(self, shape, device="cpu"):
        from specdec.rng import BUILDER_NODE, counter_uniforms

        B, n, width = shape
        self.walk += 1
        draw = torch.arange(width, dtype=torch.int64, device=device).expand(n, width)
        return counter_uniforms(self.seed, self.walk - 1, BUILDER_NODE, draw).unsqueeze(0)


def test_counter_stream_chi_square_catches_a_broken_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The power of test_counter_stream_is_lossless_on_the_step_path: the same
    seeded test fails when verification reuses the builder's uniforms."""
    import specdec.generate as generate_module
    from specdec.testing import chi_square_test

    monkeypatch.setattr(generate_module, "CounterRandom", _ReusesBuilderDraws)
    target, draft = models()
    sampling = SamplingConfig(temperature=1.0)
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", kernel="torch", random="counter",
                                       **SMALL["rheo"])
    samples = [tuple(gen.generate([0, 1], 2, sampling=sampling, seed=s).tokens) for s in range(600)]
    result = chi_square_test(samples, target.joint_law([0, 1], 2, sampling))
    assert result.unexpected > 0 or result.p_value < 1e-3, result
