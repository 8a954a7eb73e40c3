"""Per-tree authoring turned into the batch contract the engine speaks.

A researcher writes a tree builder the way the papers describe one: a host
:meth:`~specdec.trees.base.OneTreeBuilder.build` that grows ONE tree, asking a one-row
:class:`~specdec.drafts.base.DraftModel` for laws (:meth:`~specdec.drafts.base.DraftModel.root_distribution`,
:meth:`~specdec.drafts.base.DraftModel.expand`) and drawing from one random source. The
engine only ever speaks the batch form: a *build* (:mod:`specdec.trees.feed`) that yields
one :class:`~specdec.draft_request.DraftRequest` over all ``B`` rows per draft call and
receives that call's logits. :func:`host_feed` is the adapter between the two, so a
builder written from the docs runs wherever a built-in one runs: single and batched
generation (``generate_batch``, ``stream_batch``), per-request sampling, the serving
feed (:class:`~specdec.trees.feed.TreeFeed`) and the bench.

How it runs ``B`` host builds as one build:

- each row's host ``build`` runs in its own worker thread against a one-row *view* of
  the drafter (:class:`RowDraftView`); a call to the view's ``root_logits`` /
  ``tree_logits`` hands the request to the caller and waits for the answer;
- the threads take turns: exactly one runs at a time, resumed by the build, so every
  row draws from its own random source in the same order as in a batch of one, and the
  result does not depend on thread scheduling;
- the rows' requests are merged into one request per draft call (each row's nodes
  numbered after the draft ids already given; a row that asks fewer nodes, or has
  finished, gets filler slots: the root's token under the root, not live), the same
  numbering as per-request sampling's groups (:func:`specdec.trees.feed.group_build`);
- each row's tree (a :class:`~specdec.tree.DraftTree`) is stacked into the step's
  :class:`~specdec.tree_batch.TreeBatch` on the roots' device.

Every row asks the root's law first (level 0; the one draft call every builder needs), so
the root row is computed once for all rows. Cost: host work per node, as the host build
itself; the draft forwards are batched across rows (one per round of requests).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any, Protocol, cast

import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel, OneRowDraft
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource, RowStreams
from specdec.sampling import SamplingConfig
from specdec.targets.base import OneRowTarget, TargetModel
from specdec.tree import DraftTree
from specdec.tree_batch import TreeBatch
from specdec.trees.feed import Build, DraftSpec, merged_build

__all__ = ["DraftRowCopies", "FeatureDraftRowCopies", "HostBuild", "OneRowOf", "RowDraftView", "TargetRowCopies", "host_feed",
           "one_row", "row_sources_of", "rows_draft", "rows_target"]


class HostBuild(Protocol):
    """A per-tree build (:meth:`OneTreeBuilder.build <specdec.trees.base.OneTreeBuilder.build>`, bound to its builder)."""

    __qualname__: str

    def __call__(self, root_token: int, draft: OneRowDraft, sampling: SamplingConfig, rng: RandomSource) -> DraftTree:
        ...


class _Cancelled(BaseException):
    """Raised inside a row's worker thread when its build is abandoned (not an error of the builder)."""


class _Turn:
    """The hand-over between a build (the caller's thread) and one row's worker thread:
    each side waits while the other runs, so exactly one of them runs at a time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._to_worker: tuple[str, Any] | None = None
        self._to_build: tuple[str, Any] | None = None

    def ask(self, kind: str, payload: Any) -> Any:
        """Worker side: hand ``(kind, payload)`` to the build and wait for its answer."""
        with self._cond:
            self._to_build = (kind, payload)
            self._cond.notify_all()
            while self._to_worker is None:
                self._cond.wait()
            what, answer = self._to_worker
            self._to_worker = None
        if what == "cancel":
            raise _Cancelled()
        return answer

    def finish(self, kind: str, payload: Any) -> None:
        """Worker side: the last message (``"done"`` with the tree, or ``"error"``)."""
        with self._cond:
            self._to_build = (kind, payload)
            self._cond.notify_all()

    def cancel(self) -> None:
        """Build side: release a worker waiting for an answer (its build stops; nothing is handed back)."""
        with self._cond:
            self._to_worker = ("cancel", None)
            self._cond.notify_all()

    def resume(self, what: str, answer: Any) -> tuple[str, Any]:
        """Build side: answer the worker (or start it: ``what="start"``) and wait for its next message."""
        with self._cond:
            if what != "start":
                self._to_worker = (what, answer)
                self._cond.notify_all()
            while self._to_build is None:
                self._cond.wait()
            message = self._to_build
            self._to_build = None
        return message


class RowDraftView(OneRowDraft):
    """One row of the step's drafter, as the one-row :class:`~specdec.drafts.base.DraftModel`
    a host ``build`` expects: :meth:`root_logits` and :meth:`tree_logits` are answered by the
    batch's draft call (module docstring). Node ids are the row's own (root 0, then the nodes
    in the order given), as the one-row contract says. Only a build may drive it: ``begin`` and
    ``commit`` belong to the engine's rows and are refused here.

    Args:
        spec: the drafter's vocabulary.
        turn: the hand-over with the build.
        name: the drafter's name in error messages.
    """

    def __init__(self, spec: DraftSpec, turn: _Turn, root_logits: torch.Tensor, name: str) -> None:
        self._spec = spec
        self._turn = turn
        self._root = root_logits
        self.name = name

    def __repr__(self) -> str:
        return f"RowDraftView({self.name})"

    @property
    def vocab_size(self) -> int:
        return self._spec.vocab_size

    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        raise InvalidConfigError("a row view of the step's drafter is driven by the engine: a build may not begin it")

    def commit(self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        raise InvalidConfigError("a row view of the step's drafter is driven by the engine: a build may not commit it")

    def root_logits(self) -> torch.Tensor:
        """``[V]`` the row's root logits (asked once for every row, before the build starts)."""
        return self._root

    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """``[k, V]``: adds ``k`` nodes to the row's draft tree, answered by the batch's next draft call."""
        p = torch.as_tensor(parents, dtype=torch.int64).reshape(-1).cpu()
        t = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1).cpu()
        if p.numel() != t.numel():
            raise InvalidConfigError(f"tree_logits: {p.numel()} parents but {t.numel()} tokens")
        if p.numel() == 0:
            return self._root.new_zeros(0, self._root.shape[-1])
        return self._turn.ask("expand", (p, t))


def row_sources_of(rng: RandomSource, rows: int) -> list[RandomSource]:
    """The ``rows`` rows' own random sources: a :class:`~specdec.rng.RowStreams`'s sources, or
    ``rng`` itself for one row.

    Raises:
        InvalidConfigError: ``rng`` is not one source per row.
    """
    if isinstance(rng, RowStreams):
        if len(rng.sources) != rows:
            raise InvalidConfigError(f"{len(rng.sources)} random sources for {rows} rows")
        return list(rng.sources)
    if rows != 1:
        raise InvalidConfigError(f"{rows} rows need one random source per row (a RowStreams), got {type(rng).__name__}")
    return [rng]


def _row_build(build: HostBuild, root: int, spec: DraftSpec, sampling: SamplingConfig,
               rng: RandomSource, device: torch.device) -> Build:
    """One row's host build as a one-row build (draft nodes numbered from its own root)."""
    root_logits = yield DraftRequest(level=0, rows=1, width=spec.vocab_size, proposal=False)  # [1, V]
    turn = _Turn()
    name = build.__qualname__
    view = RowDraftView(spec, turn, root_logits[0], name)
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def work() -> None:  # the worker runs under the build's grad and inference modes (thread-local in torch)
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                tree = build(root, view, sampling, rng)
        except _Cancelled:
            return
        except BaseException as exc:  # handed to the build's thread, which raises it
            turn.finish("error", exc)
            return
        turn.finish("done", tree)

    worker = threading.Thread(target=work, name=f"specdec-host-build-{name}", daemon=True)
    worker.start()
    kind, payload = turn.resume("start", None)
    level, first_id = 0, 1
    earlier: list[torch.Tensor] = []
    try:
        while kind == "expand":
            parents, tokens = payload
            level += 1
            parents_d = parents.to(device).view(1, -1)
            request = DraftRequest(level=level, rows=1, width=spec.vocab_size, proposal=False, parents=parents_d,
                                   tokens=tokens.to(device).view(1, -1), first_id=first_id, earlier=tuple(earlier))
            earlier.append(parents_d)
            first_id += int(parents.numel())
            logits = yield request  # [1, k, V]
            kind, payload = turn.resume("answer", logits[0])
    finally:
        if kind == "expand":  # the build was abandoned or an error was thrown in: release the worker
            turn.cancel()
        worker.join()
    if kind == "error":
        raise payload
    if not isinstance(payload, DraftTree):
        raise InvalidConfigError(f"{name} returned {type(payload).__name__}, not a DraftTree")
    if int(payload.tokens[0]) != root:
        raise InvalidConfigError(
            f"{name} returned a tree rooted at token {int(payload.tokens[0])}, not the row's root {root}")
    return TreeBatch.from_trees([payload], device=device)


def host_feed(build: HostBuild, roots: torch.Tensor, spec: DraftSpec, sampling: SamplingConfig,
              rng: RandomSource) -> Build:
    """The batch form of a per-tree builder: a build over ``B`` rows (module docstring).

    Args:
        roots: ``[B]`` int64 the rows' last committed tokens.
        spec: the drafter's vocabulary (the host build asks over ``V``).
        rng: one source per row (:func:`row_sources_of`); row ``b``'s build draws only from its own.

    Returns:
        A :data:`~specdec.trees.feed.Build` whose requests cover all ``B`` rows.
    """
    B = int(roots.shape[0])
    sources = row_sources_of(rng, B)
    host_roots = roots.tolist()  # the host builds take int roots
    builds = [_row_build(build, int(host_roots[b]), spec, sampling, sources[b], roots.device) for b in range(B)]
    if B == 1:
        return builds[0]
    return merged_build(builds, [torch.tensor([b], dtype=torch.int64, device=roots.device) for b in range(B)], roots)


class DraftRowCopies(DraftModel):
    """A one-row draft (a :class:`~specdec.drafts.base.OneRowDraft` without a rows mode:
    :attr:`~specdec.drafts.base.DraftModel.supports_rows` False) serving ``B`` rows: one copy
    of it per row (:func:`copy.deepcopy` of the draft as given, made when the rows begin),
    each asked for its own row's logits in turn. The batch's draft call costs ``B`` one-row
    calls; a draft with a rows mode of its own is used as it is.

    Each copy starts as the prototype does (the same weights, the same state), so row ``b``
    gets exactly the logits a batch-1 generation gets from the prototype.

    Args:
        prototype: the one-row draft.
    """

    def __init__(self, prototype: OneRowDraft) -> None:
        self.prototype = prototype
        self.rows: list[OneRowDraft] = []

    def __repr__(self) -> str:
        return f"DraftRowCopies({type(self.prototype).__name__}, rows={len(self.rows)})"

    @property
    def vocab_size(self) -> int:
        return self.prototype.vocab_size

    @property
    def proposal_ids(self) -> torch.Tensor | None:
        return self.prototype.proposal_ids

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.prototype.target_layers

    @property
    def max_length(self) -> int | None:
        return self.prototype.max_length

    def begin_rows(self, prompts: Sequence[Sequence[int]], target_hidden: torch.Tensor | None = None, *,
                   positions: int | None = None) -> None:
        self.rows = [copy.deepcopy(self.prototype) for _ in prompts]
        for b, (row, prompt) in enumerate(zip(self.rows, prompts)):
            if positions is not None:
                with torch.inference_mode(False):
                    row.reserve(positions)
            row.begin(prompt, None if target_hidden is None else target_hidden[b])

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        return torch.stack([row.root_proposal_logits() if proposal else row.root_logits() for row in self.rows])

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        return torch.stack([
            row.tree_proposal_logits(parents[b], tokens[b]) if proposal else row.tree_logits(parents[b], tokens[b])
            for b, row in enumerate(self.rows)
        ])

    def commit_rows(self, emitted: Sequence[Sequence[int]], target_hidden: torch.Tensor | None = None, *,
                    device_tokens: torch.Tensor | None = None, device_counts: torch.Tensor | None = None) -> None:
        if len(emitted) != len(self.rows):
            raise InvalidConfigError(f"commit_rows got {len(emitted)} rows; {len(self.rows)} rows began")
        for b, (row, tokens) in enumerate(zip(self.rows, emitted)):
            row.commit(tokens, None if target_hidden is None else target_hidden[b, : len(tokens)])

    def keep_rows(self, rows: Sequence[int]) -> None:
        self.rows = [self.rows[int(r)] for r in rows]


class FeatureDraftRowCopies(DraftRowCopies):
    """:class:`DraftRowCopies` of a feature-level draft (it reads the target's hidden states)."""

    needs_target_hidden = True


def rows_draft(draft: DraftModel, rows: int) -> DraftModel:
    """The draft the engine runs ``rows`` rows with: ``draft`` itself when it serves several
    rows (:attr:`~specdec.drafts.base.DraftModel.supports_rows`) or one row is asked, else
    :class:`DraftRowCopies` of it (a one-row draft declares ``supports_rows = False``)."""
    if draft.supports_rows or rows == 1:
        return draft
    if not type(draft)._one_row_form:  # declared by OneRowDraft (and 0.1.0's one-row drafts, served as one)
        raise InvalidConfigError(f"{type(draft).__name__} declares supports_rows = False but writes no one-row form "
                                 "(OneRowDraft): a batch draft serves its rows itself")
    one = cast(OneRowDraft, draft)
    return FeatureDraftRowCopies(one) if draft.needs_target_hidden else DraftRowCopies(one)


class TargetRowCopies(TargetModel):
    """A one-row target (a :class:`~specdec.targets.base.OneRowTarget` without a batch mode:
    :attr:`~specdec.targets.base.TargetModel.supports_batch` False) serving ``B`` rows: one copy
    per row (:func:`copy.deepcopy` of the target as given, made when the rows are prefilled),
    each scoring its own row's tree (its host view, :meth:`TreeBatch.tree
    <specdec.tree_batch.TreeBatch.tree>`) in turn. A step costs ``B`` one-row forwards and the
    copies hold ``B`` times the target's state: give a large model a batch mode of its own
    (:class:`~specdec.targets.hf.HFTarget` has one).

    Args:
        prototype: the one-row target.
    """

    def __init__(self, prototype: OneRowTarget) -> None:
        self.prototype = prototype
        self.capture_layers = prototype.capture_layers
        self.rows: list[OneRowTarget] = []

    def __repr__(self) -> str:
        return f"TargetRowCopies({type(self.prototype).__name__}, rows={len(self.rows)})"

    @property
    def vocab_size(self) -> int:
        return self.prototype.vocab_size

    @property
    def max_length(self) -> int | None:
        return self.prototype.max_length

    @property
    def device(self) -> torch.device:
        return self.prototype.device

    def prefill_batch(self, prompts: Sequence[Sequence[int]], *, positions: int | None = None) -> None:
        self.rows = [copy.deepcopy(self.prototype) for _ in prompts]
        for row, prompt in zip(self.rows, prompts):
            if positions is not None:
                with torch.inference_mode(False):
                    row.reserve(positions)
            row.prefill(prompt)

    def score_batch(self, tree: TreeBatch) -> torch.Tensor:
        if tree.batch_size != len(self.rows):
            raise InvalidConfigError(f"a batch of {tree.batch_size} trees for {len(self.rows)} prefilled rows")
        out = []
        for b, row in enumerate(self.rows):
            logits = row.score_tree(tree.tree(b))  # [k, V]
            pad = tree.node_slots - logits.shape[0]
            out.append(torch.cat([logits, logits[:1].expand(pad, -1)]) if pad else logits)
        return torch.stack(out)

    def accept_rows(self, accepted: torch.Tensor, num_accepted: torch.Tensor, emitted: Sequence[Sequence[int]], *,
                    nodes: Sequence[Sequence[int]]) -> None:
        if len(emitted) != len(self.rows):
            raise InvalidConfigError(f"accept_rows got {len(emitted)} rows; {len(self.rows)} rows were prefilled")
        for row, row_nodes, tokens in zip(self.rows, nodes, emitted):
            row.accept(row_nodes, tokens[-1])

    def keep_rows(self, rows: Sequence[int]) -> None:
        self.rows = [self.rows[int(r)] for r in rows]

    def hidden_rows(self) -> torch.Tensor | None:
        hidden = [row.hidden_states() for row in self.rows]
        if any(h is None for h in hidden):
            return None
        n = max(int(h.shape[0]) for h in hidden if h is not None)
        return torch.stack([torch.cat([h, h[:1].expand(n - h.shape[0], *h.shape[1:])]) if h.shape[0] < n else h
                            for h in hidden if h is not None])


def rows_target(target: TargetModel, rows: int) -> TargetModel:
    """The target the engine runs ``rows`` rows with: ``target`` itself when it serves several
    rows (:attr:`~specdec.targets.base.TargetModel.supports_batch`) or one row is asked, else
    :class:`TargetRowCopies` of it."""
    if target.supports_batch or rows == 1:
        return target
    if not type(target)._one_row_target:  # declared by OneRowTarget (and 0.1.0's one-row targets, served as one)
        raise InvalidConfigError(f"{type(target).__name__} declares supports_batch = False but writes no one-row "
                                 "form (OneRowTarget): a batch target serves its rows itself")
    return TargetRowCopies(cast(OneRowTarget, target))


class OneRowOf(OneRowDraft):
    """The per-tree view of a batch draft, for the tools that drive one sequence at a time (the
    exact laws, the conformance command's draft checks, a host build run by hand): ``begin``,
    ``root_logits``, ``tree_logits`` and ``commit`` are the batch contract's calls with one row.

    Args:
        draft: a draft that speaks the batch contract only (a :class:`OneRowDraft` needs no view).
    """

    def __init__(self, draft: DraftModel) -> None:
        self.draft = draft

    def __repr__(self) -> str:
        return f"OneRowOf({type(self.draft).__name__})"

    @property
    def vocab_size(self) -> int:
        return self.draft.vocab_size

    @property
    def proposal_ids(self) -> torch.Tensor | None:
        return self.draft.proposal_ids

    @property
    def max_length(self) -> int | None:
        return self.draft.max_length

    def begin(self, prompt_ids: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        self.draft.begin_rows([prompt_ids], None if target_hidden is None else target_hidden.unsqueeze(0))
        self._next_id = 1

    def _width(self, proposal: bool) -> int:
        ids = self.draft.proposal_ids if proposal else None
        return self.draft.vocab_size if ids is None else int(ids.shape[0])

    def root_logits(self) -> torch.Tensor:
        return self.draft.request_logits(DraftRequest(level=0, rows=1, width=self._width(False), proposal=False))[0]

    def root_proposal_logits(self) -> torch.Tensor:
        return self.draft.request_logits(DraftRequest(level=0, rows=1, width=self._width(True), proposal=True))[0]

    def _tree(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor,
              proposal: bool) -> torch.Tensor:
        p = torch.as_tensor(parents, dtype=torch.int64).view(1, -1)
        t = torch.as_tensor(tokens, dtype=torch.int64).view(1, -1)
        request = DraftRequest(level=1, rows=1, width=self._width(proposal), proposal=proposal, parents=p, tokens=t,
                               first_id=self._next_id)
        self._next_id += int(p.shape[1])
        return self.draft.request_logits(request)[0]

    def tree_logits(self, parents: Sequence[int] | torch.Tensor, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        return self._tree(parents, tokens, False)

    def tree_proposal_logits(self, parents: Sequence[int] | torch.Tensor,
                             tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        return self._tree(parents, tokens, True)

    def commit(self, tokens: Sequence[int], target_hidden: torch.Tensor | None = None) -> None:
        self.draft.commit_rows([tokens], None if target_hidden is None else target_hidden.unsqueeze(0))
        self._next_id = 1


def one_row(draft: DraftModel) -> OneRowDraft:
    """``draft`` as a :class:`OneRowDraft`: itself when it writes the one-row form, else its
    :class:`OneRowOf` view."""
    return cast(OneRowDraft, draft) if type(draft)._one_row_form else OneRowOf(draft)
