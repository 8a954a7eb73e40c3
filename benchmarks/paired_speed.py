"""Paired throughput ratio of two rows of one `specdec bench` run, with a bootstrap interval (issue 48).

The quick preset's table gives each row's tokens/s over a handful of prompts; whether ``sd`` is
"at least as fast as" transformers' assisted generation needs the noise of that comparison. The
rows of one run are interleaved per unit (prompt, temperature, seed), so they saw the same
prompts under the same machine load. For each temperature this prints

- each row's throughput: tokens / seconds summed over the units (prefill included, as the
  bench's own tokens/s);
- the ratio ``A / B`` of the two, and a 95% percentile interval from resampling the prompts
  with replacement (2,000 draws, seeded), every unit of a drawn prompt kept together.

Usage::

    python benchmarks/paired_speed.py benchmarks/results/sd_vs_hf_issue48 sd hf-assisted \\
        --markdown benchmarks/results/sd_vs_hf_issue48/paired.md
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path


def load_units(folder: Path) -> list[dict]:
    """The run records of ``folder/runs.jsonl`` (the header line skipped)."""
    lines = (folder / "runs.jsonl").read_text().splitlines()
    return [rec for rec in map(json.loads, lines) if "row" in rec]


def paired_ratio(records: list[dict], a: str, b: str, *, draws: int = 2000, seed: int = 48) -> dict[float, dict[str, float]]:
    """Per temperature: both rows' throughput, their ratio and its bootstrap interval over prompts.

    Raises:
        ValueError: a row is missing, or a (prompt, seed) unit has one row and not the other.
    """
    by_temp: dict[float, dict[int, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0.0])))
    units: dict[float, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for rec in records:
        if rec["row"] not in (a, b):
            continue
        cell = by_temp[rec["temperature"]][rec["prompt_index"]][rec["row"]]
        cell[0] += rec["new_tokens"]
        cell[1] += rec["time_total"]
        units[rec["temperature"]][rec["row"]].add((rec["prompt_index"], rec["seed"]))
    if not by_temp:
        raise ValueError(f"no records of rows {a!r} or {b!r}")
    out: dict[float, dict[str, float]] = {}
    rng = random.Random(seed)
    for temp, prompts in sorted(by_temp.items()):
        if units[temp][a] != units[temp][b]:
            raise ValueError(f"T={temp}: rows {a!r} and {b!r} ran different units; not a paired comparison")
        keys = sorted(prompts)

        def ratio(sample: list[int]) -> float:
            tok_a = sum(prompts[k][a][0] for k in sample)
            sec_a = sum(prompts[k][a][1] for k in sample)
            tok_b = sum(prompts[k][b][0] for k in sample)
            sec_b = sum(prompts[k][b][1] for k in sample)
            return (tok_a / sec_a) / (tok_b / sec_b)

        boot = sorted(ratio([rng.choice(keys) for _ in keys]) for _ in range(draws))
        tok_a, sec_a = sum(prompts[k][a][0] for k in keys), sum(prompts[k][a][1] for k in keys)
        tok_b, sec_b = sum(prompts[k][b][0] for k in keys), sum(prompts[k][b][1] for k in keys)
        out[temp] = {"prompts": len(keys), "tok_s_a": tok_a / sec_a, "tok_s_b": tok_b / sec_b, "ratio": ratio(keys),
                     "low": boot[int(0.025 * draws)], "high": boot[int(0.975 * draws) - 1]}
    return out


def render(table: dict[float, dict[str, float]], a: str, b: str, folder: Path) -> str:
    lines = [f"# `{a}` against `{b}`: paired throughput ({folder})", "",
             "Tokens / seconds summed over the units (prefill included); ratio A / B with a 95% bootstrap interval "
             "over prompts (2,000 draws, seed 48; `benchmarks/paired_speed.py`).", "",
             f"| T | prompts | `{a}` tok/s | `{b}` tok/s | ratio | 95% interval |", "|---|---|---|---|---|---|"]
    for temp, row in table.items():
        lines.append(f"| {temp:g} | {row['prompts']} | {row['tok_s_a']:.1f} | {row['tok_s_b']:.1f} | {row['ratio']:.3f} | "
                     f"[{row['low']:.3f}, {row['high']:.3f}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    text = render(paired_ratio(load_units(args.folder), args.a, args.b), args.a, args.b, args.folder)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
