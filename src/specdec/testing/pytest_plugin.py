"""A pytest plug-in that runs the conformance suites of named plug-in modules.

Use:

    pytest -p specdec.testing.pytest_plugin --specdec-conformance my_pkg.rules

Every verifier, tree builder and method ``my_pkg.rules`` registers gets one
test item per conformance case (:func:`specdec.testing.conformance.conformance_cases`),
so pytest's own selection (``-k``), reporting and parallel runners apply; add
``--specdec-quick`` for the quick settings. In an author's own test file, the
parametrised form of :mod:`specdec.testing.conformance` does the same without the
plug-in.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specdec.testing.conformance import PluginCase, conformance_cases
from specdec.testing.suites import SuiteSettings

__all__ = ["ConformanceItem", "pytest_addoption", "pytest_collection_modifyitems"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specdec", "specdec conformance")
    group.addoption("--specdec-conformance", action="append", default=[], metavar="MODULE",
                    help="run the conformance suites on the plug-ins MODULE registers (repeatable)")
    group.addoption("--specdec-quick", action="store_true", help="the quick conformance settings")


class ConformanceItem(pytest.Item):
    """One conformance case as a pytest item."""

    def __init__(self, *, case: PluginCase, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.case = case

    def runtest(self) -> None:
        self.case.run()

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "specdec-conformance", None, str(self.case)


class ConformanceCollector(pytest.Collector):
    """The cases of the modules named on the command line."""

    def __init__(self, *, modules: list[str], quick: bool, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.modules, self.quick = modules, quick

    def collect(self) -> Iterator[pytest.Item]:
        settings = SuiteSettings.quick() if self.quick else SuiteSettings()
        for case in conformance_cases(*self.modules, settings=settings):
            yield ConformanceItem.from_parent(self, name=str(case), case=case)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = config.getoption("--specdec-conformance")
    if not modules:
        return
    collector = ConformanceCollector.from_parent(session, name="specdec-conformance", modules=list(modules),
                                                 quick=bool(config.getoption("--specdec-quick")))
    items.extend(collector.collect())

