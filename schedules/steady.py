"""The period of a schedule's steps run back to back without a barrier, with free transfers.

Without a barrier a rank starts step k+1 once its own step k is done, so when each rank
is free after step k+1 is x(k+1) = A (x) x(k) in max-plus algebra, with A[i, j] the
longest path of ops within one step from rank j's start to rank i's end (-inf where
none leads there): rank i's end when rank j starts at 0 and no other rank holds it
back. The period, seconds per step once the pattern repeats, is A's
maximum cycle mean (`schedules.maxplus`, the one definition the simulator uses too).
Here ops take `op_time` and data moves at once, as in `schedules.timeline`: builders
rank candidate orders by it; `simulator.steps` builds A under a full cost model.

Units: seconds. The period lies between the busiest rank's work per step (no order
does better) and the one-step makespan (a barrier's period).
"""
from __future__ import annotations

import numpy as np

from .ir import Schedule
from .maxplus import max_cycle_mean
from .timeline import OpTime, OrderTimer

COLUMN_ELEMENTS = 4_000_000  # unit x column times walked at once (32 MB of float64)


class StepTimer:
    """Step matrices and periods of candidate orders of one set of ops (as `OrderTimer`,
    whose durations and data edges it derives once) under `op_time`."""

    def __init__(self, schedule: Schedule, op_time: OpTime):
        self.timer = OrderTimer(schedule, op_time)

    def matrix(self, schedule: Schedule) -> np.ndarray:
        """A (ranks x ranks, seconds, -inf: no path) of `schedule`; KeyError unless its
        ops are the timer's, ScheduleError if the order deadlocks."""
        waves, unit_time, unit_rank = self.timer.units(schedule)
        p, n = schedule.ranks, len(unit_time)
        last = np.full(p, -1, dtype=np.int64)
        last[unit_rank] = np.arange(n)  # units are numbered rank by rank, in program order
        first = waves.prev < 0
        order, bounds, preds, ptr = waves.order, waves.bounds, waves.preds, waves.pred_ptr
        a = np.full((p, p), -np.inf)
        width = max(1, COLUMN_ELEMENTS // max(1, n))
        for lo in range(0, p, width):  # a few starting ranks at a time: a column each
            cols = np.arange(lo, min(p, lo + width))
            ready = np.full((p, len(cols)), -np.inf)
            ready[cols, np.arange(len(cols))] = 0.0
            end = np.empty((n, len(cols)))
            for k in range(len(waves)):
                w0, w1 = bounds[k], bounds[k + 1]
                units = order[w0:w1]
                # a rank's first unit waits for the rank's start; every unit for its predecessors
                start = np.where(first[units, None], ready[unit_rank[units]], -np.inf)
                if k:
                    start = np.maximum(start, np.maximum.reduceat(end[preds[ptr[w0]:ptr[w1]]],
                                                                  ptr[w0:w1] - ptr[w0], axis=0))
                end[units] = start + unit_time[units, None]
            has = last >= 0
            a[np.flatnonzero(has)[:, None], cols[None, :]] = end[last[has]]
        return a

    def period(self, schedule: Schedule) -> float:
        """Seconds per step of `schedule` back to back without a barrier."""
        return max_cycle_mean(self.matrix(schedule))

    def work(self, schedule: Schedule) -> float:
        """The busiest rank's seconds of ops per step: no order of these ops has a shorter period."""
        _, unit_time, unit_rank = self.timer.units(schedule)
        return float(np.bincount(unit_rank, weights=unit_time, minlength=schedule.ranks).max(initial=0.0))


def step_matrix_under(schedule: Schedule, op_time: OpTime) -> np.ndarray:
    """A of `schedule` (seconds) when ops take `op_time` and transfers are free."""
    return StepTimer(schedule, op_time).matrix(schedule)


def period_under(schedule: Schedule, op_time: OpTime) -> float:
    """Seconds per step of `schedule` repeated without a barrier, ops taking `op_time`,
    transfers free."""
    return StepTimer(schedule, op_time).period(schedule)
