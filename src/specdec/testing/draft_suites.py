"""The conformance cases of a registered draft: its laws, its rows mode, and methods that use it.

A draft is built by the factory its registration declares (``register("draft", NAME,
factory=...)``, :mod:`specdec.drafts.setting`) for a toy order-2 Markov target over
:data:`VOCAB` tokens; the same factory builds it for ``specdec bench``. Suites
(docs/extending.md, "Plug-in drafts"):

- ``laws``: after every prompt of :data:`PROMPTS` and at two levels of tree nodes below,
  under every sampling of :data:`~specdec.testing.suites.SAMPLINGS`, the draft's
  processed laws (:meth:`~specdec.drafts.base.DraftModel.root_distribution`,
  :meth:`~specdec.drafts.base.DraftModel.expand`) are laws over ``V`` tokens
  (finite, non-negative, summing to 1); and after :meth:`~specdec.drafts.base.DraftModel.commit`
  the draft answers as a fresh draft begun on the longer context (what a generation,
  which commits, shares with the exact laws, which begin afresh).
- ``rows``: a draft declaring ``supports_rows``, begun on three ragged prompts, answers
  every row (root, two tree levels, ragged commits, then :meth:`keep_rows` of two rows)
  as a one-row draft begun on that row's prompt answers it; for a draft without a rows
  mode the case is SKIPPED (there is none to check).
- ``whole-tree``: each method of :data:`DRAFT_METHODS` with this draft on the toy target,
  its law of the first three tokens over chained steps enumerated exactly
  (:class:`~specdec.testing.laws.ExactLaws`): it must be the target's.
- ``greedy`` and ``batch``: the generation loop with the first method and this draft (at
  T=0 the output is greedy decoding; ``generate_batch`` rows equal the rows alone).
- a draft that declares the parallel form (:attr:`~specdec.drafts.base.DraftModel.parallel_form`,
  docs/drafts.md "Parallel drafts") has three cases more: ``laws`` (every position of its block,
  after every prompt and under every sampling, is a law over ``V`` tokens), ``rows`` (its block
  in rows mode, before and after ragged commits, equals each row's block alone) and
  ``whole-tree`` (each method of :data:`PARALLEL_METHODS`, fed by its parallel form, exact on
  the toy target).

A draft registered without a factory cannot be built here: its one case is SKIPPED,
naming the draft and how to declare one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import cast

import torch

from specdec.adapters import one_row
from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel, laws_and_flags
from specdec.drafts.parallel import ParallelDraft
from specdec.drafts.setting import DraftSetting
from specdec.errors import InvalidConfigError
from specdec.methods import Method
from specdec.registry import draft_factory, get
from specdec.sampling import SamplingConfig
from specdec.testing.laws import ExactLaws, sparse_markov_pair
from specdec.testing.markov import MarkovLM
from specdec.testing.suites import (
    CONTEXT,
    EXACT_TOL,
    SAMPLINGS,
    Case,
    Failure,
    Skipped,
    SuiteSettings,
    _batch,
    _fmt,
    _greedy,
    _samplings,
)

__all__ = ["DRAFT_METHODS", "PROMPTS", "VOCAB", "draft_cases"]

VOCAB = 4
"""The toy target's vocabulary."""
PROMPTS: tuple[tuple[int, ...], ...] = ((0, 1), (2, 3, 1), (3, 0, 0, 2))
"""Ragged prompts (the rows of the ``rows`` suite)."""
DRAFT_METHODS = ("sd", "specinfer")
"""Built-in methods the draft is proven with: a chain and a static tree of i.i.d. siblings."""
PARALLEL_METHODS = ("ddtree", "ddtree-match")
"""Built-in methods a parallel draft is proven with (through its parallel form)."""
PARALLEL_DEPTH = 3
"""The block the parallel cases ask for (the draft's ``block_size`` if shorter)."""
LAW_TOL = 1e-5
"""How far a float32 draft's law may be from summing to 1, and its rows from its one-row answers."""


def _make(name: str) -> Callable[[MarkovLM], DraftModel]:
    """``target -> draft``: the draft's factory on the toy target, checked."""
    factory = draft_factory(name)

    def make(target: MarkovLM) -> DraftModel:
        draft = factory(DraftSetting(vocab_size=target.vocab_size, target=target))
        if not isinstance(draft, DraftModel):
            raise InvalidConfigError(f"the factory of draft {name!r} returned {type(draft).__name__}, not a DraftModel")
        if draft.vocab_size != target.vocab_size:
            raise InvalidConfigError(f"the factory of draft {name!r} built a draft over {draft.vocab_size} tokens "
                                     f"for a target of {target.vocab_size}")
        return draft
    return make


def _not_a_law(q: torch.Tensor, width: int) -> str | None:
    """Why ``q [..., width]`` is not a batch of laws (None when it is)."""
    if q.shape[-1] != width:
        return f"has {q.shape[-1]} columns, not V = {width}"
    if not bool(torch.isfinite(q).all()):
        return "has non-finite entries"
    if bool((q < 0).any()):
        return f"has negative entries (min {float(q.min()):.3g})"
    err = float((q.double().sum(-1) - 1.0).abs().max())
    return f"does not sum to 1 (off by {err:.3g})" if err > LAW_TOL else None


def _nodes(prompt_index: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Two levels of tree nodes below the root: ``(parents1, tokens1, parents2, tokens2)``."""
    b = prompt_index
    return [0, 0], [b % VOCAB, (b + 1) % VOCAB], [1, 2], [(b + 2) % VOCAB, (b + 3) % VOCAB]


def _laws(name: str, make: Callable[[MarkovLM], DraftModel], sid: str) -> Callable[[], Failure | None]:
    def check() -> Failure | None:
        target, _ = sparse_markov_pair(VOCAB, 0)
        sampling = SAMPLINGS[sid]
        for b, prompt in enumerate(PROMPTS):
            draft = one_row(make(target))  # one sequence, through the batch contract for a batch draft
            draft.begin(list(prompt))
            p1, t1, p2, t2 = _nodes(b)
            for where, q in (("the root", draft.root_distribution(sampling)),
                             (f"nodes {t1} below the root", draft.expand(p1, t1, sampling)),
                             (f"nodes {t2} below nodes 1, 2", draft.expand(p2, t2, sampling))):
                why = _not_a_law(q, VOCAB)
                if why is not None:
                    return Failure(f"draft {name!r} after prompt {list(prompt)}, {sid}: its law at {where} {why}: "
                                   f"{_fmt(q.reshape(-1, q.shape[-1])[0])}")
            emitted = [t1[0], t2[0]]
            draft.commit(emitted)
            fresh = one_row(make(target))
            fresh.begin([*prompt, *emitted])
            got, want = draft.root_distribution(sampling), fresh.root_distribution(sampling)
            err = float((got.double() - want.double()).abs().max())
            if err > LAW_TOL:
                return Failure(f"draft {name!r}, {sid}: after begin({list(prompt)}) and commit({emitted}) its root law "
                               f"is {_fmt(got)}, a draft begun on {[*prompt, *emitted]} gives {_fmt(want)} "
                               f"(max error {err:.3g})")
        return None
    return check


def _compare(name: str, what: str, rows: Sequence[int], got: torch.Tensor, want: Sequence[torch.Tensor]) -> Failure | None:
    for i, row in enumerate(rows):
        err = float((got[i].double() - want[i].double()).abs().max())
        if err > LAW_TOL:
            return Failure(f"draft {name!r} in rows mode, row {row} (prompt {list(PROMPTS[row])}), {what}: "
                           f"{_fmt(got[i].reshape(-1))} but the draft on that row alone gives "
                           f"{_fmt(want[i].reshape(-1))} (max error {err:.3g})")
    return None


def _rows(name: str, cls: type[DraftModel], make: Callable[[MarkovLM], DraftModel]) -> Callable[[], Failure | Skipped | None]:
    def check() -> Failure | Skipped | None:
        if not cls.supports_rows:
            return Skipped(f"draft {name!r} ({cls.__name__}) declares no rows mode (supports_rows is False): "
                           "there is no rows mode to check")
        target, _ = sparse_markov_pair(VOCAB, 0)
        sampling = SAMPLINGS["T1"]
        rows = list(range(len(PROMPTS)))
        many = make(target)
        many.begin_rows([list(p) for p in PROMPTS])
        alone = [one_row(make(target)) for _ in rows]
        for draft, prompt in zip(alone, PROMPTS):
            draft.begin(list(prompt))
        for step in range(2):
            (q,), _ = laws_and_flags(many.request_logits(DraftRequest(level=0, rows=len(rows), width=VOCAB,
                                                                      proposal=False)), (sampling,))
            failure = _compare(name, f"step {step} root law", rows, q, [a.root_distribution(sampling) for a in alone])
            if failure is not None:
                return failure
            levels = [_nodes(r) for r in rows]
            for level, (pi, ti) in enumerate(((0, 1), (2, 3))):
                parents = torch.tensor([lv[pi] for lv in levels], dtype=torch.int64)
                tokens = torch.tensor([lv[ti] for lv in levels], dtype=torch.int64)
                request = DraftRequest(level=level + 1, rows=len(rows), width=VOCAB, proposal=False,
                                       parents=parents, tokens=tokens, first_id=1 + 2 * level)
                (q,), _ = laws_and_flags(many.request_logits(request), (sampling,))
                want = [a.expand(lv[pi], lv[ti], sampling) for a, lv in zip(alone, levels)]
                failure = _compare(name, f"step {step} tree level {level + 1} (tokens {tokens.tolist()})", rows, q, want)
                if failure is not None:
                    return failure
            emitted = [[lv[1][0], (r + step) % VOCAB] if r % 2 == 0 else [(r + 1) % VOCAB]
                       for r, lv in zip(rows, levels)]
            many.commit_rows(emitted)
            for a, e in zip(alone, emitted):
                a.commit(e)
            if step == 0:
                keep = [0, 2]
                many.keep_rows(keep)
                rows, alone = [rows[k] for k in keep], [alone[k] for k in keep]
        return None
    return check


def _exact(name: str, method_name: str, make: Callable[[MarkovLM], DraftModel], sampling: SamplingConfig,
           seed: int) -> Callable[[], Failure | None]:
    def check() -> Failure | None:
        method: Method = get("method", method_name)
        tree_cls = get("tree", method.tree)
        options = dict(tree_cls.example_options[0]) if tree_cls.example_options else dict(method.defaults)
        target, _ = sparse_markov_pair(VOCAB, seed, ties=seed % 2 == 1)
        laws = ExactLaws(tree_cls(**options), get("verifier", method.verifier)(), target, one_row(make(target)), sampling)
        gap = laws.check(CONTEXT, 3, chained=True)
        if gap.error <= EXACT_TOL and abs(gap.mass - 1.0) <= EXACT_TOL:
            return None
        return Failure(f"method {method_name!r} (tree {method.tree!r} {options}, verifier {method.verifier!r}) with "
                       f"draft {name!r}: the law of the first 3 tokens is not the target's: {gap.describe(CONTEXT)}")
    return check


def _block(draft: DraftModel, rows: int, sampling: SamplingConfig) -> torch.Tensor:
    """``[B, k, V]`` the processed laws of the draft's block (``k``: :data:`PARALLEL_DEPTH` or its block_size)."""
    depth = min(PARALLEL_DEPTH, cast(ParallelDraft, draft).block_size)
    (q,), _ = laws_and_flags(draft.request_logits(DraftRequest(0, rows, VOCAB, False, block=depth)), (sampling,))
    return q


def _block_laws(name: str, make: Callable[[MarkovLM], DraftModel], sid: str) -> Callable[[], Failure | None]:
    def check() -> Failure | None:
        target, _ = sparse_markov_pair(VOCAB, 0)
        for prompt in PROMPTS:
            draft = make(target)
            size = cast(ParallelDraft, draft).block_size
            if size < 1:
                return Failure(f"draft {name!r} has the parallel form but its block_size is {size}")
            draft.begin_rows([list(prompt)])
            q = _block(draft, 1, SAMPLINGS[sid])[0]  # [k, V]
            for d in range(q.shape[0]):
                why = _not_a_law(q[d], VOCAB)
                if why is not None:
                    return Failure(f"draft {name!r} after prompt {list(prompt)}, {sid}: its block's law at position "
                                   f"{d + 1} {why}: {_fmt(q[d])}")
        return None
    return check


def _block_rows(name: str, cls: type[DraftModel], make: Callable[[MarkovLM], DraftModel]) -> Callable[[], Failure | Skipped | None]:
    def check() -> Failure | Skipped | None:
        if not cls.supports_rows:
            return Skipped(f"draft {name!r} ({cls.__name__}) declares no rows mode: its block has no rows to check")
        target, _ = sparse_markov_pair(VOCAB, 0)
        sampling = SAMPLINGS["T1"]
        rows = list(range(len(PROMPTS)))
        many = make(target)
        many.begin_rows([list(p) for p in PROMPTS])
        alone = [make(target) for _ in rows]
        for draft, prompt in zip(alone, PROMPTS):
            draft.begin_rows([list(prompt)])
        for step in range(2):
            want = [_block(a, 1, sampling)[0] for a in alone]
            failure = _compare(name, f"step {step} parallel block", rows, _block(many, len(rows), sampling), want)
            if failure is not None:
                return failure
            emitted = [[(r + step) % VOCAB] * (1 + r % 2) for r in rows]  # ragged commits
            many.commit_rows(emitted)
            for a, e in zip(alone, emitted):
                a.commit_rows([e])
        return None
    return check


def _parallel_cases(name: str, cls: type[DraftModel], make: Callable[[MarkovLM], DraftModel],
                    settings: SuiteSettings) -> Iterator[Case]:
    for sid in SAMPLINGS:
        yield Case("laws", f"parallel block laws {sid}", _block_laws(name, make, sid))
    yield Case("rows", "parallel block rows: 3 ragged prompts", _block_rows(name, cls, make))
    for method_name in PARALLEL_METHODS:
        verifier = get("verifier", get("method", method_name).verifier)
        for sid in _samplings(verifier):
            for seed in range(settings.table_seeds):
                yield Case("whole-tree", f"method {method_name} with parallel draft {name} chained {sid} seed={seed}",
                           _parallel_exact(name, method_name, make, SAMPLINGS[sid], seed))


def _parallel_exact(name: str, method_name: str, make: Callable[[MarkovLM], DraftModel], sampling: SamplingConfig,
                    seed: int) -> Callable[[], Failure | Skipped | None]:
    exact = _exact(name, method_name, make, sampling, seed)

    def check() -> Failure | Skipped | None:
        target, _ = sparse_markov_pair(VOCAB, seed)
        if not one_row(make(target)).parallel_form:
            return Skipped(f"draft {name!r} writes the batch contract only: its one-row view (the exact laws' "
                           "draft) has no parallel form yet")
        return exact()
    return check


def draft_cases(name: str, settings: SuiteSettings = SuiteSettings()) -> Iterator[Case]:
    """The cases of the registered draft ``name`` (module docstring); one SKIPPED case when it declares no factory."""
    cls: type[DraftModel] = get("draft", name)
    try:
        make = _make(name)
    except InvalidConfigError as exc:
        reason = str(exc)
        yield Case("laws", "laws: built by its factory", lambda: Skipped(reason))
        return
    for sid in SAMPLINGS:
        yield Case("laws", f"laws {sid}", _laws(name, make, sid))
    yield Case("rows", "rows: 3 ragged prompts, then rows 0 and 2", _rows(name, cls, make))
    for method_name in DRAFT_METHODS:
        verifier = get("verifier", get("method", method_name).verifier)
        for sid in _samplings(verifier):
            for seed in range(settings.table_seeds):
                yield Case("whole-tree", f"method {method_name} with draft {name} chained {sid} seed={seed}",
                           _exact(name, method_name, make, SAMPLINGS[sid], seed))
    method = get("method", DRAFT_METHODS[0])
    options = dict(get("tree", method.tree).example_options[0])
    yield Case("greedy", f"greedy method {DRAFT_METHODS[0]} with draft {name}",
               _greedy(method.tree, method.verifier, options, make))
    yield Case("batch", f"batch method {DRAFT_METHODS[0]} with draft {name} T1",
               _batch(method.tree, method.verifier, options, "T1", make))
    if cls.parallel_form:
        yield from _parallel_cases(name, cls, make, settings)
