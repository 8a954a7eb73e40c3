"""``specdec bench``: side-by-side benchmark of every method on a real model.

Modules: :mod:`~specdec.bench.prompts` (prompt sets and loaders),
:mod:`~specdec.bench.budget` (tree budgets and their mapping onto every method),
:mod:`~specdec.bench.auto_budget` (``--budget auto``),
:mod:`~specdec.bench.models` (target, draft LM and EAGLE heads),
:mod:`~specdec.bench.rows` (``--methods``: the rows of the table),
:mod:`~specdec.bench.sweep` (what a sweep runs: its configuration, units and records),
:mod:`~specdec.bench.runner` (the interleaved loop and the aggregation),
:mod:`~specdec.bench.report` (table, goals, ``results.json``, the output folder),
:mod:`~specdec.bench.plots` (the PNG plots),
:mod:`~specdec.bench.spec_bench` (Spec-Bench's report),
:mod:`~specdec.bench.runlog` (``runs.jsonl``: the resumable log of a sweep),
:mod:`~specdec.bench.workers` (``--workers N``: the sweep over Ray workers),
:mod:`~specdec.bench.settings` (presets and flags),
:mod:`~specdec.bench.prepare` (profiles and ``--budget auto`` before a sweep),
:mod:`~specdec.bench.cli` (the command). See ``docs/bench.md``.
"""

from specdec.bench.budget import Budget, method_options, parse_budget
from specdec.bench.prompts import BenchPrompt, load_prompts, select_prompts
from specdec.bench.rows import RowSpec, parse_rows
from specdec.bench.runner import aggregate, run_bench

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
