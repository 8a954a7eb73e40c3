"""Shared by the per-row sampling tests (tests/engine/test_serving.py, test_row_sampling.py): eight
sampling settings (greedy among them), and the law of the first two tokens of an order-1 toy target
(``logits after token a = table[a]``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from specdec.sampling import SamplingConfig, process_logits

Law = dict[tuple[int, int], float]

CONFIGS = [  # eight rows, eight settings: greedy, temperatures, top-k, top-p and both
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.5),
    SamplingConfig(temperature=1.5, top_k=2),
    SamplingConfig(temperature=1.0, top_p=0.7),
    SamplingConfig(temperature=0.8, top_k=3, top_p=0.9),
    SamplingConfig(temperature=1.2, top_k=2, top_p=0.8),
    SamplingConfig(temperature=2.0),
]


def target_law(table: torch.Tensor, root: int, config: SamplingConfig) -> Law:
    """The target's exact law of its next two tokens after ``root`` under ``config``."""
    V = table.shape[0]
    p1 = process_logits(table[root], config)
    out: Law = {}
    for a in range(V):
        p2 = process_logits(table[a], config)
        for b in range(V):
            if float(p1[a]) > 0 and float(p2[b]) > 0:
                out[(a, b)] = float(p1[a] * p2[b])
    return out


def first_two(emitted: Mapping[tuple[int, ...], float], table: torch.Tensor, config: SamplingConfig) -> Law:
    """The law of the first two tokens from the law of one step's emitted tokens: a step that
    emitted one token is completed with the target's conditional under ``config``."""
    law: Law = {}
    for tokens, prob in emitted.items():
        if len(tokens) >= 2:
            law[tokens[:2]] = law.get(tokens[:2], 0.0) + prob
            continue
        after = process_logits(table[tokens[0]], config)
        for x in range(table.shape[0]):
            if float(after[x]) > 0:
                law[(tokens[0], x)] = law.get((tokens[0], x), 0.0) + prob * float(after[x])
    return law


def gap(a: Mapping[tuple[int, int], float], b: Mapping[tuple[int, int], float]) -> float:
    """The largest difference in probability between two laws."""
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
