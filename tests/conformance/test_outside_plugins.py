"""The conformance command on a set of outside plug-ins (issue 43): every correct plug-in passes,
every lossy mutant fails naming its first bad case (in the suite that must catch it), every bad
module is refused with exit status 2 and a message naming the module and the name.

The plug-ins are plain modules in ``tests/conformance/outside/`` (not a package: no
``__init__.py``), imported by the command in a subprocess with that folder on ``PYTHONPATH``,
as an author's own package would be; so nothing they register reaches this test session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

OUTSIDE = Path(__file__).resolve().parent / "outside"

def run(*args: str, cwd: Path, module: str = "specdec.testing.conformance", timeout: int = 600):
    """``python -m <module> *args`` with the outside folder on PYTHONPATH, in ``cwd``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",  # one thread: tiny tensors, busy CPU
           "PYTHONPATH": os.pathsep.join([str(OUTSIDE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def report(stdout: str, role: str, name: str) -> str:
    """The report block of ``role`` ``name`` in the command's output: its PASS/FAIL/SKIP line and the lines under it."""
    match = re.search(rf"^(PASS|FAIL|SKIP)  {role} '{re.escape(name)}'.*?(?=^\S|\Z)", stdout, re.MULTILINE | re.DOTALL)
    assert match, f"no report for {role} {name!r} in:\n{stdout}"
    return match.group(0)


def assert_fails(stdout: str, role: str, name: str, first_case: str, *words: str) -> None:
    block = report(stdout, role, name)
    assert block.startswith("FAIL"), block
    case = re.search(r"first failing case: (.*)", block)
    assert case and case.group(1).startswith(first_case), block
    for word in words:
        assert word in block, f"{word!r} not in:\n{block}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """An empty folder: the command must find the plug-ins through PYTHONPATH, not the working directory."""
    return tmp_path_factory.mktemp("conformance_outside")


# ------------------------------------------------------------------ correct plug-ins
def test_correct_verifiers_pass(workdir):
    done = run("good_match", "good_rejection", "--quick", "--quiet", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "good_match: registers verifier 'outside-match'" in done.stdout
    for name in ("outside-match", "outside-rejection"):
        block = report(done.stdout, "verifier", name)
        assert block.startswith("PASS"), block
        for suite in ("per-node", "whole-tree", "composition", "statistical", "greedy", "batch"):
            assert re.search(rf"{suite} [1-9]", block), (suite, block)
    assert "2 passed, 0 failed" in done.stdout


@pytest.fixture(scope="module")
def builders_run(workdir):
    """The command on the correct outside builder and the method that uses it."""
    return run("good_nucleus", "good_method", "--quick", "--quiet", cwd=workdir)


def test_correct_builder_and_method_pass(builders_run):
    done = builders_run
    assert "good_method: registers method 'outside-nucleus-sd'" in done.stdout
    assert report(done.stdout, "tree", "outside-nucleus").startswith("PASS"), done.stdout
    assert report(done.stdout, "method", "outside-nucleus-sd").startswith("PASS"), done.stdout
    assert done.returncode == 0, done.stdout + done.stderr


def test_correct_builder_and_method_pass_the_exact_suites(builders_run, workdir):
    """Until the gap above is closed: the builder and the method pass every exact case (whole-tree,
    composition) before their first end-to-end case, which fails only because it cannot run."""
    for role, name, exact in (("tree", "outside-nucleus", "whole-tree 12, composition"),
                              ("method", "outside-nucleus-sd", "whole-tree 3")):
        block = report(builders_run.stdout, role, name)
        if block.startswith("FAIL"):
            assert exact in block, block
            assert "first failing case: statistical" in block and "grow B trees" in block, block
    code = ("from specdec.testing.conformance import conformance_cases\n"
            "from specdec.testing.suites import SuiteSettings\n"
            "cases = [c for c in conformance_cases('good_nucleus', 'good_method', settings=SuiteSettings.quick())\n"
            "         if c.case.suite not in ('statistical', 'batch')]\n"
            "assert len(cases) >= 18, len(cases)\n"
            "for c in cases: c.run()\n"
            "print('ran', len(cases))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(OUTSIDE)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=workdir, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_pytest_plugin_form(tmp_path):
    """``pytest -p specdec.testing.pytest_plugin --specdec-conformance MODULE``: one item per case, all pass."""
    done = run("-p", "specdec.testing.pytest_plugin", "--specdec-conformance", "good_match", "--specdec-quick",
               "-q", "-p", "no:cacheprovider", cwd=tmp_path, module="pytest")
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) > 100, done.stdout
    assert "failed" not in done.stdout


# ------------------------------------------------------------------ drafts (issue 56)
def test_a_plugin_draft_is_proven(workdir):
    """A draft with a factory is proven: its laws, its rows mode against its one-row answers, and the methods
    ``sd`` and ``specinfer`` using it exact on a toy target; a draft without a rows mode has its rows case
    reported as SKIP (never a pass); a draft without a factory is reported as SKIP, naming how to declare one."""
    done = run("good_bigram", "good_bigram_one_row", "draft_no_factory", "--quick", "--quiet", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "good_bigram: registers draft 'outside-bigram'" in done.stdout
    block = report(done.stdout, "draft", "outside-bigram")
    assert block.startswith("PASS") and "SKIP" not in block, block
    for suite, n in (("laws", 3), ("rows", 1), ("whole-tree", 6), ("greedy", 1), ("batch", 1)):
        assert f"{suite} {n}" in block, (suite, block)
    block = report(done.stdout, "draft", "outside-bigram-one-row")
    assert block.startswith("PASS") and "rows 1" not in block, block
    assert "SKIP  rows: 3 ragged prompts, then rows 0 and 2: draft 'outside-bigram-one-row' (OneRowBigram) " \
           "declares no rows mode" in block, block
    block = report(done.stdout, "draft", "outside-bigram-no-factory")
    assert block.startswith("SKIP  draft 'outside-bigram-no-factory': no case could run"), block
    assert "declares no factory" in block and "register('draft', 'outside-bigram-no-factory', factory=" in block
    assert "2 passed, 0 failed, 1 skipped" in done.stdout


# ------------------------------------------------------------------ lossy mutants
MUTANTS = {  # module: (role, name, the first failing case's id starts with, words of the report)
    "mutant_no_residual": ("verifier", "outside-mutant-no-residual", "per-node 1iid", ("must be p =", "measured")),
    "mutant_root_residual": ("verifier", "outside-mutant-root-residual", "whole-tree ",
                             ("after 36 passing cases (per-node 36)", "differs: expected")),
    "mutant_unnormalised": ("verifier", "outside-mutant-unnormalised", "per-node 1iid",
                            ("raised InvalidDistributionError", "mutant_unnormalised.py")),
    "mutant_no_min": ("verifier", "outside-mutant-no-min", "per-node 1iid",
                      ("raised InvalidDistributionError", "not in [0, 1]")),
    "mutant_weight_as_q": ("verifier", "outside-mutant-weight-as-q", "per-node 1iid", ("must be p =",)),
    "mutant_raises": ("verifier", "outside-mutant-raises", "per-node 1iid V=4",
                      ("raised IndexError: lookup table", "after 6 passing cases")),
    "mutant_nucleus_full_law": ("tree", "outside-mutant-nucleus-full-law", "whole-tree ",
                                ("with its default verifier 'rejection-iid'", "differs: expected")),
    "mutant_later_sibling": ("tree", "outside-mutant-later-sibling", "whole-tree ",
                             ("with its default verifier 'rejection-iid'", "differs: expected")),
    "mutant_bigram_rows": ("draft", "outside-mutant-bigram-rows", "rows: ",
                           ("after 3 passing cases (laws 3)", "in rows mode, row 2", "alone gives")),
    "mutant_bigram_dead_end": ("draft", "outside-mutant-bigram-dead-end", "laws T1",
                               ("raised InvalidDistributionError", "entirely -inf")),
}


@pytest.fixture(scope="module")
def mutants_run(workdir):
    """All the mutants in one command (each is reported on its own; exit status 1)."""
    return run(*MUTANTS, "--quick", "--quiet", cwd=workdir)


def test_mutants_exit_1(mutants_run):
    assert mutants_run.returncode == 1, mutants_run.stdout + mutants_run.stderr
    assert f"0 passed, {len(MUTANTS)} failed" in mutants_run.stdout
    assert "PASS" not in mutants_run.stdout


@pytest.mark.parametrize("module", list(MUTANTS))
def test_mutant_fails_naming_its_first_bad_case(mutants_run, module):
    role, name, first_case, words = MUTANTS[module]
    assert f"{module}: registers {role} '{name}'" in mutants_run.stdout
    assert_fails(mutants_run.stdout, role, name, first_case, *words)


def test_correct_and_lossy_together(workdir):
    """One failing plug-in makes the exit status 1; the others are still proven and reported."""
    done = run("good_rejection", "mutant_root_residual", "--quick", "--quiet", cwd=workdir)
    assert done.returncode == 1, done.stdout + done.stderr
    assert report(done.stdout, "verifier", "outside-rejection").startswith("PASS")
    assert_fails(done.stdout, "verifier", "outside-mutant-root-residual", "whole-tree ")
    assert "1 passed, 1 failed" in done.stdout


# ------------------------------------------------------------------ bad modules
BAD = {  # module: what the one-line error must say
    "bad_empty": ("'bad_empty'", "registered nothing"),
    "bad_taken": ("'bad_taken'", "verifier 'rejection-iid'", "specdec.verify.rejection"),
    "bad_import": ("'bad_import'", "failed to import", "KeyError"),
    "bad_no_kinds": ("'bad_no_kinds'", "verifier 'outside-bad-no-kinds'", "supported_kinds"),
    "bad_batch_form": ("'bad_batch_form'", "tree 'outside-bad-batch-form'", "batch_form", "no feed_build of its own"),
}


@pytest.mark.parametrize("module", list(BAD))
def test_bad_module_exits_2_naming_module_and_name(workdir, module):
    done = run(module, "--quick", "--quiet", cwd=workdir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "PASS" not in done.stdout and "FAIL" not in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("conformance: error: plug-in module"), done.stderr
    for word in BAD[module]:
        assert word in error, error


def test_bad_module_beside_a_good_one_stops_before_any_case(workdir):
    done = run("good_match", "bad_empty", "--quick", "--quiet", cwd=workdir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'bad_empty' registered nothing" in done.stderr and "PASS" not in done.stdout
