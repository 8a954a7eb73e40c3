"""Tuning: the profiles that fix a tree's settings, run on the engine loop.

This layer sits above the engine (:mod:`specdec.engine`) and calls it; the tree builders
below never run the generation loop themselves.

- :func:`profile_acceptance`: Sequoia's positional acceptance ``a_k`` (docs/trees.md, "Sequoia");
- :func:`profile_calibration`: Rheo's calibrated proxy table (docs/trees.md, "rheo").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec.drafts.base import DraftModel
from specdec.engine.loop import profile_steps
from specdec.engine.step import Roles
from specdec.errors import InvalidConfigError
from specdec.registry import get
from specdec.rng import TorchRandom
from specdec.sampling import SamplingConfig
from specdec.targets.base import TargetModel
from specdec.tree import SampleMode
from specdec.trees._common import check_int
from specdec.trees.calibration import CALIBRATION_EDGES, Calibration, _bin, check_calibration
from specdec.trees.sampled_dynamic import SampledDynamicTreeBuilder
from specdec.trees.static import StaticTreeBuilder

__all__ = ["profile_acceptance", "profile_calibration"]


def profile_acceptance(
    target: TargetModel,
    draft: DraftModel,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    k_max: int,
    *,
    steps_per_prompt: int = 4,
    seed: int | None = 0,
    verifier: str = "rejection-wor",
) -> tuple[float, ...]:
    """Estimate Sequoia's positional acceptance vector on real prompts.

    For each prompt, ``steps_per_prompt`` speculative steps are run with a
    one-level tree: the root and ``k_max`` children drawn without replacement
    from the draft law; the target scores the tree, the rule-4 verifier
    (``verifier``) picks the accepted child or none, and the emitted tokens
    are committed (so later steps profile generated contexts, as in
    Sequoia). ``a_k`` = fraction of steps in which the k-th drawn child was
    the accepted one.

    Args:
        target: the target model.
        draft: the draft model.
        prompts: token-id prompts (non-empty).
        sampling: the sampling configuration the tree will serve.
        k_max: children per profiled node (length of the returned vector).
        steps_per_prompt: speculative steps per prompt.
        seed: seed of the draws (None: from entropy).
        verifier: registry name of the rule-4 verifier.

    Returns:
        ``(a_1, ..., a_k_max)``.
    """
    check_int("k_max", k_max, 1)
    check_int("steps_per_prompt", steps_per_prompt, 1)
    if not prompts:
        raise InvalidConfigError("profile_acceptance needs at least one prompt")
    builder = StaticTreeBuilder(expansion=tuple((i,) for i in range(k_max)), mode=SampleMode.WITHOUT_REPLACEMENT)
    check = get("verifier", verifier)()
    rng = TorchRandom.seeded(seed)
    counts = [0] * k_max
    trials = 0
    for outcome in profile_steps(Roles(target, draft, builder, check), prompts, sampling, rng, steps_per_prompt,
                                 room=k_max, name="profile_acceptance"):
        result, tree = outcome.result, outcome.tree
        trials += 1
        if result.accepted_nodes:
            counts[int(tree.draw_order[0, result.accepted_nodes[0]])] += 1
    return tuple(c / trials for c in counts)


def profile_calibration(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    *,
    draws: int = 10,
    M: int = 1024,
    rank_law: str = "untempered",
    steps_per_prompt: int = 16,
    seed: int | None = 0,
    prior: float = 2.0,
) -> Calibration:
    """Measure the ``"calibrated"`` proxy's table (docs/trees.md, "Proxies") on real prompts.

    Each step drafts a one-level tree with every slot sampled (``sampled-dynamic``, ``K = draws``, the
    displaced proxy, ``M`` and ``rank_law`` as the tree that will use the table), the target
    scores it, rule 5 (the ``"mixed"`` verifier; rule 4 here, since every child is sampled)
    picks the accepted child or none, and the emitted tokens are committed, so later steps
    profile generated text (as Sequoia's profile does). For the ``i``-th draw, whose displaced
    weight (the ranking law's ``q`` at rank ``i``) falls in bin ``b`` of
    :data:`CALIBRATION_EDGES`, the table holds ``(a + prior * w_b) / (n + prior)``: ``n`` draws
    seen there, ``a`` of them accepted, ``w_b`` the bin's midpoint (so a bin never seen keeps
    the displaced weight, and a sparse one leans towards it), then made non-decreasing along each
    row (weighted isotonic fit) and no row above the one before it (:func:`check_calibration`
    says why the builder needs both).

    Args:
        target: the target model.
        draft: the draft model (EAGLE heads receive the target's features at commit).
        prompts: token-id prompts (non-empty).
        sampling: the sampling configuration the trees will serve (``T > 0``).
        draws: rows of the table (sampled children per profiled node).
        M: the sparse draft size of the served tree.
        rank_law: the served tree's ranking law.
        steps_per_prompt: steps per prompt.
        seed: seed of the draws (None: from entropy).
        prior: pseudo-count of the bin midpoint (``> 0``).

    Raises:
        InvalidConfigError: ``T = 0`` (no node is sampled there), no prompt, bad counts.

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> lm = CallableLM(lambda p: torch.tensor([[2.0, 1.0, 0.0]] * len(p)), vocab_size=3)
        >>> table = profile_calibration(lm, CallableLM(lm.fn, 3), [[0]], SamplingConfig(), draws=2, M=3)
        >>> bin_of_top = 8  # q at rank 0 is 0.665: bin [0.5, 0.7); p = q, so the first draw is always accepted
        >>> round(table[0][bin_of_top], 3)  # 16 of 16 (+ 2 pseudo-draws at 0.6), pooled with the unseen bins above
        0.94
        >>> # rank 1 (q 0.245, bin [0.2, 0.35)) never accepted: 0.031, pooled with the unseen bins 4 and 5 below it
        >>> round(table[1][6], 3), round(table[1][4], 3), round(table[1][3], 3)  # bin 3: its midpoint 0.035
        (0.045, 0.045, 0.035)
    """
    if sampling.greedy:
        raise InvalidConfigError("profile_calibration needs T > 0: at T = 0 no node has a sampled child")
    for name, value in (("draws", draws), ("steps_per_prompt", steps_per_prompt)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidConfigError(f"{name} must be an int >= 1, got {value!r}")
    if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not prior > 0:
        raise InvalidConfigError(f"prior must be a number > 0, got {prior!r}")
    if not prompts:
        raise InvalidConfigError("profile_calibration needs at least one prompt")
    builder = SampledDynamicTreeBuilder(K=max(2, draws), B=1, depth=1, N=max(2, draws), M=max(M, draws, 2),
                                        proxy="displaced", rank_law=rank_law)
    check = get("verifier", "mixed")()
    rng = TorchRandom.seeded(seed)
    bins = len(CALIBRATION_EDGES)
    seen = torch.zeros(draws, bins, dtype=torch.float64)  # [draws, bins]
    hits = torch.zeros(draws, bins, dtype=torch.float64)
    for outcome in profile_steps(Roles(target, draft, builder, check), prompts, sampling, rng, steps_per_prompt,
                                 room=draws + 1, name="profile_calibration"):
        result, tree = outcome.result, outcome.tree
        n = int(tree.num_nodes[0])
        accepted = result.accepted_nodes[0] if result.accepted_nodes else -1
        for node, (i, w) in enumerate(zip(tree.draw_order[0, 1:n].tolist(), tree.weights[0, 1:n].tolist()), start=1):
            if i < draws:  # the i-th draw, its displaced weight's bin
                b = _bin(w)
                seen[i, b] += 1
                hits[i, b] += float(node == accepted)
    upper = list(CALIBRATION_EDGES[1:]) + [1.0]
    mid = torch.tensor([(lo + hi) / 2 for lo, hi in zip(CALIBRATION_EDGES, upper)], dtype=torch.float64)  # [bins]
    table = (hits + prior * mid) / (seen + prior)  # [draws, bins]
    weight = seen + prior  # [draws, bins]
    rows = [_isotonic(table[i].tolist(), weight[i].tolist()) for i in range(draws)]  # non-decreasing over bins
    for i in range(1, draws):  # no row above the one before it (the minimum keeps each row non-decreasing)
        rows[i] = [min(a, b) for a, b in zip(rows[i], rows[i - 1])]
    return check_calibration(rows)


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit of ``values`` (pool adjacent violators).

    Example:
        >>> _isotonic([0.1, 0.3, 0.2, 0.4], [1, 1, 1, 1])
        [0.1, 0.25, 0.25, 0.4]
    """
    blocks: list[list[float]] = []  # [mean, weight, size]
    for v, w in zip(values, weights):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [b[0] for b in blocks for _ in range(int(b[2]))]
