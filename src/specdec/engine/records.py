"""The engine path's records: the roles of a generation (:class:`Roles`) and a step's
per-step inputs (:class:`StepInputs`), taken by :func:`specdec.engine.step.step_rows` and
:func:`specdec.engine.loop.decode_rows` (with :class:`specdec.engine.loop.RowsRequest`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch

from specdec.drafts.base import DraftModel
from specdec.engine.options import StepOptions
from specdec.processors import LogitsProcessorLike
from specdec.rng import RandomSource, RowStreams
from specdec.targets.base import TargetModel
from specdec.trees.base import TreeBuilder
from specdec.verify.base import Verifier

__all__ = ["Roles", "StepInputs"]


@attrs.frozen(eq=False)
class Roles:
    """The four roles of a generation, as one record (the engine path: :func:`step_rows`,
    :func:`specdec.engine.loop.decode_rows`).

    Attributes:
        target: the :class:`~specdec.targets.base.TargetModel` that scores the trees.
        draft: the :class:`~specdec.drafts.base.DraftModel` the builder drafts with (None: a root-only
            tree, plain decoding).
        builder: the :class:`~specdec.trees.base.TreeBuilder`.
        verifier: the :class:`~specdec.verify.base.Verifier`.
    """

    target: TargetModel
    draft: DraftModel | None
    builder: TreeBuilder
    verifier: Verifier


@attrs.frozen(eq=False)
class StepInputs:
    """A step's per-step inputs besides its rows' sampling, sources and roots (:func:`step_rows`).

    Attributes:
        row_rngs: the walk's per-row sources (None: ``[rng]``).
        verify_rng: the kernel's per-row counter streams (``"triton"`` only).
        options: :class:`~specdec.engine.options.StepOptions` (validate mode, rows).
        clock: ``"perf_counter"`` or ``"cuda_events"``.
        check_tree: check that the verifier supports the trees' children (kinds and modes)
            before verifying (the loop asks on its first step, and on every step in validate mode).
        compiler: a :class:`~specdec.engine.compiler.StepCompiler` (one row only).
        logits_processor, contexts: applied to every node's logits with that node's own
            context: ``contexts[b]`` ``[L_b]`` (row ``b``'s committed sequence, ending with its root)
            followed by the node's path (:mod:`specdec.processors`); a tuple: one processor (or
            None) per batch row.
        logprobs: fill :attr:`StepOutcome.logprobs`.
        top_logprobs: ``k > 0``: fill :attr:`StepOutcome.top_logprobs` and ``top_ids`` (0: not).
        rows: the rows' names in error messages (None: a single generation).
    """

    row_rngs: Sequence[RandomSource] | None = None
    verify_rng: RowStreams | None = None
    options: StepOptions = StepOptions(validate=False)
    clock: str = "perf_counter"
    check_tree: bool = True
    compiler: Any = None
    logits_processor: LogitsProcessorLike | tuple[LogitsProcessorLike | None, ...] | None = None
    contexts: Sequence[torch.Tensor] | None = None
    logprobs: bool = False
    rows: Sequence[int] | None = None
    top_logprobs: int = 0
