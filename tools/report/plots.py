"""The report's PNGs: one style, matplotlib's Agg canvas, no pyplot state (a figure is made, drawn to PNG
bytes and dropped). A series is (label, steps, values); with several runs, a run keeps its colour in every
plot and a metric keeps its line style.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

DPI = 80
SMALL = (5.0, 2.9)  # inches: the health panels, two a row on the page
WIDE = (7.6, 3.4)
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
DASHES = ("-", "--", ":", "-.")
STYLE = {
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "lines.markersize": 3,
}
Series = tuple[str, Sequence[float], Sequence[float | None]]


def _figure(size: tuple[float, float], bottom: float = 0.16) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update(STYLE)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=size)
    # fixed margins (in inches, so every size gets room for the labels): tight_layout draws the figure a
    # second time, half of the cost of a plot
    w, h = size
    fig.subplots_adjust(left=0.8 / w, right=1 - 0.15 / w, top=1 - 0.3 / h, bottom=bottom)
    ax = fig.subplots()
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))  # a tick is an artist: few of them, fast drawing
    return fig, ax


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})  # zlib's default 6: 3x the time
    return buf.getvalue()


def _ys(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def lines(
    title: str,
    ylabel: str,
    series: Sequence[tuple[int, int, Series]],
    size: tuple[float, float] = SMALL,
    points: Sequence[tuple[int, int, Series]] = (),
    hline: tuple[float, str] | None = None,
    ylim: tuple[float, float] | None = None,
    vlines: Sequence[tuple[float, str]] = (),
) -> bytes:
    """A line plot over the training steps. `series`: (run index, metric index, (label, steps, values));
    `points`: markers only (validations); `hline`: (y, label); `vlines`: (step, label), e.g. restarts."""
    fig, ax = _figure(size, bottom=0.5 / size[1])
    many = len(series) > 1 or points
    several_runs = any(run_i for run_i, _, _ in series)
    for run_i, metric_i, (label, xs, ys) in series:
        ax.plot(
            list(xs),
            _ys(ys),
            color=COLORS[(run_i if several_runs else metric_i) % len(COLORS)],
            linestyle=DASHES[metric_i % len(DASHES)] if several_runs else "-",
            marker="o" if len(xs) <= 30 else None,
            label=label,
        )
    several_runs = several_runs or any(run_i for run_i, _, _ in points)
    for run_i, metric_i, (
        label,
        xs,
        ys,
    ) in points:  # a run's colour (one run: a colour a metric), a shape a metric
        color = COLORS[(run_i if several_runs else metric_i + 4) % len(COLORS)]
        ax.plot(list(xs), _ys(ys), linestyle="none", marker="Ds^v"[metric_i % 4], markersize=5, color=color,
                label=label)  # fmt: skip
    if hline is not None:
        ax.axhline(hline[0], color="#555555", linestyle="--", linewidth=1, label=hline[1])
    for x, label in vlines:
        ax.axvline(x, color="#d62728", linestyle=":", linewidth=1.2, label=label)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4), useOffset=False)
    if many or hline is not None or vlines:
        ax.legend(loc="best")
    return png(fig)


def split_bars(title: str, rows: list[dict[str, Any]], parts: Sequence[tuple[str, str]]) -> bytes:
    """The step-time split of one run: a stacked bar a step (stacked areas past 40 steps: a bar each would
    cost a second of drawing at 200 steps)."""
    fig, ax = _figure((WIDE[0], WIDE[1] + 0.5), bottom=1.15 / (WIDE[1] + 0.5))
    steps = [r["step"] for r in rows]
    used = [(i, key, label) for i, (key, label) in enumerate(parts) if any(r.get(key) for r in rows)]
    if len(rows) > 40:
        ax.stackplot(steps, *[[r.get(k) or 0.0 for r in rows] for _, k, _ in used],
                     labels=[lab for _, _, lab in used], colors=[COLORS[i % len(COLORS)] for i, _, _ in used])  # fmt: skip
    else:
        bottom = [0.0] * len(rows)
        for i, key, label in used:
            vals = [r.get(key) or 0.0 for r in rows]
            ax.bar(steps, vals, bottom=bottom, label=label, color=COLORS[i % len(COLORS)])
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(title)
    ax.legend(ncol=4, loc="upper left", bbox_to_anchor=(0, -0.22))
    return png(fig)


def split_means(
    title: str, runs: list[tuple[str, list[dict[str, Any]]]], parts: Sequence[tuple[str, str]]
) -> bytes:
    """Several runs: one horizontal stacked bar a run, the mean seconds a step of each phase."""
    height = 1.6 + 0.5 * len(runs)
    fig, ax = _figure((WIDE[0], height), bottom=1.0 / height)
    fig.subplots_adjust(left=0.3)
    ys = list(range(len(runs)))  # positions, not category names: the y locator of _figure would split those
    left = [0.0] * len(runs)
    for i, (key, label) in enumerate(parts):
        vals = [sum(r.get(key) or 0.0 for r in rows) / max(1, len(rows)) for _, rows in runs]
        if not any(vals):
            continue
        ax.barh(ys, vals, left=left, label=label, color=COLORS[i % len(COLORS)])
        left = [a + v for a, v in zip(left, vals, strict=True)]
    ax.set_yticks(ys, [label for label, _ in runs])
    ax.invert_yaxis()
    ax.set_xlabel("seconds a step (mean over the steps)")
    ax.set_title(title)
    ax.legend(ncol=4, loc="upper left", bbox_to_anchor=(-0.3, -0.45 * 2.6 / height))
    return png(fig)
