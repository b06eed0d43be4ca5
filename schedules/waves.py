"""Waves: a topological order of a task graph's units, one numpy step per wave.

Wave k holds the units whose predecessors (the previous unit of their rank and the
producers of their inputs) all lie in earlier waves, so a schedule whose ranks run n
units each takes about n steps (`schedules.timeline` times orders with them and
`simulator.exact` walks them). Plain arrays: the compiled graph (`schedules.graph`)
keeps its waves, and this module needs nothing of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Waves:
    """A topological order of units in waves, with every unit's predecessors.

    order: the units wave by wave; wave k is order[bounds[k]:bounds[k + 1]].
    preds: the predecessors of unit order[i] are preds[pred_ptr[i]:pred_ptr[i + 1]]
        (a unit in wave 0 has none; every later one has at least one).
    prev: per unit, the unit before it on its rank (-1 for a rank's first).
    """

    order: np.ndarray
    bounds: np.ndarray
    preds: np.ndarray
    pred_ptr: np.ndarray
    prev: np.ndarray

    @property
    def complete(self) -> bool:
        """False when some units can never start: the schedule deadlocks."""
        return len(self.order) == len(self.prev)

    def __len__(self) -> int:
        return len(self.bounds) - 1


def waves_of(prev: np.ndarray, src: np.ndarray, dst: np.ndarray) -> Waves:
    """The waves of units given `prev` (per unit, the unit before it on its rank, or -1)
    and data dependencies `dst[i]` needs `src[i]` (unit ids). Kahn's algorithm, one
    numpy step per wave; units on a cycle are left out (see `Waves.complete`)."""
    n = len(prev)
    follows = np.flatnonzero(prev >= 0)
    a = np.concatenate((prev[follows], src)).astype(np.int64)
    b = np.concatenate((follows, dst)).astype(np.int64)
    by_a = np.argsort(a, kind="stable")
    # successors as rows of a table padded with n (a unit has a handful), so a wave's
    # successors are one gather; indeg[n] absorbs the padding
    column = np.arange(len(a)) - np.searchsorted(a[by_a], a[by_a])
    succ = np.full((n + 1, int(column.max(initial=-1)) + 1), n, dtype=np.int64)
    succ[a[by_a], column] = b[by_a]
    indeg = np.bincount(b, minlength=n + 1)
    frontier = np.flatnonzero(indeg[:n] == 0)
    parts, sizes = [], [0]
    keep = np.ones(len(b) + 1, dtype=bool)
    while frontier.size:
        parts.append(frontier)
        sizes.append(frontier.size)
        nxt = succ[frontier].ravel()
        np.subtract.at(indeg, nxt, 1)
        nxt = np.sort(nxt[indeg[nxt] == 0])
        if not nxt.size:
            break
        keep[1:nxt.size] = nxt[1:] != nxt[:-1]  # a unit reached from two frontier units, once
        frontier = nxt[keep[:nxt.size]]
    order = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    position = np.full(n, n, dtype=np.int64)
    position[order] = np.arange(len(order))
    by_pos = np.argsort(position[b], kind="stable")
    pred_ptr = np.searchsorted(position[b][by_pos], np.arange(len(order) + 1))
    return Waves(order, np.cumsum(sizes), a[by_pos], pred_ptr, np.asarray(prev, dtype=np.int64))


def finish_times(waves: Waves, duration: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every unit when unit u takes duration[u] seconds and starts once
    all its predecessors have ended."""
    start = np.zeros(len(duration))
    end = np.zeros(len(duration))
    order, bounds, preds, ptr = waves.order, waves.bounds, waves.preds, waves.pred_ptr
    for k in range(len(waves)):
        lo, hi = bounds[k], bounds[k + 1]
        units = order[lo:hi]
        if k:
            start[units] = np.maximum.reduceat(end[preds[ptr[lo]:ptr[hi]]], ptr[lo:hi] - ptr[lo])
        end[units] = start[units] + duration[units]
    return start, end
