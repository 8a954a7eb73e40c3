"""A tree batch checked on the device: the serving call's tree check, with no host read per node.

:meth:`TreeBatch.tree <specdec.tree_batch.TreeBatch.tree>` and :meth:`Verifier.check_tree
<specdec.verify.base.Verifier.check_tree>` check a tree on the host (a few reads per node). The
serving call (:func:`specdec.engine.serving.verify_for_engine`) checks the same invariants as
``[B]`` tensors instead, in three groups:

- **structure** (:func:`check_batch_on_device` ``.malformed``, a bit per broken invariant,
  :data:`MALFORMED`): what makes the tensors no tree at all or out of the batch's bounds
  (a root that is not a root, a parent not before its child, a kind that is none, padding
  that is not padding, depths or ancestors that disagree with the parents, more children
  or depth than the bounds, siblings' ranks or draw orders that are not ``0 .. k - 1``,
  deterministic siblings or children drawn without replacement that repeat a token).
  :func:`raise_malformed` turns them into :class:`~specdec.errors.MalformedTreeError`
  naming the row, from ONE host read of the ``[B]`` codes;
- **support** (``.unsupported``, bits of :data:`UNSUPPORTED`): children the verifier cannot
  verify losslessly (its :attr:`~specdec.verify.base.Verifier.supported_kinds` and
  :attr:`~specdec.verify.base.Verifier.supported_modes`, as :meth:`Verifier.check_tree
  <specdec.verify.base.Verifier.check_tree>` decides them);
- **laws and ids** (``.law_bad``, ``.outside``): a recorded law that is not a distribution
  (no id, ids repeated, probabilities not finite, negative or not summing to 1; ``-1`` ids are
  padding), a sampled child's token outside its law's support, or a weight outside ``[0, 1]``;
  a token or a law id outside ``[0, V)``.

The last two flag the row (no read). Every check is row-wise: one row's values never change
another row's result.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from specdec.errors import MalformedTreeError
from specdec.tree import NodeKind, SampleMode
from specdec.tree_batch import PAD, TreeBatch
from specdec.verify.base import Verifier

__all__ = ["MALFORMED", "UNSUPPORTED", "DeviceTreeCheck", "check_batch_on_device", "raise_malformed",
           "unsupported_message"]

MALFORMED = (
    "num_nodes is outside [1, n]",
    "node 0 is not a root (parent -1, kind ROOT)",
    "a node's parent is not an earlier node (0 <= parent < node)",
    "a node's kind is neither DETERMINISTIC nor SAMPLED",
    "a slot past num_nodes is not padding (kind PAD, parent -1)",
    "depths disagree with the parents or exceed max_depth",
    "the ancestor mask disagrees with the parents",
    "a node has more children than max_children, or more sampled children than max_sampled",
    "siblings' draw orders (sampled) or ranks (deterministic) are not 0 .. k - 1",
    "deterministic siblings, or children drawn without replacement, repeat a token",
)
"""What bit ``i`` of :attr:`DeviceTreeCheck.malformed` means."""

UNSUPPORTED = ("deterministic children", "sampled children", "several children drawn 'iid'",
               "several children drawn 'wor'")
"""What bit ``i`` of :attr:`DeviceTreeCheck.unsupported` means (children of that kind are present)."""


@attrs.frozen(eq=False)
class DeviceTreeCheck:
    """The device check of a tree batch (module docstring); every field ``[B]`` on the tree's device.

    Attributes:
        malformed: int64, bit ``i`` set: invariant :data:`MALFORMED` ``[i]`` is broken (0: a tree).
        unsupported: int64, bit ``i`` set: the row has :data:`UNSUPPORTED` ``[i]`` and the verifier
            cannot verify them losslessly (0: supported).
        law_bad: bool: a recorded law of the row is not a distribution, a sampled child's token has
            probability 0 under its law, or a weight is outside ``[0, 1]``.
        outside: bool: a token (root included) or a law id of the row is outside ``[0, V)``.
        tree: the batch with every outside id replaced (tokens by 0, law ids by ``-1``), so that
            no gather of the verification leaves the vocabulary (those rows are flagged).
    """

    malformed: torch.Tensor
    unsupported: torch.Tensor
    law_bad: torch.Tensor
    outside: torch.Tensor
    tree: TreeBatch


def _bits(flags: list[torch.Tensor]) -> torch.Tensor:
    """``[B]`` int64 with bit ``i`` set where ``flags[i]`` (``[B]`` bool) holds."""
    return sum((f.long() << i for i, f in enumerate(flags)), torch.zeros_like(flags[0], dtype=torch.int64))


def _law_tolerance(dtype: torch.dtype) -> float:
    return 1e-9 if dtype == torch.float64 else 1e-4  # as a SparseLaw's own check (specdec.tree)


def check_batch_on_device(tree: TreeBatch, verifier: Verifier, *, structure: bool = True) -> DeviceTreeCheck:
    """Check every row of ``tree`` on its device (module docstring).

    Args:
        structure: check the structure, the support and the laws: ONE host read (the rows'
            structure codes, with two bits that choose the law checks' form), raising
            :class:`~specdec.errors.MalformedTreeError` naming the first row that is no tree.
            False: only the tokens outside the vocabulary (no read), the check the serving call
            always makes.
    """
    B, n, V = tree.batch_size, tree.node_slots, tree.vocab_size
    dev = tree.device
    slots = torch.arange(n, device=dev)  # [n]
    valid = slots.view(1, n) < tree.num_nodes.view(B, 1)  # [B, n]
    tok_out = valid & ((tree.tokens < 0) | (tree.tokens >= V))  # [B, n]
    tokens = torch.where(tok_out, 0, tree.tokens)
    zero = torch.zeros(B, dtype=torch.int64, device=dev)
    if not structure:
        return DeviceTreeCheck(zero, zero, zero.bool(), tok_out.any(-1), attrs.evolve(tree, tokens=tokens))
    kinds, parents, order = tree.kinds, tree.parents, tree.draw_order  # [B, n] each
    node = valid & (slots.view(1, n) > 0)  # [B, n] draft nodes
    sampled = node & (kinds == int(NodeKind.SAMPLED))
    determ = node & (kinds == int(NodeKind.DETERMINISTIC))
    par = parents.clamp(0, n - 1)  # [B, n] a gather index even where the parent is wrong (flagged)
    # ---- structure
    bad_count = (tree.num_nodes < 1) | (tree.num_nodes > n)
    bad_root = (parents[:, 0] != -1) | (kinds[:, 0] != int(NodeKind.ROOT))
    bad_parent = (node & ((parents < 0) | (parents >= slots.view(1, n)))).any(-1)
    bad_kind = (node & ~sampled & ~determ).any(-1)
    bad_pad = (~valid & ((kinds != PAD) | (parents != -1))).any(-1)
    depth_of_parent = tree.depths.gather(1, par)  # [B, n]
    bad_depth = ((node & (tree.depths != depth_of_parent + 1)) | (valid & (tree.depths > tree.max_depth))).any(-1) \
        | (tree.depths[:, 0] != 0)
    eye = torch.eye(n, dtype=torch.bool, device=dev).expand(B, n, n)
    want = eye | (tree.ancestors.gather(1, par.unsqueeze(-1).expand(B, n, n)) & node.unsqueeze(-1))  # [B, n, n]
    bad_anc = (tree.ancestors != want).any(-1).any(-1)
    owner = torch.where(node, par, n)  # [B, n]: parent slot, n for no parent (a spare bin)
    n_sampled = torch.zeros(B, n + 1, dtype=torch.int64, device=dev).scatter_add_(1, owner, sampled.long())[:, :n]
    n_determ = torch.zeros(B, n + 1, dtype=torch.int64, device=dev).scatter_add_(1, owner, determ.long())[:, :n]
    max_sampled = tree.max_sampled if tree.max_sampled is not None else tree.max_children
    bad_width = ((n_sampled + n_determ) > tree.max_children).any(-1) | (n_sampled > max_sampled).any(-1)
    same_parent = (parents.unsqueeze(-1) == parents.unsqueeze(-2)) & ~eye  # [B, n, n] two siblings
    both_s = sampled.unsqueeze(-1) & sampled.unsqueeze(-2)
    both_d = determ.unsqueeze(-1) & determ.unsqueeze(-2)
    same_order = order.unsqueeze(-1) == order.unsqueeze(-2)
    rank_of = torch.where(sampled, n_sampled.gather(1, par), n_determ.gather(1, par))  # [B, n] siblings of its kind
    bad_order = (node & ((order < 0) | (order >= rank_of))).any(-1) \
        | (same_parent & same_order & (both_s | both_d)).any(-1).any(-1)
    same_token = tree.tokens.unsqueeze(-1) == tree.tokens.unsqueeze(-2)
    wor_kids = sampled & tree.law_wor.gather(1, par)  # [B, n] children drawn without replacement
    bad_repeat = (same_parent & same_token & (both_d | (wor_kids.unsqueeze(-1) & wor_kids.unsqueeze(-2)))).any(-1).any(-1)
    malformed = _bits([bad_count, bad_root, bad_parent, bad_kind, bad_pad, bad_depth, bad_anc, bad_width, bad_order,
                       bad_repeat])
    # ---- support (Verifier.check_tree's kinds and modes)
    present = [determ.any(-1), sampled.any(-1), ((n_sampled > 1) & ~tree.law_wor).any(-1),
               ((n_sampled > 1) & tree.law_wor).any(-1)]
    allowed = [NodeKind.DETERMINISTIC in verifier.supported_kinds, NodeKind.SAMPLED in verifier.supported_kinds,
               SampleMode.IID in verifier.supported_modes, SampleMode.WITHOUT_REPLACEMENT in verifier.supported_modes]
    unsupported = _bits([p if not ok else torch.zeros_like(p) for p, ok in zip(present, allowed)])
    # ---- laws, at the nodes that have sampled children (a SparseLaw's check: its ids >= 0, the rest padding)
    ids, probs = tree.law_ids, tree.law_probs  # [B, n, L]
    L = int(ids.shape[-1])
    has_law = n_sampled > 0  # [B, n]
    bad_weight = (valid & ~((tree.weights >= 0) & (tree.weights <= 1))).any(-1) | (tree.weights[:, 0] != 1)
    if L == 0:  # no law recorded: a sampled child has none
        law_bad = sampled.any(-1) | bad_weight
        raise_malformed(malformed.tolist())  # the one read
        return DeviceTreeCheck(malformed, unsupported, law_bad, tok_out.any(-1), attrs.evolve(tree, tokens=tokens))
    real = ids >= 0
    kept = torch.where(real, probs, 0)  # [B, n, L] the law's own entries
    sums = kept.sum(-1)
    law_rows = has_law & (~real.any(-1) | ~(kept.amin(-1) >= 0) | ~torch.isfinite(sums)
                          | ((sums - 1.0).abs() > _law_tolerance(probs.dtype)))
    # the full layout (column l holds id l or padding: distinct, in the vocabulary, a token's column is the token)
    columns = torch.arange(L, device=dev)
    full = ~has_law | (torch.where(real, ids, columns) == columns).all(-1) if L <= V else torch.zeros_like(has_law)
    read = torch.stack([malformed, (~full).any(-1).long()], dim=1).tolist()  # the one read
    raise_malformed([r[0] for r in read])
    # a sampled child's token under its parent's law: the children's tokens by parent and draw order [B, n, C]
    C = max(int(max_sampled), 1)
    where = torch.where(sampled, par * C + order.clamp(0, C - 1), n * C)
    kids = torch.full((B, n * C + 1), -2, dtype=torch.int64, device=dev).scatter_(1, where, tokens)[:, : n * C]
    kids = kids.view(B, n, C)
    if any(r[1] for r in read):  # some law in another layout: its ids checked, sorted (repeats side by side), searched
        id_out = has_law & ((ids.amin(-1) < -1) | (ids.amax(-1) >= V))  # [B, n]
        ids = ids.clamp(-1, V - 1)  # no gather leaves the vocabulary (a row with such an id is flagged)
        sorted_ids, at = torch.where(real, ids, -1).sort(-1)
        repeats = has_law & ((sorted_ids[..., 1:] == sorted_ids[..., :-1]) & (sorted_ids[..., 1:] >= 0)).any(-1)
        pos = torch.searchsorted(sorted_ids.contiguous(), kids.contiguous()).clamp_max(L - 1)  # [B, n, C]
        found = (sorted_ids.gather(-1, pos) == kids) & (probs.gather(-1, at.gather(-1, pos)) > 0)
    else:
        id_out = repeats = torch.zeros_like(has_law)
        pos = kids.clamp(0, L - 1)
        found = (ids.gather(-1, pos) == kids) & (probs.gather(-1, pos) > 0)
    off_law = ((kids >= 0) & ~found).any(-1)  # [B, n] a parent with a sampled child outside its law's support
    law_bad = (law_rows | repeats | off_law).any(-1) | bad_weight
    outside = tok_out.any(-1) | id_out.any(-1)
    return DeviceTreeCheck(malformed, unsupported, law_bad, outside, attrs.evolve(tree, tokens=tokens, law_ids=ids))


def raise_malformed(codes: Sequence[int]) -> None:
    """Raise :class:`~specdec.errors.MalformedTreeError` naming the first malformed row (``codes``: the
    rows' :attr:`DeviceTreeCheck.malformed`, read) and what is broken."""
    for b, code in enumerate(codes):
        if code:
            broken = "; ".join(m for i, m in enumerate(MALFORMED) if code >> i & 1)
            raise MalformedTreeError(f"tree: row {b} is not a tree: {broken}")


def unsupported_message(verifier: Verifier, bits: int) -> str:
    """The refusal of a row whose children the verifier cannot verify (``bits`` of :data:`UNSUPPORTED`)."""
    what = ", ".join(m for i, m in enumerate(UNSUPPORTED) if bits >> i & 1)
    kinds = sorted(k.name.lower() for k in verifier.supported_kinds)
    modes = sorted(m.value for m in verifier.supported_modes)
    return (f"verifier {verifier.registry_name!r} cannot verify {what} losslessly; it supports {kinds} "
            f"children, several drawn {modes}")
