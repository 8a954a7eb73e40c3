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
from specdec.engine import choose_verification
from specdec.models import CallableLM
from specdec.registry import get
from specdec.sampling import SamplingConfig
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


def generate(kernel: str, method: str | None = "rheo", seed: int = 3, random: str = "torch", tree: str | None = None,
             verifier: str | None = None, **sampling):
    target, draft = models()
    options = SMALL.get(method, {}) if method is not None else {"expansion": (2, 1)}
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel=kernel, random=random,
                                       tree=tree, verifier=verifier, **options)
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
        choose_verification(get("verifier", "kseq")(), SamplingConfig(), "triton", torch.device("cpu"))
    with pytest.raises(InvalidConfigError, match="no fused kernel"):
        generate("triton", method=None, tree="static", verifier="kseq")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    import specdec.engine.dispatch as dispatch

    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)  # as on a machine without the interpreter
    with pytest.raises(InvalidConfigError, match="CUDA"):
        choose_verification(get("verifier", "match")(), SamplingConfig(), "triton", torch.device("cpu"))
    with pytest.raises(InvalidConfigError, match="CUDA"):
        generate("triton")


def test_auto_picks_the_kernel_on_cuda_only_for_declared_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one dispatch: on CUDA with Triton, every verifier that declares a rule gets the device-resident
    fused kernel (plug-ins included: the kernel takes the rule descriptor); the others walk."""
    import specdec.engine.dispatch as dispatch
    from specdec.verify.mixed import MixedVerifier

    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for name in ("greedy", "match", "rejection-iid", "rejection-wor", "mixed"):  # greedy: rule 2's descriptor on one-hot p
        assert choose_verification(get("verifier", name)(), SamplingConfig(), "auto", cuda).path == "triton"
        assert choose_verification(get("verifier", name)(), SamplingConfig(), "auto", cpu).path == "tensor"
    assert choose_verification(get("verifier", "kseq")(), SamplingConfig(), "auto", cuda).path == "walk"

    class Declared(MixedVerifier):  # a plug-in that keeps rule 5 and says so
        fused = MixedVerifier.fused

    class Changed(MixedVerifier):  # a plug-in that changes the rule: it declares none, so it walks
        pass

    assert choose_verification(Declared(), SamplingConfig(), "auto", cuda).path == "triton"
    assert choose_verification(Changed(), SamplingConfig(), "auto", cuda).path == "walk"


@pytest.mark.parametrize("method", ["rheo", "specinfer", "sequoia", "eagle2"])
@pytest.mark.parametrize("sampling", [{"temperature": 0.8, "top_k": 4}, {"temperature": 1.0, "top_p": 0.9},
                                      {"temperature": 0.0}], ids=["logits", "probs", "greedy"])
def test_the_kernel_emits_what_the_tensor_rule_emits_on_the_counter_stream(method: str, sampling: dict) -> None:
    """Both fused modes (softmax + top-k in the kernel; top-p processed in torch) and greedy: with the
    counter stream, ``kernel="triton"`` (the device tree batch, tables built on the device) emits the
    tokens of ``kernel="torch"`` (the tensor rule on the same uniforms)."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    for seed in range(2):
        kernel = generate("triton", method=method, seed=seed, random="counter", **sampling)
        reference = generate("torch", method=method, seed=seed, random="counter", **sampling)
        assert kernel.tokens == reference.tokens
        assert kernel.stats.kernel_path == "triton" and reference.stats.kernel_path == "torch"


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
    import specdec.request as request_module
    from specdec.testing import chi_square_test

    monkeypatch.setattr(request_module, "seeded_sources", lambda random, seeds: [_ReusesBuilderDraws.seeded(s) for s in seeds])
    target, draft = models()
    sampling = SamplingConfig(temperature=1.0)
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo", kernel="torch", random="counter",
                                       **SMALL["rheo"])
    samples = [tuple(gen.generate([0, 1], 2, sampling=sampling, seed=s).tokens) for s in range(600)]
    result = chi_square_test(samples, target.joint_law([0, 1], 2, sampling))
    assert result.unexpected > 0 or result.p_value < 1e-3, result


def test_the_greedy_verifier_reaches_the_kernel_and_emits_the_tensor_rule_tokens() -> None:
    """``greedy`` declares rule 2's descriptor on one-hot p (Verifier.fused), so the kernel runs it now
    (a33012e's whitelist left it out): the same tokens as the tensor rule and as plain greedy decoding."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    target, draft = models()
    outs = {}
    for kernel in ("triton", "torch"):
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=None, tree="eagle", verifier="greedy",
                                           kernel=kernel, K=3, depth=3, N=6)
        outs[kernel] = gen.generate([0, 1], max_new_tokens=12, sampling=SamplingConfig(temperature=0.0), seed=0)
    assert outs["triton"].stats.kernel_path == "triton"
    assert outs["triton"].tokens == outs["torch"].tokens
    plain = specdec.autoregressive_generate(target, [0, 1], 12, SamplingConfig(temperature=0.0))
    assert outs["triton"].tokens == plain.tokens
