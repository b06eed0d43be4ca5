"""Legend entries for what a Trace's timeline shows."""
from __future__ import annotations

import numpy as np
from matplotlib.artist import Artist
from matplotlib.legend_handler import HandlerBase
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from pipesched.schedules.ir import OPS
from pipesched.simulator.trace import ALLREDUCE, COMPUTE, SPAN_OPS, Trace

from .rows import chunk_of_spans
from .style import ALLREDUCE_COLOR, ARROW_COLOR, COMM_COLOR, IDLE_COLOR, OP_COLORS, OP_NAMES, PAIR_EDGE, shade


class PairHandle(Patch):
    """Legend entry of an overlapped pair, drawn as the box it stands for."""


class _PairHandler(HandlerBase):
    def create_artists(self, legend, orig, xdescent, ydescent, width, height, fontsize, trans):
        return [Rectangle((-xdescent, -ydescent + height / 2 * (1 - k)), width, height / 2, facecolor=color,
                          edgecolor=PAIR_EDGE, linewidth=0.6, transform=trans)
                for k, color in enumerate((OP_COLORS["F"], orig.get_facecolor()))]


HANDLER_MAP = {PairHandle: _PairHandler()}


def legend_handles(traces: list[Trace], lanes: bool = True, arrows: bool = False) -> list[Artist]:
    """Entries for the op kinds, pairs, chunks, idle time and transfers found in any
    of `traces` (give fig.legend handler_map=HANDLER_MAP)."""
    present: set[int] = set()
    second: list[int] = []  # ops paired with an F
    chunks = 1
    for trace in traces:
        comp = trace.lane == COMPUTE
        present |= set(trace.op[comp & ~trace.overlapped].tolist())
        second += trace.op[comp & trace.overlapped & (trace.op != OPS.index("F"))].tolist()
        chunks = max(chunks, chunk_of_spans(trace)[1])
    handles: list[Artist] = [Patch(facecolor=OP_COLORS[op], label=OP_NAMES[op])
                             for i, op in enumerate(SPAN_OPS) if i in present]
    if second:
        op = OPS[int(np.bincount(second).argmax())]
        handles.append(PairHandle(facecolor=OP_COLORS[op], label=f"F+{op} overlapped in one box"))
    if chunks > 1:
        handles.append(Patch(facecolor=shade(OP_COLORS["F"], 1, 2), label="lighter: 2nd chunk on the rank"))
    handles.append(Patch(facecolor=IDLE_COLOR, label="idle"))
    if arrows:
        handles.append(Line2D([], [], color=ARROW_COLOR, lw=0.8, label="transfer"))
    if lanes:
        handles.append(Patch(facecolor=COMM_COLOR, label="thin lanes: send, recv"))
    if any((t.lane == ALLREDUCE).any() for t in traces):
        handles.append(Patch(facecolor=ALLREDUCE_COLOR, label="lowest lane: DP all-reduce"))
    return handles
