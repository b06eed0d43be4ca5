"""Figures of Traces: timelines, predicted vs measured, schedule comparison (matplotlib).

Figures are drawn on plain `Figure`s and written by `style.save`; no display is needed.
"""
import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot: there is no display here
