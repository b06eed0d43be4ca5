"""The exact engine: the timeline as the longest path of the task graph, on arrays.

For deterministic costs every start time is a longest path over the units: a unit
starts when its rank is free and every input has arrived. Transfers on a directed link
are served in the order the sender issues them, and a rank issues sends in program
order, so FIFO link contention is static too and stays inside the longest path.
Blocking sends hold the sender until the transfer ends. Host time outside ops
(`Timing.host`) occupies the rank before and after a unit; a transfer leaves once its
send is posted.

The units are walked in waves (`schedules.timeline`): a wave holds at most one unit per
rank, so each wave is a handful of numpy operations. A link has one sender, so within a
wave it carries the sends of one unit; a unit's several sends on one link go out in
turn, one numpy step each.
"""
from __future__ import annotations

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.timeline import graph_waves

from .timing import Timeline, Timing


class _Sends:
    """The transfers grouped for the walk: group g = (wave, turn) holds
    edges[bounds[g]:bounds[g + 1]], each a unit's turn-th send on its link."""

    def __init__(self, graph: TaskGraph, timing: Timing, wave_of_unit: np.ndarray, n_waves: int):
        col = graph.columns()
        xfer = np.flatnonzero(timing.edge_link >= 0)
        unit = col["unit"][col["edge_src"][xfer]]
        # a unit's sends go out in task order, then edge order: the order of (src task, edge id)
        key = unit * (len(timing.links) + 1) + timing.edge_link[xfer]
        order = np.lexsort((xfer, col["edge_src"][xfer], key))
        xfer, key, unit = xfer[order], key[order], unit[order]
        turn = np.arange(len(xfer)) - np.searchsorted(key, key)
        self.turns = int(turn.max(initial=0)) + 1
        group = wave_of_unit[unit] * self.turns + turn
        by_group = np.argsort(group, kind="stable")
        self.edges = xfer[by_group]
        self.bounds = np.searchsorted(group[by_group], np.arange(n_waves * self.turns + 1))


def longest_path(graph: TaskGraph, timing: Timing) -> Timeline:
    """Earliest start and end of every unit, task and transfer (seconds)."""
    waves = graph_waves(graph)
    if not waves.complete:
        raise ValueError("graph has no topological order: validate the schedule first")
    col = graph.columns()
    n_units, n_edges = len(graph.units), len(graph.edges)
    wave_of_unit = np.empty(n_units, dtype=np.int64)
    wave_of_unit[waves.order] = np.repeat(np.arange(len(waves)), np.diff(waves.bounds))
    # inputs from other units, grouped by the wave of their consumer
    src_unit, dst_unit = col["unit"][col["edge_src"]], col["unit"][col["edge_dst"]]
    by_wave = np.argsort(wave_of_unit[dst_unit], kind="stable")
    in_bounds = np.searchsorted(wave_of_unit[dst_unit][by_wave], np.arange(len(waves) + 1))
    sends = _Sends(graph, timing, wave_of_unit, len(waves))

    position = np.empty(n_units, dtype=np.int64)
    position[waves.order] = np.arange(n_units)
    slot = position[dst_unit] - waves.bounds[wave_of_unit[dst_unit]]  # the consumer's place in its wave
    local = timing.edge_link < 0

    host = timing.host
    zeros = np.zeros(n_units)
    pre, take, post = (host.pre, host.take, host.post) if host is not None else (zeros, zeros, zeros)
    send_offset = host.send_offset if host is not None else np.zeros(n_edges)
    task_offset, task_len = timing.task_offset, timing.task_len
    src_offset, src_len = task_offset[col["edge_src"]], task_len[col["edge_src"]]
    edge_time, edge_link = timing.edge_time, timing.edge_link
    link_free = np.zeros(len(timing.links))

    start = np.zeros(n_units)
    free = np.zeros(n_units + 1)  # when each unit's rank may start its next; [-1]: 0 for a rank's first
    edge_start = np.full(n_edges, np.nan)
    edge_end = np.full(n_edges, np.nan)
    prev = waves.prev
    for k in range(len(waves)):
        units = waves.order[waves.bounds[k]:waves.bounds[k + 1]]
        t = free[prev[units]] + pre[units]
        inputs = by_wave[in_bounds[k]:in_bounds[k + 1]]
        if len(inputs):
            # a local input is ready when its task ends; a transfer arrives when it ends
            ready = start[src_unit[inputs]] + src_offset[inputs] + src_len[inputs]
            arrived = np.where(local[inputs], ready, edge_end[inputs])
            latest = np.full(len(units), -np.inf)
            np.maximum.at(latest, slot[inputs], arrived)
            t = np.maximum(t, latest)
        t = t + take[units]
        start[units] = t
        free[units] = t + timing.unit_time[units] + post[units]
        for turn in range(sends.turns):
            g = k * sends.turns + turn
            e = sends.edges[sends.bounds[g]:sends.bounds[g + 1]]
            if not len(e):
                continue
            s = start[src_unit[e]] + src_offset[e] + src_len[e] + send_offset[e]
            if timing.contention:
                s = np.maximum(s, link_free[edge_link[e]])
            f = s + edge_time[e]
            link_free[edge_link[e]] = f
            edge_start[e], edge_end[e] = s, f
            if timing.blocking_sends:
                np.maximum.at(free, src_unit[e], f)
    task_start = start[col["unit"]] + task_offset
    return Timeline(start, start + timing.unit_time, edge_start, edge_end, task_start, task_start + task_len)
