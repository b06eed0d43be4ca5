"""The schedule-comparison chart: what a user reads to choose a schedule.

Left: bubble ratio against the number of microbatches; middle: peak memory (the
largest rank's) against it; right: makespan against peak memory for one number of
microbatches, with the Pareto front (no other schedule is both faster and leaner)
joined up. One colour and marker per schedule throughout.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.transforms
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
    note = f"fastest: {min(ok, key=lambda p: p.makespan).schedule} ({fmt_seconds(min(p.makespan for p in ok))})"
    frame = ax.get_window_extent().transformed(matplotlib.transforms.Affine2D().scale(72 / ax.figure.dpi))
    note_box = (frame.x1 - 4 - _text_width(note, 7), frame.y0, frame.x1, frame.y0 + 4 + 7 * 1.3)
    _name_points(ax, ok, xs, ys, on_front, keep_clear=[note_box])
    ax.text(0.99, 0.02, note, transform=ax.transAxes, ha="right", fontsize=7, color="0.35")


LABEL_FONT = 7.0  # points
LABEL_PAD = 1.5  # points between a name and anything it must not cover
MARKER_HALF = 4.5  # points: half a Pareto marker (ms=7 plus its edge)


def _name_points(ax: Axes, points: list[SweepPoint], xs: np.ndarray, ys: np.ndarray, best: set[int],
                 keep_clear: list[tuple[float, float, float, float]] | None = None) -> list:
    """Write each schedule's name by its point where it covers no other name, no point
    and nothing in `keep_clear` (boxes in points), inside the axes: right of the point
    if it fits, else left, else moved away with a thin leader line, nearest place
    first. The Pareto front is named first, then the rest fastest first; a name with
    no free place is left out (the legend still names the marker). Returns the
    annotations. The axes' limits and position must be final."""
    ratio = 72 / ax.figure.dpi  # display units -> points
    at = ax.transData.transform(np.column_stack([xs, ys])) * ratio
    frame = ax.get_window_extent().transformed(matplotlib.transforms.Affine2D().scale(ratio))
    taken = [(x - MARKER_HALF, y - MARKER_HALF, x + MARKER_HALF, y + MARKER_HALF) for x, y in at]
    taken += list(keep_clear or [])
    order = sorted(range(len(points)), key=lambda k: (id(points[k]) not in best, ys[k]))
    h = LABEL_FONT * 1.2
    names = []
    for k in order:
        x, y = at[k]
        w = _text_width(points[k].schedule, LABEL_FONT)
        place = _free_place(x, y, w, h, taken, (frame.x0, frame.y0, frame.x1, frame.y1), skip=k)
        if place is None:
            continue
        dx, dy, box = place
        taken.append(box)
        lead = abs(dy) > h / 2 or abs(dx) > 8
        names.append(ax.annotate(
            points[k].schedule, (xs[k], ys[k]), xytext=(dx, dy), textcoords="offset points", va="center",
            ha="left" if dx > 0 else "right", fontsize=LABEL_FONT, gid="name",
            color="0.1" if id(points[k]) in best else "0.45",
            arrowprops=dict(arrowstyle="-", color="0.6", lw=0.5, shrinkA=0, shrinkB=MARKER_HALF) if lead else None,
            bbox=dict(boxstyle="square,pad=0.05", facecolor="white", edgecolor="none", alpha=0.7)))
    return names


def _free_place(x: float, y: float, w: float, h: float, taken: list, frame: tuple, skip: int):
    """(dx, dy, box) of the nearest place for a w x h name by the point at (x, y) that
    overlaps nothing in `taken` but the point's own marker (index `skip`), inside
    `frame`; None if there is none."""
    candidates = []
    for dx in (6.0, 14.0, 26.0, 42.0):
        for step in range(0, 7):
            for sign in ((1,) if step == 0 else (-1, 1)):
                dy = sign * step * h
                candidates.append((dx, dy))
                candidates.append((-dx, dy))
    candidates.sort(key=lambda c: (abs(c[0]) + abs(c[1]), c[0] < 0))
    for dx, dy in candidates:
        x0 = x + dx if dx > 0 else x + dx - w
        box = (x0 - LABEL_PAD, y + dy - h / 2 - LABEL_PAD, x0 + w + LABEL_PAD, y + dy + h / 2 + LABEL_PAD)
        if box[0] < frame[0] or box[2] > frame[2] or box[1] < frame[1] or box[3] > frame[3]:
            continue
        if any(_overlap(box, other) for i, other in enumerate(taken) if i != skip):
            continue
        if (abs(dy) > h / 2 or abs(dx) > 8) and _leader_crosses(x, y, x0 if dx > 0 else x0 + w, y + dy, taken, skip):
            continue
        return dx, dy, box
    return None


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _leader_crosses(x0: float, y0: float, x1: float, y1: float, taken: list, skip: int) -> bool:
    """Whether the leader line from a point to its name runs through another box (once
    clear of the point's own marker, which may touch its neighbours')."""
    for t in np.linspace(0.0, 1.0, 24)[1:-1]:
        px, py = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
        if abs(px - x0) < MARKER_HALF + LABEL_PAD and abs(py - y0) < MARKER_HALF + LABEL_PAD:
            continue
        if any(b[0] - LABEL_PAD < px < b[2] + LABEL_PAD and b[1] - LABEL_PAD < py < b[3] + LABEL_PAD
               for i, b in enumerate(taken) if i != skip):
            return True
    return False


def _text_width(text: str, fontsize: float) -> float:
    """The width in points of `text` at `fontsize` in the default font."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    width, _, _ = TextToPath().get_text_width_height_descent(text, FontProperties(size=fontsize), ismath=False)
    return float(width)
