"""Timelines with free transfers, on arrays: each op takes a given time, data moves at once.

Builders compare candidate orders with them (`OrderTimer`, `fastest`,
`makespan_under`) and the receive-posting rule times a unit-time run with them
(`unit_time_starts`). The core walks units in waves (`schedules.waves`): wave k holds the units whose
predecessors (the previous unit of their rank and the producers of their inputs) all
lie in earlier waves, so a wave is one numpy step, and a schedule whose ranks run n
units each takes about n steps. The same waves give the exact engine
(`simulator.exact`) its order.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .graph import TaskGraph, derive_edges
from .ir import BW, OPS, Overlap, Schedule, ScheduleError
from .waves import Waves, finish_times, waves_of

# (op, model_stage, num_model_stages) -> seconds
OpTime = Callable[[str, int, int], float]

UNIT_COST = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0, "R": 1.0}  # the unit-time run of the posting rule


def graph_waves(graph: TaskGraph) -> Waves:
    """The waves of a compiled graph (computed once, kept on the graph)."""
    if graph.waves is None:
        prev = np.full(len(graph.units), -1, dtype=np.int64)
        for ids in graph.rank_units:
            prev[ids[1:]] = ids[:-1]
        col = graph.columns()
        unit = col["unit"]
        graph.waves = waves_of(prev, unit[col["edge_src"]], unit[col["edge_dst"]])
    return graph.waves


def free_transfer_times(graph: TaskGraph, task_time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every unit when task t takes task_time[t] seconds, the ops of a pair
    run one after the other and transfers take no time."""
    unit_time = np.bincount(graph.columns()["unit"], weights=task_time, minlength=len(graph.units))
    return finish_times(graph_waves(graph), unit_time)


def unit_time_starts(graph: TaskGraph) -> np.ndarray:
    """Start of every unit when F, B and W take 1, BW 2 and transfers nothing."""
    return free_transfer_times(graph, np.where(graph.columns()["op"] == OPS.index(BW), UNIT_COST[BW], 1.0))[0]


class OrderTimer:
    """Makespans of candidate orders for one set of ops (same stages, paths and ops,
    different programs) under `op_time`: the tasks, their durations and data edges
    are derived once; each candidate costs one wave walk, without validation."""

    def __init__(self, schedule: Schedule, op_time: OpTime):
        tasks = list(schedule.tasks())
        self.index = {t: i for i, t in enumerate(tasks)}
        edges = derive_edges(schedule, self.index)
        self.src = np.fromiter((e.src for e in edges), np.int64, len(edges))
        self.dst = np.fromiter((e.dst for e in edges), np.int64, len(edges))
        model = [st.model_stage for st in schedule.stages]
        num_model = schedule.num_model_stages
        self.duration = np.fromiter((op_time(t.op, model[t.stage], num_model) for t in tasks), float, len(tasks))

    def units(self, schedule: Schedule) -> tuple[Waves, np.ndarray, np.ndarray]:
        """The waves of `schedule`'s units (a unit: one op, or a pair run serially), each
        unit's seconds and its rank; KeyError unless its ops are exactly the ones the
        timer was built for, ScheduleError if the order deadlocks."""
        index = self.index
        task_unit = np.full(len(index), -1, dtype=np.int64)
        prev: list[int] = []
        rank: list[int] = []
        unit = 0
        for r, program in enumerate(schedule.programs):
            for i, item in enumerate(program):
                if isinstance(item, Overlap):
                    task_unit[index[item.first]] = task_unit[index[item.second]] = unit
                else:
                    task_unit[index[item]] = unit
                prev.append(unit - 1 if i else -1)
                rank.append(r)
                unit += 1
        if (task_unit < 0).any():
            raise KeyError("the schedule lacks some of the timer's ops")
        waves = waves_of(np.asarray(prev, dtype=np.int64), task_unit[self.src], task_unit[self.dst])
        if not waves.complete:
            raise ScheduleError(f"schedule {schedule.name!r} deadlocks")
        unit_time = np.bincount(task_unit, weights=self.duration, minlength=unit)
        return waves, unit_time, np.asarray(rank, dtype=np.int64)

    def makespan(self, schedule: Schedule) -> float:
        """Makespan of `schedule` (seconds); KeyError unless its ops are exactly the ones
        the timer was built for. Pairs run serially; ScheduleError if the order deadlocks."""
        waves, unit_time, _ = self.units(schedule)
        return float(finish_times(waves, unit_time)[1].max(initial=0.0))


def fastest(candidates: list[Schedule], op_time: OpTime) -> Schedule:
    """The candidate with the shortest makespan under `op_time` (ties: the first)."""
    timer = OrderTimer(candidates[0], op_time)

    def makespan(candidate: Schedule) -> float:
        try:
            return timer.makespan(candidate)
        except KeyError:  # other ops than the first candidate's (e.g. fused backwards)
            return OrderTimer(candidate, op_time).makespan(candidate)

    times = [makespan(c) for c in candidates]
    return candidates[times.index(min(times))]


def makespan_under(schedule: Schedule, op_time: OpTime) -> float:
    """Makespan of `schedule` (seconds) when op X of model stage k (of S) takes
    op_time(X, k, S), pairs run serially and transfers are free."""
    return OrderTimer(schedule, op_time).makespan(schedule)
