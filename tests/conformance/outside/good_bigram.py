"""A correct outside draft: a bigram draft (its law after a node depends on that node's token only),
with a rows mode and a declared factory, so the conformance command proves it and ``specdec bench``
benches it (``--methods "sd@outside-bigram"``).

After token ``t`` it proposes ``width`` tokens ``(5 t + 1 + i) mod V`` with log-weights that fall with
``i``; every other token has probability 0 (an exact zero of the law, as sparse drafts have).
"""

import torch

from specdec.drafts.base import OneRowDraft
from specdec.registry import register


def make_bigram(setting):
    """The factory: a bigram draft over the target's vocabulary, its logits on the target's device."""
    return OutsideBigram(setting.vocab_size, device=setting.device)


@register("draft", "outside-bigram", factory=make_bigram)
class OutsideBigram(OneRowDraft):
    """A bigram draft with a rows mode (one context and one tree per row)."""

    supports_rows = True

    def __init__(self, vocab_size, width=3, device="cpu"):
        self._vocab_size = vocab_size
        self.width = min(width, vocab_size)
        self.device = torch.device(device)
        self._rows = None  # per row: [last committed token, then the tokens of the step's tree nodes]
        self._many = False

    @property
    def vocab_size(self):
        return self._vocab_size

    def _logits(self, tokens):
        out = torch.full((len(tokens), self._vocab_size), float("-inf"))
        for row, t in enumerate(tokens):
            for i in range(self.width):
                out[row, (5 * t + 1 + i) % self._vocab_size] = -0.7 * i + 0.3 * ((t + i) % 3)
        return out.to(self.device)

    # one row
    def begin(self, prompt_ids, target_hidden=None):
        self._rows = [[int(prompt_ids[-1])]]
        self._many = False

    def root_logits(self):
        return self._logits([self._rows[0][0]])[0]

    def tree_logits(self, parents, tokens):
        return self._add(self._rows[0], parents, tokens)

    def commit(self, tokens, target_hidden=None):
        row = self._rows[0]
        del row[1:]
        if len(tokens):
            row[0] = int(tokens[-1])

    # rows
    @property
    def rows_mode(self):
        return self._many

    def begin_rows(self, prompts, target_hidden=None, *, positions=None):
        if len(prompts) == 1:
            return OneRowDraft.begin_rows(self, prompts)
        self._rows = [[int(p[-1])] for p in prompts]
        self._many = True

    def root_rows_logits(self, proposal=False):
        return self._logits([row[0] for row in self._rows])

    def tree_rows_logits(self, parents, tokens, proposal=False):
        return torch.stack([self._add(row, p, t) for row, p, t in zip(self._rows, parents.tolist(), tokens.tolist())])

    def commit_rows(self, emitted, target_hidden=None, *, device_tokens=None, device_counts=None):
        if not self._many:
            return OneRowDraft.commit_rows(self, emitted, target_hidden)
        for row, tokens in zip(self._rows, emitted):
            del row[1:]
            if len(tokens):
                row[0] = int(tokens[-1])

    def keep_rows(self, rows):
        self._rows = [self._rows[int(r)] for r in rows]

    def _add(self, row, parents, tokens):
        parents = [int(p) for p in parents]
        tokens = [int(t) for t in tokens]
        for p in parents:
            if not 0 <= p < len(row):
                raise ValueError(f"unknown parent node {p}")
        row.extend(tokens)
        return self._logits(tokens)
