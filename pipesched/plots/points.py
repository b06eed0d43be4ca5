"""The points a sweep chart draws: plain data, no matplotlib, so the sweep command can
collect them without importing a plotting library."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SweepPoint:
    """One schedule at one number of microbatches. Seconds and bytes; `error` says why
    the schedule could not be built there (the numbers are then nan)."""

    schedule: str
    ranks: int
    microbatches: int
    makespan: float = math.nan
    bubble_ratio: float = math.nan
    peak_memory: float = math.nan
    comm_hidden_fraction: float = math.nan
    error: str | None = None


def pareto_front(points: list[SweepPoint]) -> list[SweepPoint]:
    """The points no other point beats on both makespan and peak memory, by memory."""
    ok = sorted((p for p in points if p.error is None), key=lambda p: (p.peak_memory, p.makespan))
    front: list[SweepPoint] = []
    for p in ok:
        if not front or p.makespan < front[-1].makespan:
            front.append(p)
    return front
