"""One public command that proves a plug-in: ``python -m specdec.testing.conformance MODULE``.

It imports ``MODULE`` (:func:`specdec.plugins.load_plugin`), finds every
verifier, tree builder, draft and method it registered, and runs on each the suites of
:mod:`specdec.testing.suites`: exact per-node and whole-tree enumeration, exact
composition with every registered partner it fits, a seeded statistical test
through the generation loop, greedy equality at T=0 and batched = single-row
equality; a draft (built by its declared factory) gets the suites of
:mod:`specdec.testing.draft_suites`: its laws, its rows mode, and methods using it
exact on a toy target. It prints one report per plug-in (pass with the number of
cases per suite, or the first failing case with the node or token position, the
expected and the measured law; every case that could not run as a ``SKIP`` line
with the reason) and exits 0 when no plug-in fails, 1 when one fails,
2 when a module cannot be loaded. A case that raises is a failing case.

The same checks run inside pytest (the author's own suite) with
:func:`conformance_cases`:

    import pytest
    from specdec.testing.conformance import conformance_cases

    @pytest.mark.parametrize("case", conformance_cases("my_pkg.rules"), ids=str)
    def test_conformance(case):
        case.run()

or with the pytest plug-in: ``pytest -p specdec.testing.pytest_plugin --specdec-conformance my_pkg.rules``.
"""

from __future__ import annotations

import argparse
import sys
import unittest
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import attrs

from specdec.errors import InvalidConfigError, SpecDecError
from specdec.plugins import Plugin, load_entry_point_plugins, load_plugin, shown_name
from specdec.testing.draft_suites import draft_cases
from specdec.testing.suites import (
    SUITES,
    Case,
    Failure,
    Skipped,
    SuiteSettings,
    method_cases,
    tree_cases,
    verifier_cases,
)

__all__ = ["ConformanceError", "ConformanceSkipped", "PluginCase", "PluginReport", "check_registered",
           "conformance_cases", "main", "run_conformance"]

CHECKED_ROLES = ("verifier", "tree", "draft", "method")
"""The roles the suites prove (a ``target`` is not proven by this command)."""

_SUITES: dict[str, Callable[[str, SuiteSettings], Iterator[Case]]] = {
    "verifier": verifier_cases, "tree": tree_cases, "draft": draft_cases, "method": method_cases,
}


class ConformanceError(AssertionError):
    """A conformance case failed (raised by :meth:`PluginCase.run` inside pytest)."""


class ConformanceSkipped(unittest.SkipTest):
    """A conformance case could not run (raised by :meth:`PluginCase.run`; pytest reports it as skipped)."""


@attrs.frozen
class PluginCase:
    """One case of one registered plug-in, runnable inside pytest.

    Attributes:
        role: the registry role (``verifier``, ``tree`` or ``method``).
        name: the registered name.
        case: the :class:`~specdec.testing.suites.Case`.
    """

    role: str
    name: str
    case: Case

    def __str__(self) -> str:
        return f"{self.role} {self.name}: {self.case.id}"

    def run(self) -> None:
        """Run the case; raise :class:`ConformanceError` with the failure's message, or
        :class:`ConformanceSkipped` with the reason it could not run."""
        outcome = _run_case(self.case)
        if isinstance(outcome, Skipped):
            raise ConformanceSkipped(f"{self}: SKIP: {outcome.reason}")
        if outcome is not None:
            raise ConformanceError(f"{self}: {outcome.message}")


@attrs.frozen
class PluginReport:
    """What the suites found for one registered plug-in.

    Attributes:
        role: the registry role.
        name: the registered name.
        counts: cases passed per suite (the failing suite's count stops at its failure).
        failure: the first failing case's id and failure, or None.
        seconds: wall time.
        skipped: the id and reason of every case that could not run (neither passed nor failed).
    """

    role: str
    name: str
    counts: dict[str, int]
    failure: tuple[str, Failure] | None
    seconds: float
    skipped: tuple[tuple[str, Skipped], ...] = ()

    @property
    def passed(self) -> bool:
        """No case failed (cases that could not run are :attr:`skipped`, and said)."""
        return self.failure is None

    @property
    def proven(self) -> bool:
        """No case failed and at least one passed (False for a plug-in whose every case was skipped)."""
        return self.failure is None and sum(self.counts.values()) > 0

    def render(self) -> str:
        """The report's lines, as the command prints them: PASS, FAIL, or SKIP when no case could run;
        then one ``SKIP`` line per case that could not run."""
        done = ", ".join(f"{suite} {n}" for suite, n in self.counts.items()) or "no case"
        skips = "".join(f"\n      SKIP  {case_id}: {skip.reason}" for case_id, skip in self.skipped)
        noted = f", {len(self.skipped)} skipped" if self.skipped else ""
        if self.failure is None and not self.proven:
            return f"SKIP  {self.role} {self.name!r}: no case could run ({len(self.skipped)} skipped){skips}"
        if self.failure is None:
            return (f"PASS  {self.role} {self.name!r}: {sum(self.counts.values())} cases ({done}){noted} "
                    f"in {self.seconds:.1f} s{skips}")
        case_id, failure = self.failure
        return (f"FAIL  {self.role} {self.name!r} after {sum(self.counts.values())} passing cases ({done}){noted}, "
                f"{self.seconds:.1f} s\n      first failing case: {case_id}\n      {failure.message}{skips}")


def _run_case(case: Case) -> Failure | Skipped | None:
    try:
        return case.check()
    except Exception as exc:  # noqa: BLE001 - a plug-in that raises fails the case, never passes it
        return _raised(exc)


def check_registered(role: str, name: str, settings: SuiteSettings = SuiteSettings(),
                     progress: Callable[[str], None] | None = None) -> PluginReport:
    """Run every case of the registered ``role``/``name`` until the first failure.

    Raises:
        InvalidConfigError: ``role`` is not one of :data:`CHECKED_ROLES`.
    """
    if role not in _SUITES:
        raise InvalidConfigError(f"conformance checks roles {', '.join(CHECKED_ROLES)}, not {role!r}")
    start = time.perf_counter()
    counts: Counter[str] = Counter()
    skipped: list[tuple[str, Skipped]] = []
    cases = _SUITES[role](name, settings)
    while True:
        try:
            case = next(cases)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - making the cases calls the plug-in (constructors, declarations)
            return PluginReport(role, name, dict(counts), ("setting up the cases", _raised(exc)),
                                time.perf_counter() - start, tuple(skipped))
        if not settings.runs(case.suite):
            continue
        if progress is not None:
            progress(f"{role} {name}: {case.id}")
        outcome = _run_case(case)
        if isinstance(outcome, Skipped):
            skipped.append((case.id, outcome))
            continue
        if outcome is not None:
            return PluginReport(role, name, dict(counts), (case.id, outcome), time.perf_counter() - start,
                                tuple(skipped))
        counts[case.suite] += 1
    return PluginReport(role, name, dict(counts), None, time.perf_counter() - start, tuple(skipped))


def _raised(exc: BaseException) -> Failure:
    """The failure of a case that raised: the exception and the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return Failure(f"raised {type(exc).__name__}: {exc}{where}")


def _targets(plugins: Sequence[Plugin]) -> list[tuple[str, str]]:
    return [(role, name) for plugin in plugins for role in CHECKED_ROLES for name in plugin.names(role)]


def conformance_cases(*modules: str, settings: SuiteSettings = SuiteSettings()) -> list[PluginCase]:
    """Every case of every verifier, tree builder, draft and method the ``modules`` register, for
    ``pytest.mark.parametrize`` (ids: ``str(case)``). Loads the modules (:func:`~specdec.plugins.load_plugin`).

    Raises:
        PluginError: a module fails to import, registers nothing, or declares what it does not implement.
    """
    plugins = [load_plugin(m) for m in modules]
    return [PluginCase(role, name, case) for role, name in _targets(plugins) for case in _SUITES[role](name, settings)
            if settings.runs(case.suite)]


def run_conformance(modules: Sequence[str], settings: SuiteSettings = SuiteSettings(), *,
                    entry_points: bool = False, progress: Callable[[str], None] | None = None) -> list[PluginReport]:
    """Load ``modules`` (and, with ``entry_points``, the installed plug-ins of group
    ``specdec.plugins``) and report on everything they registered that the suites prove."""
    plugins = [load_plugin(m) for m in modules]
    if entry_points:
        plugins += load_entry_point_plugins()
    return [check_registered(role, name, settings, progress) for role, name in _targets(plugins)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specdec.testing.conformance",
        description="Prove that the verifiers, tree builders, drafts and methods a module registers are "
                    "lossless: exact enumeration, composition with registered partners, a seeded statistical test "
                    "through the generation loop, greedy and batch equality; a draft's laws and rows, and methods "
                    "using it exact on a toy target. Exit 0: none fails (cases that cannot run are reported as "
                    "SKIP); 1: one fails; 2: a module cannot be loaded.")
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="dotted module names that register plug-ins")
    parser.add_argument("--entry-points", action="store_true",
                        help="also check every installed plug-in of the entry-point group 'specdec.plugins'")
    parser.add_argument("--quick", action="store_true", help="fewer seeds and samples (less power)")
    parser.add_argument("--only", metavar="NAME", action="append", default=None,
                        help="check only this registered name (repeatable)")
    parser.add_argument("--suite", action="append", default=None, choices=SUITES,
                        help="run only this suite (repeatable; default: all)")
    parser.add_argument("--quiet", action="store_true", help="no progress line per case")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns the exit status."""
    args = _parser().parse_args(argv)
    if not args.modules and not args.entry_points:
        print("conformance: error: name at least one MODULE (or --entry-points)", file=sys.stderr)
        return 2
    settings = SuiteSettings.quick(args.suite) if args.quick else SuiteSettings(suites=args.suite)
    try:
        plugins = [load_plugin(m) for m in args.modules]
        if args.entry_points:
            plugins += load_entry_point_plugins()
    except SpecDecError as exc:
        print(f"conformance: error: {exc}", file=sys.stderr)
        return 2
    targets = [(r, n) for r, n in _targets(plugins) if args.only is None or n in args.only]
    for plugin in plugins:
        found = ", ".join(f"{role} {name!r}" for role in plugin.registered for name in plugin.names(role))
        shown = shown_name(plugin.module)  # a plug-in file by its name (its module's name is private)
        print(f"{shown.removesuffix('.py')}: registers {found}")
        unchecked = [f"{role} {name!r}" for role in plugin.registered if role not in CHECKED_ROLES
                     for name in plugin.names(role)]
        if unchecked:
            print(f"  not checked here: {', '.join(unchecked)} (this command proves verifiers, tree builders, "
                  "drafts and methods)")
    if not targets:
        print("conformance: error: nothing to check (no verifier, tree builder, draft or method matched)",
              file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        if not args.quiet and sys.stderr.isatty():
            print(f"\r\033[K  {line[:150]}", end="", file=sys.stderr, flush=True)

    reports = []
    for role, name in targets:
        report = check_registered(role, name, settings, progress)
        if not args.quiet and sys.stderr.isatty():
            print("\r\033[K", end="", file=sys.stderr)
        print(report.render(), flush=True)
        reports.append(report)
    failed = sum(not r.passed for r in reports)
    unproven = sum(r.passed and not r.proven for r in reports)
    tail = f", {unproven} skipped" if unproven else ""
    print(f"{len(reports) - failed - unproven} passed, {failed} failed{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
