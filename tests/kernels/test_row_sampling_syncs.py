"""The host-sync budget of a mixed-sampling batch (issue 56, deliverable 3): 4 rows under 4
sampling configurations (greedy among them) stay within :data:`BUDGET` sync-type events per step
on the CPU default, with ``kernel="torch"`` and with ``kernel="triton"`` (Triton's interpreter),
as every other path of ``tests/kernels/test_sync_budget.py`` (the same models and trees)."""

from __future__ import annotations

import pytest

import specdec
from specdec.testing.counter import StepCounter
from tests.kernels.test_sync_budget import BUDGET, PROMPTS, TREE, models  # noqa: F401 (the fixture)

MIXED = [specdec.SamplingConfig(temperature=1.0), specdec.SamplingConfig(temperature=0.7, top_k=40),
         specdec.SamplingConfig(temperature=1.0, top_p=0.9), specdec.SamplingConfig(temperature=0.0)]


def mixed_syncs_per_step(models, method: str, kernel: str, tokens: int = 12):  # noqa: F811
    target, draft = models
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel=kernel, **TREE)
    gen.generate_batch(PROMPTS, 4, MIXED, seeds=[0, 1, 2, 3])  # warm-up: per-shape index tensors made once
    with StepCounter() as counter:
        out = gen.generate_batch(PROMPTS, tokens, MIXED, seeds=[0, 1, 2, 3])
    return counter.syncs / out.steps, counter


# Triton's interpreter runs the kernel on the host, about 70-90 s per 12-token run: the triton cases are in the
# slow suite (CI time); a shorter run is no cheaper per step (the prefill's copies are shared by fewer steps).
# The mixed batch's one launch per step and its rows' equality run in the default suite
# (tests/kernels/test_row_sampling_kernel.py).
@pytest.mark.parametrize("method, kernel", [
    ("eagle3", "auto"), ("eagle3", "torch"), pytest.param("eagle3", "triton", marks=pytest.mark.slow),
    ("rheo", "auto"), ("rheo", "torch"), pytest.param("rheo", "triton", marks=pytest.mark.slow),
])
def test_a_mixed_sampling_batch_stays_within_the_budget(models, method, kernel):  # noqa: F811
    if kernel == "triton":
        pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    per_step, counter = mixed_syncs_per_step(models, method, kernel)
    assert per_step <= BUDGET, counter.report()
