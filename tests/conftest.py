"""Shared pytest configuration for the specdec test suite (kept small).

- Hypothesis: no per-example deadline (the CI machine is small and shared, so
  wall-clock deadlines only produce flaky failures) and a fixed database-free
  profile, so property tests are reproducible.
- ``torch_rng``: a seeded :class:`specdec.rng.TorchRandom`.
- Torch runs single-threaded: the tests use tiny tensors, for which OpenMP
  thread hand-off costs milliseconds per op on a loaded 2-core machine.
- No model hub: ``HF_HUB_OFFLINE=1``.
- No shared plan file for the CPU linear tuning (``SPECDEC_LINEAR_PLANS=0``):
  a test's quick tuning must not become the plan of a later benchmark.
- Without a GPU, Triton kernels run under its interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["SPECDEC_LINEAR_PLANS"] = "0"
# Triton reads TRITON_INTERPRET when its own language module is imported, which
# a test module may trigger (through transformers) before tests/kernels is
# collected: set it here, first, so on a machine without CUDA every Triton
# kernel runs under the interpreter.
import torch  # noqa: E402  (importing torch does not import triton)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hypothesis import HealthCheck, settings

from specdec.rng import TorchRandom

torch.set_num_threads(1)

settings.register_profile(
    "specdec",
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("specdec")


@pytest.fixture
def torch_rng() -> TorchRandom:
    """A :class:`TorchRandom` seeded with 0 (fresh for every test)."""
    return TorchRandom.seeded(0)
