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

from ..options import fmt_seconds
from .legend import HANDLER_MAP, legend_handles
from .memory import draw_memory
from .rows import RowLayout, draw_trace, has_comm, layout_for
from .style import save, time_axis

MAX_ARROWS = 160  # with more transfers than this, only the lanes: lines would be a blur
TITLE_IN, LEGEND_IN = 0.12, 0.45  # their distance from the figure's top, inches
TITLE_LINE_IN = 0.2


def figure_rows(ranks: int, rows_per_rank: int = 1, memory: bool = True, width: float = 12.0,
                left: float = 0.75, title_lines: int = 1) -> tuple[Figure, Axes, Axes | None]:
    """A figure whose margins are fixed in inches (so label fitting can trust the axes'
    size): the rows' axes, and a memory axes below it when `memory`. Sizes in inches."""
    row = float(np.clip(2.6 / ranks, 0.3, 0.6)) * rows_per_rank
    top, bottom, mem, gap = 0.95 + TITLE_LINE_IN * (title_lines - 1), 0.5, (1.5 if memory else 0.0), \
        (0.3 if memory else 0.0)
    height = top + ranks * row + gap + mem + bottom
    fig = Figure(figsize=(width, height))
    right = 1.25
    fw = (width - left - right) / width
    ax = fig.add_axes((left / width, (bottom + mem + gap) / height, fw, ranks * row / height))
    mem_ax = fig.add_axes((left / width, bottom / height, fw, mem / height), sharex=ax) if memory else None
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    return fig, ax, mem_ax


def title_of(trace: Trace, m: Metrics) -> str:
    return (f"{trace.schedule}: p={trace.ranks}, m={trace.microbatches} ({trace.source}) - makespan "
            f"{fmt_seconds(m.makespan)}, bubble {100 * m.bubble_ratio:.1f} %")


def label_rows(ax: Axes, trace: Trace, layout: RowLayout) -> None:
    """"rank r" beside each compute bar, and "send"/"recv" beside the lanes where legible."""
    small = trace.ranks > 8
    ax.set_yticks(layout.top + layout.bar / 2, [f"rank {r}" for r in range(trace.ranks)],
                  fontsize=6.5 if small else 8)
    if layout.lane > 0 and not small:
        lanes = np.concatenate([layout.lane_top(lane) + layout.lane / 2 for lane in (SEND, RECV)])
        ax.set_yticks(lanes, ["send"] * trace.ranks + ["recv"] * trace.ranks, minor=True, fontsize=5,
                      color="0.45")
    ax.tick_params(axis="y", which="both", length=0)


def annotate_rows(ax: Axes, layout: RowLayout, texts: list[str], fontsize: float) -> None:
    """A short text right of each rank's compute bar."""
    for r, text in enumerate(texts):
        ax.text(1.005, layout.top[r] + layout.bar / 2, text, transform=ax.get_yaxis_transform(), va="center",
                fontsize=fontsize, color="0.3")


def finish(fig: Figure, ax: Axes, mem_ax: Axes | None, title: str, handles: list, span_s: float) -> None:
    """Title, legend and time axes of a rows figure."""
    time_axis(ax, span_s)
    if mem_ax is not None:
        ax.tick_params(axis="x", labelbottom=False)
        ax.set_xlabel("")
        time_axis(mem_ax, span_s)
    height = fig.get_size_inches()[1]
    fig.suptitle(title, x=0.5, y=1 - TITLE_IN / height, va="top", fontsize=11)
    legend_in = LEGEND_IN + TITLE_LINE_IN * title.count("\n")
    fig.legend(handles=handles, handler_map=HANDLER_MAP, loc="upper center", ncol=9, fontsize=7.5,
               frameon=False, bbox_to_anchor=(0.5, 1 - legend_in / height), handlelength=1.4,
               columnspacing=1.2)


def plot_timeline(trace: Trace, path: str | Path | None = None, *, memory: bool = True,
                  arrows: bool | None = None, title: str | None = None, width: float = 12.0) -> Figure:
    """The timeline figure of `trace`, written to `path` (.png, .svg or .pdf) if given.

    Transfers are drawn as send/recv lanes when they take time, and also as lines from
    sender to receiver when `arrows` (default: if there are at most MAX_ARROWS)."""
    comp = trace.lane == COMPUTE
    if not comp.any():
        raise TraceError(f"the trace of {trace.schedule} has no compute spans to draw")
    m = compute_metrics(trace)
    t0, t1 = float(trace.start[comp].min()), float(trace.end[comp].max())
    lanes = has_comm(trace)
    if arrows is None:
        arrows = lanes and int((trace.lane == SEND).sum()) <= MAX_ARROWS
    fig, ax, mem_ax = figure_rows(trace.ranks, memory=memory, width=width)
    layout = layout_for(trace.ranks, lanes)
    ax.set_xlim(0, (max(t1, float(trace.end.max())) - t0) * 1.005)
    ax.set_ylim(trace.ranks, 0)
    draw_trace(ax, trace, layout, t0, window=(t0, t1), arrows=arrows)
    label_rows(ax, trace, layout)
    annotate_rows(ax, layout, [f"idle {100 * r.bubble_ratio:.0f} %" for r in m.per_rank],
                  7 if trace.ranks <= 8 else 6)
    if mem_ax is not None:
        draw_memory(mem_ax, [(trace, t0, "-")], trace.ranks)
    finish(fig, ax, mem_ax, title or title_of(trace, m), legend_handles([trace], lanes, arrows), m.makespan)
    if path is not None:
        save(fig, path)
    return fig
