"""``torch.compile`` of the step's device parts between model forwards (``compile=``)."""

from __future__ import annotations

import types
from typing import Any

import torch

from specdec.rng import UniformTable
from specdec.trees.levelwise import CompiledLevelFn, LevelFn, LevelStep, finish_levels, level_step
from specdec.verify.fast import decide_from_scores, decide_tree_batch, decide_tree_walk

__all__ = ["StepCompiler"]


class StepCompiler:
    """``torch.compile(fullgraph=True)`` of the step's device parts between
    model forwards: the verification (:func:`~specdec.verify.fast.decide_from_scores` at
    ``T > 0``, from the target's logits or warped scores, with the law's max and exp-sum
    fused; :func:`~specdec.verify.fast.decide_tree_batch` on one-hot rows at ``T = 0``;
    on a CPU the walk, :func:`~specdec.verify.fast.decide_tree_walk`),
    each level of a level-wise builder (its level function, its draws read from
    a uniform table drawn before each level, :class:`~specdec.rng.UniformTable`,
    and the driver's scoring and beam, :func:`~specdec.trees.levelwise.level_step`)
    and the builder's final rerank and layout
    (:func:`~specdec.trees.levelwise.finish_levels`). Used by
    ``SpeculativeGenerator(..., compile=True)``.

    Args:
        backend: the ``torch.compile`` backend (``"inductor"`` by default;
            ``"aot_eager"`` traces the same graphs without generating code).
    """

    def __init__(self, backend: str = "inductor") -> None:
        self.backend = backend
        self.decide = self._compile(decide_tree_batch)
        self.decide_scores = self._compile(decide_from_scores)
        self.decide_walk = self._compile(decide_tree_walk)
        self._levels: dict[Any, CompiledLevelFn] = {}
        self.finish = self._compile(finish_levels)

    def _compile(self, fn: Any) -> Any:
        return torch.compile(fn, fullgraph=True, backend=self.backend)

    def level(self, level: LevelFn, key: Any) -> CompiledLevelFn:
        """The compiled ``fn(q, u, live, draw, parent_score, vocab_map, root, beam_width)``
        (:data:`~specdec.trees.levelwise.CompiledLevelFn`) of ``level`` followed by
        :func:`~specdec.trees.levelwise.level_step`, one per ``key`` (builder and sampling)."""
        fn = self._levels.get(key)
        if fn is None:
            def one_level(
                q: Any, u: torch.Tensor, live: torch.Tensor, draw: Any, parent_score: torch.Tensor,
                vocab_map: torch.Tensor | None, root: torch.Tensor, beam_width: int,
            ) -> LevelStep:
                table = UniformTable(u)
                lv = level(q, table, live) if draw is None else level(q, table, live, draw)
                return level_step(lv, parent_score, vocab_map, root, beam_width)

            # dynamo caches its graphs per code object: one code object per key, so that each
            # builder's few shapes (root level, middle levels, last level) have a cache of their own
            code = one_level.__code__.replace(co_name=f"one_level_{len(self._levels)}")
            own = types.FunctionType(code, one_level.__globals__, code.co_name, None, one_level.__closure__)
            fn = self._levels[key] = self._compile(own)
        return fn
