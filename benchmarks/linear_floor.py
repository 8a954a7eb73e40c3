"""The linear layers' floor of a target forward of n tokens (issue 48): how close to a one-token
forward an n-token forward can be with the CPU linear layouts specdec has.

For every ``nn.Linear`` of the target (SmolLM2-135M-Instruct: 30 layers x q, k, v, o, gate, up,
down, and the LM head), the tuned plan (:func:`specdec.kernels.linear.tune_linear`: each layout
timed with the weights out of cache, the layouts interleaved, the fastest of 5) gives the seconds
of ``F.linear`` (``rows``), ``(W @ x.T).T`` (``columns``), oneDNN's packed linear (``onednn``) and,
where it builds, specdec's few-row kernel (``fewrow``, :mod:`specdec.kernels.fewrow`) at 1-16 rows. Summed over the model's linears:

- ``best``: every linear at its fastest layout for ``n`` rows (what ``accelerate_linears`` runs);
- ``rows``: ``F.linear`` everywhere (transformers' own forward).

The ratio ``best(n) / best(1)`` is the most the linear layers allow an ``n``-token forward to
approach a one-token one; the rest of the forward (attention, norms, rotary, the mask, Python)
comes on top. Timings are this machine's; the plans come from the plan cache
(``SPECDEC_LINEAR_PLANS``) or are measured (about a minute per new shape on 2 cores).

Usage::

    SPECDEC_LINEAR_PLANS=/tmp/plans.json python benchmarks/linear_floor.py --threads 2 \\
        --markdown benchmarks/results/linear_floor_smollm2.md
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from specdec.kernels.linear import LINEAR_METHODS, onednn_available, tune_linear

SIZES = (1, 2, 3, 4, 5, 6, 9, 16)


def linear_shapes(model: torch.nn.Module) -> Counter[tuple[int, int]]:
    """``{(N, K): count}`` of the model's linear layers (a tied LM head counts once)."""
    seen: set[int] = set()
    shapes: Counter[tuple[int, int]] = Counter()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            shapes[(int(module.weight.shape[0]), int(module.weight.shape[1]))] += 1
    return shapes


def floor_table(shapes: Counter[tuple[int, int]], sizes: tuple[int, ...]) -> dict[int, dict[str, float]]:
    """Per row count: the summed seconds of the best layout and of ``rows`` (``F.linear``)."""
    methods = tuple(m for m in LINEAR_METHODS if m != "onednn" or onednn_available())
    plans = {shape: tune_linear(shape, max_rows=max(sizes), methods=methods) for shape in shapes}
    out: dict[int, dict[str, float]] = {}
    for n in sizes:
        best = sum(count * min(plans[s].seconds[n - 1].values()) for s, count in shapes.items())
        rows = sum(count * plans[s].seconds[n - 1]["rows"] for s, count in shapes.items())
        out[n] = {"best": best, "rows": rows}
    return out


def render(table: dict[int, dict[str, float]], shapes: Counter[tuple[int, int]], threads: int) -> str:
    one = table[1]["best"]
    lines = [
        f"# Linear-layer floor of a target forward (SmolLM2-135M-Instruct, {threads} threads, torch {torch.__version__})",
        "",
        "Summed over the model's linear layers ("
        + ", ".join(f"{c} x {n}x{k}" for (n, k), c in sorted(shapes.items())) + "), cold weights, "
        "fastest of 5 interleaved timings (`benchmarks/linear_floor.py`).",
        "",
        "| tokens n | best layout (ms) | ratio to n = 1 | F.linear everywhere (ms) |",
        "|---|---|---|---|",
    ]
    for n, row in table.items():
        lines.append(f"| {n} | {1e3 * row['best']:.1f} | {row['best'] / one:.2f}x | {1e3 * row['rows']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from specdec.models.smollm2 import load_smollm2

    model, _ = load_smollm2()
    shapes = linear_shapes(model)
    table = floor_table(shapes, SIZES)
    text = render(table, shapes, args.threads)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "shapes": {f"{n}x{k}": c for (n, k), c in shapes.items()},
                                         "ms": {n: {k: 1e3 * v for k, v in row.items()} for n, row in table.items()}},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
