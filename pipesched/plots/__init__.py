"""Figures of Traces: timelines, predicted vs measured, schedule comparison (matplotlib).

Figures are drawn on plain `Figure`s and written by `style.save`; no display is needed.
This module itself imports no matplotlib, so its error type costs nothing to import.
"""


class FigureError(ValueError):
    """A figure cannot be drawn or written as asked (its path, size or time window)."""
