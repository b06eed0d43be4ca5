"""A Trace drawn as rows of boxes on a time axis, one row per rank (shared by every
figure that shows spans).

Each rank's row has a compute bar (ops coloured by kind, the rank's later virtual
stages lighter, an overlapped pair as two halves of one outlined box, idle time grey)
and, when transfers take time, two thin lanes under it: the rank's sends, then its
receives, coloured by payload (activations like F, gradients like B). Transfers can
also be drawn as lines from sender to receiver. A data-parallel step adds one more thin
lane, its gradient all-reduces, under everything else.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PolyCollection

from pipesched.schedules.ir import OPS
from pipesched.simulator.metrics import merged_intervals
from pipesched.simulator.trace import ALLREDUCE, COMPUTE, RECV, SEND, SPAN_OPS, Trace

from .labels import Boxes, draw_labels
from .style import ALLREDUCE_COLOR, ARROW_COLOR, IDLE_COLOR, OP_COLORS, PAIR_EDGE, points_per_unit, shade


MIN_SEAMED_PT = 2.5  # ops narrower than this (points, the median) are drawn without seams


@dataclass(frozen=True)
class RowLayout:
    """Where rank r is drawn, in y data units (the y axis points down): its compute bar
    spans top[r] .. top[r] + bar; the send and recv lanes (each `lane` high, 0 for none)
    follow below it, then the all-reduce lane (`dp` high, 0 for none)."""

    top: np.ndarray
    bar: float = 0.62
    lane: float = 0.1
    gap: float = 0.02
    dp: float = 0.0

    def lane_top(self, lane: int) -> np.ndarray:
        if lane == ALLREDUCE:
            return self.top + self.bar + self.gap + 2 * self.lane
        return self.top + self.bar + self.gap + (0 if lane == SEND else self.lane)

    def bottom(self) -> np.ndarray:
        """Per rank, the lower edge of everything drawn for it."""
        below = 2 * self.lane + self.dp
        return self.top + self.bar + (self.gap + below if below > 0 else 0.0)


def layout_for(ranks: int, lanes: bool = True, allreduce: bool = False) -> RowLayout:
    """The default rows: rank r within [r, r + 1), compute on top, send/recv lanes below,
    then (with `allreduce`) the all-reduce lane."""
    return RowLayout(np.arange(ranks, dtype=float) + 0.06, bar=0.54 if allreduce else 0.62,
                     lane=0.1 if lanes else 0.0, dp=0.1 if allreduce else 0.0)


def has_comm(trace: Trace) -> bool:
    """Whether any transfer takes time (with free communication there is nothing to draw)."""
    xfer = (trace.lane == SEND) | (trace.lane == RECV)
    return bool(xfer.any() and (trace.end[xfer] - trace.start[xfer]).max() > 0)


def has_allreduce(trace: Trace) -> bool:
    """Whether the trace has a data-parallel all-reduce that takes time."""
    ar = trace.lane == ALLREDUCE
    return bool(ar.any() and (trace.end[ar] - trace.start[ar]).max() > 0)


def chunk_of_spans(trace: Trace) -> tuple[np.ndarray, int]:
    """Per span, the index of its virtual stage among its rank's stages (0 = the
    lowest), and the most stages any rank holds."""
    chunk = np.zeros(len(trace), dtype=int)
    most = 1
    for r in range(trace.ranks):
        m = trace.rank == r
        held = np.unique(trace.stage[m & (trace.lane == COMPUTE)])
        if len(held):
            chunk[m] = np.clip(np.searchsorted(held, trace.stage[m]), 0, len(held) - 1)
            most = max(most, len(held))
    return chunk, most


def idle_gaps(trace: Trace, rank: int, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Gaps (starts, ends; seconds) between the rank's compute within [lo, hi]."""
    m = trace.mask(COMPUTE, rank)
    s, e = merged_intervals(trace.start[m], trace.end[m])
    starts = np.concatenate(([lo], e))
    ends = np.concatenate((s, [hi]))
    keep = ends - starts > 1e-9 * max(hi - lo, 1e-300)
    return starts[keep], ends[keep]


def _rects(x: np.ndarray, y: np.ndarray, w: np.ndarray, h: float | np.ndarray) -> np.ndarray:
    h = np.broadcast_to(h, x.shape)
    return np.stack([np.stack([x, y], 1), np.stack([x + w, y], 1),
                     np.stack([x + w, y + h], 1), np.stack([x, y + h], 1)], 1)


def draw_trace(ax: Axes, trace: Trace, layout: RowLayout, t0: float, *, window: tuple[float, float],
               labels: bool = True, arrows: bool = False) -> dict[str, object]:
    """Draw `trace` on `ax` (whose limits and position must be final) with times shifted
    by -t0 seconds; gaps within `window` (seconds) are drawn as idle.

    Returns the artists by gid: "compute:<op>" (one rectangle per span not in an
    overlapped pair), "pair" (one rectangle per overlapped span: two per pair), "idle",
    "send", "recv" (one rectangle per span), "arrows" (one line per matched send and
    receive) and "labels" (a list of texts)."""
    chunk, chunks = chunk_of_spans(trace)
    x, w = trace.start - t0, trace.end - trace.start
    y = layout.top[trace.rank]
    comp = trace.lane == COMPUTE
    palette = np.array([[shade(OP_COLORS[op], c, chunks) for c in range(chunks)] for op in SPAN_OPS])
    colors = palette[trace.op, chunk].reshape(-1, 3)
    colors[trace.lane == ALLREDUCE] = np.asarray(shade(ALLREDUCE_COLOR, 0, 1))
    pt_x, _ = points_per_unit(ax)
    # white seams between neighbouring ops, never wide enough to eat a narrow op; none
    # where ops are too narrow to tell apart anyway (p=16, m=64), since there seams
    # would wash every colour out towards the white and busy rows would look idle
    typical = pt_x * float(np.median(w[comp])) if comp.any() else 10.0  # points
    seam = 0.0 if typical < MIN_SEAMED_PT else float(np.clip(0.15 * typical, 0.05, 0.6))
    out: dict[str, object] = {}

    def add(gid: str, idx: np.ndarray, top: np.ndarray, h, **style) -> None:
        coll = PolyCollection(_rects(x[idx], top, w[idx], h), facecolors=colors[idx], **style)
        coll.set_gid(gid)
        ax.add_collection(coll)
        out[gid] = coll

    for i, op in enumerate(SPAN_OPS):
        idx = np.flatnonzero(comp & ~trace.overlapped & (trace.op == i))
        if len(idx):
            add(f"compute:{op}", idx, y[idx], layout.bar, edgecolors="white", linewidths=seam)

    # an overlapped pair: the forward in the upper half, the backward in the lower one
    pair = np.flatnonzero(comp & trace.overlapped)
    half = layout.bar / 2
    pair_y = y[pair] + np.where(trace.op[pair] != OPS.index("F"), half, 0.0)
    if len(pair):
        add("pair", pair, pair_y, half, edgecolors=PAIR_EDGE, linewidths=min(0.7, 2 * seam))

    gaps = [idle_gaps(trace, r, *window) for r in range(trace.ranks)]
    gap_rank = np.concatenate([np.full(len(s), r) for r, (s, _) in enumerate(gaps)])
    gs = np.concatenate([s for s, _ in gaps]) - t0
    ge = np.concatenate([e for _, e in gaps]) - t0
    idle = PolyCollection(_rects(gs, layout.top[gap_rank], ge - gs, layout.bar), facecolors=IDLE_COLOR,
                          edgecolors="none", zorder=0.5)
    idle.set_gid("idle")
    ax.add_collection(idle)
    out["idle"] = idle

    if layout.lane > 0:
        for lane, gid in ((SEND, "send"), (RECV, "recv")):
            idx = np.flatnonzero(trace.lane == lane)
            if len(idx):
                add(gid, idx, layout.lane_top(lane)[trace.rank[idx]], layout.lane, edgecolors="none")
    if layout.dp > 0:
        idx = np.flatnonzero(trace.lane == ALLREDUCE)
        if len(idx):
            add("allreduce", idx, layout.lane_top(ALLREDUCE)[trace.rank[idx]], layout.dp, edgecolors="white",
                linewidths=min(0.3, seam))
    if arrows:
        out["arrows"] = _arrows(ax, trace, layout, t0)

    single = np.flatnonzero(comp & ~trace.overlapped)
    boxes = Boxes(np.concatenate((single, pair)), x, np.concatenate((y[single], pair_y)), w,
                  np.concatenate((np.full(len(single), layout.bar), np.full(len(pair), half))))
    out["labels"] = draw_labels(ax, trace, boxes, colors) if labels else []
    return out


def _arrows(ax: Axes, trace: Trace, layout: RowLayout, t0: float) -> LineCollection:
    """A line per transfer from the sender's row where the send starts to the receiver's
    row where the receive ends, through the gaps between the rows."""
    send, recv = trace.transfer_pairs()
    src, dst = trace.rank[send], trace.rank[recv]
    bottom = layout.bottom()
    down = layout.top[dst] > layout.top[src]
    y0 = np.where(down, bottom[src], layout.top[src])
    y1 = np.where(down, layout.top[dst], bottom[dst])
    segments = np.stack([np.stack([trace.start[send] - t0, y0], 1), np.stack([trace.end[recv] - t0, y1], 1)], 1)
    # behind the boxes (they show where a rank waits) but over the idle shading
    lines = LineCollection(segments, colors=ARROW_COLOR, linewidths=0.6, alpha=0.7, zorder=0.8)
    lines.set_gid("arrows")
    ax.add_collection(lines)
    return lines
