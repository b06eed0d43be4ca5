"""Predicted vs measured: two traces of one schedule on a shared time axis.

Each rank gets two rows, the predicted trace above the measured one, both starting at
their first op. Beside each rank, its errors as `simulator.compare` defines them
(predicted - measured): bubble ratio in points, peak memory relative to measured; the
title gives the makespan error and the op start-time error.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from pipesched.simulator.compare import Comparison, RankComparison, compare
from pipesched.simulator.trace import Trace, TraceError

from ..formatting import fmt_seconds
from .legend import legend_handles
from .memory import draw_memory, has_memory
from .rows import RowLayout, draw_trace, has_allreduce
from .style import save
from .timeline import annotate_rows, drawable, figure_rows, finish


def plot_compare(predicted: Trace, measured: Trace, path: str | Path | None = None, *,
                 names: tuple[str, str] = ("predicted", "measured"), memory: bool = True,
                 title: str | None = None, window: tuple[float, float] | None = None,
                 figsize: tuple[float, float] | None = None) -> Figure:
    """`measured` against `predicted`, rank by rank on one time axis, each from its first
    op; written to `path` (.png, .svg or .pdf) if given. Memory: solid measured, dashed
    predicted. `window`: (start, end) seconds from the first op, the part to draw;
    `figsize`: (width, height) inches. Title and errors describe the whole traces."""
    try:
        c = compare(predicted, measured)
    except ValueError as exc:  # different shapes, no common ops: bad input, one line from the CLI
        raise TraceError(str(exc)) from None
    p = predicted.ranks
    # with few ranks each row is also named (left of "rank r"): room for the longer name
    pad = 0.6 * 5.5 * max(map(len, names)) + 6 if p <= 8 else 2.0  # points
    heading = title or title_of(c, predicted, measured, names)
    parts = [drawable(tr, window) for tr in (predicted, measured)]
    fig, ax, mem_ax = figure_rows(p, rows_per_rank=2, memory=memory, figsize=figsize, left=0.75 + pad / 72,
                                  title_lines=heading.count("\n") + 1)
    starts = [t0 for _, t0, _ in parts]
    if window is None:
        ax.set_xlim(0, max(float(part.end.max()) - t0 for part, t0, _ in parts) * 1.005)
    else:
        ax.set_xlim(0, window[1] - window[0])
    ax.set_ylim(p, 0)
    dp = 0.06 if any(has_allreduce(part) for part, _, _ in parts) else 0.0  # each row's all-reduce lane
    bar = 0.4 - dp
    layouts = [RowLayout(np.arange(p) + 0.05 + k * (bar + dp + 0.04), bar=bar, lane=0.0, gap=0.0, dp=dp)
               for k in range(2)]
    for (part, t0, t1), layout in zip(parts, layouts):
        draw_trace(ax, part, layout, t0, window=(t0, t1))
    ax.set_yticks(np.arange(p) + 0.5, [f"rank {r}" for r in range(p)], fontsize=8 if p <= 8 else 6.5)
    if p <= 8:
        ax.set_yticks(np.concatenate([lay.top + bar / 2 for lay in layouts]), [names[0]] * p + [names[1]] * p,
                      minor=True, fontsize=5.5, color="0.4")
    ax.tick_params(axis="y", which="both", length=0, pad=2)
    ax.tick_params(axis="y", which="major", pad=pad)
    mid = RowLayout(np.arange(p) + 0.05, bar=2 * (bar + dp) + 0.04, lane=0.0)
    annotate_rows(ax, mid, [rank_note(r) for r in c.per_rank], 6.5 if p <= 8 else 5)
    if mem_ax is not None:
        draw_memory(mem_ax, [(parts[1][0], starts[1], "-"), (parts[0][0], starts[0], "--")], p)
        drawn = [name for name, tr in zip(names, (predicted, measured)) if has_memory(tr)]
        mem_ax.set_title(f"solid: {names[1]}, dashed: {names[0]}" if len(drawn) == 2 else
                         f"memory: {drawn[0]} only" if drawn else "", loc="left", fontsize=7, color="0.35", pad=2)
    finish(fig, ax, mem_ax, heading, legend_handles([predicted, measured], lanes=False),
           max(c.predicted.makespan, c.measured.makespan) if window is None else window[1] - window[0],
           window[0] if window is not None else 0.0)
    if path is not None:
        save(fig, path)
    return fig


def rank_note(r: RankComparison) -> str:
    """The errors written beside a rank's rows."""
    note = f"bubble {100 * r.bubble_error:+.1f} pts"
    if r.predicted_peak_memory > 0 and r.measured_peak_memory > 0:  # else memory was not modelled or measured
        note += f"\nmemory {100 * r.peak_memory_rel_error:+.1f} %"
    return note


def title_of(c: Comparison, predicted: Trace, measured: Trace, names: tuple[str, str]) -> str:
    schedule = predicted.schedule if predicted.schedule == measured.schedule else \
        f"{predicted.schedule} vs {measured.schedule}"
    return (f"{schedule}: p={predicted.ranks}, m={predicted.microbatches} - makespan {names[0]} "
            f"{fmt_seconds(c.predicted.makespan)}, {names[1]} {fmt_seconds(c.measured.makespan)} "
            f"(error {100 * c.makespan_rel_error:+.1f} %); op starts off by {100 * c.start_time_error_p50:.1f} % "
            f"(median), {100 * c.start_time_error_p90:.1f} % (p90)\nper rank: {names[0]} above {names[1]}; "
            f"errors are {names[0]} - {names[1]}")
