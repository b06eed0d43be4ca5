"""Memory per rank over time: resident parameters plus stored activations.

An F stores its stage's `activation_memory` from its start; a fused BW frees it at its
end; a split B leaves `weight_memory` held at its end (what W needs, which may be more
than the F stored: B's captured gradients) and the W frees that at its end. With communication buffers counted (`CostModel.comm_buffers`), a transfer's payload
is held by the sender from the producing op's end until the transfer ends, and by the
receiver from the moment its receive is posted (by the executor's rule,
`simulator.posting`) until the consumer starts; a tensor handed over at
a V turn is held from its producer's end until its consumer starts. Frees at the same
instant as an allocation count first, so back-to-back ops do not add up. Units: seconds
and bytes.
"""
from __future__ import annotations

import numpy as np

from pipesched.schedules.graph import LOCAL, TaskGraph
from pipesched.schedules.ir import B, BW, F, W

from .costs import StageCost


def resident_bytes(graph: TaskGraph, stage_costs: list[StageCost]) -> list[float]:
    """Parameter bytes each rank holds: one copy per virtual stage placed on it."""
    held = [0.0] * graph.schedule.ranks
    for st in graph.schedule.stages:
        held[st.rank] += stage_costs[st.model_stage].param_bytes
    return held


def buffer_intervals(graph: TaskGraph, edge_bytes: list[float], posts: list[int], unit_start: list[float],
                     unit_end: list[float], edge_end: list[float]) -> list[tuple[int, float, float, float]]:
    """(rank, from, to, bytes) of every communication and hand-over buffer; `posts`: per
    edge, the receiver's unit its receive is posted before (`simulator.posting`)."""
    out = []
    for e, edge in enumerate(graph.edges):
        nbytes = edge_bytes[e]
        if not nbytes:
            continue
        producer, consumer = graph.task_unit[edge.src], graph.task_unit[edge.dst]
        src_rank, dst_rank = graph.unit_rank[producer], graph.unit_rank[consumer]
        if edge.kind == LOCAL:
            out.append((src_rank, unit_end[producer], unit_start[consumer], nbytes))
            continue
        out.append((src_rank, unit_end[producer], edge_end[e], nbytes))
        at = posts[e]
        posted = unit_end[graph.rank_units[dst_rank][at - 1]] if at > 0 else 0.0
        out.append((dst_rank, min(posted, unit_start[consumer]), unit_start[consumer], nbytes))
    return out


def memory_samples(graph: TaskGraph, stage_costs: list[StageCost], task_start: list[float],
                   task_end: list[float], buffers: list[tuple[int, float, float, float]] | None = None
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rank, (times, bytes) after every change, starting with the resident bytes at t=0.
    `buffers`: extra (rank, from, to, bytes) holdings (see `buffer_intervals`)."""
    sched = graph.schedule
    ranks = sched.ranks
    per_rank: list[list[tuple[float, int, float]]] = [[] for _ in range(ranks)]
    for rank, held_from, held_to, nbytes in buffers or ():
        per_rank[rank].append((held_from, 1, nbytes))
        per_rank[rank].append((held_to, 0, -nbytes))
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
