"""The timeline figure of any Trace: one row per rank in real time, memory below.

The title gives schedule, p, m, makespan and bubble ratio; beside each row is the
rank's idle share. Rows are drawn by `rows.draw_trace`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pipesched.simulator.metrics import Metrics, compute_metrics
from pipesched.simulator.trace import COMPUTE, RECV, SEND, Trace, TraceError

from ..formatting import fmt_seconds
from .legend import HANDLER_MAP, legend_handles
from .memory import draw_memory
from .rows import RowLayout, draw_trace, has_allreduce, has_comm, layout_for
from . import FigureError, check_figure_size
from .style import points_per_unit, save, time_axis

MAX_ARROWS = 160  # with more transfers than this, only the lanes: lines would be a blur
# past these a figure takes minutes and shows nothing legible: draw a window, or use Perfetto
MAX_RANKS_DRAWN = 256
MAX_SPANS_DRAWN = 300_000
MIN_ROW_IN = 0.05  # inches per rank row, the least a --figsize height may leave
TITLE_IN, LEGEND_IN = 0.12, 0.45  # their distance from the figure's top, inches
TITLE_LINE_IN = 0.2
LANE_FONT_PT = 5.0


def figure_rows(ranks: int, rows_per_rank: int = 1, memory: bool = True, figsize: tuple[float, float] | None = None,
                left: float = 0.75, title_lines: int = 1) -> tuple[Figure, Axes, Axes | None]:
    """A figure whose margins are fixed in inches (so label fitting can trust the axes'
    size): the rows' axes, and a memory axes below it when `memory`. `figsize`: (width,
    height) inches; by default 12 wide and as high as the ranks need."""
    top, bottom, mem, gap = 0.95 + TITLE_LINE_IN * (title_lines - 1), 0.5, (1.5 if memory else 0.0), \
        (0.3 if memory else 0.0)
    right = 1.25
    width, height = figsize if figsize is not None else (12.0, None)
    if not (np.isfinite(width) and width > left + right + 1):
        raise FigureError(f"a figure {width:g} in wide leaves no room for the rows; give a width above "
                          f"{left + right + 1:g} in")
    if height is None:
        row = float(np.clip(2.6 / ranks, 0.3, 0.6)) * rows_per_rank
        height = top + ranks * row + gap + mem + bottom
    elif not (np.isfinite(height) and (height - top - gap - mem - bottom) / ranks >= MIN_ROW_IN):
        need = top + gap + mem + bottom + ranks * MIN_ROW_IN
        raise FigureError(f"a figure {height:g} in high leaves too little room for {ranks} ranks; give a height of "
                          f"at least {need:.3g} in")
    check_figure_size(width, height)
    fig = Figure(figsize=(width, height))
    row = (height - top - gap - mem - bottom) / ranks
    fw = (width - left - right) / width
    ax = fig.add_axes((left / width, (bottom + mem + gap) / height, fw, ranks * row / height))
    mem_ax = fig.add_axes((left / width, bottom / height, fw, mem / height), sharex=ax) if memory else None
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return fig, ax, mem_ax


def title_of(trace: Trace, m: Metrics) -> str:
    if m.steps > 1:  # steps back to back (simulator.steps): m per step
        steps = f"m={trace.microbatches // m.steps} x {m.steps} steps"
        period = f", period {fmt_seconds(m.period)} (barrier {m.step_barrier})" if m.period else ""
        return (f"{trace.schedule}: p={trace.ranks}, {steps} ({trace.source}) - makespan {fmt_seconds(m.makespan)}"
                f"{period}, bubble {100 * m.bubble_ratio:.1f} %")
    return (f"{trace.schedule}: p={trace.ranks}, m={trace.microbatches} ({trace.source}) - makespan "
            f"{fmt_seconds(m.makespan)}, bubble {100 * m.bubble_ratio:.1f} %")


def label_rows(ax: Axes, trace: Trace, layout: RowLayout) -> None:
    """"rank r" beside each compute bar, and "send"/"recv" beside the lanes where each lane
    is tall enough for its word (the legend names the lanes anyway)."""
    _, pt_y = points_per_unit(ax)
    rank_pt = min(8.0, 0.8 * layout.bar * pt_y)
    ax.set_yticks(layout.top + layout.bar / 2, [f"rank {r}" for r in range(trace.ranks)],
                  fontsize=max(rank_pt, 4.0))
    if layout.lane > 0 and layout.lane * pt_y >= LANE_FONT_PT:
        lanes = np.concatenate([layout.lane_top(lane) + layout.lane / 2 for lane in (SEND, RECV)])
        ax.set_yticks(lanes, ["send"] * trace.ranks + ["recv"] * trace.ranks, minor=True, fontsize=LANE_FONT_PT,
                      color="0.45")
    ax.tick_params(axis="y", which="both", length=0)


def annotate_rows(ax: Axes, layout: RowLayout, texts: list[str], fontsize: float) -> None:
    """A short text right of each rank's compute bar."""
    for r, text in enumerate(texts):
        ax.text(1.005, layout.top[r] + layout.bar / 2, text, transform=ax.get_yaxis_transform(), va="center",
                fontsize=fontsize, color="0.3")


def finish(fig: Figure, ax: Axes, mem_ax: Axes | None, title: str, handles: list, span_s: float,
           origin_s: float = 0.0) -> None:
    """Title, legend and time axes of a rows figure (x = 0 labelled `origin_s` seconds)."""
    time_axis(ax, span_s, origin_s)
    if mem_ax is not None:
        ax.tick_params(axis="x", labelbottom=False)
        ax.set_xlabel("")
        time_axis(mem_ax, span_s, origin_s)
    height = fig.get_size_inches()[1]
    fig.suptitle(title, x=0.5, y=1 - TITLE_IN / height, va="top", fontsize=11)
    legend_in = LEGEND_IN + TITLE_LINE_IN * title.count("\n")
    fig.legend(handles=handles, handler_map=HANDLER_MAP, loc="upper center", ncol=9, fontsize=7.5,
               frameon=False, bbox_to_anchor=(0.5, 1 - legend_in / height), handlelength=1.4,
               columnspacing=1.2)


def drawable(trace: Trace, window: tuple[float, float] | None) -> tuple[Trace, float, float]:
    """The part of `trace` to draw and the times (t0, t1) its axis spans: from its first op
    to its last, or `window` (seconds from its first op). FigureError when that part is
    too large to draw legibly (more than MAX_RANKS_DRAWN ranks or MAX_SPANS_DRAWN spans)."""
    comp = trace.lane == COMPUTE
    if not comp.any():
        raise TraceError(f"the trace of {trace.schedule} has no compute spans to draw")
    first = float(trace.start[comp].min())
    if trace.ranks > MAX_RANKS_DRAWN:
        raise FigureError(f"the trace has {trace.ranks} ranks; a figure draws at most {MAX_RANKS_DRAWN} legibly: "
                          f"export it with --perfetto and open it in ui.perfetto.dev")
    if window is None:
        t0, t1 = first, float(trace.end[comp].max())
    else:
        lo, hi = window
        if not (np.isfinite(lo) and np.isfinite(hi) and 0 <= lo < hi):
            raise FigureError(f"a time window needs 0 <= START < END seconds, got {lo:g}, {hi:g}")
        # no further than the trace's end: an axis out to 1e308 s overflows matplotlib's ticks
        last = float(trace.end.max()) if len(trace) else first
        end = min(hi, max(last - first, lo + abs(lo) * 1e-9 + 1e-300))
        trace, t0, t1 = trace.within(first + lo, first + end), first + lo, first + end
        if not (trace.lane == COMPUTE).any():
            raise FigureError(f"no op runs between {lo:g} s and {hi:g} s of the trace")
    if len(trace) > MAX_SPANS_DRAWN:
        raise FigureError(f"{len(trace):,} spans are too many to draw legibly (at most {MAX_SPANS_DRAWN:,}): "
                          f"draw a time window (--window START,END in seconds) or export with --perfetto")
    return trace, t0, t1


def plot_timeline(trace: Trace, path: str | Path | None = None, *, memory: bool = True,
                  arrows: bool | None = None, title: str | None = None,
                  window: tuple[float, float] | None = None,
                  figsize: tuple[float, float] | None = None) -> Figure:
    """The timeline figure of `trace`, written to `path` (.png, .svg or .pdf) if given.

    Transfers are drawn as send/recv lanes when they take time, and also as lines from
    sender to receiver when `arrows` (default: if there are at most MAX_ARROWS).
    `window`: (start, end) seconds from the first op, the part to draw; `figsize`:
    (width, height) inches. The title and idle shares describe the whole trace."""
    part, t0, t1 = drawable(trace, window)
    m = compute_metrics(trace)
    lanes = has_comm(part)
    if arrows is None:
        arrows = lanes and int((part.lane == SEND).sum()) <= MAX_ARROWS
    fig, ax, mem_ax = figure_rows(trace.ranks, memory=memory, figsize=figsize)
    layout = layout_for(trace.ranks, lanes, has_allreduce(part))
    right = t1 if window is not None else max(t1, float(part.end.max()))
    ax.set_xlim(0, (right - t0) * (1.0 if window is not None else 1.005))
    ax.set_ylim(trace.ranks, 0)
    draw_trace(ax, part, layout, t0, window=(t0, t1), arrows=arrows)
    label_rows(ax, trace, layout)
    annotate_rows(ax, layout, [f"idle {100 * r.bubble_ratio:.0f} %" for r in m.per_rank],
                  7 if trace.ranks <= 8 else 6)
    if mem_ax is not None:
        draw_memory(mem_ax, [(part, t0, "-")], trace.ranks)
    finish(fig, ax, mem_ax, title or title_of(trace, m), legend_handles([part], lanes, arrows), right - t0,
           window[0] if window is not None else 0.0)
    if path is not None:
        save(fig, path)
    return fig
