"""Step options: an explicit object handed to the loop, never a module global.

:class:`StepOptions` carries what the step does beyond its inputs: whether it
checks everything (validate mode), which rows of the tree the tensor rule
decides (``rows``), and how the step's time split is measured (``clock``).
A generation builds one (``SpeculativeGenerator(..., options=)``); the
``SPECDEC_VALIDATE`` environment variable sets the default of ``validate``.
"""

from __future__ import annotations

import os

import attrs

from specdec.errors import InvalidConfigError
from specdec.verify.fast import VERIFY_ROWS

__all__ = ["CLOCKS", "VERIFY_ROWS", "StepOptions"]

CLOCKS = ("auto", "perf_counter", "cuda_events")
"""How a step's time split is measured: host ``perf_counter`` (exact on a CPU, where ops
run synchronously), CUDA events on the current stream (on a GPU, where the host only
enqueues work; read after the step's one device-to-host copy), or ``"auto"``: CUDA events
for a target on CUDA, ``perf_counter`` otherwise."""


def _env_validate() -> bool:
    return os.environ.get("SPECDEC_VALIDATE", "") not in ("", "0")


def _check_rows(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in VERIFY_ROWS:
        raise InvalidConfigError(f"rows must be one of {VERIFY_ROWS}, got {value!r}")


def _check_clock(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in CLOCKS:
        raise InvalidConfigError(f"clock must be one of {', '.join(CLOCKS)}, got {value!r}")


def _check_flag(instance: object, attribute: attrs.Attribute[bool], value: bool) -> None:
    if not isinstance(value, bool):
        raise InvalidConfigError(f"{attribute.name} must be a bool, got {value!r}")


@attrs.frozen
class StepOptions:
    """What the step does beyond its inputs (module docstring).

    Attributes:
        validate: every step checks its tree batch in full
            (:meth:`~specdec.tree_batch.TreeBatch.validate`), that the verifier supports
            every tree (:meth:`~specdec.verify.base.Verifier.check_tree`) and every row of
            ``p`` that is not flagged bad (:func:`~specdec.sampling.check_distribution`),
            at the cost of host reads. Otherwise the verifier's support is checked on the
            first step of each generation only (every registered builder draws the same
            kinds and modes at every step). Default: ``SPECDEC_VALIDATE=1`` in the environment.
        rows: :data:`VERIFY_ROWS`; the same decisions either way, except when a uniform
            falls within float rounding of a threshold.
        clock: :data:`CLOCKS`.
        optimum: after each step, compute at every node the step's path tested the best
            acceptance any lossless rule could reach with that node's recorded proposals
            (:func:`~specdec.verify.optimum.tree_node_optimum`), for
            :attr:`~specdec.engine.stats.GenerationStats.optimum_by_depth` and
            :attr:`~specdec.engine.stats.GenerationStats.gap_by_depth`. Costs a host read of
            the visited rows of ``p`` and host work per step: off by default, and never on
            for timed runs.
    """

    validate: bool = attrs.field(factory=_env_validate, validator=_check_flag)
    rows: str = attrs.field(default="auto", validator=_check_rows)
    clock: str = attrs.field(default="auto", validator=_check_clock)
    optimum: bool = attrs.field(default=False, validator=_check_flag)
