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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdec._extras import require_extra
from specdec.errors import InvalidConfigError

_xgr: Any
try:  # the [grammar] extra; this module is imported only where a grammar is used, never by `import specdec`
    import xgrammar as _xgr
except ModuleNotFoundError:  # pragma: no cover - the extra's absence is reported by GrammarProcessor
    _xgr = None

__all__ = ["GrammarProcessor"]


class GrammarProcessor:
    """An xgrammar grammar as a context-dependent logits processor (module docstring).

    Args:
        compiled_grammar: an ``xgrammar.CompiledGrammar`` for the model's tokenizer.
        prompt_length: the prompt's length: tokens after it are the generated ones the grammar
            constrains. None: taken from the first call (its rows' length, as xgrammar's own
            Hugging Face processor does): give it when the first call may not be on the prompt.
        vocab_size: the logits' width when it exceeds the tokenizer's (padded LM heads: the
            padding columns are banned).

    Raises:
        MissingExtraError: xgrammar is not installed (``pip install 'specdec-trees[grammar]'``).
        InvalidConfigError: a call's rows are shorter than the prompt, or scores of another width.

    Example (a grammar over four tokens; after ``a`` only ``b`` may follow):
        >>> import torch, xgrammar as xgr
        >>> info = xgr.TokenizerInfo(["a", "b", "ab", "</s>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[3])
        >>> grammar = xgr.GrammarCompiler(info).compile_grammar('root ::= ("ab" | "a" "b")+')
        >>> processor = GrammarProcessor(grammar, prompt_length=1)
        >>> processor(torch.tensor([[3, 0]]), torch.zeros(1, 4)).isfinite().tolist()
        [[False, True, False, False]]
    """

    def __init__(self, compiled_grammar: Any, prompt_length: int | None = None, vocab_size: int | None = None) -> None:
        if _xgr is None:
            require_extra("grammar", "GrammarProcessor")
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

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` ``[b, V]`` with ``-inf`` where the grammar bans a token after ``input_ids[r]``."""
        if scores.shape[-1] != self.vocab_size:
            raise InvalidConfigError(
                f"GrammarProcessor: scores have {scores.shape[-1]} columns, the grammar's vocabulary {self.vocab_size} "
                "(give vocab_size= for a padded LM head)"
            )
        if self.prompt_length is None:
            self.prompt_length = int(input_ids.shape[1])
        if input_ids.shape[1] < self.prompt_length:
            raise InvalidConfigError(
                f"GrammarProcessor: rows of length {input_ids.shape[1]} are shorter than the prompt ({self.prompt_length})"
            )
        rows = input_ids[:, self.prompt_length:].tolist()  # one host read per call: the generated tokens
        keep = torch.stack([self.allowed(row) for row in rows]).to(scores.device)  # [b, V]
        return scores.masked_fill(~keep, float("-inf"))
