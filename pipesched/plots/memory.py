"""The memory panel: bytes held by each rank over time, as step lines."""
from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from pipesched.simulator.trace import Trace

from .style import bytes_unit


def has_memory(trace: Trace) -> bool:
    """Whether the trace holds any memory (a simulation without memory costs holds none)."""
    return any(len(b) and b.max() > 0 for _, b in trace.memory)


def draw_memory(ax: Axes, traces: list[tuple[Trace, float, str]], ranks: int) -> list[Line2D]:
    """Memory per rank over time on `ax`; `traces` are (trace, t0 seconds subtracted
    from its times, linestyle). Returns the lines, one per rank and trace."""
    peak = max((float(b.max()) for tr, _, _ in traces for _, b in tr.memory if len(b)), default=0.0)
    if peak <= 0:
        ax.text(0.5, 0.5, "memory not modelled (all zero): give activation and parameter bytes",
                transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.4")
        ax.set_yticks([])
        return []
    div, unit = bytes_unit(peak)
    cmap = matplotlib.colormaps["viridis"]
    xmax = ax.get_xlim()[1]
    lines: list[Line2D] = []
    labelled = False  # ranks are named once, by the first trace drawn
    for tr, t0, style in traces:
        if not has_memory(tr):
            continue  # this one has no memory model: a line at zero would only mislead
        for r, (t, b) in enumerate(tr.memory):
            if not len(t):
                continue
            # the level after all changes at one instant: a free and an alloc at the same
            # time is no dip; then hold the last level to the right edge
            last = np.append(t[1:] != t[:-1], True)
            t, b = t[last], b[last]
            tt = np.concatenate((t - t0, [max(xmax, t[-1] - t0)]))
            bb = np.concatenate((b, [b[-1]])) / div
            # later ranks thinner, on top: where ranks hold the same, both colours still show
            lines += ax.step(tt, bb, where="post", color=cmap(0.85 * r / max(ranks - 1, 1)),
                             lw=2.4 - 1.4 * r / max(ranks - 1, 1),
                             linestyle=style, label=None if labelled else f"rank {r}")
        labelled = True
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(0, peak / div * 1.08)
    ax.grid(axis="y", color="0.9", lw=0.6)
    if ranks <= 8:
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, frameon=False, handlelength=1.2)
    else:
        ax.text(1.01, 1.0, f"rank 0 (dark)\nto {ranks - 1} (light)", transform=ax.transAxes, fontsize=7,
                va="top")
    return lines
