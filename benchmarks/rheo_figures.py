"""The RheoSampling figures of the docs (issue 47): tau against temperature per method, and a draft tree.

Writes two SVG files (deterministic: matplotlib's Agg backend, a fixed ``svg.hashsalt``, no date in
the metadata, text kept as text):

- ``rheo_tau_vs_temperature.svg``: tau (± one standard error over generations) against the
  temperature T, one line per method, from the committed run logs of the exploratory temperature
  sweeps (``benchmarks/results/*/runs.jsonl``): SmolLM2-135M-Instruct (the folders
  ``rheo_sweep_smollm2_b60_t*``) and Gemma-3-270M (``rheo_t*_gemma3_b60*``, the step-2,353 head),
  the rows that docs/rheo_results.md's two "Temperature sweep" sections report. The EAGLE-2/3
  tree (``eagle3``) falls with T, the static trees (Sequoia, SpecInfer) rise, rheo keeps EAGLE's
  top-K slots and adds a sampled one. The every-slot configuration, logged before issue 47 as
  ``rheo[m=10,...]``, is the ``sampled-dynamic`` method and is drawn under that name, never as rheo
  (``rheo_sweep_table.every_slot_names``);
- ``rheo_tree.svg``: a schematic RheoSampling draft tree of depth 3, its deterministic top-K children
  and its sampled children drawn differently.

The logs are read with ``benchmarks/rheo_sweep_table.py``'s functions (``read_logs``, ``cells``,
``tau``, ``stderr``, ``every_slot_names``), so a cell here is the same number as that script's table.
The script prints every run log and row it used, per method and temperature.

Usage::

    python benchmarks/rheo_figures.py                      # both figures into docs/img/
    python benchmarks/rheo_figures.py --only tau --out-dir /tmp/figs
    python benchmarks/rheo_figures.py --results benchmarks/results --no-gemma
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rheo_sweep_table import cells, every_slot_names, read_logs, stderr, tau  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TAU_SVG = "rheo_tau_vs_temperature.svg"
TREE_SVG = "rheo_tree.svg"
SVG_SALT = "specdec-rheo-figures"
"""matplotlib's ``svg.hashsalt``: the SVG's element ids do not change from run to run."""

ALL = None
"""A row selector's temperatures: every temperature at which the row has a cell."""

Units = dict[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class Line:
    """One method's line: ``rows`` are ``(row as shown, temperatures or ALL)``, the row names as
    ``rheo_sweep_table.py`` shows them (every-slot cells already renamed to ``sampled-dynamic[...]``).
    At each temperature exactly one selector may hold a cell (two are an error)."""

    method: str
    label: str
    rows: tuple[tuple[str, tuple[float, ...] | None], ...]
    color: str
    linestyle: str = "-"
    marker: str = "o"
    linewidth: float = 1.4


@dataclass(frozen=True)
class Panel:
    title: str
    folders: tuple[str, ...]
    lines: tuple[Line, ...]


@dataclass(frozen=True)
class Point:
    temperature: float
    tau: float
    stderr: float
    generations: int
    prompts: int
    row: str
    """The row as shown (``sampled-dynamic[...]`` for an every-slot cell)."""
    logged: str
    """The row as its run log names it."""
    folder: str


EAGLE3 = Line("eagle3", "eagle3 (EAGLE-2/3: top-K children, deterministic)", (), "#1f77b4")
RHEO = Line("rheo", "rheo (m = 1 sampled child per node, its defaults)", (), "#d62728", linewidth=2.6)
SAMPLED_DYNAMIC = Line("sampled-dynamic", "sampled-dynamic[proxy=displaced,M=1024] (every child sampled; not rheo)",
                       (("sampled-dynamic[proxy=displaced,M=1024]", ALL),), "#2ca02c", marker="s")
SEQUOIA = Line("sequoia", "sequoia@eagle3 (static tree, sampled children)", (("sequoia@eagle3", ALL),), "#9467bd",
               linestyle="--")
SPECINFER = Line("specinfer", "specinfer@eagle3 (static tree, sampled children)", (("specinfer@eagle3", ALL),),
                 "#7f7f7f", linestyle="--", marker="^")
SD = Line("sd", "sd (chain of 6 from a 2-layer draft LM)", (("sd", ALL),), "#8c564b", linestyle=":", marker="v")


def _with(line: Line, rows: tuple[tuple[str, tuple[float, ...] | None], ...]) -> Line:
    return Line(line.method, line.label, rows, line.color, line.linestyle, line.marker, line.linewidth)


_S = "rheo_sweep_smollm2_b60"
SMOLLM2 = Panel(
    "SmolLM2-135M-Instruct (48 new tokens)",
    tuple(f"{_S}_{s}" for s in ("t0", "t0_sd", "t03", "t03_untempered", "t03_mKdisp", "t06", "t06_untempered",
                                "t06_mKdisp", "t08", "t08_sd", "t08_mKdisp", "t1", "t1_mKdisp", "t12", "t12_sd",
                                "t12_mKdisp")),
    (
        # the untempered ranking law, the default; at T = 0 and 1 the two laws are one (the sweep's --same-at)
        _with(EAGLE3, (("eagle3[rank_law=untempered]", ALL), ("eagle3", (0.0, 1.0)))),
        _with(RHEO, (("rheo[rank_law=untempered]", ALL), ("rheo", (0.0, 1.0)))),
        SAMPLED_DYNAMIC, SEQUOIA, SPECINFER, SD,
    ),
)

_G = "rheo_t{}_gemma3_b60"
GEMMA3 = Panel(
    "Gemma-3-270M (32 new tokens, the step-2,353 head)",
    tuple(_G.format(t) + s for t, s in (("0", ""), ("0", "_sd"), ("03", ""), ("03", "_static"), ("03", "_sd"),
                                        ("06", ""), ("06", "_static"), ("06", "_sd"), ("08", ""), ("08", "_static"),
                                        ("08", "_sd"), ("1", ""), ("1", "_static"), ("1", "_sd"), ("12", ""),
                                        ("12", "_sd"))),
    (
        # rows without a rank_law in their name ran with the untempered law (the Gemma sweep's --same-at)
        _with(EAGLE3, (("eagle3[rank_law=untempered]", ALL), ("eagle3", (0.0, 0.6, 0.8, 1.0, 1.2)))),
        _with(RHEO, (("rheo[rank_law=untempered]", ALL), ("rheo", (0.0, 0.6, 0.8, 1.0, 1.2)))),
        SAMPLED_DYNAMIC, SEQUOIA, SPECINFER, SD,
    ),
)

CAPTION = "exploratory sweep, 20 ShareGPT prompts x 3 seeds (T = 0: 1 seed), 60 nodes, depth 6, CPU"


def method_of(row: str) -> str:
    """``rheo[m=2]`` -> ``rheo``, ``sequoia@eagle3`` -> ``sequoia``."""
    return row.split("[", 1)[0].split("@", 1)[0]


def load(dirs: list[Path]) -> tuple[dict[tuple[str, float], Units], dict[tuple[str, float], str],
                                    dict[tuple[str, float], str], set[tuple[str, float]]]:
    """The cells of one sweep's folders as ``rheo_sweep_table.py`` shows them:
    ``(table, logged, folder, every_slot)``: ``{(row, T): units}`` with every-slot cells under their
    ``sampled-dynamic`` name, ``{(row, T): the row as logged}``, ``{(row, T): the folder that holds it}``,
    and the ``(row as logged, T)`` of the cells logged with every slot sampled.

    The folders must be parts of one sweep (``read_logs``'s checks; ``SystemExit`` otherwise).
    """
    headers: list[dict[str, Any]] = []
    _, records, _ = read_logs(dirs, headers)
    table = cells(records)
    folder: dict[tuple[str, float], str] = {}
    for d in dirs:
        for key in cells(read_logs([d])[1]):
            folder[key] = str(d)
    logged = {key: key[0] for key in table}
    renamed = every_slot_names(headers)
    for (row, t), new in sorted(renamed.items()):
        if (row, t) not in table:
            continue
        if (new, t) in table:
            raise SystemExit(f"{row} at T={t:g} is sampled-dynamic's {new}, which these logs also hold at T={t:g}")
        table[(new, t)] = table.pop((row, t))
        logged[(new, t)] = logged.pop((row, t))
        folder[(new, t)] = folder.pop((row, t))
    return table, logged, folder, set(renamed)


def series(dirs: list[Path], lines: tuple[Line, ...]) -> dict[str, list[Point]]:
    """``{line label: points by temperature}`` of the folders' cells that each line selects.

    A cell logged with every slot sampled is only ever a ``sampled-dynamic`` line's (an error otherwise:
    ``load`` shows it under that method's name); a row of another method than the line's is an error too.
    """
    table, logged, folder, every_slot = load(dirs)
    out: dict[str, list[Point]] = {}
    for line in lines:
        by_t: dict[float, Point] = {}
        for row, temps in line.rows:
            if method_of(row) != line.method:
                raise ValueError(f"line {line.label!r} ({line.method}) selects a row of another method: {row}")
            for (r, t), units in table.items():
                if r != row or (temps is not ALL and t not in temps) or not units:
                    continue
                if (logged[(r, t)], t) in every_slot and line.method != "sampled-dynamic":
                    raise ValueError(f"{logged[(r, t)]} at T={t:g} has every slot sampled: it is sampled-dynamic's, "
                                     f"not {line.method}'s")
                if t in by_t:
                    raise ValueError(f"line {line.label!r}: two rows at T={t:g} ({by_t[t].row}, {row})")
                by_t[t] = Point(t, tau(units), stderr(units), len(units), len({p for p, _ in units}), r,
                                logged[(r, t)], folder[(r, t)])
        out[line.label] = [by_t[t] for t in sorted(by_t)]
    return out


def _shown(path: Path) -> str:
    """``path`` relative to the repository where it is inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def describe(title: str, dirs: list[Path], data: dict[str, list[Point]]) -> str:
    """What a panel used: its run logs, then per line and temperature the row, tau ± standard error and folder."""
    text = [f"{title}: run logs " + ", ".join(_shown(d / "runs.jsonl") for d in dirs)]
    for label, points in data.items():
        text.append(f"  {label}:")
        for p in points:
            shown = p.row if p.row == p.logged else f"{p.row} (logged as {p.logged})"
            se = f" ± {p.stderr:.2f}" if p.stderr == p.stderr else ""
            text.append(f"    T={p.temperature:g}: {p.tau:.2f}{se} ({p.prompts}p, {p.generations} generations) "
                        f"{shown}, {Path(p.folder).name}")
        if not points:
            text.append("    (no cell)")
    return "\n".join(text)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": SVG_SALT, "svg.fonttype": "none", "font.size": 9})
    return plt


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, format="svg", metadata={"Date": None})


def plot_tau(panels: list[tuple[Panel, dict[str, list[Point]]]], path: Path) -> None:
    """tau (± one standard error) against T, one panel per target, one line per method, one shared legend."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.3), squeeze=False, sharey=True)
    handles: dict[str, Any] = {}
    for ax, (panel, data) in zip(axes[0], panels, strict=True):
        for line in panel.lines:
            pts = data.get(line.label, [])
            if not pts:
                continue
            h = ax.errorbar([p.temperature for p in pts], [p.tau for p in pts],
                            yerr=[p.stderr if p.stderr == p.stderr else 0.0 for p in pts], color=line.color,
                            linestyle=line.linestyle, marker=line.marker, markersize=4.5, capsize=3,
                            linewidth=line.linewidth, label=line.label)
            handles.setdefault(line.label, h)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("temperature T")
        ax.set_xticks([0, 0.3, 0.6, 0.8, 1.0, 1.2])
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("tau (tokens per target forward)")
    order = [line.label for line in panels[0][0].lines if line.label in handles]
    fig.legend([handles[k] for k in order], order, loc="lower center", ncol=2, fontsize=8.5, frameon=False,
               borderaxespad=0.2)
    fig.suptitle("tau against temperature per method (" + CAPTION + ")", fontsize=10)
    fig.tight_layout(rect=(0, 0.15, 1, 0.98))
    _save(fig, path)
    plt.close(fig)


# the schematic tree: node -> (parent, kind, token), kind "det" (top-K, deterministic) or "samp" (sampled)
TREE: dict[str, tuple[str | None, str, str]] = {
    "root": (None, "root", "context"),
    "a": ("root", "det", "the"), "b": ("root", "det", "a"), "c": ("root", "samp", "one"),
    "aa": ("a", "det", "cat"), "ab": ("a", "det", "dog"), "ac": ("a", "samp", "fox"),
    "ba": ("b", "det", "new"),
    "ca": ("c", "det", "day"), "cb": ("c", "samp", "more"),
    "aaa": ("aa", "det", "sat"), "aab": ("aa", "samp", "ran"),
    "aca": ("ac", "det", "ran"),
    "caa": ("ca", "det", "ago"), "cab": ("ca", "samp", "later"),
}
DET_COLOR, SAMP_COLOR = "#1f77b4", "#d95f02"


def plot_tree(path: Path) -> None:
    """A RheoSampling draft tree of depth 3 (K = 3 children per expanded node: 2 deterministic, m = 1 sampled),
    after EAGLE-2's pruning to the best N nodes; deterministic edges solid, sampled edges dashed."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    children: dict[str, list[str]] = {}
    for node, (parent, _, _) in TREE.items():
        if parent is not None:
            children.setdefault(parent, []).append(node)
    # x: leaves left to right, a parent above the middle of its children; y: -depth
    pos: dict[str, tuple[float, float]] = {}
    next_leaf = [0.0]

    def place(node: str, depth: int) -> float:
        kids = children.get(node, [])
        x = sum(place(k, depth + 1) for k in kids) / len(kids) if kids else next_leaf[0]
        if not kids:
            next_leaf[0] += 1.0
        pos[node] = (x, -float(depth))
        return x

    place("root", 0)
    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    for node, (parent, kind, _) in TREE.items():
        if parent is None:
            continue
        (x0, y0), (x1, y1) = pos[parent], pos[node]
        det = kind == "det"
        ax.plot([x0, x1], [y0, y1], color=DET_COLOR if det else SAMP_COLOR, linestyle="-" if det else "--",
                linewidth=1.8, zorder=1)
    for node, (_, kind, token) in TREE.items():
        x, y = pos[node]
        if kind == "root":
            face, edge, style = "#eeeeee", "#444444", "-"
        elif kind == "det":
            face, edge, style = "#dbe9f6", DET_COLOR, "-"
        else:
            face, edge, style = "#fde5d2", SAMP_COLOR, "--"
        ax.text(x, y, token, ha="center", va="center", fontsize=9, zorder=2,
                bbox={"boxstyle": "round,pad=0.35", "facecolor": face, "edgecolor": edge, "linestyle": style,
                      "linewidth": 1.4})
    for depth in range(1, 4):
        ax.text(-0.9, -depth, f"depth {depth}", ha="right", va="center", fontsize=8, color="#555555")
    legend = [
        Line2D([], [], color=DET_COLOR, linewidth=1.8,
               label="top-K (deterministic): the draft's top-(K - m) tokens at the node, verified by sample-and-match"),
        Line2D([], [], color=SAMP_COLOR, linewidth=1.8, linestyle="--",
               label="sampled: drawn from q' (the draft's top-M tokens outside the deterministic slots, "
                     "renormalised), verified first, by rejection"),
    ]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8, frameon=False)
    ax.set_title("A RheoSampling draft tree: K = 3 children per expanded node, m = 1 of them sampled\n"
                 "(EAGLE-2's expansion and pruning keep the best-weighted nodes; sampled-dynamic samples every child)",
                 fontsize=9)
    xs = [p[0] for p in pos.values()]
    ax.set_xlim(min(xs) - 1.6, max(xs) + 0.6)
    ax.set_ylim(-3.5, 0.45)
    ax.axis("off")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results",
                    help="the folder holding the sweeps' run folders (default: benchmarks/results)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "img", help="where the SVGs go (default: docs/img)")
    ap.add_argument("--only", choices=("tau", "tree"), default=None, help="draw one figure only")
    ap.add_argument("--no-gemma", action="store_true", help="the tau figure with the SmolLM2 panel only")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "tau"):
        panels = []
        for panel in (SMOLLM2,) if args.no_gemma else (SMOLLM2, GEMMA3):
            dirs = [args.results / f for f in panel.folders]
            data = series(dirs, panel.lines)
            print(describe(panel.title, dirs, data))
            panels.append((panel, data))
        plot_tau(panels, args.out_dir / TAU_SVG)
        print(f"wrote {_shown(args.out_dir / TAU_SVG)}")
    if args.only in (None, "tree"):
        plot_tree(args.out_dir / TREE_SVG)
        print(f"wrote {_shown(args.out_dir / TREE_SVG)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
