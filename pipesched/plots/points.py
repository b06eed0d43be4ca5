"""The points a sweep chart draws: plain data, no matplotlib, so the sweep command can
collect them without importing a plotting library. A `SweepPoint` is what
`simulator.sweep` computes for one schedule at one number of microbatches."""
from __future__ import annotations

from pipesched.simulator.sweep import SweepPoint

__all__ = ["SweepPoint", "pareto_front"]


def pareto_front(points: list[SweepPoint]) -> list[SweepPoint]:
    """The points no other point beats on both makespan and peak memory, by memory."""
    ok = sorted((p for p in points if p.error is None), key=lambda p: (p.peak_memory, p.makespan))
    front: list[SweepPoint] = []
    for p in ok:
        if not front or p.makespan < front[-1].makespan:
            front.append(p)
    return front
