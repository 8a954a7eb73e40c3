"""``--budget auto``'s forward-cost curve, timed with one prefill and a line per round (issue 57).

:func:`time_tree_forwards` is :func:`specdec.trees.sequoia.measure_forward_times` with
``interleave=True, statistic="min"`` as :mod:`specdec.bench.prepare` ran it, less its 78
prefills of the profile prompt (one before every timed forward: minutes of a phase that said
nothing on a loaded 2-core CPU), plus progress lines. :mod:`specdec.bench.auto_budget`
re-exports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specdec.errors import ContextOverflowError, InvalidConfigError, MeasurementError, SpecDecError
from specdec.targets.base import TargetModel
from specdec.tree import DraftTree, SampleMode, SparseLaw
from specdec.tree_batch import TreeBatch

__all__ = ["time_tree_forwards"]


def _chain(prompt_ids: Sequence[int], size: int, vocab: int) -> DraftTree:
    """A chain of ``size`` tokens (root included) after ``prompt_ids``: the tree a forward-cost timing scores."""
    law = SparseLaw.from_dense(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64), SampleMode.IID)
    tokens = [int(prompt_ids[i % len(prompt_ids)]) for i in range(size - 1)]
    return DraftTree.chain(int(prompt_ids[-1]), tokens, [law] * (size - 1), vocab)


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
    for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidConfigError(f"{name} must be an int >= {low}, got {value!r}")
    if not prompt_ids:
        raise InvalidConfigError("timing tree forwards needs a non-empty prompt")
    if batch_size > 1 and not target.supports_batch:
        raise InvalidConfigError(f"{type(target).__name__} has no batch mode: cannot time {batch_size}-row forwards")
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise InvalidConfigError(f"tree sizes must be ints >= 1, got {sizes}")
    limit = target.max_length
    if limit is not None and len(prompt_ids) + sizes[-1] > limit:
        raise ContextOverflowError(
            f"a {sizes[-1]}-token tree after a {len(prompt_ids)}-token prompt exceeds max_length {limit}")
    vocab = target.vocab_size
    trees = {s: _chain(prompt_ids, s, vocab) for s in sizes}
    batches = {s: TreeBatch.from_trees([t] * batch_size) for s, t in trees.items()}  # the engine's form, B = 1 too
    once = batch_size == 1 and target.rescores_trees  # declared on the target contract
    if once:
        target.prefill_batch([list(prompt_ids)])
    times: dict[int, float] = {}
    rounds = warmup + repeats
    started = clock()
    for rep in range(rounds):
        for size in sizes:
            if not once:
                target.prefill_batch([list(prompt_ids)] * batch_size)
            start = clock()
            try:
                out = target.score_batch(batches[size])
                float(out.reshape(-1)[0])  # forces completion on asynchronous devices
            except SpecDecError:
                raise
            except Exception as exc:  # noqa: BLE001 - one clear error naming the size; no curve is guessed
                raise MeasurementError(
                    f"the target forward of a {size}-token tree{f' x {batch_size} rows' if batch_size > 1 else ''} "
                    f"failed while timing the forward-cost curve ({type(exc).__name__}: {exc}); the curve is not "
                    "guessed: fix the model at that size, or give the tree budget by hand (--budget N)"
                ) from exc
            elapsed = clock() - start
            if rep >= warmup:
                times[size] = min(times.get(size, elapsed), elapsed)
        if log is not None:
            spent = clock() - started
            left = spent / (rep + 1) * (rounds - rep - 1)
            log(f"auto budget: target forwards of {len(sizes)} tree sizes ({sizes[0]}-{sizes[-1]} tokens): round "
                f"{rep + 1} of {rounds} in {spent:.0f} s" + (f", about {left:.0f} s left" if left else ""))
    return times
