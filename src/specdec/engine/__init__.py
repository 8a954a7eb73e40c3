"""The engine: one loop around one step, one dispatch, options as an explicit object.

Layers (docs/architecture.md): the tools (CLI, bench, training) and the tuning code
(Sequoia's profiling, Rheo's calibration, the budget search) call the engine; the engine
calls the strategies (tree builders, verifiers, drafts, targets) through their declared
contracts and the kernels through rule descriptors.

- :mod:`~specdec.engine.step`: :func:`step_rows`, the speculative step of ``B`` rows
  (its records :class:`Roles` and :class:`StepInputs`; :func:`run_step`, its compatibility
  form), and :func:`commit_step`;
- :mod:`~specdec.engine.loop`: :func:`decode_rows`, the one generation loop (its record
  :class:`RowsRequest`; :func:`run_rows`, its compatibility form), and :func:`profile_steps`;
- :mod:`~specdec.engine.dispatch`: :func:`choose_verification`, the one decision of how
  a generation verifies;
- :mod:`~specdec.engine.options`: :class:`StepOptions`;
- :mod:`~specdec.engine.stats`: :class:`GenerationStats`, :class:`StepTally`;
- :mod:`~specdec.engine.compiler`: :class:`StepCompiler` (``compile=``);
- :mod:`~specdec.engine.layouts`: a tree batch in serving engines' attention and KV forms;
- :mod:`~specdec.engine.serving`: :func:`verify_for_engine`, verification in one call with
  per-row sampling (docs/serving.md);
- :mod:`~specdec.engine.proposals`: an engine's own proposals verified in its layouts (vLLM's
  flat ragged chains, SGLang's retrieve arrays).
"""

from specdec.engine.compiler import StepCompiler
from specdec.engine.dispatch import KERNEL_CHOICES, VERIFY_PATHS, Verification, choose_verification
from specdec.engine.loop import RowsRequest, StepReport, decode_rows, profile_steps, run_rows
from specdec.engine.options import CLOCKS, VERIFY_ROWS, StepOptions
from specdec.engine.proposals import (
    ChainProposals,
    ChainVerification,
    DraftLaws,
    TreeProposals,
    TreeVerification,
    check_rule,
    serving_rules,
    verify_chain_proposals,
    verify_tree_proposals,
)
from specdec.engine.serving import EngineVerification, RowSampling, verify_for_engine
from specdec.engine.fixed_step import FixedStep, StepBudget, fixed_step, run_fixed_step
from specdec.engine.stats import AcceptanceCounts, GenerationStats, StepTally
from specdec.engine.step import (
    Roles,
    StepClock,
    StepInputs,
    StepOutcome,
    commit_step,
    emitted_logprobs,
    read_step,
    run_step,
    step_rows,
)

__all__ = [
    "AcceptanceCounts",
    "CLOCKS",
    "KERNEL_CHOICES",
    "VERIFY_PATHS",
    "VERIFY_ROWS",
    "ChainProposals",
    "ChainVerification",
    "DraftLaws",
    "EngineVerification",
    "FixedStep",
    "GenerationStats",
    "Roles",
    "RowSampling",
    "RowsRequest",
    "StepBudget",
    "StepClock",
    "StepCompiler",
    "StepInputs",
    "StepOptions",
    "StepOutcome",
    "StepReport",
    "StepTally",
    "TreeProposals",
    "TreeVerification",
    "Verification",
    "check_rule",
    "choose_verification",
    "commit_step",
    "decode_rows",
    "fixed_step",
    "emitted_logprobs",
    "profile_steps",
    "read_step",
    "run_fixed_step",
    "run_rows",
    "run_step",
    "serving_rules",
    "step_rows",
    "verify_chain_proposals",
    "verify_for_engine",
    "verify_tree_proposals",
]
