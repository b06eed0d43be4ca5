"""Memory per rank over time: resident parameters plus stored activations.

An F stores its stage's `activation_memory` from its start; a fused BW frees it at its
end; a split B frees all but `weight_memory` at its end and the W frees the rest at its
end. Frees at the same instant as an allocation count first, so back-to-back ops do not
add up. Units: seconds and bytes.
"""
from __future__ import annotations

import numpy as np

from schedules.graph import TaskGraph
from schedules.ir import B, BW, F, W

from .costs import StageCost


def resident_bytes(graph: TaskGraph, stage_costs: list[StageCost]) -> list[float]:
    """Parameter bytes each rank holds: one copy per virtual stage placed on it."""
    held = [0.0] * graph.schedule.ranks
    for st in graph.schedule.stages:
        held[st.rank] += stage_costs[st.model_stage].param_bytes
    return held


def memory_samples(graph: TaskGraph, stage_costs: list[StageCost], task_start: list[float],
                   task_end: list[float]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank, (times, bytes) after every change, starting with the resident bytes at t=0."""
    sched = graph.schedule
    ranks = sched.ranks
    per_rank: list[list[tuple[float, int, float]]] = [[] for _ in range(ranks)]
    for t, task in enumerate(graph.tasks):
        st = sched.stages[task.stage]
        cost = stage_costs[st.model_stage]
        act, keep = cost.activation_memory, cost.weight_memory
        if task.op == F:
            delta, when, order = act, task_start[t], 1
        elif task.op == B:
            delta, when, order = -(act - keep), task_end[t], 0
        elif task.op == W:
            delta, when, order = -keep, task_end[t], 0
        elif task.op == BW:
            delta, when, order = -act, task_end[t], 0
        else:
            continue
        if delta:
            per_rank[st.rank].append((when, order, delta))
    base = resident_bytes(graph, stage_costs)
    out = []
    for r in range(ranks):
        events = per_rank[r]
        if events:
            arr = np.asarray(events, dtype=np.float64)
            order = np.lexsort((arr[:, 1], arr[:, 0]))
            times = np.concatenate(([min(0.0, arr[order[0], 0])], arr[order, 0]))
            levels = base[r] + np.concatenate(([0.0], np.cumsum(arr[order, 2])))
        else:
            times, levels = np.array([0.0]), np.array([base[r]])
        out.append((times, levels))
    return out


def peak_bytes(samples: tuple[np.ndarray, np.ndarray]) -> float:
    return float(samples[1].max()) if len(samples[1]) else 0.0
