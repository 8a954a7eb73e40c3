"""Issue 56: the engine path's functions take at most 8 parameters, and the loop reads top to
bottom in named phases around one request record.

Every function (and method) defined in ``specdec.engine.loop`` and ``specdec.engine.step``
takes at most 8 parameters (``self`` counted), except the two documented compatibility forms
``run_rows`` and ``run_step``, which build the records and call the engine path
(``decode_rows``, ``step_rows``). The loop's phases are each run as often as their role says:
``_check`` and ``_start`` once per generation, ``_step`` and ``_stop`` once per step,
``_retire`` once per step that some row outlives.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest
import torch

import specdec.engine.loop as loop
import specdec.engine.records as records
import specdec.engine.step as step
from specdec.adapters import rows_draft, rows_target
from specdec.engine import Roles, choose_verification, RowsRequest, StepInputs, decode_rows, run_rows, run_step, step_rows
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing import markov_pair
from specdec.trees.static import StaticTreeBuilder
from specdec.verify.rejection import RejectionIIDVerifier

LIMIT = 8
WRAPPERS = {"run_rows", "run_step"}


def defined_functions(module) -> list[tuple[str, int]]:
    """``(qualified name, parameter count)`` of every function and method the module's source defines."""
    tree = ast.parse(pathlib.Path(inspect.getfile(module)).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
            out.append((node.name, count))
    return out


@pytest.mark.parametrize("module", [loop, step], ids=lambda m: m.__name__)
def test_no_engine_function_takes_more_than_eight_parameters(module) -> None:
    found = defined_functions(module)
    assert len(found) >= 5  # not vacuous: the module's functions were read
    # the count sees a long signature: each module's compatibility form is read, and is over the limit
    assert [n for name, n in found if name in WRAPPERS] == [19 if module is loop else 18]
    over = [(name, n) for name, n in found if n > LIMIT and name not in WRAPPERS]
    assert over == [], over
    # the source count agrees with inspect.signature wherever the function is a module attribute
    for name, n in found:
        fn = getattr(module, name, None)
        if inspect.isfunction(fn) and fn.__module__ == module.__name__:
            assert len(inspect.signature(fn).parameters) == n, name


def test_the_record_forms_and_wrappers() -> None:
    for fn in (loop.decode_rows, step.step_rows, step.decide_rows, loop.profile_steps):
        assert len(inspect.signature(fn).parameters) <= LIMIT, fn.__name__
    # the compatibility forms keep their public signatures (docs/api/public.md, deprecation policy)
    assert len(inspect.signature(run_rows).parameters) == 19
    assert len(inspect.signature(run_step).parameters) == 18
    assert decode_rows is loop.decode_rows and step_rows is step.step_rows
    assert Roles is records.Roles and StepInputs is records.StepInputs and RowsRequest is loop.RowsRequest


def _setup():
    target, draft = markov_pair(vocab_size=12, seed=3)
    builder = StaticTreeBuilder(expansion=(2, 1))
    return target, draft, builder, RejectionIIDVerifier()


def test_run_rows_runs_the_phases_in_their_roles(monkeypatch) -> None:
    calls: dict[str, int] = {}

    def counted(name):
        phase = getattr(loop, name)

        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return phase(*args, **kwargs)

        monkeypatch.setattr(loop, name, wrapper)

    for name in ("_check", "_start", "_step", "_stop", "_retire"):
        counted(name)
    target, draft, builder, verifier = _setup()
    prompts = [[1, 2, 3], [4, 5]]
    sources = [TorchRandom.seeded(7), TorchRandom.seeded(8)]
    reports = list(run_rows(target, draft, builder, verifier, prompts, SamplingConfig(temperature=1.0), sources,
                            max_new_tokens=9, named=True))
    steps = len(reports)
    assert steps >= 3
    assert calls == {"_check": 1, "_start": 1, "_step": steps, "_stop": steps, "_retire": steps - 1}
    assert all(sum(len(report.kept[r]) for report in reports if r in report.kept) == 9 for r in range(2))


def test_the_wrapper_and_the_record_form_agree() -> None:
    def tokens(reports):
        return [(report.rows, report.kept) for report in reports]

    sampling = SamplingConfig(temperature=0.8)
    target, draft, builder, verifier = _setup()
    old = tokens(run_rows(target, draft, builder, verifier, [[1, 2, 3]], sampling, [TorchRandom.seeded(5)],
                          max_new_tokens=10, logprobs=True))
    target, draft, builder, verifier = _setup()
    request = RowsRequest([[1, 2, 3]], sampling, [TorchRandom.seeded(5)], 10, logprobs=True)
    new = tokens(decode_rows(Roles(target, draft, builder, verifier), request))
    assert old == new and sum(len(kept[0]) for _, kept in old) == 10


def test_run_step_is_step_rows() -> None:
    sampling = SamplingConfig(temperature=1.0)
    outs = []
    for form in ("run_step", "step_rows"):
        target, draft, builder, verifier = _setup()
        target, draft = rows_target(target, 1), rows_draft(draft, 1)
        target.prefill_batch([[1, 2, 3]], positions=32)
        draft.begin_rows([[1, 2, 3]], None, positions=32)
        verification = choose_verification(verifier, sampling, "torch", torch.device("cpu"))
        roots = torch.tensor([3])
        rng = TorchRandom.seeded(11)
        with torch.inference_mode():
            if form == "run_step":
                out = run_step(target, draft, builder, verifier, verification, sampling, rng, roots, logprobs=True)
            else:
                out = step_rows(Roles(target, draft, builder, verifier), verification, sampling, rng, roots,
                                StepInputs(logprobs=True))
        outs.append(out)
    assert outs[0].results == outs[1].results
    assert torch.equal(outs[0].logprobs, outs[1].logprobs)
