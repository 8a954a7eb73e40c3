"""A draft whose logits go through a logits processor, each node in its own context.

``ProcessedDraft(draft, processor)`` wraps any :class:`~specdec.drafts.base.DraftModel`:
the root's logits are processed with the committed sequence as context, and
each tree node's logits with the committed sequence followed by the node's
path (its own token last), the contexts the target's rows get in
:mod:`specdec.processors` (docs/generation.md, "Logits processors"). Use it
with the same processor given to ``generate(..., logits_processor=)``: the
draft then proposes from the processed law the target is verified against,
which raises acceptance when the processor moves the law (a repetition penalty,
a ban). The output law is exact either way: builders record the ``q`` they drew
from, and every verifier corrects for it.

The wrapper keeps the step's node paths on the host (node ids as in
:class:`~specdec.drafts.base.DraftModel`: root 0, then 1, 2, ... in the order
given to ``tree_logits``), so it reads the level's parents and tokens to the
host once per level, and it calls the processor once per depth of the new
nodes. It proposes over the full vocabulary (a reduced proposal vocabulary,
EAGLE-3's, is not used: the processor's signature is over ``V``), and it has no
batch mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafts.base import OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.processors import LogitsProcessorLike, call_processor, check_processor

__all__ = ["ProcessedDraft"]


def _ints(values: Sequence[int] | torch.Tensor) -> list[int]:
    return [int(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]


class ProcessedDraft(OneRowDraft):
    """``draft`` with ``processor`` applied to its logits, each node in its own context.

    Args:
        draft: any draft model (its feature needs, ``target_layers`` and
            ``max_length`` are passed through).
        processor: transformers' ``LogitsProcessorList`` (or any callable
            ``(input_ids [b, len], scores [b, V]) -> [b, V]``).

    Example:
        >>> import torch
        >>> from specdec.models import CallableLM
        >>> base = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 4), vocab_size=4)
        >>> def ban_last(ids, scores):
        ...     return scores.scatter(1, ids[:, -1:], float("-inf"))
        >>> d = ProcessedDraft(base, ban_last)
        >>> d.begin([1, 2])
        >>> d.root_logits().tolist()
        [0.0, 0.0, -inf, 0.0]
        >>> d.tree_logits([0], [3]).tolist()
        [[0.0, 0.0, 0.0, -inf]]
    """

    registry_name = "processed"

    def __init__(self, draft: OneRowDraft, processor: LogitsProcessorLike) -> None:
        if not isinstance(draft, OneRowDraft):
            raise InvalidConfigError(f"ProcessedDraft wraps a OneRowDraft, got {type(draft).__name__}")
        checked = check_processor(processor, "processor")
        if checked is None:
            raise InvalidConfigError("ProcessedDraft needs a logits processor (got an empty one)")
        self.draft = draft
        self.processor = checked
        self.needs_target_hidden = draft.needs_target_hidden  # type: ignore[misc]  # the wrapped draft's need
        self._context: list[int] = []
        self._paths: list[tuple[int, ...]] = [()]  # node id -> path below the root

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.draft.target_layers

    @property
    def max_length(self) -> int | None:
        return self.draft.max_length

    @property
    def vocab_size(self) -> int:
        return self.draft.vocab_size

    def reserve(self, positions: int) -> None:
        self.draft.reserve(positions)

    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        if target_hidden is None:
            self.draft.begin(prompt_ids)
        else:
            self.draft.begin(prompt_ids, target_hidden=target_hidden)
        self._context = _ints(prompt_ids)
        self._paths = [()]

    def root_logits(self) -> torch.Tensor:
        logits = self.draft.root_logits()  # [V]
        return self._process([()], logits.unsqueeze(0))[0]

    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        logits = self.draft.tree_logits(parents, tokens)  # [k, V]
        new = [self._paths[p] + (t,) for p, t in zip(_ints(parents), _ints(tokens))]
        self._paths.extend(new)
        return self._process(new, logits)

    def commit(self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        self.draft.commit(tokens, target_hidden=target_hidden)
        self._context.extend(_ints(tokens))
        self._paths = [()]

    def _process(self, paths: list[tuple[int, ...]], logits: torch.Tensor) -> torch.Tensor:
        """``[k, V]`` ``logits`` with each row processed in the context ``committed + paths[i]``,
        one processor call per path length."""
        out = torch.empty_like(logits)
        by_length: dict[int, list[int]] = {}
        for i, path in enumerate(paths):
            by_length.setdefault(len(path), []).append(i)
        for rows in by_length.values():
            ids = torch.tensor([self._context + list(paths[i]) for i in rows], dtype=torch.int64, device=logits.device)
            index = torch.tensor(rows, dtype=torch.int64, device=logits.device)  # [n]
            scores = logits.index_select(0, index)  # [n, V], a copy: processors may write in place
            out.index_copy_(0, index, call_processor(self.processor, ids, scores, "draft ").to(logits.dtype))
        return out
