"""The exact engine: the timeline as the longest path of the task graph, on arrays.

For deterministic costs every start time is a longest path over the units: a unit
starts when its rank is free and every input has arrived. Transfers on a directed link
are served in the order the sender issues them, and a rank issues sends in program
order, so FIFO link contention is static too and stays inside the longest path.
Blocking sends hold the sender until the transfer ends. Host time outside ops
(`Timing.host`) occupies the rank before and after a unit; a transfer leaves once its
send is posted.

The units are walked in waves (`schedules.timeline`): a wave holds at most one unit per
rank, so each wave is a handful of numpy operations on contiguous slices (units are
renumbered in wave order, inputs and outputs sorted to match). A link has one sender,
so within a wave it carries the sends of one unit; a unit's several sends on one link
go out in turn, one numpy step each.
"""
from __future__ import annotations

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.timeline import graph_waves

from .timing import Timeline, Timing


class _Layout:
    """The graph renumbered for the walk. Units by position in wave order; an arrival
    slot per edge: first local edges, then transfers, each sorted by when their producer
    runs (transfers by (wave, turn): a unit's turn-th send on its link)."""

    def __init__(self, graph: TaskGraph, timing: Timing):
        waves = graph_waves(graph)
        if not waves.complete:
            raise ValueError("graph has no topological order: validate the schedule first")
        col = graph.columns()
        n_units = len(graph.units)
        self.order, self.bounds = waves.order, waves.bounds.tolist()
        position = np.empty(n_units, dtype=np.int64)
        position[self.order] = np.arange(n_units)
        wave = np.empty(n_units, dtype=np.int64)
        wave[self.order] = np.repeat(np.arange(len(waves)), np.diff(waves.bounds))
        prev = waves.prev[self.order]
        unit_rank = np.zeros(n_units, dtype=np.int64)
        for r, ids in enumerate(graph.rank_units):
            unit_rank[ids] = r
        # n_units + r: "rank r free at its start" (0, or the time `longest_path` is given)
        self.prev = np.where(prev >= 0, position[np.maximum(prev, 0)], n_units + unit_rank[self.order])
        self.last = np.asarray([position[ids[-1]] if ids else -1 for ids in graph.rank_units], dtype=np.int64)

        src, dst = col["edge_src"], col["edge_dst"]
        src_pos, dst_pos = position[col["unit"][src]], position[col["unit"][dst]]
        ready_offset, ready_len = timing.task_offset[src], timing.task_len[src]
        local = timing.edge_link < 0
        n_edges = len(src)
        # local edges by producer position
        loc = np.flatnonzero(local)
        loc = loc[_sorted_by(src_pos[loc], loc, n_edges)]
        self.local_bounds = np.searchsorted(wave[col["unit"][src[loc]]], np.arange(len(waves) + 1)).tolist()
        self.local_src, self.local_offset, self.local_len = src_pos[loc], ready_offset[loc], ready_len[loc]
        # transfers: a unit's sends go out in task order, then edge order; turn = rank among its sends on a link
        xfer = np.flatnonzero(~local)
        unit_link = col["unit"][src[xfer]] * (len(timing.links) + 1) + timing.edge_link[xfer]
        size = np.bincount(col["unit"], minlength=n_units)
        member = src[xfer] - (np.cumsum(size) - size)[col["unit"][src[xfer]]]  # its task's place in the unit
        xfer = xfer[_sorted_by(unit_link * int(size.max(initial=1)) + member, xfer, n_edges)]
        unit_link = col["unit"][src[xfer]] * (len(timing.links) + 1) + timing.edge_link[xfer]
        turn = _rank_in_run(unit_link)
        self.turns = int(turn.max(initial=0)) + 1
        group = wave[col["unit"][src[xfer]]] * self.turns + turn
        by_group = _sorted_by(group, np.arange(len(xfer)), len(xfer))
        xfer = self.sends = xfer[by_group]
        self.send_bounds = np.searchsorted(group[by_group], np.arange(len(waves) * self.turns + 1)).tolist()
        send_offset = timing.host.send_offset[xfer] if timing.host is not None else np.zeros(len(xfer))
        self.send_src, self.send_link, self.send_time = src_pos[xfer], timing.edge_link[xfer], timing.edge_time[xfer]
        self.send_offset, self.send_len, self.send_posted = ready_offset[xfer], ready_len[xfer], send_offset
        # arrival slots: local edges, then transfers, then one that never holds anything up
        slot = np.empty(n_edges, dtype=np.int64)
        slot[loc] = np.arange(len(loc))
        slot[xfer] = len(loc) + np.arange(len(xfer))
        self.n_slots, self.first_send_slot = len(loc) + len(xfer) + 1, len(loc)
        # per unit (by position) its inputs' slots, padded with the idle slot
        by_dst = _sorted_by(dst_pos, np.arange(n_edges), n_edges)
        column = _rank_in_run(dst_pos[by_dst])
        self.inputs = np.full((n_units, int(column.max(initial=-1)) + 1), self.n_slots - 1, dtype=np.int64)
        self.inputs[dst_pos[by_dst], column] = slot[by_dst]


def _rank_in_run(sorted_keys: np.ndarray) -> np.ndarray:
    """For sorted keys, each one's place among the equal keys before it (0, 1, ...)."""
    if not len(sorted_keys):
        return np.zeros(0, dtype=np.int64)
    index = np.arange(len(sorted_keys))
    starts = np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1]))
    return index - np.maximum.accumulate(np.where(starts, index, 0))


def _sorted_by(key: np.ndarray, tie: np.ndarray, tie_range: int) -> np.ndarray:
    """The order that sorts by `key`, then by `tie` (distinct values in 0..tie_range-1): one
    unstable sort of a composite key, much faster than a stable or lexicographic one."""
    return np.argsort(key.astype(np.int64) * tie_range + tie)


def longest_path(graph: TaskGraph, timing: Timing, ready: np.ndarray | None = None,
                 link_ready: np.ndarray | None = None) -> Timeline:
    """Earliest start and end of every unit, task and transfer (seconds).

    `ready`: per rank, when it may start its first unit (default 0); `link_ready`: per
    link of `timing.links`, when it may carry its first transfer (default 0). Either may
    have a second axis of columns (ranks x S, links x S), each an independent walk of
    the same graph, and may hold -inf (a column that does not depend on that rank or
    link: every time is a max of sums, so -inf marks what a start does not reach); then
    every time of the Timeline has that column axis too. The Timeline's `rank_free` is
    when each rank may start its next unit (after its last unit, host time after it and
    blocking sends), `link_free` when each link is free again."""
    lay = _Layout(graph, timing)
    n_units, order = len(graph.units), lay.order
    ranks = graph.schedule.ranks
    columns = () if ready is None or np.ndim(ready) < 2 else (np.shape(ready)[1],)
    if link_ready is not None and np.ndim(link_ready) == 2:
        columns = (np.shape(link_ready)[1],)
    col = (lambda a: a[:, None]) if columns else (lambda a: a)  # per-unit arrays against columns
    host = timing.host
    pre, take, post = ((col(host.pre[order]), col(host.take[order]), col(host.post[order])) if host is not None
                       else (None,) * 3)
    unit_time = col(timing.unit_time[order])
    start = np.zeros((n_units, *columns))
    free = np.zeros((n_units + ranks, *columns))  # when each unit's rank may start its next one; then per rank
    if ready is not None:
        free[n_units:] = np.reshape(ready, (ranks, -1)) if columns else ready
    arrival = np.full((lay.n_slots, *columns), -np.inf)
    send_start = np.zeros((len(lay.sends), *columns))
    link_free = np.zeros((len(timing.links), *columns))
    if link_ready is not None:
        link_free[:] = np.reshape(link_ready, (len(timing.links), -1)) if columns else link_ready
    local_offset, local_len = col(lay.local_offset), col(lay.local_len)
    send_offset, send_len, send_posted, send_time = map(col, (lay.send_offset, lay.send_len, lay.send_posted,
                                                              lay.send_time))
    inputs, has_inputs = lay.inputs, lay.inputs.shape[1] > 0
    bounds, local_bounds, send_bounds, turns = lay.bounds, lay.local_bounds, lay.send_bounds, lay.turns
    contention, blocking, s0 = timing.contention, timing.blocking_sends, lay.first_send_slot
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        t = free[lay.prev[lo:hi]]
        if host is not None:
            t = t + pre[lo:hi]
        if has_inputs:
            t = np.maximum(t, arrival[inputs[lo:hi]].max(axis=1))
        if host is not None:
            t = t + take[lo:hi]
        start[lo:hi] = t
        free[lo:hi] = t + unit_time[lo:hi] + post[lo:hi] if host is not None else t + unit_time[lo:hi]
        a, b = local_bounds[k], local_bounds[k + 1]
        if b > a:  # a local input is there when its task ends
            arrival[a:b] = start[lay.local_src[a:b]] + local_offset[a:b] + local_len[a:b]
        for g in range(k * turns, (k + 1) * turns):
            a, b = send_bounds[g], send_bounds[g + 1]
            if b == a:
                continue
            s = start[lay.send_src[a:b]] + send_offset[a:b] + send_len[a:b] + send_posted[a:b]
            link = lay.send_link[a:b]
            if contention:
                s = np.maximum(s, link_free[link])
            f = s + send_time[a:b]
            link_free[link] = f
            send_start[a:b], arrival[s0 + a:s0 + b] = s, f
            if blocking:
                np.maximum.at(free, lay.send_src[a:b], f)
    unit_start = np.empty((n_units, *columns))
    unit_start[order] = start
    edge_start = np.full((len(graph.edges), *columns), np.nan)
    edge_end = np.full((len(graph.edges), *columns), np.nan)
    edge_start[lay.sends], edge_end[lay.sends] = send_start, arrival[s0:s0 + len(lay.sends)]
    unit_of_task = graph.columns()["unit"]
    task_start = unit_start[unit_of_task] + col(timing.task_offset)
    rank_free = np.where(col(lay.last >= 0), free[np.where(lay.last >= 0, lay.last, n_units + np.arange(ranks))],
                         free[n_units:])
    return Timeline(unit_start, unit_start + col(timing.unit_time), edge_start, edge_end, task_start,
                    task_start + col(timing.task_len), rank_free, link_free)
