"""The PNG plots of a ``specdec bench --out DIR`` sweep (matplotlib, an optional extra, imported only here).

:func:`write_plots` draws ``tau.png``, ``acceptance.png`` and ``speedup.png``
(bars per method and temperature, acceptance by depth), and
:func:`write_temperature_plot` ``temperature.png`` (tau and speedup against
the temperature); the records are those of ``results.json``
(:func:`specdec.bench.runner.aggregate`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specdec.bench.rows import kind_rank
from specdec.errors import InvalidConfigError

__all__ = ["PLOT_FILES", "write_plots", "write_temperature_plot"]

PLOT_FILES: tuple[str, ...] = ("tau.png", "acceptance.png", "speedup.png", "temperature.png")
"""The plots' file names."""


def _methods(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The records' methods, each once, in table order (the baseline first, the peer last)."""
    names: list[str] = []
    for r in sorted(records, key=lambda r: kind_rank(r.get("kind", ""))):
        if r["method"] not in names:
            names.append(r["method"])
    return names


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise InvalidConfigError(
            "the benchmark plots need matplotlib: pip install matplotlib "
            "(or pip install 'specdec-trees[bench]'), or pass --no-plots"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(out: str | os.PathLike, records: Sequence[Mapping[str, Any]], title: str = "") -> list[Path]:
    """Write ``tau.png``, ``acceptance.png`` and ``speedup.png`` into ``out``.

    Raises:
        InvalidConfigError: matplotlib is not installed.
    """
    plt = _pyplot()
    p = Path(out)
    temps = sorted({r["temperature"] for r in records})
    names = _methods(records)
    lookup = {(r["method"], r["temperature"]): r for r in records}
    files = []

    def bars(metric: str, fname: str, ylabel: str, hline: float | None) -> None:
        shown = [n for n in names if any((n, t) in lookup and lookup[(n, t)].get(metric) is not None for t in temps)]
        fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(shown) + 2), 4.2))
        width = 0.8 / max(1, len(temps))
        for i, t in enumerate(temps):
            xs, ys = [], []
            for j, n in enumerate(shown):
                v = lookup.get((n, t), {}).get(metric)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    xs.append(j + (i - (len(temps) - 1) / 2) * width)
                    ys.append(v)
            b = ax.bar(xs, ys, width=width, label=f"T={t:g}")
            ax.bar_label(b, fmt="%.2f", fontsize=7)
        if hline is not None:
            ax.axhline(hline, color="grey", linewidth=1, linestyle="--")
        ax.set_xticks(range(len(shown)), shown, rotation=20, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel}{' - ' + title if title else ''}", fontsize=10)
        ax.legend()
        fig.tight_layout()
        fig.savefig(p / fname, dpi=110)
        plt.close(fig)
        files.append(p / fname)

    bars("tau", "tau.png", "tau (tokens per target forward)", 1.0)

    fig, axes = plt.subplots(1, len(temps), figsize=(5.2 * len(temps), 4.0), squeeze=False)
    for ax, t in zip(axes[0], temps):
        deepest = 1
        for n in names:
            rec = lookup.get((n, t))
            if rec and rec["kind"] == "speculative" and rec.get("acceptance_by_depth"):
                acc = rec["acceptance_by_depth"]
                ax.plot(range(1, len(acc) + 1), acc, marker="o", label=n)
                deepest = max(deepest, len(acc))
        ax.set_xticks(range(1, deepest + 1))
        ax.set_xlabel("depth")
        ax.set_ylabel("P(accepted | tested)")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"acceptance by depth, T={t:g}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(p / "acceptance.png", dpi=110)
    plt.close(fig)
    files.append(p / "acceptance.png")

    bars("speedup", "speedup.png", "speedup vs autoregressive (wall clock)", 1.0)
    return files


def write_temperature_plot(out: str | os.PathLike, records: Sequence[Mapping[str, Any]], title: str = "") -> Path:
    """``temperature.png``: tau (left) and speedup (right) against the temperature, one line per method.

    The figure of the one-hot dilemma: a tree built from the draft's top-k
    children keeps its tau at T = 0 and loses it as T grows, while rheo's
    sampled slot holds it up (docs/bench.md, "The temperature sweep").
    """
    plt = _pyplot()
    p = Path(out)
    names = _methods(records)
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.2))
    for ax, metric, ylabel in ((axes[0], "tau", "tau (tokens per target forward)"),
                               (axes[1], "speedup", "speedup vs autoregressive")):
        for n in names:
            pts = sorted((r["temperature"], r[metric]) for r in records if r["method"] == n
                         and r.get(metric) is not None and not (isinstance(r[metric], float) and math.isnan(r[metric])))
            if not pts or (n == "autoregressive"):
                continue
            ax.plot([t for t, _ in pts], [v for _, v in pts], marker="o", label=n)
        ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")  # the baseline: tau 1, speedup 1
        ax.set_xlabel("temperature")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel.split(' (')[0]} vs temperature", fontsize=10)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    f = p / "temperature.png"
    fig.savefig(f, dpi=110)
    plt.close(fig)
    return f

