"""``specdec bench``: side-by-side benchmark of every method on a real model.

Modules: :mod:`~specdec.bench.prompts` (prompt sets and loaders),
:mod:`~specdec.bench.budget` (tree budgets, ``--budget auto``),
:mod:`~specdec.bench.models` (target, draft LM and EAGLE heads),
:mod:`~specdec.bench.runner` (the interleaved loop and the aggregation),
:mod:`~specdec.bench.report` (table, ``results.json``, plots, goals, Spec-Bench's report),
:mod:`~specdec.bench.runlog` (``runs.jsonl``: the resumable log of a sweep),
:mod:`~specdec.bench.workers` (``--workers N``: the sweep over Ray workers),
:mod:`~specdec.bench.cli` (the command). See ``docs/bench.md``.
"""

from specdec.bench.budget import Budget, method_options, parse_budget
from specdec.bench.prompts import BenchPrompt, load_prompts, select_prompts
from specdec.bench.runner import RowSpec, aggregate, parse_rows, run_bench

__all__ = [
    "Budget",
    "BenchPrompt",
    "RowSpec",
    "aggregate",
    "load_prompts",
    "method_options",
    "parse_budget",
    "parse_rows",
    "run_bench",
    "select_prompts",
]
