"""The exact engine: the makespan as the longest path of the task graph.

For deterministic costs the timeline is a longest-path computation over the units in
topological order: a unit starts when its rank is free and every input has arrived.
Transfers on a directed link are served in the order the sender issues them, and a
rank issues sends in program order, so FIFO link contention is static too and stays
inside the longest path. Blocking sends hold the sender until the transfer ends. Host
time outside ops (`Timing.unit_pre`, `unit_post`) occupies the rank before and after a
unit; a transfer starts once its send is posted (`edge_offset` after the unit's end).
"""
from __future__ import annotations

import math

from pipesched.schedules.graph import TaskGraph

from .timing import Timeline, Timing


def longest_path(graph: TaskGraph, timing: Timing) -> Timeline:
    """Earliest start and end of every unit, task and transfer (seconds)."""
    if not graph.topo_units and graph.units:
        raise ValueError("graph has no topological order: validate the schedule first")
    n_units, n_edges, n_tasks = len(graph.units), len(graph.edges), len(graph.tasks)
    unit_start = [0.0] * n_units
    unit_end = [0.0] * n_units
    task_start = [0.0] * n_tasks
    task_end = [0.0] * n_tasks
    edge_start = [math.nan] * n_edges
    edge_end = [math.nan] * n_edges
    arrival = [0.0] * n_edges
    rank_free = [0.0] * graph.schedule.ranks
    link_free = [0.0] * len(timing.links)
    units, unit_rank = graph.units, graph.unit_rank
    inputs, outputs = graph.task_inputs, graph.task_outputs
    unit_time, edge_time, edge_link = timing.unit_time, timing.edge_time, timing.edge_link
    contention, blocking = timing.contention, timing.blocking_sends
    no_host = [0.0] * n_units
    pre, post, take = timing.unit_pre or no_host, timing.unit_post or no_host, timing.unit_take or no_host
    offset = timing.edge_offset or [0.0] * n_edges
    task_offset, task_len = timing.task_offset, timing.task_len
    for u in graph.topo_units:
        r = unit_rank[u]
        t = rank_free[r] + pre[u]
        members = units[u]
        for task in members:
            for e in inputs[task]:
                if arrival[e] > t:
                    t = arrival[e]
        t += take[u]
        end = t + unit_time[u]
        unit_start[u] = t
        unit_end[u] = end
        free = end + post[u]
        for task in members:
            if task_offset is None:
                task_start[task], ready = t, end
            else:
                task_start[task] = t + task_offset[task]
                ready = task_start[task] + task_len[task]
            task_end[task] = ready
            for e in outputs[task]:
                link = edge_link[e]
                if link < 0:
                    arrival[e] = ready
                    continue
                s = ready + offset[e]
                if contention and link_free[link] > s:
                    s = link_free[link]
                f = s + edge_time[e]
                link_free[link] = f
                edge_start[e] = s
                edge_end[e] = arrival[e] = f
                if blocking and f > free:
                    free = f
        rank_free[r] = free
    return Timeline(unit_start, unit_end, edge_start, edge_end, task_start, task_end)


def makespan_under(schedule, op_time) -> float:
    """Makespan of `schedule` when op X of model stage k (of S) takes op_time(X, k, S)
    seconds, pairs run serially and transfers are free. Builders use it to choose
    between candidate orders."""
    from pipesched.schedules.validate import validate

    graph = validate(schedule)
    num_model = schedule.num_model_stages
    model = [st.model_stage for st in schedule.stages]
    task_time = [op_time(t.op, model[t.stage], num_model) for t in graph.tasks]
    return max(free_transfer_timeline(graph, task_time).unit_end, default=0.0)


def free_transfer_timeline(graph: TaskGraph, task_time: list[float]) -> Timeline:
    """The timeline when task t takes task_time[t] seconds, the ops of a pair run one
    after the other and transfers take no time."""
    unit_time = [sum(task_time[t] for t in members) for members in graph.units]
    none = [0.0] * len(graph.edges)
    return longest_path(graph, Timing(task_time, unit_time, none, none, [-1] * len(graph.edges), [], False, False, []))
