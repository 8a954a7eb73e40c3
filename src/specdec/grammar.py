"""Grammar-constrained generation: an xgrammar grammar as a logits processor with context.

A grammar constraint bans, after a sequence, every token the grammar does not allow next.
On a draft tree each node's row is processed in that node's own context (the committed
sequence, then the node's path: :mod:`specdec.processors`), so the constraint applied per
node is exactly a logits processor with context, and every registered method keeps the
*processed* target law: the law of constrained autoregressive decoding (docs/generation.md,
"Grammar-constrained generation"; exact by enumeration in ``tests/e2e/test_grammar.py``).

:class:`GrammarProcessor` wraps an xgrammar ``CompiledGrammar`` (the ``[grammar]`` extra).
It is a function of its input: row ``r`` of a call is constrained by the generated part of
``input_ids[r]`` (the tokens after ``prompt_length``), whatever was called before. It keeps
one xgrammar matcher and moves it between calls: it rolls the matcher back to the longest
common prefix of what it has accepted and the row's generated tokens, then accepts the rest;
the rows of one call (the nodes of one depth, which share the committed sequence) cost a
rollback and an acceptance of the path each. After the grammar has ended (a stop token
accepted) only stop tokens are allowed. A row whose tokens the grammar cannot accept (a
draft node off the grammar: its parent's constrained law gives it probability 0, so no
verifier ever accepts it) gets all ``-inf``: it is flagged as a bad row and raises only if a
verifier visits it, which it cannot.

A whole tree (:mod:`specdec.processors` calls :meth:`GrammarProcessor.process_tree` once per
tree) is masked in one native call of xgrammar's ``GrammarMatcher.traverse_draft_tree`` where the
installed xgrammar has it (0.2.9 does), from the root's state and the tree in SGLang's
first-child / next-sibling arrays; the rows it leaves empty after the grammar has ended are
then given the stop tokens, so the masks are exactly those of the per-node fills (one rollback,
acceptance and ``fill_next_token_bitmask`` per node), which run otherwise or when asked
(``tree_mask="per_node"``). :attr:`GrammarProcessor.tree_mask_path` names the path, an INFO log
says it once per process, and :attr:`GrammarProcessor.whole_tree_calls` /
:attr:`GrammarProcessor.node_fills` count what ran.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Sequence
from typing import Any

import torch

from specdec._extras import require_extra
from specdec.errors import InvalidConfigError, MalformedTreeError
from specdec.processors import TreeLogitsProcessor

_xgr: Any
try:  # the [grammar] extra; this module is imported only where a grammar is used, never by `import specdec`
    import xgrammar as _xgr
except ModuleNotFoundError:  # pragma: no cover - the extra's absence is reported by GrammarProcessor
    _xgr = None

__all__ = ["GrammarProcessor", "TREE_MASK_PATHS", "has_tree_traversal"]

_log = logging.getLogger(__name__)

TREE_MASK_PATHS = ("traverse_draft_tree", "per_node")
"""The two ways :meth:`GrammarProcessor.process_tree` masks a tree: one native call of
xgrammar's ``GrammarMatcher.traverse_draft_tree``, or one mask fill per node."""

_TREE_MASK_CHOICES = ("auto",) + TREE_MASK_PATHS
_logged: set[tuple[str, str]] = set()  # (path, why) already said at INFO in this process


def has_tree_traversal() -> bool:
    """True when the installed xgrammar has ``GrammarMatcher.traverse_draft_tree`` (0.2.9 does)."""
    return _xgr is not None and callable(getattr(_xgr.GrammarMatcher, "traverse_draft_tree", None))


def _say_once(path: str, why: str) -> None:
    if (path, why) not in _logged:
        _logged.add((path, why))
        _log.info("specdec.grammar: draft trees are masked by %s (%s)", path, why)


class GrammarProcessor(TreeLogitsProcessor):
    """An xgrammar grammar as a context-dependent logits processor (module docstring).

    Args:
        compiled_grammar: an ``xgrammar.CompiledGrammar`` for the model's tokenizer.
        prompt_length: the prompt's length: tokens after it are the generated ones the grammar
            constrains. None: taken from the first call (its rows' length, as xgrammar's own
            Hugging Face processor does): give it when the first call may not be on the prompt.
        vocab_size: the logits' width when it exceeds the tokenizer's (padded LM heads: the
            padding columns are banned).
        tree_mask: how a whole tree is masked (:meth:`process_tree`): ``"auto"`` (xgrammar's
            ``traverse_draft_tree`` where the installed xgrammar has it, else one fill per node),
            ``"traverse_draft_tree"`` (required) or ``"per_node"``. The masks are the same.

    Attributes:
        tree_mask_path: the path :meth:`process_tree` takes, one of :data:`TREE_MASK_PATHS`.
        whole_tree_calls: trees masked by one ``traverse_draft_tree`` call so far.
        node_fills: rows masked one by one so far (per-node fills, and every row of a direct call).

    Raises:
        MissingExtraError: xgrammar is not installed (``pip install 'specdec-trees[grammar]'``).
        InvalidConfigError: a call's rows are shorter than the prompt, or scores of another width;
            ``tree_mask`` unknown, or ``"traverse_draft_tree"`` with an xgrammar that lacks it.

    Example (a grammar over four tokens; after ``a`` only ``b`` may follow):
        >>> import torch, xgrammar as xgr
        >>> info = xgr.TokenizerInfo(["a", "b", "ab", "</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[3])
        >>> grammar = xgr.GrammarCompiler(info).compile_grammar('root ::= ("ab" | "a" "b")+')
        >>> processor = GrammarProcessor(grammar, prompt_length=1)
        >>> processor(torch.tensor([[3, 0]]), torch.zeros(1, 4)).isfinite().tolist()
        [[False, True, False, False]]
    """

    def __init__(self, compiled_grammar: Any, prompt_length: int | None = None, vocab_size: int | None = None,
                 tree_mask: str = "auto") -> None:
        if _xgr is None:
            require_extra("grammar", "GrammarProcessor")
        if tree_mask not in _TREE_MASK_CHOICES:
            raise InvalidConfigError(f"GrammarProcessor: tree_mask must be one of {', '.join(_TREE_MASK_CHOICES)}, "
                                     f"got {tree_mask!r}")
        native = has_tree_traversal()
        if tree_mask == "traverse_draft_tree" and not native:
            raise InvalidConfigError(f"GrammarProcessor: tree_mask='traverse_draft_tree', but the installed xgrammar "
                                     f"{_xgrammar_version()} has no GrammarMatcher.traverse_draft_tree "
                                     "(xgrammar 0.2.9 has it)")
        self.tree_mask_path = "traverse_draft_tree" if native and tree_mask != "per_node" else "per_node"
        if self.tree_mask_path == "traverse_draft_tree":
            _say_once(self.tree_mask_path, "one native call of xgrammar's GrammarMatcher.traverse_draft_tree per tree")
        elif tree_mask == "per_node":
            _say_once("per-node fills", "tree_mask='per_node'")
        else:
            _say_once("per-node fills", f"the installed xgrammar {_xgrammar_version()} has no "
                                        "GrammarMatcher.traverse_draft_tree")
        self.whole_tree_calls = 0
        self.node_fills = 0
        xgr = _xgr
        self._xgr = xgr
        self.grammar = compiled_grammar
        self.matcher = xgr.GrammarMatcher(compiled_grammar)
        self.tokenizer_vocab = int(compiled_grammar.tokenizer_info.vocab_size)
        self.vocab_size = self.tokenizer_vocab if vocab_size is None else int(vocab_size)
        if self.vocab_size < self.tokenizer_vocab:
            raise InvalidConfigError(f"vocab_size {self.vocab_size} is smaller than the tokenizer's {self.tokenizer_vocab}")
        self.prompt_length = prompt_length
        self.stop_ids = list(compiled_grammar.tokenizer_info.stop_token_ids)
        self.accepted: list[int] = []  # the generated tokens the processor is at, in order
        self.in_matcher = 0  # how many of them the matcher holds (the rest: stop tokens after the end)
        self._bitmask = xgr.allocate_token_bitmask(1, self.tokenizer_vocab)

    # ---------------------------------------------------------------- the matcher's position
    def _sync(self, generated: Sequence[int]) -> bool:
        """Move the matcher to ``generated``; False when the grammar refuses one of its tokens.
        Stop tokens after the grammar has ended are kept in :attr:`accepted` without the matcher
        (it accepts nothing once terminated): :attr:`in_matcher` counts the ones it holds."""
        common = 0
        limit = min(len(self.accepted), len(generated))
        while common < limit and self.accepted[common] == generated[common]:
            common += 1
        if common < len(self.accepted):
            in_matcher_kept = min(self.in_matcher, common)
            if self.in_matcher > in_matcher_kept:
                self.matcher.rollback(self.in_matcher - in_matcher_kept)
            self.in_matcher = in_matcher_kept
            del self.accepted[common:]
        for token in generated[common:]:
            token = int(token)
            if self.matcher.is_terminated():
                if token not in self.stop_ids:  # after the end only stop tokens follow
                    return False
            elif self.matcher.accept_token(token):
                self.in_matcher += 1
            else:
                return False
            self.accepted.append(token)
        return True

    def allowed(self, generated: Sequence[int]) -> torch.Tensor:
        """``[V]`` bool: the tokens the grammar allows after ``generated`` (all False when it
        refuses ``generated`` itself; only the stop tokens after the grammar has ended)."""
        out = torch.zeros(self.vocab_size, dtype=torch.bool)
        self.node_fills += 1
        if not self._sync(generated):
            return out
        if self.matcher.is_terminated():
            out[self.stop_ids] = True
            return out
        self.matcher.fill_next_token_bitmask(self._bitmask)
        ones = torch.zeros(1, self.tokenizer_vocab)
        self._xgr.apply_token_bitmask_inplace(ones, self._bitmask)
        out[: self.tokenizer_vocab] = ones[0] == 0
        return out

    def tree_allowed(self, generated: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """``[n, V]`` bool: row ``i`` is :meth:`allowed` after ``generated`` then node ``i``'s path
        (by :attr:`tree_mask_path`).

        Args:
            generated: the generated tokens of the committed sequence (the root's context).
            tokens: the ``n`` node tokens.
            parents: each node's parent, ``-1`` for the nodes of depth 0 (root and padding slots,
                whose rows are the root's).

        Raises:
            MalformedTreeError: ``parents`` is not a forest over the ``n`` nodes.
        """
        roots, children = _forest(parents, len(tokens))
        if not tokens:
            return torch.zeros(0, self.vocab_size, dtype=torch.bool)
        if self.tree_mask_path == "per_node":
            return self._tree_allowed_per_node(generated, tokens, parents, roots, children)
        allowed = _unpack_bitmask(self._tree_bitmask(generated, tokens, parents, roots, children), self.tokenizer_vocab)
        return torch.nn.functional.pad(allowed, (0, self.vocab_size - self.tokenizer_vocab))  # padding columns banned

    def _tree_allowed_per_node(self, generated: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                               roots: list[int], children: list[list[int]]) -> torch.Tensor:
        """:meth:`tree_allowed` by one :meth:`allowed` (a mask fill) per node."""
        root_row = self.allowed(generated)  # [V]: every node of depth 0 sees the committed context only
        rows = [root_row] * len(tokens)
        path: list[list[int]] = [[] for _ in tokens]
        for i in _parents_first(roots, children, depth_first=True):  # depth-first: short rollbacks
            if parents[i] >= 0:
                path[i] = path[parents[i]] + [int(tokens[i])]
                rows[i] = self.allowed([*generated, *path[i]])
        return torch.stack(rows)  # [n, V]

    def _tree_bitmask(self, generated: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                      roots: list[int], children: list[list[int]]) -> torch.Tensor:
        """``[n, words]`` int32: every node's allowed tokens as xgrammar's bitmask rows (bit ``j``
        of word ``k``: token ``32 k + j``), from one ``traverse_draft_tree`` call."""
        n = len(tokens)
        bitmask = self._xgr.allocate_token_bitmask(n, self.tokenizer_vocab)  # [n, words] int32
        bitmask.zero_()  # a row the traversal does not visit (below a refused or ended node) bans every token
        if not self._sync(generated):
            return bitmask  # the root's context is refused: every node's is
        root_ended = bool(self.matcher.is_terminated())
        # the tree in xgrammar's layout (first child / next sibling) over the node slots, the root
        # swapped into slot 0 (its state: the committed context, its token already accepted); the
        # children of every depth-0 node hang below it. A node is linked when its parent is and
        # its token is in the tokenizer's vocabulary (the matcher refuses the others)
        root = roots[0]
        position = list(range(n))
        position[0], position[root] = root, 0  # an involution: node i's row is at position[i]
        first_child, next_sibling, last_child, draft = [-1] * n, [-1] * n, [-1] * n, [0] * n
        linked = [parent < 0 for parent in parents]
        order = _parents_first(roots, children, depth_first=False)
        for i in order:
            parent, token = parents[i], int(tokens[i])
            if parent < 0 or not linked[parent] or not 0 <= token < self.tokenizer_vocab:
                continue
            linked[i] = True
            at, up = position[i], 0 if parents[parent] < 0 else position[parent]
            draft[at] = token
            if first_child[up] < 0:
                first_child[up] = at
            else:
                next_sibling[last_child[up]] = at
            last_child[up] = at
        if not root_ended:
            done = self.matcher.traverse_draft_tree(torch.tensor(first_child, dtype=torch.int64),
                                                    torch.tensor(next_sibling, dtype=torch.int64),
                                                    torch.tensor(draft, dtype=torch.int64), bitmask)
            if not done:  # pragma: no cover - no time limit is given, so the traversal always completes
                raise RuntimeError("xgrammar's traverse_draft_tree did not complete")
            self.whole_tree_calls += 1
        if root != 0:
            bitmask = bitmask[torch.tensor(position)]  # by node
        others = [i for i in roots if i != root]
        if others:
            bitmask[others] = bitmask[root].clone()  # every depth-0 node sees the committed context only
        # after the grammar has ended xgrammar's rows are empty; the per-node rule allows the stop
        # tokens there: a node has ended when its token is a stop token its parent's row allows
        stops = set(self.stop_ids)
        ended = [root_ended if parent < 0 else False for parent in parents]
        for i in order:
            parent, token = parents[i], int(tokens[i])
            if parent >= 0 and token in stops and linked[i]:
                ended[i] = ended[parent] or bool((int(bitmask[parent, token // 32]) >> (token % 32)) & 1)
        if any(ended):
            stop_words = torch.zeros(bitmask.shape[1], dtype=torch.int64)
            for token in self.stop_ids:
                stop_words[token // 32] |= 1 << (token % 32)
            stop_words = torch.where(stop_words >= 1 << 31, stop_words - (1 << 32), stop_words)  # bit 31: the sign
            bitmask[torch.tensor(ended)] = stop_words.to(torch.int32)
        return bitmask

    def process_tree(self, scores: torch.Tensor, context: torch.Tensor, tokens: torch.Tensor,
                     parents: torch.Tensor) -> torch.Tensor:
        """A whole tree's ``scores [n, V]`` with ``-inf`` where the grammar bans a token after each
        node's context (:class:`specdec.processors.TreeLogitsProcessor`; one host read). On the
        ``traverse_draft_tree`` path ``scores`` is masked in place (xgrammar's own kernel for
        float32 / float16 / bfloat16 CPU scores) and returned.

        Args:
            scores: ``[n, V]`` node rows.
            context: ``[L]`` int64 committed sequence (prompt and generated; its last token the root's).
            tokens: ``[n]`` int64 node tokens.
            parents: ``[n]`` int64 parent slots, ``-1`` for the root and padding slots.
        """
        self._check_width(scores)
        length, n = int(context.shape[0]), int(tokens.shape[0])
        if self.prompt_length is None:
            self.prompt_length = length
        if length < self.prompt_length:
            raise InvalidConfigError(
                f"GrammarProcessor: a committed context of length {length} is shorter than the prompt "
                f"({self.prompt_length})"
            )
        host = torch.cat([context.view(-1), tokens.view(-1), parents.view(-1)]).tolist()  # one host read
        generated, node_tokens = host[self.prompt_length : length], host[length : length + n]
        node_parents = host[length + n :]
        if self.tree_mask_path == "per_node" or n == 0:
            keep = self.tree_allowed(generated, node_tokens, node_parents)  # [n, V]
            return scores.masked_fill(~keep.to(scores.device), float("-inf"))
        roots, children = _forest(node_parents, n)
        bitmask = self._tree_bitmask(generated, node_tokens, node_parents, roots, children)  # [n, words]
        tv = self.tokenizer_vocab
        if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float16, torch.bfloat16):
            live = bitmask.any(1)  # [n]: rows that allow a token; the others (refused nodes) are filled at once
            scores[~live] = float("-inf")
            rows = live.nonzero().flatten().tolist()
            self._xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=tv, indices=rows)
        else:  # xgrammar's CPU kernel takes these dtypes only; on a device the bits are unpacked there
            keep = _unpack_bitmask(bitmask.to(scores.device), tv)  # [n, V_tok]
            scores[:, :tv] = scores[:, :tv].masked_fill(~keep, float("-inf"))
        scores[:, tv:] = float("-inf")  # a padded LM head's padding columns
        return scores

    def _check_width(self, scores: torch.Tensor) -> None:
        if scores.shape[-1] != self.vocab_size:
            raise InvalidConfigError(
                f"GrammarProcessor: scores have {scores.shape[-1]} columns, the grammar's vocabulary {self.vocab_size} "
                "(give vocab_size= for a padded LM head)"
            )

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` ``[b, V]`` with ``-inf`` where the grammar bans a token after ``input_ids[r]``
        (one fill per row: a tree handed row by row, e.g. inside a ``LogitsProcessorList``,
        takes the per-node path, said once at INFO)."""
        self._check_width(scores)
        if self.tree_mask_path == "traverse_draft_tree":
            _say_once("per-node fills", "the processor was called on rows, not through process_tree: e.g. wrapped "
                                        "in a LogitsProcessorList, or autoregressive decoding")
        if self.prompt_length is None:
            self.prompt_length = int(input_ids.shape[1])
        if input_ids.shape[1] < self.prompt_length:
            raise InvalidConfigError(
                f"GrammarProcessor: rows of length {input_ids.shape[1]} are shorter than the prompt ({self.prompt_length})"
            )
        rows = input_ids[:, self.prompt_length:].tolist()  # one host read per call: the generated tokens
        keep = torch.stack([self.allowed(row) for row in rows]).to(scores.device)  # [b, V]
        return scores.masked_fill(~keep, float("-inf"))


def _xgrammar_version() -> str:
    try:
        return importlib.metadata.version("xgrammar")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - installed without metadata
        return "(version unknown)"


def _forest(parents: Sequence[int], n: int) -> tuple[list[int], list[list[int]]]:
    """The nodes of depth 0 (parent ``-1``) and each node's children; MalformedTreeError when
    ``parents`` has another length, a slot outside ``[-1, n)`` or a cycle."""
    if len(parents) != n:
        raise MalformedTreeError(f"parents has {len(parents)} entries for {n} node tokens")
    roots: list[int] = []
    children: list[list[int]] = [[] for _ in range(n)]
    for i, parent in enumerate(parents):
        if parent < 0:
            roots.append(i)
        elif parent >= n or parent == i:
            raise MalformedTreeError(f"parents[{i}] = {parent} is not another node's slot (n = {n})")
        else:
            children[parent].append(i)
    reached = sum(1 for _ in _parents_first(roots, children, depth_first=False))
    if reached != n:
        raise MalformedTreeError(f"parents has a cycle: {n - reached} of {n} nodes are not below a node of depth 0")
    return roots, children


_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


def _unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """``[m, width]`` bool from xgrammar's ``[m, words]`` int32 bitmask: token ``32 k + j`` is bit
    ``j`` of word ``k``, set when the token is allowed."""
    bits = (bitmask.unsqueeze(-1) >> _BIT_SHIFTS) & 1  # [m, words, 32]
    return bits.view(bitmask.shape[0], -1)[:, :width].bool()


def _parents_first(roots: list[int], children: list[list[int]], *, depth_first: bool) -> list[int]:
    """Every node below ``roots``, each after its parent (depth-first or breadth-first)."""
    if not depth_first:
        order = list(roots)
        for node in order:  # grows while it is read: each node's children after it
            order.extend(children[node])
        return order
    order = []
    pending = list(reversed(roots))
    while pending:
        node = pending.pop()
        order.append(node)
        pending.extend(reversed(children[node]))
    return order
