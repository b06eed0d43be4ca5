"""The schedule-comparison chart: what a user reads to choose a schedule.

Left: bubble ratio against the number of microbatches; middle: peak memory (the
largest rank's) against it; right: makespan against peak memory for one number of
microbatches, with the Pareto front (no other schedule is both faster and leaner)
joined up. One colour and marker per schedule throughout.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from ..formatting import fmt_seconds
from .points import SweepPoint, pareto_front  # noqa: F401  (the chart draws them)
from .style import bytes_unit, save, time_unit

MARKERS = "osD^vP*Xh<>"
DODGE = 0.035  # octaves between neighbouring schedules' points on a microbatch axis


def _styles(names: list[str]) -> dict[str, dict]:
    cmap = matplotlib.colormaps["tab10"]
    return {n: {"color": cmap(i % 10), "marker": MARKERS[i % len(MARKERS)]} for i, n in enumerate(names)}


def _against_m(ax: Axes, points: list[SweepPoint], styles: dict, value, ylabel: str, ms: list[int]) -> list:
    lines = []
    n = len(styles)
    for i, (name, style) in enumerate(styles.items()):
        mine = sorted((p for p in points if p.schedule == name and p.error is None), key=lambda p: p.microbatches)
        # schedules often tie (same memory): nudge each sideways so none hides another
        dodge = 2 ** (DODGE * (i - (n - 1) / 2))
        if mine:
            lines += ax.plot([p.microbatches * dodge for p in mine], [value(p) for p in mine], label=name, lw=1.4,
                             ms=4.5, **style)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ms))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("microbatches m")
    ax.set_ylabel(ylabel)
    ax.grid(color="0.92", lw=0.6)
    return lines


def plot_sweep(points: list[SweepPoint], path: str | Path | None = None, *, pareto_m: int | None = None,
               title: str | None = None) -> Figure:
    """The comparison figure of a sweep (see the module doc); `pareto_m` picks the
    microbatches of the Pareto panel (default: the largest swept). Written to `path`
    (.png, .svg or .pdf) if given. Artists carry gids: "bubble", "memory" (one line
    per schedule) and "pareto" (one point per schedule)."""
    names = list(dict.fromkeys(p.schedule for p in points))
    styles = _styles(names)
    ms = sorted({p.microbatches for p in points})
    ranks = points[0].ranks if points else 0
    fig = Figure(figsize=(14, 4.6))
    axes = fig.subplots(1, 3, gridspec_kw={"left": 0.05, "right": 0.87, "bottom": 0.13, "top": 0.86,
                                           "wspace": 0.28})
    for line in _against_m(axes[0], points, styles, lambda p: 100 * p.bubble_ratio, "bubble (% of rank time idle)",
                           ms):
        line.set_gid("bubble")
    axes[0].set_ylim(bottom=0)
    peak = max((p.peak_memory for p in points if p.error is None), default=0.0)
    if peak > 0:
        div, unit = bytes_unit(peak)
        for line in _against_m(axes[1], points, styles, lambda p: p.peak_memory / div,
                               f"peak memory of the fullest rank ({unit})", ms):
            line.set_gid("memory")
        axes[1].set_ylim(bottom=0)
    m = pareto_m if pareto_m is not None else (ms[-1] if ms else 0)
    at_m = [p for p in points if p.microbatches == m]
    if peak > 0:
        _pareto(axes[2], at_m, styles, div, unit)
    else:
        axes[1].set_axis_off()
        axes[1].text(0.5, 0.5, "peak memory: not modelled\n(give activation and parameter bytes)", ha="center",
                     va="center", transform=axes[1].transAxes, fontsize=9, color="0.4")
        _makespans(axes[2], at_m, styles)
    fig.legend(handles=[axes[0].plot([], [], label=n, **s)[0] for n, s in styles.items()], loc="center left",
               bbox_to_anchor=(0.88, 0.5), frameon=False, fontsize=9)
    default = (f"schedules at p={ranks}: bubble and memory against m; makespan vs memory at m={m}" if peak > 0
               else f"schedules at p={ranks}: bubble against m; makespan at m={m}")
    fig.suptitle(title or default, fontsize=11)
    if path is not None:
        save(fig, path)
    return fig


def _makespans(ax: Axes, points: list[SweepPoint], styles: dict) -> None:
    """Without memory there is no trade-off to show: makespans at one m, fastest on top."""
    ok = sorted((p for p in points if p.error is None), key=lambda p: -p.makespan)
    if not ok:
        return
    scale, tunit = time_unit(max(p.makespan for p in ok))
    bars = ax.barh([p.schedule for p in ok], [p.makespan * scale for p in ok],
                   color=[styles[p.schedule]["color"] for p in ok])
    for bar in bars:
        bar.set_gid("makespan")
    ax.set_xlabel(f"makespan ({tunit})")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"m={ok[0].microbatches}: makespan (memory not modelled)", fontsize=8.5)
    ax.grid(axis="x", color="0.92", lw=0.6)


def _pareto(ax: Axes, points: list[SweepPoint], styles: dict, div: float, unit: str) -> None:
    ok = [p for p in points if p.error is None]
    if not ok:
        ax.text(0.5, 0.5, "no schedule at this m", ha="center", va="center", transform=ax.transAxes)
        return
    scale, tunit = time_unit(max(p.makespan for p in ok))
    front = pareto_front(ok)
    on_front = {id(p) for p in front}
    for p in ok:
        style = styles[p.schedule]
        best = id(p) in on_front
        (pt,) = ax.plot([p.peak_memory / div], [p.makespan * scale], ls="none", ms=7, marker=style["marker"],
                        mec=style["color"], mfc=style["color"] if best else "white", mew=1.4)
        pt.set_gid("pareto")
    if len(front) > 1:
        ax.step([p.peak_memory / div for p in front], [p.makespan * scale for p in front], where="post",
                color="0.3", lw=0.9, ls="--", zorder=0)
    ax.set_xlabel(f"peak memory of the fullest rank ({unit})")
    ax.set_ylabel(f"makespan ({tunit})")
    ax.set_title(f"m={ok[0].microbatches}: filled = Pareto front (none faster and leaner)", fontsize=8.5)
    ax.grid(color="0.92", lw=0.6)
    xs = np.array([p.peak_memory / div for p in ok])
    ys = np.array([p.makespan * scale for p in ok])
    pad_x = max(float(np.ptp(xs)), float(xs.max()) * 0.05, 1e-9) * 0.15
    pad_y = max(float(np.ptp(ys)), float(ys.max()) * 0.05) * 0.15
    ax.set_xlim(xs.min() - pad_x, xs.max() + 2.5 * pad_x)  # room for the names
    ax.set_ylim(ys.min() - pad_y, ys.max() + pad_y)
    _name_points(ax, ok, xs, ys, on_front)
    ax.text(0.99, 0.02, f"fastest: {min(ok, key=lambda p: p.makespan).schedule} "
            f"({fmt_seconds(min(p.makespan for p in ok))})", transform=ax.transAxes, ha="right", fontsize=7,
            color="0.35")


def _name_points(ax: Axes, points: list[SweepPoint], xs: np.ndarray, ys: np.ndarray, best: set[int]) -> None:
    """Write each schedule's name right of its point, moved up or down until it does
    not cover an earlier name (the axes' limits and position must be final)."""
    fontsize = 7.0
    to_pt = ax.transData.transform  # display units are points at 72 dpi
    ratio = 72 / ax.figure.dpi
    placed: list[tuple[float, float, float, float]] = []
    for k in np.argsort(-ys):
        x, y = to_pt((xs[k], ys[k])) * ratio
        w, h = 0.6 * fontsize * len(points[k].schedule), fontsize * 1.15
        for dy in (0, -h, h, -2 * h, 2 * h, -3 * h, 3 * h):
            box = (x + 5, y + dy - h / 2, x + 5 + w, y + dy + h / 2)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                break
        placed.append(box)
        ax.annotate(points[k].schedule, (xs[k], ys[k]), xytext=(5, dy), textcoords="offset points",
                    va="center", fontsize=fontsize, color="0.1" if id(points[k]) in best else "0.45",
                    arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=3) if dy else None,
                    bbox=dict(boxstyle="square,pad=0.05", facecolor="white", edgecolor="none", alpha=0.7))
