"""Shared helpers of the tree builders: parameter checks, tie-safe top-k, draws.

Every random draw goes through a :class:`~specdec.rng.RandomSource`
(``rng.categorical``), so the exact enumeration tests
(:func:`specdec.testing.exact_law`) walk the very code generation runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from specdec._constants import device_constant
from specdec.errors import InvalidConfigError
from specdec.rng import RandomSource
from specdec.tree import SampleMode

__all__ = [
    "check_int",
    "check_mode",
    "check_paths",
    "DraftLaw",
    "draft_law",
    "draw_children",
    "draw_rows",
    "log_weight",
    "log_weights",
    "MIN_WEIGHT",
    "min_top1_weight",
    "normalised_law",
    "residual_masses",
    "slot_residual",
    "row_mass",
    "top_tokens",
    "MAX_TREE_NODES",
    "top_tokens_fixed",
    "top_tokens_tensors",
]


MAX_TREE_NODES = 1 << 16
"""The most nodes (root included) any built-in builder may put in one tree:
a bound on chain depth, dynamic trees' ``N`` and depth and static trees, so a
typo (``depth=10**9``) is an error, not a step that never ends."""


def check_int(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` if it is an ``int`` in ``[minimum, maximum]``; else raise :class:`InvalidConfigError`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidConfigError(f"{name} must be an int <= {maximum}, got {value!r}")
    return value


def check_mode(value: object) -> SampleMode:
    """Convert ``"iid"`` / ``"wor"`` (or a :class:`SampleMode`) to a :class:`SampleMode`."""
    if isinstance(value, SampleMode):
        return value
    try:
        return SampleMode(value)
    except ValueError:
        raise InvalidConfigError(
            f"mode must be 'iid' (i.i.d. draws, rule 3) or 'wor' (without replacement, rule 4), got {value!r}"
        ) from None


def normalised_law(q: torch.Tensor, *, on_device: bool = False) -> torch.Tensor:
    """``q`` in float64, renormalised to sum to 1 exactly as it will be sampled.

    Args:
        q: ``[..., V]`` processed draft probabilities (any float dtype).
        on_device: keep a CUDA tensor on its device (the dynamic builders only
            move their few top-ranked entries to the CPU); otherwise, and for
            devices without float64 (MPS), the result is on the CPU.

    Returns:
        ``[..., V]`` float64 rows ``q / sum(q)``. Builders draw from and record
        this law, so the recorded law is exactly the one sampled from.

    Public as :func:`specdec.trees.normalised_law`: a builder of your own
    passes the draft's ``q`` (float32 from the model) through it before drawing
    children (``rng.categorical`` refuses a law that does not sum to 1 within
    its dtype's rounding, :func:`~specdec.rng_sources.check_categorical`) and
    records the very law it drew from.

    Example:
        >>> import torch
        >>> from specdec.trees import normalised_law
        >>> q = torch.tensor([0.2, 0.3, 0.4])  # float32, mass 0.9
        >>> law = normalised_law(q)
        >>> law.dtype, round(float(law.sum()), 12), [round(x, 4) for x in law.tolist()]
        (torch.float64, 1.0, [0.2222, 0.3333, 0.4444])
    """
    device = q.device if on_device and q.device.type == "cuda" else torch.device("cpu")
    q = (q.detach() if q.requires_grad else q).to(device)  # (no op where no graph is kept, or already there)
    total = law_total(q)  # [..., 1]
    q64 = q.to(torch.float64)
    if q64.data_ptr() == q.data_ptr():  # already float64: a new tensor
        return q64 / total
    return q64.div_(total)  # the copy made above, divided in place (the same bits)


def top_tokens(q: torch.Tensor, count: int) -> list[list[tuple[int, float]]]:
    """The ``count`` most probable tokens of each row, tie-safe.

    Ranking within a row is by ``(-q(x), x)``: decreasing probability, ties
    broken by the smaller token id. This tie rule only decides *which* tokens
    fill a node's deterministic slots; it is a function of ``q`` alone (no
    random draw), so it is harmless for losslessness. It is never used to rank
    nodes against each other (that is the total order (-score, creation
    index), docs/trees.md, ``eagle``). Tokens with ``q = 0`` are
    never returned, so a row may yield fewer than ``count`` tokens.

    Args:
        q: ``[k, V]`` float64 probabilities.
        count: ``>= 1`` tokens wanted per row.

    Returns:
        ``k`` lists of ``(token, q(token))``, most probable first.

    Example:
        >>> import torch
        >>> top_tokens(torch.tensor([[0.25, 0.5, 0.25, 0.0]], dtype=torch.float64), 3)
        [[(1, 0.5), (0, 0.25), (2, 0.25)]]
    """
    return [list(zip(ids.tolist(), probs.tolist())) for ids, probs in top_tokens_tensors(q, count)]


def top_tokens_tensors(q: torch.Tensor, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`top_tokens` as tensors: per row, ``([n] int64 ids, [n] probs)`` with
    ``n <= count``, in the same order (``(-q(x), x)``; tokens with ``q = 0``
    never returned). For large ``count`` (a sparse draft of hundreds of
    entries) this avoids building Python lists.

    Example:
        >>> import torch
        >>> ids, probs = top_tokens_tensors(torch.tensor([[0.25, 0.5, 0.25, 0.0]], dtype=torch.float64), 3)[0]
        >>> ids.tolist(), probs.tolist()
        ([1, 0, 2], [0.5, 0.25, 0.25])
    """
    if q.dim() != 2:
        raise ValueError(f"top_tokens expects [k, V] probabilities, got shape {tuple(q.shape)}")
    vocab = q.shape[-1]
    if count >= vocab:
        threshold = torch.zeros(q.shape[0], 1, dtype=q.dtype, device=q.device)
    else:
        # torch.topk's *values* are exact; only its order among equal values is
        # unspecified, so take every token >= the count-th value and sort those
        # stably ourselves.
        threshold = torch.topk(q, count, dim=-1).values[:, -1:]
    rows, cols = torch.nonzero((q >= threshold) & (q > 0), as_tuple=True)  # row-major: ids ascending
    values = q[rows, cols]
    # order by (row, -q, id): stable sort by -q, then stable sort by row
    by_value = torch.sort(values, descending=True, stable=True).indices
    order = by_value[torch.sort(rows[by_value], stable=True).indices]
    sizes = torch.bincount(rows, minlength=q.shape[0]).tolist()
    # ties at the threshold may keep more than ``count`` tokens in a row: cut them
    return [(c[:count], v[:count]) for c, v in zip(cols[order].split(sizes), values[order].split(sizes))]


class DraftLaw(NamedTuple):
    """Draft laws ``q = probs / total`` of ``R`` rows, with no ``[R, V]`` float64 law made
    (:func:`draft_law`; what the level-wise driver hands its level functions).

    ``q`` in float64 is ``probs.to(float64) / total`` entry by entry, the bits
    :func:`normalised_law` gives, so only the entries that are read need the
    division: ranking by ``probs`` ranks by ``q`` (dividing by one positive
    ``total`` keeps the order and the ties of values with 24 or 53 bits of
    mantissa), and the few ranked entries are divided after the gather. No
    level function reads the dense law (RheoSampling's residual ``1 - q(S)``
    is read from ``S``'s entries, :func:`slot_residual`).

    Attributes:
        probs: ``[R, V]`` processed draft probabilities (any float dtype; rows flagged ``bad`` are not laws).
        total: ``[R, 1]`` float64 the sum of each row of ``probs`` in float64 (:func:`normalised_law`'s divisor).
        bad: ``[R, 1]`` bool rows whose draft logits were not a distribution: ``q`` is 0 there.
    """

    probs: torch.Tensor
    total: torch.Tensor
    bad: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.probs.shape

    @property
    def device(self) -> torch.device:
        return self.probs.device


_TOTAL_CHUNK = 1 << 19
"""Entries per float64 chunk of :func:`law_total` on a CPU (4 MiB)."""


def law_total(probs: torch.Tensor) -> torch.Tensor:
    """``[..., 1]`` float64 the sum of each row of ``probs`` ``[..., V]`` in float64:
    :func:`normalised_law`'s divisor and :class:`DraftLaw`'s ``total``.

    On a CPU, eagerly, a few rows at a time (4 MiB of float64) are copied to
    float64 and summed: the bits of ``probs.sum(-1, dtype=float64)`` (each
    row is summed alone, in the same order), which makes a float64 copy of
    the whole ``[R, V]`` inside: past glibc's 32 MiB mmap threshold that copy
    is fresh memory at every call, so at ``V = 128256`` 80 rows (a batch of
    8 beams of 10) cost 62 ms that way and 7 ms in chunks (10 rows: about 1
    ms either way). Elsewhere, and in a compiled graph, it is that one op
    (fused there: no copy).
    """
    if probs.dtype == torch.float64:
        return probs.sum(dim=-1, keepdim=True)
    if probs.device.type != "cpu" or torch.compiler.is_compiling():
        return probs.sum(dim=-1, keepdim=True, dtype=torch.float64)
    V = probs.shape[-1]
    per = max(1, _TOTAL_CHUNK // max(V, 1))  # rows per chunk
    if probs.numel() <= per * V:  # one chunk: two ops
        return probs.to(torch.float64).sum(dim=-1, keepdim=True)
    rows = probs.reshape(-1, V)  # [R, V]
    total = torch.cat([c.to(torch.float64).sum(dim=-1, keepdim=True) for c in rows.split(per)])  # [R, 1]
    return total.reshape(*probs.shape[:-1], 1)


def draft_law(q: torch.Tensor, bad: torch.Tensor) -> DraftLaw:
    """:class:`DraftLaw` of processed draft probabilities ``q`` ``[R, V]`` and their flags
    ``bad`` (``R`` of them, any shape): :func:`normalised_law` (``on_device=True``) without its
    ``[R, V]`` copy and division (its divisor is the same op on the same tensor, :func:`law_total`)."""
    device = q.device if q.device.type in ("cuda", "cpu") else torch.device("cpu")
    probs = q.detach() if q.requires_grad else q
    if probs.device != device:  # (no op where it is already there)
        probs, bad = probs.to(device), bad.to(device)
    return DraftLaw(probs, law_total(probs), bad.reshape(-1, 1))


def _as_law(q: torch.Tensor | DraftLaw) -> tuple[torch.Tensor, DraftLaw | None]:
    """``(probs, law)``: a :class:`DraftLaw`'s probs and the law, or ``(q, None)`` for a float64 law."""
    if isinstance(q, DraftLaw):
        return q.probs, q
    return q, None


_GROUP_MIN_VOCAB = 16384
"""Rows at least this long (on a CPU) are ranked in two stages by :func:`top_tokens_fixed`."""


def top_tokens_fixed(q: torch.Tensor | DraftLaw, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`top_tokens` as fixed-shape tensors, with no host read.

    The same tokens in the same order (``(-q(x), x)``; among tokens tied at
    the cut the smaller ids are kept), padded where a row has fewer than
    ``count`` positive entries.

    On a CPU, long rows are ranked in two stages (:func:`_group_candidates`):
    the entries of the best ``count`` groups of consecutive ids hold every
    token returned, so the full row is read once, by a max per group.

    Args:
        q: ``[R, V]`` float64 probabilities, or a :class:`DraftLaw` (ranked by
            its ``probs``, the returned values divided by its ``total``, its
            bad rows empty).
        count: ``>= 1`` tokens wanted per row.

    Returns:
        ``ids [R, c]`` int64 (``-1`` padded) and ``probs [R, c]`` (``0`` padded; float64
        for a :class:`DraftLaw`), ``c = min(count, V)``.

    Example:
        >>> import torch
        >>> ids, probs = top_tokens_fixed(torch.tensor([[0.25, 0.5, 0.25, 0.0]], dtype=torch.float64), 4)
        >>> ids.tolist(), probs.tolist()
        ([[1, 0, 2, -1]], [[0.5, 0.25, 0.25, 0.0]])
    """
    probs, law = _as_law(q)
    R, V = probs.shape
    c = min(count, V)
    group = _group_size(V, c) if probs.device.type == "cpu" and V >= _GROUP_MIN_VOCAB else 0
    if group:
        candidates, where = _group_candidates(probs, c, group)  # [R, c * group] and their ids (ascending)
        values, ids = _ranked(candidates, c)
        ids = where.gather(-1, ids)
    else:
        values, ids = _ranked(probs, c)
    if law is not None:
        values = torch.div(values, law.total)  # [R, c] float64 (promoted): q at the ranked entries, normalised_law's bits
        values = values.masked_fill(law.bad, 0.0)  # a bad row: q is 0 (no child)
    # a token of probability 0 is never proposed (the tied ones included, when the cut is 0); probs are >= 0
    return torch.where(values > 0, ids, -1), values


_KEY_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
"""Float dtypes whose values :func:`_order_keys` packs with their column into one int64 key."""
_LOW = 0xFFFFFFFF
"""The key's low 32 bits: ``_LOW - column`` (the smaller column, the larger key)."""


def _order_keys(q: torch.Tensor) -> torch.Tensor | None:
    """``[R, n]`` int64 keys ordering the entries of ``q`` ``[R, n]`` by ``(-value, column)``
    (larger key first, every key distinct), or ``None`` for a dtype that does not fit.

    The bits of a non-negative float, read as a signed integer of the same width, grow with
    its value, so ``bits << 32 | (2^32 - 1 - column)`` compares as the pair does: one
    ``topk`` on the keys ranks by the total order with no tie left to break. Negative
    entries (the ``-1`` padding of :func:`_group_candidates`) get negative keys, below every
    probability; a NaN (a bad row, whose result is discarded) gets a large one."""
    bits = _KEY_BITS.get(q.dtype)
    if bits is None or q.shape[-1] > _LOW:
        return None
    return (q.view(bits).to(torch.int64) << 32) | _low_keys(q.shape[-1], q.device)  # [R, n]


@device_constant(16)
def _low_keys(n: int, device: torch.device) -> torch.Tensor:
    """``[n]`` int64 ``2^32 - 1 - column``, once per size and device (never written to)."""
    return _LOW - torch.arange(n, device=device)


def _top_keys(keys: torch.Tensor, c: int, ordered: bool = True) -> torch.Tensor:
    """``[R, c]`` int64 columns of the ``c`` largest keys of each row, largest first
    (``ordered=False``: the same columns in an unspecified order, a cheaper topk)."""
    return _LOW - (torch.topk(keys, c, dim=-1, sorted=ordered).values & _LOW)


def _ranked(q: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[R, c]`` the ``c`` largest values of each row of ``q`` and their columns, ordered by
    ``(-value, column)``, the columns tied at the cut the smallest ones (zeros included)."""
    keys = _order_keys(q)
    if keys is not None:  # one topk on (value, column) keys: ties ordered by construction
        ids = _top_keys(keys, c)  # [R, c]
        return q.gather(-1, ids), ids
    values, ids = torch.topk(q, c, dim=-1)  # [R, c]: exact values; which of the tokens tied at the cut, not trusted
    kth = values[:, -1:]  # [R, 1]
    # order the c candidates by (-q, id): sort by id, then stably by -q; the tokens tied at the cut come last
    ids, perm = torch.sort(ids, dim=-1)
    values, order = torch.sort(values.gather(-1, perm), dim=-1, descending=True, stable=True)
    ids = ids.gather(-1, order)
    # the places of the tied tokens go to the tokens equal to the cut with the smallest ids: the k-th slot holding
    # the cut's value takes the k-th of them, found by a binary search in their running count over V
    wanted = torch.cumsum(values == kth, dim=-1, dtype=torch.int32)  # [R, c]: 0 above the cut, then 1, 2, ...
    running = torch.cumsum(q == kth, dim=-1, dtype=torch.int32)  # [R, V] (int32: half the bytes of the pass over V)
    tied = torch.searchsorted(running, wanted)  # [R, c] int64 ids (slots above the cut: unused)
    return values, torch.where(wanted > 0, tied, ids)


def _group_size(V: int, c: int) -> int:
    """The group length of :func:`_group_candidates` for ``c`` of ``V`` entries (a power of two
    with at least 8 groups per candidate group), or 0 where grouping would not shorten the row."""
    group = 128  # (fastest at c = 10, V = 128256 on this CPU; c = 1024 takes 8)
    while group > 8 and c * group * 8 > V:
        group //= 2
    return group if c * group * 8 <= V else 0


def _group_candidates(q: torch.Tensor, c: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of the ``c`` best groups of ``group`` consecutive columns of each row of
    ``q`` ``[R, V]`` (groups ranked by ``(-max, index)``, as :func:`_ranked` ranks entries),
    ``[R, c * group]`` in ascending column order, and their columns (past ``V``: value -1).

    They hold the ``c`` largest values of the row and, among the columns tied
    at the ``c``-th, the smallest ones: every group holding an entry above the
    cut ``v`` is chosen (fewer than ``c`` entries are above ``v``, so fewer
    than ``c`` groups have a max above ``v``), the other chosen groups have
    max ``v`` and are the first such groups, each holding an entry equal to
    ``v`` at a smaller column than any entry of an unchosen group; so the
    ``c`` best entries of the candidates under ``(-value, column)`` are the row's.
    """
    R, V = q.shape
    full = V - V % group
    bits = _KEY_BITS.get(q.dtype)
    if bits is not None and V <= _LOW and not torch.compiler.is_compiling():
        # eagerly, the maxima of the value bits read as integers: the same order and ties as the values'
        # for probabilities (>= 0; a NaN, in a bad row whose result is discarded, gets a large one), and
        # an integer max is about 2.4x faster on a CPU than a float one, which minds NaNs (a -0.0 reads
        # below +0.0: it only reorders groups whose entries are all 0, never proposed). Compiled, the
        # float max (inductor's kernel for the integer one took rheo's compiled step from 40 to 77 ms)
        ints = q.view(bits)  # [R, V]
        maxima = ints.unfold(-1, group, group).amax(dim=-1)  # [R, G] (a view: no copy of the row)
        if full < V:
            maxima = torch.cat([maxima, ints[:, full:].amax(dim=-1, keepdim=True)], dim=-1)
        G = maxima.shape[-1]
        # [R, G]: _order_keys of the maxima
        keys: torch.Tensor | None = (maxima.to(torch.int64) << 32) | _low_keys(G, q.device)
    else:
        maxima = q.unfold(-1, group, group).amax(dim=-1)  # [R, G]
        if full < V:
            maxima = torch.cat([maxima, q[:, full:].amax(dim=-1, keepdim=True)], dim=-1)
        G = maxima.shape[-1]
        keys = _order_keys(maxima)
    if keys is not None:  # the c best groups by (-max, index), in ascending index order
        chosen = torch.sort(_top_keys(keys, c, ordered=False), dim=-1).values  # [R, c] (distinct keys: the same set)
        return _group_entries(q, chosen, group)
    # the chosen groups: every max above the c-th largest max, then the first groups (by index) equal to it
    kth = torch.topk(maxima, c, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)  # [R, 1]
    tied = maxima == kth  # [R, G]
    above = maxima > kth
    take = above | (tied & (torch.cumsum(tied, dim=-1) <= c - above.sum(dim=-1, keepdim=True)))  # [R, G]: c groups
    # their indices in ascending order, by each one's rank among them (a row with NaN is bad: any index will do)
    place = torch.where(take, torch.cumsum(take, dim=-1) - 1, c)  # [R, G]; c: a discard column
    chosen = torch.zeros(R, c + 1, dtype=torch.int64, device=q.device).scatter_(
        -1, place, _offsets(G, q.device).expand(R, G)
    )[:, :c]  # [R, c] ascending group indices
    return _group_entries(q, chosen, group)


def _group_entries(q: torch.Tensor, chosen: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of ``q`` ``[R, V]`` in the groups ``chosen`` ``[R, c]`` (ascending) and their
    columns, ``[R, c * group]`` each (columns past ``V``: value -1)."""
    R, V = q.shape
    c = chosen.shape[-1]
    columns = (chosen.unsqueeze(-1) * group + _offsets(group, q.device)).reshape(R, c * group)  # [R, c * group]
    values = q.gather(-1, columns.clamp(max=V - 1))
    if V % group:  # the last group's columns past V: below every probability
        values = values.masked_fill(columns >= V, -1.0)
    return values, columns


@device_constant(16)
def _offsets(group: int, device: torch.device) -> torch.Tensor:
    """``[group]`` int64 ``0 .. group - 1``, once per size and device (never written to)."""
    return torch.arange(group, device=device)


def draw_rows(
    probs: torch.Tensor,
    count: int,
    mode: SampleMode,
    rng: RandomSource,
    active: torch.Tensor,
    *,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw ``count`` columns of every active row of ``probs``, i.i.d. or
    without replacement: :func:`draw_children` for a batch of rows.

    Draw ``j`` of every row is made before draw ``j + 1`` of any row (one
    :meth:`~specdec.rng.RandomSource.categorical_rows` call each). Without
    replacement a drawn column is zeroed before the next draw, and a row whose
    positive entries are exhausted draws no more (rule 4's law).

    Args:
        probs: ``[R, L]`` float64 rows summing to 1 (active rows).
        count: draws per row (``>= 1``).
        mode: :class:`SampleMode`.
        rng: the source of every draw.
        active: ``[R]`` bool rows to draw for.
        counts: ``[R]`` int64 draws wanted per row (``<= count``; default ``count`` for every row).

    Returns:
        ``[R, count]`` int64 drawn columns in draw order, ``-1`` where nothing was drawn.
    """
    drawn = []
    remaining = probs  # [R, L]
    for j in range(count):
        wanted = active if counts is None else active & (counts > j)  # [R]
        if mode == SampleMode.WITHOUT_REPLACEMENT:
            mass = row_mass(remaining)  # [R]
            live = wanted & (mass > 0)  # [R]
            column = rng.categorical_rows(remaining / torch.where(live, mass, 1.0).unsqueeze(-1), live)  # [R]
            zeroed = remaining.scatter(-1, column.clamp_min(0).unsqueeze(-1), 0.0)
            remaining = torch.where((column >= 0).unsqueeze(-1), zeroed, remaining)
        else:
            column = rng.categorical_rows(probs, wanted)  # [R]
        drawn.append(column)
    return torch.stack(drawn, dim=-1)


def draw_children(
    probs: torch.Tensor, count: int, mode: SampleMode, rng: RandomSource, *, exclude: Sequence[int] = ()
) -> list[int]:
    """Draw ``count`` indices from ``probs``, i.i.d. or without replacement.

    Without replacement (docs/verifiers.md rule 4, the law the verifier undoes):
    sequential categorical draws from ``probs`` with each drawn index zeroed
    and the rest renormalised (the mass summed left to right, :func:`row_mass`).
    If fewer than ``count`` indices have positive probability, every one of
    them is drawn (in draw order) and no more.

    Args:
        probs: ``[L]`` float64 probabilities summing to 1.
        count: number of draws wanted (``>= 0``).
        mode: :class:`SampleMode`.
        rng: the source of every draw (``rng.categorical``).
        exclude: without replacement, indices drawn before (zeroed first), so
            that a node's draws can be made one at a time.

    Returns:
        The drawn indices into ``probs``, in draw order.
    """
    if mode == SampleMode.IID:
        return [rng.categorical(probs) for _ in range(count)]
    drawn: list[int] = []
    remaining = probs.clone()
    if exclude:
        remaining[list(exclude)] = 0.0
    for _ in range(count):
        mass = float(row_mass(remaining))
        if not mass > 0.0:
            break
        index = rng.categorical(remaining / mass)
        drawn.append(index)
        remaining[index] = 0.0
    return drawn


def row_mass(x: torch.Tensor) -> torch.Tensor:
    """``[...]`` the sum of each row of ``x`` ``[..., L]``, as the last entry of
    its cumulative sum: summed left to right, so trailing zeros (padding)
    never change it and a row sums to the same bits alone or in a batch (on
    the CPU). The per-node and the tensor builders both use it."""
    return torch.cumsum(x, dim=-1)[..., -1]


def residual_masses(q: torch.Tensor, deterministic: torch.Tensor) -> torch.Tensor:
    """``[k]`` residual mass ``1 - q(S)`` of each row (:func:`slot_residual` of ``q``'s
    entries at ``S``): read from ``S`` alone, not from the row.

    Args:
        q: ``[k, V]`` float64 draft laws.
        deterministic: ``[k, s]`` int64 token ids of each row's ``S``, ``-1`` padded.
    """
    return slot_residual(torch.where(deterministic >= 0, q.gather(-1, deterministic.clamp_min(0)), 0.0))


def slot_residual(in_s: torch.Tensor) -> torch.Tensor:
    """``[k]`` float64 ``1 - q(S)``: one minus the sum (:func:`row_mass`, left to right) of
    ``q`` at ``S`` (``in_s`` ``[k, s]``, ``0`` padded), clamped at 0; ``1`` for an empty ``S``.

    ``O(s)`` per row, where the sum of ``q`` outside ``S`` reads the vocabulary. Where ``S``
    holds all of a row's support the result can be a few ulps above 0: RheoSampling gives a
    node a sampled slot only where a positive entry remains outside ``S`` as well (the
    first candidate of ``q'``), so such a node gets none, as with an exact 0. The per-node
    and the tensor builders both use it (the same bits)."""
    if in_s.shape[-1] == 0:
        return torch.ones(in_s.shape[0], dtype=torch.float64, device=in_s.device)
    return (1.0 - row_mass(in_s)).clamp_min(0.0)


MIN_WEIGHT = float(torch.finfo(torch.float64).tiny)
"""The least construction weight of RheoSampling's ``"min_top1"`` proxy: ``1 - q(top1)`` rounds to 0
where the rest of ``q`` lies below an ulp of 1, and a construction weight must be positive."""


def min_top1_weight(top1: torch.Tensor) -> torch.Tensor:
    """RheoSampling's ``"min_top1"`` proxy ``min(q(top1), 1 - q(top1))`` (at least :data:`MIN_WEIGHT`)
    of ``q(top1)`` (any shape, float64): the per-node and the tensor builders both use it (the same bits).

    Example:
        >>> import torch
        >>> min_top1_weight(torch.tensor([0.7, 0.2, 1.0], dtype=torch.float64)).tolist()
        [0.30000000000000004, 0.2, 2.2250738585072014e-308]
    """
    return torch.minimum(top1, 1.0 - top1).clamp_min(MIN_WEIGHT)


def masked_outside(q: torch.Tensor, det_ids: torch.Tensor) -> torch.Tensor:
    """``[k, V]`` ``q`` with the tokens ``det_ids`` ``[k, s]`` (``-1`` padded, ignored) zeroed."""
    hit = torch.zeros(q.shape, dtype=torch.int64, device=q.device)  # a count: padding (-1 -> 0) adds 0
    hit.scatter_add_(-1, det_ids.clamp_min(0), (det_ids >= 0).to(torch.int64))
    return q.masked_fill(hit > 0, 0.0)


def log_weights(weights: Sequence[float]) -> list[float]:
    """``log(w)`` of construction weights in ``(0, 1]`` (path scores add these).

    torch's float64 ``log``, in one call, not ``math.log``: the two differ in
    the last bit for about 0.1% of inputs, and the tensor builders
    (:mod:`specdec.trees.levelwise`) rank by torch's.
    """
    for weight in weights:
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"construction weights must lie in (0, 1], got {weight!r}")
    return torch.log(torch.tensor(weights, dtype=torch.float64)).tolist()


def log_weight(weight: float) -> float:
    """``log(weight)`` for one construction weight in ``(0, 1]`` (:func:`log_weights`)."""
    return log_weights([weight])[0]


def check_paths(paths: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Validate and normalise an explicit tree shape given as child-slot paths.

    A path ``(i0, i1, ..., ik)`` names the node reached by taking the root's
    child slot ``i0``, then that node's slot ``i1``, and so on. The set must be
    non-empty, prefix-closed (every proper prefix is itself a path), and the
    slots of each node's children must be exactly ``0..c-1``.

    Returns:
        The paths sorted breadth first (by length, then lexicographically).
    """
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence) or len(paths) == 0:
        raise InvalidConfigError(f"paths must be a non-empty sequence of tuples of slot indices, got {paths!r}")
    norm: set[tuple[int, ...]] = set()
    for path in paths:
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or len(path) == 0:
            raise InvalidConfigError(f"each path must be a non-empty tuple of slot indices, got {path!r}")
        for slot in path:
            if not isinstance(slot, int) or isinstance(slot, bool) or slot < 0:
                raise InvalidConfigError(f"slot indices must be ints >= 0, got {slot!r} in path {tuple(path)!r}")
        t = tuple(int(s) for s in path)
        if t in norm:
            raise InvalidConfigError(f"path {t!r} is listed twice")
        norm.add(t)
    children: dict[tuple[int, ...], list[int]] = {}
    for t in norm:
        if len(t) > 1 and t[:-1] not in norm:
            raise InvalidConfigError(f"path {t!r} needs its parent path {t[:-1]!r} (paths must be prefix-closed)")
        children.setdefault(t[:-1], []).append(t[-1])
    for parent, slots in children.items():
        if sorted(slots) != list(range(len(slots))):
            raise InvalidConfigError(
                f"the child slots of path {parent!r} must be 0..{len(slots) - 1}, got {sorted(slots)}"
            )
    return tuple(sorted(norm, key=lambda t: (len(t), t)))
