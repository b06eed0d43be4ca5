"""Figures of Traces: timelines, predicted vs measured, schedule comparison (matplotlib).

Figures are drawn on plain `Figure`s and written by `style.save`; no display is needed.
This module itself imports no matplotlib, so its error type costs nothing to import.
"""


class FigureError(ValueError):
    """A figure cannot be drawn or written as asked (its path, size or time window)."""


DPI = 150  # dots per inch of PNG figures
MAX_FIGURE_INCHES = 100.0
MAX_FIGURE_PIXELS = 2 ** 26  # about 67 million: 268 MB of RGBA while drawn
"""The largest figure drawn: a side at most MAX_FIGURE_INCHES, and width x height x DPI^2
at most MAX_FIGURE_PIXELS (beyond them matplotlib takes gigabytes and minutes, or fails)."""


def check_figure_size(width: float, height: float, what: str = "a figure") -> None:
    """FigureError naming the bounds unless `width` x `height` inches can be drawn."""
    import math
    for side, value in (("wide", width), ("high", height)):
        if not (math.isfinite(value) and 0 < value <= MAX_FIGURE_INCHES):
            raise FigureError(f"{what} {value:g} in {side} is not drawn: a side must be more than 0 and at most "
                              f"{MAX_FIGURE_INCHES:g} inches")
    pixels = width * height * DPI * DPI
    if pixels > MAX_FIGURE_PIXELS:
        raise FigureError(f"{what} of {width:g} x {height:g} in is {pixels:,.0f} pixels at {DPI} dpi, more than the "
                          f"{MAX_FIGURE_PIXELS:,} drawn (e.g. {math.sqrt(MAX_FIGURE_PIXELS) / DPI:.0f} x "
                          f"{math.sqrt(MAX_FIGURE_PIXELS) / DPI:.0f} in)")
