"""Benchmarks of the kernel paths (issue 6). Run with::

    pytest benchmarks/test_bench_kernels.py --benchmark-only

CPU cases (always): the reference verifiers' walk (``process_logits`` + ``Verifier.verify``)
on a host tree; the reference verifiers with a CounterRandom (the stream the kernel
reproduces) against TorchRandom; and the CPU KV compactor chosen by ``compact_kv_auto``.
(The generation loop's dispatch is chosen once per generation, :mod:`specdec.engine.dispatch`:
it costs nothing per step.)

GPU cases (skipped without CUDA and Triton): the fused verification kernel
against the torch reference on CUDA logits at V = 49152 and 128256 and trees
of 16, 64 and 128 nodes, and the Triton KV compaction against the torch
in-place version. ``benchmarks/gpu_check.py`` does the same checks and timings
in one prepared script for a lent GPU.

Torch runs single-threaded on the CPU cases (as in ``test_bench_verify.py``;
``SPECDEC_BENCH_THREADS`` overrides).
"""

from __future__ import annotations

import os

import pytest
import torch

from gpu_check import RULES, make_case
from specdec.rng import CounterRandom
from specdec.kernels.kv_compact import compact_kv_inplace, kv_keep_index
from specdec.kernels.select import compact_kv_auto, triton_available
from specdec.kernels.verify_fused import fused_verify
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig, process_logits

SAMPLING = SamplingConfig(temperature=0.7, top_k=50)
CUDA = torch.cuda.is_available() and triton_available()
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device and Triton (pip install 'specdec-trees[kernels]')")


@pytest.fixture(autouse=True)
def _torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SPECDEC_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------- CPU
def test_bench_cpu_walk(benchmark) -> None:
    """V = 49152, a 64-node RheoSampling-shaped tree, T=0.7 top-k 50: the verifier's walk."""
    tree, logits = make_case("mixed", 49152, 64, seed=0, device="cpu")
    verifier = get("verifier", "mixed")()
    rng = TorchRandom.seeded(0)

    def run():
        return verifier.verify(tree, process_logits(logits, SAMPLING), rng)
    result = benchmark(run)
    assert len(result.tokens) == result.num_accepted + 1


@pytest.mark.parametrize("source", ["torch", "counter"])
@pytest.mark.parametrize("rule", RULES)
def test_bench_cpu_reference_verify(benchmark, rule: str, source: str) -> None:
    tree, logits = make_case(rule, 49152, 64, seed=1, device="cpu")
    p = process_logits(logits, SAMPLING)
    verifier = get("verifier", rule)()
    rng = TorchRandom.seeded(0) if source == "torch" else CounterRandom(0)
    benchmark(verifier.verify, tree, p, rng)


def test_bench_cpu_kv_auto(benchmark) -> None:
    gen = torch.Generator().manual_seed(0)
    cache = [torch.randn(1, 3, 576, 64, generator=gen) for _ in range(60)]
    keep = kv_keep_index(512, [0, 3, 9, 20, 41, 63])
    benchmark(compact_kv_auto, cache, keep)


# ---------------------------------------------------------------------- GPU
@needs_gpu
@pytest.mark.parametrize("size", [16, 64, 128])
@pytest.mark.parametrize("vocab", [49152, 128256])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("path", ["torch", "triton"])
def test_bench_gpu_verify(benchmark, path: str, rule: str, vocab: int, size: int) -> None:
    tree, logits = make_case(rule, vocab, size, seed=vocab + size, device="cuda")
    verifier = get("verifier", rule)()
    rng = TorchRandom.seeded(0, device="cuda")
    counter = CounterRandom(0)

    def run():
        if path == "triton":
            result = fused_verify(verifier, tree, logits, counter, inputs="logits", sampling=SAMPLING)
        else:
            result = verifier.verify(tree, process_logits(logits, SAMPLING), rng)
        torch.cuda.synchronize()
        return result

    run()  # compile / warm up
    benchmark(run)


@needs_gpu
@pytest.mark.parametrize("path", ["torch-inplace", "triton"])
def test_bench_gpu_kv(benchmark, path: str) -> None:
    from specdec.kernels.kv_compact_triton import compact_kv_triton

    cache = [torch.randn(1, 3, 576, 64, device="cuda", dtype=torch.bfloat16) for _ in range(60)]
    keep = kv_keep_index(512, [0, 3, 9, 20, 41, 63], device="cuda")
    fn = compact_kv_triton if path == "triton" else compact_kv_inplace

    def run():
        out = fn(cache, keep)
        torch.cuda.synchronize()
        return out

    run()
    benchmark(run)
