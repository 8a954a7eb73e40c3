"""The conformance command and suites (specdec.testing.conformance / suites): correct rules pass,
every lossy mutant fails naming its first bad case, raising plug-ins fail, bad modules exit 2."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdec.errors import InvalidConfigError
from specdec.registry import ROLES, list_registered, register, unregister
from specdec.testing.conformance import ConformanceError, PluginCase, check_registered, conformance_cases, main
from specdec.testing.suites import SUITES, SuiteSettings, verifier_cases
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier

from .mutants import DeepBonusFromP, TopTwoRecordsFullLaw

sys.path.insert(0, str(Path(__file__).parents[1] / "verify"))
import verify_mutants  # noqa: E402 - the repository's lossy verifier mutants

EXACT = SuiteSettings.quick(suites=("per-node", "whole-tree"))
PREFIX = "conformance-test-"


@pytest.fixture
def registered() -> Iterator[None]:
    """Remove whatever a test registers."""
    before = {role: set(list_registered(role)) for role in ROLES}
    yield
    for role in ROLES:
        for name in set(list_registered(role)) - before[role]:
            unregister(role, name)


def _register(role: str, obj: object, name: str) -> str:
    register(role, PREFIX + name)(obj)
    return PREFIX + name


def test_the_deep_bonus_mutant_passes_per_node_and_fails_whole_tree(registered) -> None:
    name = _register("verifier", type("DeepBonus", (DeepBonusFromP,), {}), "deep-bonus")
    per_node = check_registered("verifier", name, SuiteSettings.quick(suites=("per-node",)))
    assert per_node.passed and per_node.counts["per-node"] > 0
    report = check_registered("verifier", name, EXACT)
    assert not report.passed
    case_id, failure = report.failure
    assert case_id.startswith("whole-tree ")
    assert "token 2 after context" in failure.message and "expected [" in failure.message
    assert "FAIL  verifier" in report.render() and "first failing case: whole-tree" in report.render()


LOSSY = [verify_mutants.RatioOnTopK, verify_mutants.MixedWithFullQ,
         verify_mutants.Rule3OnWithoutReplacement, verify_mutants.Rule4OnIID,
         verify_mutants.ForgetsToRenormaliseResidual, verify_mutants.ForgetsToRenormaliseQ,
         verify_mutants.KSeqRhoOne, verify_mutants.KSeqResidualOtherRho]


@pytest.mark.parametrize("mutant", LOSSY, ids=lambda c: c.__name__)
def test_every_lossy_mutant_fails_the_exact_suites(registered, mutant) -> None:
    name = _register("verifier", type(mutant.__name__, (mutant,), {}), mutant.__name__.lower())
    report = check_registered("verifier", name, EXACT)
    assert not report.passed, report.render()
    assert report.failure[0].split()[0] in ("per-node", "whole-tree")


@pytest.mark.parametrize("valid", [verify_mutants.KSeqRhoK, verify_mutants.MixedDeterministicFirst],
                         ids=lambda c: c.__name__)
def test_a_valid_but_unusual_rule_passes(registered, valid) -> None:
    """K-SEQ with rho = k, rule 5 testing S first: exact (lower acceptance only); the suites must pass them."""
    name = _register("verifier", type(valid.__name__, (valid,), {}), valid.__name__.lower())
    report = check_registered("verifier", name, SuiteSettings.quick(suites=("per-node", "whole-tree", "batch")))
    assert report.passed, report.render()


def test_a_builder_recording_the_wrong_law_fails(registered) -> None:
    name = _register("tree", type("TopTwo", (TopTwoRecordsFullLaw,), {}), "top-two")
    report = check_registered("tree", name, SuiteSettings.quick(suites=("whole-tree",)))
    assert not report.passed and report.failure[0].startswith("whole-tree ")


def test_the_builtin_rules_pass_the_exact_suites() -> None:
    for name in ("mixed", "rejection-wor"):
        report = check_registered("verifier", name, SuiteSettings.quick(suites=("per-node", "whole-tree")))
        assert report.passed, report.render()


def test_a_verifier_that_raises_fails_that_case(registered) -> None:
    class RaisesOnFour(Verifier):
        supported_kinds = frozenset({NodeKind.SAMPLED, NodeKind.DETERMINISTIC})
        supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})

        def verify_node(self, tree, node, p_node, rng):
            if tree.vocab_size == 4:
                raise RuntimeError("not ready for V=4")
            z = rng.categorical(p_node)
            for child in tree.children(node):
                if int(tree.tokens[child]) == z:
                    return NodeOutcome(accepted_child=child)
            return NodeOutcome(bonus_token=z)

    name = _register("verifier", RaisesOnFour, "raises")
    report = check_registered("verifier", name, EXACT)
    assert not report.passed
    assert "V=4" in report.failure[0]
    assert "raised RuntimeError: not ready for V=4" in report.failure[1].message
    case = next(c for c in verifier_cases(name, EXACT) if "V=4" in c.id)
    with pytest.raises(ConformanceError, match="raised RuntimeError: not ready for V=4"):
        PluginCase("verifier", name, case).run()


def test_suite_settings_refuse_an_unknown_suite() -> None:
    with pytest.raises(InvalidConfigError, match="per-node"):
        SuiteSettings(suites=("pre-node",))
    assert set(SUITES) == {"per-node", "whole-tree", "composition", "statistical", "greedy", "batch", "laws", "rows"}


GOOD = '''
from specdec.registry import register
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier


@register("verifier", "{name}")
class Match(Verifier):
    """Sample-and-match."""

    supported_kinds = frozenset({{NodeKind.DETERMINISTIC, NodeKind.SAMPLED}})
    supported_modes = frozenset({{SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT}})

    def verify_node(self, tree, node, p_node, rng):
        z = rng.categorical(p_node)
        for child in tree.children(node):
            if int(tree.tokens[child]) == z:
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token={bonus})
'''


def test_the_command_exit_status(registered, tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "conf_good.py").write_text(textwrap.dedent(GOOD.format(name=PREFIX + "cmd-good", bonus="z")))
    (tmp_path / "conf_bad.py").write_text(textwrap.dedent(GOOD.format(
        name=PREFIX + "cmd-bad", bonus="rng.categorical(p_node)")))  # a second draw: the bonus is not z
    (tmp_path / "conf_empty.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["conf_good", "--quick", "--suite", "per-node"]) == 0
    out = capsys.readouterr().out
    assert "conf_good: registers verifier 'conformance-test-cmd-good'" in out and "PASS  verifier" in out
    assert main(["conf_bad", "--quick", "--suite", "per-node", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  verifier 'conformance-test-cmd-bad'" in out and "first failing case: per-node" in out
    assert "must be p = [" in out and "measured [" in out
    assert main(["conf_empty"]) == 2
    assert "registered nothing" in capsys.readouterr().err
    assert main(["conf_missing_module"]) == 2
    assert "failed to import" in capsys.readouterr().err
    assert main([]) == 2


def test_conformance_cases_for_pytest(registered, tmp_path, monkeypatch) -> None:
    (tmp_path / "conf_cases.py").write_text(textwrap.dedent(GOOD.format(name=PREFIX + "cases", bonus="z")))
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = conformance_cases("conf_cases", settings=SuiteSettings.quick(suites=("per-node",)))
    assert cases and all(str(c).startswith("verifier conformance-test-cases: per-node ") for c in cases)
    for case in cases[:5]:
        case.run()
