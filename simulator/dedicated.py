"""Op durations measured on time-shared cores, turned into dedicated seconds.

Where ranks outnumber the cores and are pinned (rank r on core r mod C, as the executor
pins them), an op's span is stretched by whatever its core's other ranks computed
meanwhile. Which ops overlap follows the schedule: in a 1F1B run rank 1's backward may
share its core half the time and in a DualPipe run most of the time, so one mean
duration per op kind read from the runs of one schedule does not carry over to another
(docs/accuracy.md: DualPipe at p = 4 on two cores).

Undoing the sharing gives each op's dedicated work. Under processor sharing
(`simulator.sharing`), a rank computing beside k others on its core runs at
1 / ((k + 1)(1 + switching)) of its dedicated speed, so the work of a span is the
integral of that rate over it. The simulation then shares the cores again for whichever
schedule it times. Host time outside ops is not undone: the kernel runs a rank woken
from a wait first, so its posting and bookkeeping stretch the op computing beside it,
which stays in that op's work; the simulation runs host time first
(`HostSharing.host_time_first`) to match. A data-parallel run's trace is replica 0's;
the other replicas' compute spans, which share the cores with it, come in its
meta["replica_compute"] as [global rank, start, end].
"""
from __future__ import annotations

import numpy as np

from pipesched.schedules.ir import OPS

from .costs import HostSharing
from .trace import COMPUTE, Trace


def shares_cores(sharing: HostSharing | None, ranks: int) -> bool:
    """Whether `ranks` CPU ranks are pinned to fewer cores than ranks (the case undone here)."""
    return sharing is not None and sharing.pinned and not sharing.gpu and ranks > int(sharing.capacity)


def world_ranks(trace: Trace) -> int:
    """The ranks of the run `trace` comes from: its own, times the data-parallel replicas."""
    return trace.ranks * int((trace.meta.get("data_parallel") or {}).get("degree", 1))


def replica_compute(trace: Trace) -> np.ndarray:
    """The other replicas' compute spans of a data-parallel trace, rows of (global rank,
    start, end) seconds, each rank's in program order (meta["replica_compute"]); none
    without them."""
    return np.asarray(trace.meta.get("replica_compute") or np.empty((0, 3)), dtype=float).reshape(-1, 3)


def dedicated_durations(trace: Trace, sharing: HostSharing) -> np.ndarray:
    """Per span of `trace`, seconds: a compute span's dedicated work with its core's other
    ranks' compute spans undone (see the module docstring; cores as `sharing` pins them),
    every other span's plain duration."""
    out = trace.end - trace.start
    if not shares_cores(sharing, world_ranks(trace)):
        return out
    cores = int(sharing.capacity)
    slow = 1.0 + sharing.switching
    comp = np.flatnonzero((trace.lane == COMPUTE) & (trace.op < len(OPS)))
    others = replica_compute(trace)
    rank = np.concatenate((trace.rank[comp], others[:, 0].astype(np.int64)))
    start = np.concatenate((trace.start[comp], others[:, 1]))
    end = np.concatenate((trace.end[comp], others[:, 2]))
    for r in range(trace.ranks):
        mine = comp[trace.rank[comp] == r]
        mates = (rank % cores == r % cores) & (rank != r)
        if not len(mine) or not mates.any():
            continue
        # how many of the core's other ranks compute, as a step function of time
        times = np.concatenate((start[mates], end[mates]))
        order = np.argsort(times, kind="stable")
        times = times[order]
        count = int(mates.sum())
        busy = np.cumsum(np.concatenate((np.ones(count), -np.ones(count)))[order])
        for i in mine:
            a, b = trace.start[i], trace.end[i]
            lo, hi = np.searchsorted(times, a, side="right"), np.searchsorted(times, b, side="left")
            edges = np.concatenate(([a], times[lo:hi], [b]))
            k = np.concatenate(([busy[lo - 1] if lo else 0.0], busy[lo:hi]))
            rate = np.where(k > 0, 1.0 / ((k + 1.0) * slow), 1.0)
            out[i] = float(np.sum(np.diff(edges) * rate))
    return out
