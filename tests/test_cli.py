"""The ``specdec`` command line: ``list`` and ``demo``, and their errors."""

from __future__ import annotations

import doctest
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from specdec import cli, demo
from specdec.registry import ROLES, get, list_registered, register, unregister
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.tree import NodeKind, SampleMode
from specdec.verify.base import NodeOutcome, Verifier
from specdec.verify.rejection import RejectionIIDVerifier, recursive_rejection


class _MatchRule(Verifier):
    """Test-only sample-and-match (docs/verifiers.md rule 2): draw z ~ p, accept the child equal to z."""

    supported_kinds = frozenset({NodeKind.DETERMINISTIC})
    supported_modes = frozenset({SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT})

    def verify_node(self, tree, node, p_node, rng):
        z = rng.categorical(p_node)
        for child in tree.children(node):
            if int(tree.tokens[child]) == z:
                return NodeOutcome(accepted_child=child)
        return NodeOutcome(bonus_token=z)


class _AlwaysAcceptFirst(Verifier):
    """Test-only LOSSY rule: accepts the first sampled child, whatever p says."""

    supported_kinds = frozenset({NodeKind.SAMPLED})
    supported_modes = frozenset({SampleMode.IID})
    lossless = False

    def verify_node(self, tree, node, p_node, rng):
        kids = tree.children(node)
        if kids:
            return NodeOutcome(accepted_child=kids[0])
        return NodeOutcome(bonus_token=rng.categorical(p_node))


class _BonusFromP(RejectionIIDVerifier):
    """Test-only LOSSY mutant of rule 3 that claims to be lossless: when every child is
    rejected it draws the bonus from p instead of the residual."""

    def verify_node(self, tree, node, p_node, rng):
        p = p_node.to(torch.float64)
        P = p / p.sum()
        children = tree.sampled_children(node)
        if children:
            q = tree.law_of(children[0]).dense(tree.vocab_size, dtype=torch.float64)
            tokens = [int(tree.tokens[c]) for c in children]
            accepted, _ = recursive_rejection(P, q, children, tokens, rng, without_replacement=False)
            if accepted is not None:
                return NodeOutcome(accepted_child=accepted)
        return NodeOutcome(bonus_token=rng.categorical(P))  # the bug: P is p, not the final residual


@pytest.fixture
def toy_verifiers():
    register("verifier", "zz-test-match")(_MatchRule)
    register("verifier", "zz-test-lossy")(_AlwaysAcceptFirst)
    yield
    unregister("verifier", "zz-test-match")
    unregister("verifier", "zz-test-lossy")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------- list
def test_list_all_roles_shows_registered_names(capsys, toy_verifiers):
    code, out, err = run(capsys, "list")
    assert code == 0, err
    assert "verifier (" in out
    assert "zz-test-match" in out and "Test-only sample-and-match" in out
    for role in ROLES:
        for name in list_registered(role):
            assert f"  {name}" in out


def test_list_role_and_pattern(capsys, toy_verifiers):
    code, out, _ = run(capsys, "list", "verifier", "--pattern", "zz-test-m*")
    assert code == 0
    assert "zz-test-match" in out
    assert "zz-test-lossy" not in out
    assert out.splitlines()[0] == "verifier (1):"


MARKUP = re.compile(r"`|:[a-z:]+:|\]\(|\*\*")


@pytest.mark.parametrize("role", ROLES)
def test_list_summaries_are_plain_full_sentences(role):
    """Issue 43: `specdec list` printed raw markup (``x``, :class:`X`) and sentences cut at a line break."""
    for name in list_registered(role):
        obj = get(role, name)
        line = cli._summary(obj)
        assert line and not MARKUP.search(line), (name, line)
        assert "\n" not in line and "  " not in line, (name, line)
        # a full sentence, or the whole first paragraph of the description
        text = obj.description if role == "method" else inspect.getdoc(obj)
        paragraph = " ".join(text.strip().split("\n\n")[0].split())
        assert line.endswith(".") or line == cli._plain(paragraph), (name, line)


def test_list_summary_joins_wrapped_lines_and_strips_markup():
    class Rule:
        """Rule 5: sampled children first (against ``q'``, see :class:`~specdec.tree.SparseLaw`,
        :meth:`the walk <specdec.verify.base.Verifier.verify>` and [the guide](docs/verifiers.md)),
        then *rule 2*. A second sentence.

        A second paragraph.
        """

    assert cli._summary(Rule) == ("Rule 5: sampled children first (against q', see SparseLaw, the walk and the "
                                  "guide), then rule 2.")
    assert cli._summary(get("target", "hf")).endswith("Mistral) as the target p.")  # wrapped in its docstring
    assert cli._summary(get("verifier", "rejection-iid")) == ("Rule 3: recursive rejection for sampled children "
                                                              "drawn i.i.d. from q'.")  # i.i.d. ends no sentence
    failures, tried = doctest.testmod(cli, verbose=False)
    assert tried >= 3 and failures == 0


def test_list_pattern_matching_nothing_exits_1(capsys):
    code, out, err = run(capsys, "list", "verifier", "--pattern", "no-such-*")
    assert code == 1
    assert "no registered name" in err and "no-such-*" in err


def test_list_unknown_role_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["list", "verifiers"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_no_subcommand_and_unknown_subcommand_fail(capsys):
    for argv in ([], ["frobnicate"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("specdec ")


# ------------------------------------------------------------------- demo
def test_demo_runs_every_registered_method_and_verifier(capsys, toy_verifiers):
    code, out, err = run(capsys, "demo", "--trees", "30", "--vocab", "5", "--depth", "2", "--max-new-tokens", "6")
    assert code == 0, out + err
    assert "tau = tokens emitted per target forward" in out
    first_words = [line.split()[0] for line in out.splitlines() if line.strip()]
    for name in list_registered("verifier") + list_registered("method"):
        assert name in first_words, name
    assert "FAILED" not in out


def test_demo_flags_a_method_that_is_not_greedy_exact(capsys, toy_verifiers):
    from specdec.methods import Method

    register("method", "zz-test-broken")(Method("zz-test-broken", "chain", "zz-test-lossy", {"depth": 3}))
    try:
        rows = cli.run_method_demo(max_new_tokens=12, vocab=12, seed=0, methods="zz-test-broken")
        assert len(rows) == 1 and rows[0].error is None
        assert not rows[0].greedy_matches  # accepting every draft reproduces the draft, not the target
        code, out, _ = run(capsys, "demo", "--methods", "zz-test-broken", "--verifiers", "none", "--max-new-tokens", "12")
        assert code == 1
        assert "NO" in out
    finally:
        unregister("method", "zz-test-broken")


def test_demo_method_rows_are_greedy_exact():
    rows = cli.run_method_demo(max_new_tokens=10, vocab=6)
    assert [r.method for r in rows] == list_registered("method")
    for r in rows:
        assert r.error is None, r
        assert r.greedy_matches, r.method
        assert r.new_tokens == 10 and 1.0 <= r.tau and r.target_forwards >= 1
        assert all(0.0 <= a <= 1.0 for a in r.acceptance_by_depth)


@pytest.mark.parametrize("argv", [
    ["demo", "--trees", "0"],
    ["demo", "--trees", "many"],
    ["demo", "--temperature", "-1"],
    ["demo", "--temperature", "nan"],
    ["demo", "--width", "-2"],
])
def test_demo_bad_arguments_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_demo_vocab_of_one_is_a_clear_error(capsys):
    code, _, err = run(capsys, "demo", "--vocab", "1")
    assert code == 2
    assert "at least 2 tokens" in err


def test_demo_nothing_matching_exits_1(capsys):
    code, _, err = run(capsys, "demo", "--verifiers", "no-such-*", "--methods", "no-such-*")
    assert code == 1
    assert "no registered method" in err and "no registered verifier" in err


@pytest.mark.parametrize(("flag", "role"), [("--methods", "method"), ("--verifiers", "verifier")])
@pytest.mark.parametrize("pattern", ["zzz*", ""])
def test_demo_pattern_matching_nothing_is_an_error(capsys, flag, role, pattern):
    """Issue 16, defect 4c: one part's pattern matching nothing used to skip that part and exit 0."""
    code, out, err = run(capsys, "demo", flag, pattern, "--trees", "5", "--vocab", "4", "--max-new-tokens", "4")
    assert code == 1
    assert out == ""  # refused before either part runs
    assert f"no registered {role} matches {pattern!r}" in err and f"{flag} none" in err
    for name in list_registered(role):
        assert name in err  # the message lists what is registered


def test_demo_none_skips_a_part(capsys):
    code, out, err = run(capsys, "demo", "--methods", "none", "--trees", "5", "--vocab", "4", "--depth", "1")
    assert code == 0, err
    assert "Part 1" not in out and "Part 2" in out
    code, out, err = run(capsys, "demo", "--verifiers", "none", "--methods", "sd", "--vocab", "4",
                         "--max-new-tokens", "4")
    assert code == 0, err
    assert "Part 1" in out and "Part 2" not in out
    code, _, err = run(capsys, "demo", "--verifiers", "none", "--methods", "none")
    assert code == 1 and "nothing to run" in err


def test_demo_statistics_separate_lossless_from_lossy(toy_verifiers):
    rows = {r.verifier: r for r in cli.run_demo(trees=1500, vocab=6, depth=2, verifiers="zz-test-*")}
    good, bad = rows["zz-test-match"], rows["zz-test-lossy"]
    assert good.recipe == "deterministic"
    assert bad.recipe == "sampled-iid"
    # a lossless rule is within sampling noise of direct sampling from the target ...
    assert good.tv_first_token < 2.5 * good.tv_reference + 0.02
    # ... the rule that always accepts the draft emits the draft's law instead
    assert bad.tv_first_token > 3 * bad.tv_reference + 0.05
    assert bad.tau == pytest.approx(3.0)  # always accepts 2 levels, plus the bonus
    assert 1.0 <= good.tau <= 3.0
    assert not bad.declared_lossless and good.declared_lossless
    # the verdicts are measured: the lossy rule fails its test, and is reported lossy as it declares
    assert good.passed and good.verdict == "pass" and not good.failed
    assert not bad.passed and bad.verdict == "lossy (declared)" and not bad.failed
    assert bad.p_value < 1e-12 and good.alpha == pytest.approx(demo.DEFAULT_ALPHA / 2)  # Bonferroni over 2


PLUGIN = """\
from specdec.registry import register
from specdec.verify.rejection import RejectionIIDVerifier


@register("verifier", "zz-test-plugin-rule")
class PluginRule(RejectionIIDVerifier):
    \"\"\"Rule 3 from a plug-in file (``zz``), see :class:`RejectionIIDVerifier`.\"\"\"
"""


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "zz_cli_plugin.py"
    path.write_text(PLUGIN)
    yield path
    if "zz-test-plugin-rule" in list_registered("verifier"):
        unregister("verifier", "zz-test-plugin-rule")
    sys.modules.pop("zz_cli_plugin", None)


def test_list_and_demo_load_a_plugin(capsys, plugin_file):
    code, out, err = run(capsys, "list", "verifier", "--plugin", str(plugin_file))
    assert code == 0, err
    assert "zz-test-plugin-rule  Rule 3 from a plug-in file (zz), see RejectionIIDVerifier.  [zz_cli_plugin.py]" in out
    assert "[specdec" not in out  # built-ins are not labelled
    code, out, err = run(capsys, "demo", "--plugin", str(plugin_file), "--methods", "none", "--verifiers",
                         "zz-test-plugin-rule", "--trees", "50", "--vocab", "5")
    assert code == 0, err
    assert re.search(r"^zz-test-plugin-rule .* pass +lossless$", out, re.MULTILINE), out


@pytest.mark.parametrize("command", [["list"], ["demo", "--methods", "none"]])
def test_a_plugin_that_cannot_be_loaded_is_bad_input(capsys, tmp_path, command):
    empty = tmp_path / "zz_cli_empty.py"
    empty.write_text("X = 1\n")
    try:
        code, out, err = run(capsys, *command, "--plugin", str(empty))
        assert code == 2 and out == ""
        assert err.startswith(f"specdec {command[0]}: error: plug-in module {str(empty)!r} registered nothing")
        code, _, err = run(capsys, *command, "--plugin", "zz_cli_no_such_module")
        assert code == 2 and "plug-in module 'zz_cli_no_such_module' failed to import: ModuleNotFoundError" in err
    finally:
        sys.modules.pop("zz_cli_empty", None)


def test_demo_verdicts_are_measured_and_a_lossy_mutant_fails_the_run(capsys):
    """Issue 43: the demo printed each verifier's own `lossless` flag as its verdict, and
    exited 0 for lossy mutants. At the defaults (400 trees, seed 0) every built-in verifier
    passes its test and a rule-3 mutant drawing its bonus from p fails it, and the run."""
    register("verifier", "zz-test-bonus-from-p")(_BonusFromP)
    try:
        code, out, err = run(capsys, "demo", "--methods", "none")
    finally:
        unregister("verifier", "zz-test-bonus-from-p")
    assert code == 1, out + err
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for name in list_registered("verifier"):
        assert re.search(r"\s[0-9.e+-]+  pass +lossless$", lines[name]), lines[name]
    assert re.search(r"\s[0-9.e+-]+  FAIL +lossless$", lines["zz-test-bonus-from-p"])
    assert "FAILED: zz-test-bonus-from-p: declared lossless" in out
    n = len(list_registered("verifier")) + 1
    assert f"alpha = 0.001 / {n} verifier(s) = {0.001 / n:.3g}" in out  # Bonferroni, stated
    assert "Power: a FAIL is at least 90% likely" in out
    assert re.search(r"at T=1 for a first-token law at total variation >= 0\.1\d\d from", out)
    assert "lossless yes" not in out


def test_demo_a_verifier_declared_lossy_that_fails_does_not_fail_the_run(capsys, toy_verifiers):
    code, out, err = run(capsys, "demo", "--methods", "none", "--verifiers", "zz-test-lossy")
    assert code == 0, err
    assert re.search(r"^zz-test-lossy .* lossy \(declared\) +lossy$", out, re.MULTILINE), out
    assert "FAILED" not in out


def test_demo_power_statement_holds():
    """The stated power is met: a law at the stated TV (spread as evenly as the bins allow)
    fails the test in at least 90% of simulated runs."""
    from specdec.testing import chi_square_test

    p = torch.tensor([0.45, 0.25, 0.15, 0.1, 0.05], dtype=torch.float64)
    n, level = 400, 1e-3 / 6
    law = dict(enumerate(p.tolist()))
    dof = chi_square_test([0] * n, law).dof
    tv = demo.detectable_tv(p, n, dof, level)
    assert 0.05 < tv < 0.3
    half = torch.tensor([1.0, 0, 0, 0, 1.0], dtype=torch.float64)  # a set of mass 1/2: the weakest chi2 for a TV
    shifted = p + tv * (half * p / (half * p).sum() - (1 - half) * p / ((1 - half) * p).sum())
    assert 0.5 * float((shifted - p).abs().sum()) == pytest.approx(tv)
    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(shifted.expand(400, -1), n, replacement=True, generator=gen)
    fails = sum(chi_square_test(row.tolist(), law).p_value < level for row in draws)
    assert fails / 400 >= 0.88  # >= 0.9 up to simulation noise
    failures, tried = doctest.testmod(demo, verbose=False)
    assert tried >= 3 and failures == 0


def test_demo_trees_follow_the_recipes():
    target, draft = cli.toy_models(7, seed=3)
    sampling = SamplingConfig(temperature=1.0)
    rng = TorchRandom.seeded(0)
    for recipe in ("deterministic", "mixed", "sampled-iid", "sampled-wor", "sampled-chain"):
        draft.begin([2])
        tree = cli.demo_tree(2, draft, sampling, recipe, depth=2, width=3, rng=rng)
        assert tree.num_nodes == (1 + 2 if recipe == "sampled-chain" else 1 + 3 + 9)  # a chain for chain-only rules
        kinds = set(tree.kinds[1:].tolist())
        if recipe == "deterministic":
            assert kinds == {NodeKind.DETERMINISTIC}
        elif recipe == "mixed":
            assert kinds == {NodeKind.DETERMINISTIC, NodeKind.SAMPLED}
            for node in range(tree.num_nodes):
                if tree.children(node):
                    law = tree.sampled_law_at(node)
                    # q' excludes the deterministic siblings (RheoSampling slots)
                    for d in tree.deterministic_children(node):
                        assert law.prob_of(int(tree.tokens[d])) == 0.0
        else:
            assert kinds == {NodeKind.SAMPLED}
            mode = SampleMode.WITHOUT_REPLACEMENT if recipe == "sampled-wor" else SampleMode.IID
            assert all(law.mode == mode for law in tree.laws)
        # the recorded laws are the draft's processed laws q after each node's path
        if recipe in ("sampled-iid", "sampled-wor"):
            draft.begin([2])
            q_root = draft.root_distribution(sampling)
            assert torch.allclose(tree.sampled_law_at(0).dense(7), q_root)


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "specdec"
    if not script.exists():
        pytest.skip("specdec console script not installed next to this interpreter")
    done = subprocess.run([str(script), "list", "method"], capture_output=True, text=True, timeout=120)
    assert done.returncode == (0 if list_registered("method") else 1), done.stderr
    bad = subprocess.run([str(script), "list", "nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_train_commands_are_dispatched_with_their_own_parsers(capsys) -> None:
    from specdec.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train-eagle", "--help"])
    assert exc.value.code == 0 and "--version" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["train-draft"])  # --target and --out are required
    assert exc.value.code == 2 and "--target" in capsys.readouterr().err
