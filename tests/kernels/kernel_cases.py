"""Random trees and target rows for the kernel tests (importable by name:
pytest puts this folder on ``sys.path``).

Every tree has the child mix its verifier supports (docs/verifiers.md rules 2-5):

- ``match``: sampled children (i.i.d. or without replacement, from a sparse
  ``q'``) and top-K deterministic children, mixed freely;
- ``rejection-iid`` / ``rejection-wor``: sampled children only, drawn from the
  top-M of ``q`` or, at some nodes, from the whole support of ``q`` (static
  trees record that);
- ``mixed``: RheoSampling nodes, ``m`` sampled children from
  ``q' = norm(top-M of q minus S)`` then ``K - m`` deterministic children
  (``S``), up to ``K = 10``.

Target rows are correlated with the draft (``log q`` plus noise) so that
children are often accepted and walks go deep; some rows are one-hot, some
equal the sampled law ``q'`` exactly (acceptance ratio 1, the boundary case).
"""

from __future__ import annotations

import attrs
import torch

from specdec.sampling import SamplingConfig, process_logits
from specdec.tree import DraftTree, SampleMode, SparseLaw, TreeAssembler

RULES = ("match", "rejection-iid", "rejection-wor", "mixed")


@attrs.frozen
class Case:
    """A tree, its raw target logits, and the processed rows ``p``."""

    tree: DraftTree
    logits: torch.Tensor  # [n, V] raw target logits
    p: torch.Tensor  # [n, V] process_logits(logits, sampling)
    sampling: SamplingConfig


def _draft_row(gen: torch.Generator, V: int) -> torch.Tensor:
    """A peaked float64 draft law over V tokens (Zipf-like, random order)."""
    ranks = torch.randperm(V, generator=gen).double() + 1
    logits = -1.3 * torch.log(ranks) + 0.3 * torch.randn(V, generator=gen, dtype=torch.float64)
    return torch.softmax(logits, 0)


def _sparse(indices: torch.Tensor, probs: torch.Tensor, mode: SampleMode) -> SparseLaw:
    probs = probs.double()
    return SparseLaw(indices.to(torch.int64), probs / probs.sum(), mode)


def _draw(gen: torch.Generator, law: SparseLaw, k: int) -> list[int]:
    if law.mode == SampleMode.IID:
        picks = torch.multinomial(law.probs, k, replacement=True, generator=gen)
    else:
        k = min(k, int((law.probs > 0).sum()))
        picks = torch.multinomial(law.probs, k, replacement=False, generator=gen)
    return [int(law.indices[i]) for i in picks.tolist()]


def random_tree(rule: str, V: int, seed: int, max_nodes: int = 14, top_m: int = 48) -> tuple[DraftTree, torch.Tensor]:
    """A random tree for ``rule`` and the ``[n, V]`` float64 draft rows ``q`` of its nodes."""
    gen = torch.Generator().manual_seed(seed * 1009 + V)
    asm = TreeAssembler(root_token=int(torch.randint(V, (1,), generator=gen)), vocab_size=V)
    q_rows = {0: _draft_row(gen, V)}
    frontier = [0]
    while frontier and len(asm) < max_nodes:
        node = frontier.pop(0)
        q = q_rows[node]
        room = max_nodes - len(asm)
        top = torch.topk(q, top_m)
        kids: list[int] = []
        choice = int(torch.randint(3, (1,), generator=gen))
        if rule in ("rejection-iid", "rejection-wor"):
            mode = SampleMode.IID if rule == "rejection-iid" else SampleMode.WITHOUT_REPLACEMENT
            if choice == 0:  # a static tree's law: the whole support of q
                law = _sparse(torch.arange(V), q, mode)
            else:
                law = _sparse(top.indices, top.values, mode)
            for tok in _draw(gen, law, min(1 + choice, room)):
                kids.append(asm.add_sampled(node, tok, law, weight=0.5))
        elif rule == "mixed":
            K = min([2, 4, 10][choice], room)
            m = 2 if (K >= 4 and choice == 1) else 1
            m = min(m, K)
            det = top.indices[: K - m]
            rest_i, rest_p = top.indices[K - m :], top.values[K - m :]
            mode = SampleMode.WITHOUT_REPLACEMENT if m > 1 else SampleMode.IID
            law = _sparse(rest_i, rest_p, mode)
            for tok in _draw(gen, law, m):
                kids.append(asm.add_sampled(node, tok, law, weight=0.5))
            for tok in det.tolist():
                kids.append(asm.add_deterministic(node, int(tok), weight=0.5))
        else:  # match: any mix
            n_det = min(choice + 1, room)
            for tok in top.indices[:n_det].tolist():
                kids.append(asm.add_deterministic(node, int(tok), weight=0.5))
            if choice != 1 and len(kids) < room:
                mode = SampleMode.IID if choice == 0 else SampleMode.WITHOUT_REPLACEMENT
                law = _sparse(top.indices[n_det:], top.values[n_det:], mode)
                for tok in _draw(gen, law, min(2, room - len(kids))):
                    kids.append(asm.add_sampled(node, tok, law, weight=0.5))
        for k in kids:
            q_rows[k] = _draft_row(gen, V)
        frontier += kids
    tree = asm.build()
    return tree, torch.stack([q_rows[i] for i in range(tree.num_nodes)])


def random_case(rule: str, V: int, seed: int, sampling: SamplingConfig, dtype: torch.dtype = torch.float32,
                max_nodes: int = 14) -> Case:
    """A random tree with correlated target logits (in ``dtype``) and ``p =
    process_logits(logits)`` (float32 for float16/bfloat16 logits).

    For float32/float64 and plain sampling (T = 1, no top-k/top-p), the root's
    row is exactly its sampled law ``q'`` (the ratio-1 boundary) and node 1's
    row is one-hot on node 2's token.
    """
    tree, q = random_tree(rule, V, seed, max_nodes)
    gen = torch.Generator().manual_seed(seed * 31 + 7)
    # the target row after node i correlates with the draft row at node i
    logits = (torch.log(q) + 0.8 * torch.randn(q.shape, generator=gen, dtype=torch.float64)).to(dtype)
    plain = sampling.top_k == 0 and sampling.top_p == 1.0 and sampling.temperature == 1.0
    if plain and dtype in (torch.float32, torch.float64) and tree.num_nodes > 2:
        law = tree.sampled_law_at(0)
        if law is not None:
            logits[0] = torch.log(law.dense(tree.vocab_size, dtype=torch.float64)).to(dtype)
        logits[1] = float("-inf")
        logits[1, int(tree.tokens[2])] = 0.0
    return Case(tree, logits, process_logits(logits, sampling), sampling)
