"""``benchmarks/rheo_calibration.py`` computes Rheo's and EAGLE's node
acceptance in closed form; here each number is checked against the exact law
of the real verifiers (``mixed`` for Rheo's top-(K-1) plus one sampled child,
``match`` for EAGLE's top-K), enumerated over every random branch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from verify_cases import Mix, NodeCase, run_node_case

from specdec.registry import get
from specdec.tree import SampleMode

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rheo_calibration.py"


def _script():
    spec = importlib.util.spec_from_file_location("rheo_calibration", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("K,M", [(2, 4), (3, 5), (3, 6)])
def test_slot_formula_equals_the_verifiers_exact_acceptance(seed, K, M):
    slot_acceptance = _script().slot_acceptance
    V = 6
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, 0)
    q = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 2, 0)
    order = torch.argsort(q, descending=True, stable=True)
    S, cand = order[: K - 1].tolist(), order[K - 1 : M]
    q_prime = torch.zeros(V, dtype=torch.float64)
    q_prime[cand] = q[cand] / q[cand].sum()
    eagle, p_s, slot, residual = slot_acceptance(p, q, K, M)

    rheo_case = NodeCase(V, p, q, q_prime, S, Mix(1, SampleMode.IID, K - 1), False)
    assert run_node_case(get("verifier", "mixed")(), rheo_case).acceptance == pytest.approx(p_s + slot, abs=1e-12)
    eagle_case = NodeCase(V, p, q, q_prime, order[:K].tolist(), Mix(0, SampleMode.IID, K), False)
    assert run_node_case(get("verifier", "match")(), eagle_case).acceptance == pytest.approx(eagle, abs=1e-12)
    assert residual == pytest.approx(1 - float(q[S].sum()))
    assert p_s == pytest.approx(float(p[S].sum()))
