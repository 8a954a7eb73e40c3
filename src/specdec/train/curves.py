"""Training curves of a run, and of the earlier phases it was initialised from.

``python -m specdec.train.recipes --out RUN --plot curves.png [--plot-before EARLIER]``
(:mod:`specdec.train.recipes`): :func:`chained_metrics` puts the
``NAME.metrics.jsonl`` logs of consecutive phases (``--init-from`` chains) on
one step axis; :func:`plot_losses` draws their loss and top-1 agreement
(matplotlib, an optional extra, imported only here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from specdec._extras import needs_extra

__all__ = ["chained_metrics", "plot_losses"]


def _smooth(xs: list[float], k: int = 50) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def _metrics_rows(f: Path) -> list[dict[str, float]]:
    """One run's ``NAME.metrics.jsonl`` rows, by step; a resumed run re-logs the steps after its
    last checkpoint, so the latest row of a step wins."""
    by_step: dict[int, dict[str, float]] = {}
    for line in f.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_step[int(row["step"])] = row
    return [by_step[s] for s in sorted(by_step)]


def chained_metrics(runs: Sequence[Path]) -> tuple[dict[str, list[dict[str, float]]], list[int]]:
    """The metrics of consecutive training phases (``--init-from`` chains) on one step axis.

    Args:
        runs: run folders, earliest phase first; each holds ``NAME.metrics.jsonl`` files.

    Returns:
        ``(curves, boundaries)``: ``curves[name]`` the rows of every phase that logged ``name``,
        each phase's ``step`` shifted by the last step of the phases before it (a phase's own
        step 1 follows the previous phase's last step); ``boundaries`` the shifted last step
        of every phase but the last (where the next one starts).
    """
    curves: dict[str, list[dict[str, float]]] = {}
    offset, boundaries = 0, []
    for i, run in enumerate(runs):
        files = sorted(Path(run).glob("*.metrics.jsonl"))
        if not files:
            raise FileNotFoundError(f"{run}: no *.metrics.jsonl (not a training run folder)")
        last = 0
        for f in files:
            rows = _metrics_rows(f)
            if not rows:
                continue
            curves.setdefault(f.name.split(".")[0], []).extend({**r, "step": r["step"] + offset} for r in rows)
            last = max(last, int(rows[-1]["step"]))
        offset += last
        if i < len(runs) - 1:
            boundaries.append(offset)
    return curves, boundaries


def plot_losses(run: Path, png: Path, before: Sequence[Path] = ()) -> Path:
    """Loss and top-1 agreement curves of a run's ``*.metrics.jsonl`` logs (needs matplotlib).

    ``before``: earlier phases of the same models (the runs ``run`` was ``--init-from``-ed from,
    earliest first), drawn first on one step axis with a dotted line where each phase ends.
    """
    with needs_extra("plots", "plot_losses"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    curves, boundaries = chained_metrics([*before, run])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in curves.items():
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, _smooth([r["loss"] for r in rows]), label=name)
        axes[1].plot(steps, _smooth([r["acc"] for r in rows]), label=f"{name} (depth 1)")
        if "acc2" in rows[0]:
            axes[1].plot(steps, _smooth([r.get("acc2", 0.0) for r in rows]), "--", label=f"{name} (depth 3, TTT)")
    for b in boundaries:
        for ax in axes:
            ax.axvline(b, color="grey", linestyle=":", linewidth=1)
    axes[0].set(xlabel="step", ylabel="training loss (50-step mean)", yscale="log", title="loss")
    axes[1].set(xlabel="step", ylabel="top-1 agreement with the target (train batches)", title="agreement")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png

