"""``--budget auto``'s forward-cost curve, timed with one prefill and a line per round (issue 57).

:func:`time_tree_forwards` runs :func:`specdec.trees.sequoia.measure_forward_times` with
``interleave=True, statistic="min"``, prefilling once where the target declares
``rescores_trees`` (not before each of 78 timed forwards: minutes of a phase that said nothing on
a loaded 2-core CPU), and turns its rounds into progress lines. :mod:`specdec.bench.auto_budget`
re-exports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specdec.errors import InvalidConfigError
from specdec.targets.base import TargetModel
from specdec.trees.sequoia import measure_forward_times, timing_chain

__all__ = ["time_tree_forwards"]


_chain = timing_chain  # the tree a forward-cost timing scores (specdec.trees.sequoia)


def time_tree_forwards(
    target: TargetModel,
    prompt_ids: Sequence[int],
    sizes: Sequence[int],
    *,
    repeats: int = 5,
    warmup: int = 1,
    batch_size: int = 1,
    log: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[int, float]:
    """``--budget auto``'s forward-cost curve: the fastest of ``repeats`` timed target forwards of a
    tree of each size, the sizes in turn (1, 2, 5, 1, 2, 5, ...: a spell of load on a shared machine
    falls on every size alike, and only adds time), after ``warmup`` untimed rounds; the same
    measurement as :func:`~specdec.trees.sequoia.measure_forward_times` with ``interleave=True,
    statistic="min"``, with two differences (issue 57):

    - a target whose class sets ``rescores_trees`` (:class:`~specdec.targets.hf.HFTarget`:
      scoring again before ``accept`` discards the previous tree) is prefilled once, not before
      every forward: the prefills of the profile prompt were most of this phase's time (78 of
      them, minutes on a loaded 2-core CPU), and the timed forwards are the same;
    - ``log`` gets a line after each round: rounds done, seconds so far, about how long is left.

    Args:
        target: the target model.
        prompt_ids: a prompt (its last token is the root).
        sizes: tokens per forward (tree nodes including the root), each ``>= 1``.
        repeats, warmup: timed and untimed rounds.
        batch_size: ``B`` rows scored together (the target's batch mode, prefilled before every
            forward as :func:`~specdec.trees.sequoia.measure_forward_times` does).
        log: receives the progress lines (None: silent).
        clock: the timer (tests replace it).

    Returns:
        ``{tokens: seconds}``, as :func:`~specdec.trees.sequoia.measure_forward_times`.

    Raises:
        InvalidConfigError: bad counts, an empty prompt, no batch mode for ``B > 1``.
        ContextOverflowError: a tree past the target's context.
        MeasurementError: a forward failed (naming the size).

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> lm = CallableLM(lambda p: torch.zeros(len(p), 4), vocab_size=4)
        >>> sorted(time_tree_forwards(lm, [1, 2], [1, 3], repeats=2))
        [1, 3]
    """
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise InvalidConfigError(f"tree sizes must be ints >= 1, got {sizes}")

    def report(done: int, rounds: int, spent: float) -> None:
        if log is not None:
            left = spent / done * (rounds - done)
            log(f"auto budget: target forwards of {len(sizes)} tree sizes ({sizes[0]}-{sizes[-1]} tokens): round "
                f"{done} of {rounds} in {spent:.0f} s" + (f", about {left:.0f} s left" if left else ""))

    return measure_forward_times(target, prompt_ids, sizes, repeats=repeats, warmup=warmup, batch_size=batch_size,
                                 interleave=True, statistic="min", prefill_once=batch_size == 1 and target.rescores_trees,
                                 on_round=report, clock=clock)
