"""Microbatch numbers on compute boxes: one size for the whole figure, thinned to every
k-th microbatch when a row would carry more numbers than can be told apart."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from matplotlib.axes import Axes
from matplotlib.text import Text

from pipesched.simulator.trace import Trace

from .style import points_per_unit, text_color

FONT_MAX, FONT_MIN = 7.5, 5.0   # points
# along a row, at most one label per this many label lengths: numbers inside their boxes
# can sit close; tags hide what is under them, so fewer
BOX_GAP, TAG_GAP = 1.8, 6.0
STRIDES = (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100)


class Boxes(NamedTuple):
    """Compute boxes as drawn, in data units: `idx` is each box's span; `y` and `h`
    are per box; `x` and `w` are per span of the trace (index them with `idx`)."""

    idx: np.ndarray
    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    h: np.ndarray


def draw_labels(ax: Axes, trace: Trace, boxes: Boxes, colors: np.ndarray) -> list[Text]:
    """Label `boxes` (data units on `ax`, whose limits and position are final) with
    their microbatch numbers: inside the boxes where a number fits (one size, smaller
    only in boxes lower than the rest); where boxes are too
    narrow for any readable size, as small tags over every k-th microbatch, so that one
    can still be followed across the ranks."""
    if not len(boxes.idx):
        return []
    pt_x, pt_y = points_per_unit(ax)
    idx, yy = boxes.idx, boxes.y
    ww, hh = boxes.w[idx] * pt_x, boxes.h * pt_y
    chars = len(str(int(trace.mb.max())))  # every label sized like the longest: no ragged fits
    length = lambda size: (0.62 * chars + 0.3) * size  # noqa: E731  (points)
    # sized for the wider boxes: in 1F1B a backward is labelled even where forwards are too narrow
    size = min(0.85 * float(np.median(hh)), float(np.percentile(ww, 75)) / length(1.0), FONT_MAX)
    tagged = size < FONT_MIN
    size = max(size, FONT_MIN)
    along = length(size)
    # a box lower than the rest (half of an overlapped pair) takes a smaller size if it must
    sizes = np.full(len(idx), size) if tagged else np.minimum(size, 0.85 * hh)
    fits = (ww >= (0.3 if tagged else 1.0) * length(sizes)) & (hh >= 1.05 * sizes if tagged else sizes >= FONT_MIN)
    # the stride counts every box, not only those that fit, so that noise in a measured
    # trace does not label a random few
    width_pt = ax.get_position().width * ax.figure.get_size_inches()[0] * 72
    per_row = np.bincount(trace.rank[idx if tagged else idx[fits]], minlength=trace.ranks).max()
    gap = TAG_GAP if tagged else BOX_GAP
    stride = next((k for k in STRIDES if per_row / k <= width_pt / (gap * along)), STRIDES[-1])
    idx, yy, hh, sizes = idx[fits], yy[fits], hh[fits], sizes[fits]
    keep = trace.mb[idx] % stride == 0
    centre = boxes.x[idx] + boxes.w[idx] / 2
    if tagged:  # tags overhang their boxes: drop any that would touch the previous one in its row
        last: dict[int, float] = {}
        for j in np.lexsort((centre, trace.rank[idx])):
            r = int(trace.rank[idx[j]])
            if keep[j] and centre[j] * pt_x - last.get(r, -np.inf) < 1.5 * along:
                keep[j] = False
            elif keep[j]:
                last[r] = centre[j] * pt_x
    tag = dict(boxstyle="square,pad=0.08", facecolor="white", edgecolor="none", alpha=0.85) if tagged else None
    return [ax.text(c, top + h / pt_y / 2, str(trace.mb[i]), ha="center", va="center", fontsize=fs,
                    color="black" if tagged else text_color(tuple(colors[i])), bbox=tag, clip_on=True,
                    gid="label")
            for i, c, top, h, fs in zip(idx[keep], centre[keep], yy[keep], hh[keep], sizes[keep])]
