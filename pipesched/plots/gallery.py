"""Several timelines stacked on one time axis, to compare schedules by eye: the same
second is the same width in every panel, so a shorter schedule ends further left."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.trace import COMPUTE, Trace, TraceError

from ..formatting import fmt_bytes, fmt_seconds
from .legend import HANDLER_MAP, legend_handles
from .rows import draw_trace, layout_for
from .style import save, time_axis

ROW_IN, HEAD_IN, GAP_IN = 0.28, 0.3, 0.12  # per rank, above each panel, between panels; inches


def plot_gallery(traces: list[Trace], path: str | Path | None = None, *, title: str | None = None,
                 width: float = 12.0) -> Figure:
    """One panel per trace (compute rows only, no memory), sharing the time axis; each
    panel headed by its schedule, makespan, bubble and peak memory. Written to `path`
    (.png, .svg or .pdf) if given."""
    if not traces or any(not (t.lane == COMPUTE).any() for t in traces):
        raise TraceError("every trace of a gallery needs compute spans")
    top, bottom, left, right = 0.8, 0.5, 0.75, 0.3
    heights = [HEAD_IN + t.ranks * ROW_IN for t in traces]
    height = top + bottom + sum(heights) + GAP_IN * (len(traces) - 1)
    fig = Figure(figsize=(width, height))
    starts = [float(t.start[t.lane == COMPUTE].min()) for t in traces]
    span = max(float(t.end.max()) - t0 for t, t0 in zip(traces, starts)) * 1.005
    y = height - top
    axes = []
    for trace, t0, h in zip(traces, starts, heights):
        y -= h
        ax = fig.add_axes((left / width, y / height, (width - left - right) / width, (h - HEAD_IN) / height))
        y -= GAP_IN
        ax.set_xlim(0, span)
        ax.set_ylim(trace.ranks, 0)
        comp = trace.lane == COMPUTE
        draw_trace(ax, trace, layout_for(trace.ranks, lanes=False), t0,
                   window=(t0, float(trace.end[comp].max())))
        m = compute_metrics(trace)
        peak = max(r.peak_memory_bytes for r in m.per_rank)
        head = f"{trace.schedule}: makespan {fmt_seconds(m.makespan)}, bubble {100 * m.bubble_ratio:.1f} %"
        ax.set_title(head + (f", peak memory {fmt_bytes(peak)}" if peak > 0 else ""), loc="left", fontsize=9,
                     pad=3)
        ax.set_yticks(np.arange(trace.ranks) + 0.37, [str(r) for r in range(trace.ranks)], fontsize=7)
        ax.set_ylabel("rank", fontsize=7, labelpad=2)
        ax.tick_params(axis="y", length=0)
        ax.tick_params(axis="x", labelbottom=False)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        axes.append(ax)
    axes[-1].tick_params(axis="x", labelbottom=True)
    time_axis(axes[-1], span)
    fig.legend(handles=legend_handles(traces, lanes=False), handler_map=HANDLER_MAP, loc="upper center", ncol=9,
               fontsize=7.5, frameon=False, bbox_to_anchor=(0.5, 1 - 0.42 / height), handlelength=1.4,
               columnspacing=1.2)
    ranks = {t.ranks for t in traces}
    mbs = {t.microbatches for t in traces}
    fig.suptitle(title or f"{len(traces)} schedules" + (f" at p={ranks.pop()}" if len(ranks) == 1 else "") +
                 (f", m={mbs.pop()}" if len(mbs) == 1 else "") + ", on one time axis", y=1 - 0.1 / height,
                 va="top", fontsize=11)
    if path is not None:
        save(fig, path)
    return fig
