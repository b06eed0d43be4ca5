"""Replay: simulate a measured run again with the durations it measured.

A prediction can miss for two reasons: the op times it assumed (cost estimation) or how
it combines them (the simulator's semantics: dependencies, posting, host time, links).
Replaying a run takes the first away: every op and every transfer the receiver waited
for gets the duration the run measured, so what remains between the replay and the run
is the simulator's own error.

- Ops: the measured Trace's compute spans, keyed by (op, microbatch, virtual stage).
  `per="task"` gives every task its own measured duration; `per="kind"` the median of
  its rank's spans of the same op kind and model stage (what a cost model could at best
  know).
- Transfers: the executor records when each receive's consumer began to take it and
  so whether it then had to wait (`meta["receive_takes"]`). A transfer waited for took from
  its departure (the sender's op end plus the modelled time to post it) until the
  receive ended; one that had arrived before gets the cost model's link time, cut to
  arrive by the time it was taken. Traces without that record keep the link times.
- Host time outside ops: `host="run"` fits the runtime's four host costs (per op, send,
  receive posted, receive taken) to the run's own gaps between ops that waited for
  nothing (`simulator.run_costs.fit_host_overhead`; the cost model's where the trace
  lacks the record); `host="costs"` keeps the cost model's calibrated ones.
- Memory and the data-parallel step tail (all-reduces, optimizer) come from the cost
  model (`costs`, e.g. the run's own calibration). Ranks sharing cores are not modelled again: the measured durations
  already include the slowdown.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import OPS, Schedule
from pipesched.schedules.validate import validate

from .costs import CostModel
from .data_parallel import add_step_tail, has_tail
from .exact import longest_path
from .timing import Timing, resolve, to_trace
from .trace import COMPUTE, RECV, Trace

REPLAY_MODES = ("task", "kind")
HOST_SOURCES = ("run", "costs")
WAIT_MARGIN = 100e-6  # seconds: a take lasting longer waited for its data (one that had arrived takes ~10-70 us)


class ReplayError(ValueError):
    """A measured trace does not fit the schedule it is replayed on."""


def _lookup(measured: Trace, spans: np.ndarray, op: np.ndarray, mb: np.ndarray, stage: np.ndarray,
            rank: np.ndarray, stages: int, microbatches: int, ranks: int, span_rank: np.ndarray | None = None
            ) -> np.ndarray:
    """For each (op, mb, stage, rank) asked, the index of the span among `spans` with that
    key, or -1. `span_rank` (per span of the trace) replaces the spans' rank in the key."""
    def key(o, m, s, r):
        return ((o.astype(np.int64) * microbatches + m) * stages + s) * ranks + r

    rank_of = measured.rank if span_rank is None else span_rank
    have = key(measured.op[spans], measured.mb[spans], measured.stage[spans], rank_of[spans])
    order = np.argsort(have, kind="stable")
    want = key(op, mb, stage, rank)
    where = np.minimum(np.searchsorted(have[order], want), max(len(order) - 1, 0))
    if not len(order):
        return np.full(len(want), -1)
    hit = have[order[where]] == want
    return np.where(hit, spans[order[where]], -1)


def task_spans(graph: TaskGraph, measured: Trace) -> np.ndarray:
    """Per task id of `graph`, the index of its compute span in `measured` (-1: none)."""
    col, sched = graph.columns(), graph.schedule
    return _lookup(measured, np.flatnonzero(measured.lane == COMPUTE), col["op"], col["mb"], col["stage"],
                   col["rank"], len(sched.stages), sched.microbatches, sched.ranks)


def measured_task_times(graph: TaskGraph, measured: Trace, per: str = "task") -> np.ndarray:
    """Seconds per task id of `graph`, from the compute spans of `measured` (one per task;
    an overlapped pair's spans are its two ops)."""
    if per not in REPLAY_MODES:
        raise ReplayError(f"unknown replay mode {per!r}; modes are {', '.join(REPLAY_MODES)}")
    sched = graph.schedule
    if (measured.ranks, measured.microbatches) != (sched.ranks, sched.microbatches):
        raise ReplayError(f"the trace has p={measured.ranks}, m={measured.microbatches}; "
                          f"the schedule p={sched.ranks}, m={sched.microbatches}")
    col = graph.columns()
    span = task_spans(graph, measured)
    if (span < 0).any():
        missing = graph.tasks[int(np.flatnonzero(span < 0)[0])]
        raise ReplayError(f"the trace has no span of {missing} on its rank ({int((span < 0).sum())} tasks "
                          f"missing): is it a run of {sched.name!r}?")
    durations = measured.end[span] - measured.start[span]
    if per == "task":
        return durations
    model = np.asarray([s.model_stage for s in sched.stages], dtype=np.int64)[col["stage"]]
    group = (col["rank"].astype(np.int64) * (sched.num_model_stages + 1) + model) * 8 + col["op"]
    out = np.empty(len(durations))
    for g in np.unique(group):
        members = group == g
        out[members] = np.median(durations[members])
    return out


def measured_edge_times(graph: TaskGraph, measured: Trace, timing: Timing) -> np.ndarray | None:
    """Seconds per edge id: for each transfer its receiver waited for, from its departure
    (the measured end of its op plus `timing`'s time to post it) to its measured arrival;
    for the others `timing`'s link time, cut to arrive by the time the receiver took it.
    None when the trace does not say when receives were taken (`meta["receive_takes"]`,
    recorded by the executor)."""
    takes = measured.meta.get("receive_takes")
    if not takes:
        return None
    sched = graph.schedule
    col = graph.columns()
    out = timing.edge_time.copy()
    xfer = np.flatnonzero(timing.edge_link >= 0)
    src, dst = col["edge_src"][xfer], col["edge_dst"][xfer]
    n_stages, mbs, ranks = len(sched.stages), sched.microbatches, sched.ranks
    task_span = task_spans(graph, measured)
    # a receive is keyed by its producing op and (receiver, sender)
    pair = col["rank"][dst].astype(np.int64) * ranks + col["rank"][src]
    recv = _lookup(measured, np.flatnonzero(measured.lane == RECV), col["op"][src], col["mb"][src],
                   col["stage"][src], pair, n_stages, mbs, ranks * ranks,
                   span_rank=measured.rank.astype(np.int64) * ranks + measured.peer)
    rows = np.asarray([(r, OPS.index(o), mb, st, peer, t) for r, o, mb, st, peer, t in (row[:6] for row in takes)],
                      dtype=float)
    row_key = (((rows[:, 1] * mbs + rows[:, 2]) * n_stages + rows[:, 3]) * ranks * ranks
               + rows[:, 0] * ranks + rows[:, 4]).astype(np.int64)
    want = ((col["op"][src].astype(np.int64) * mbs + col["mb"][src]) * n_stages + col["stage"][src]) * ranks * ranks \
        + pair
    order = np.argsort(row_key, kind="stable")
    at = np.minimum(np.searchsorted(row_key[order], want), len(order) - 1)
    found = (row_key[order[at]] == want) & (recv >= 0) & (task_span[src] >= 0)
    taken = rows[order[at], 5]
    blocked = measured.end[recv] - taken > WAIT_MARGIN
    send_offset = timing.host.send_offset[xfer] if timing.host is not None else np.zeros(len(xfer))
    depart = measured.end[task_span[src]] + send_offset
    waited = found & blocked
    out[xfer[waited]] = np.maximum(0.0, measured.end[recv[waited]] - depart[waited])
    early = found & ~blocked
    out[xfer[early]] = np.clip(out[xfer[early]], 0.0, np.maximum(0.0, taken[early] - depart[early]))
    return out


def replay(schedule: Schedule | TaskGraph, measured: Trace, costs: CostModel, per: str = "task",
           transfers: bool = True, host: str = "run") -> Trace:
    """The run `measured` simulated again with its own durations (see the module
    docstring); `costs` gives links, memory and (host="costs") host time outside ops,
    its `recv_lookahead` how the run posted receives. transfers=False keeps the cost
    model's link times for every transfer."""
    if host not in HOST_SOURCES:
        raise ReplayError(f"unknown host source {host!r}; sources are {', '.join(HOST_SOURCES)}")
    graph = schedule if isinstance(schedule, TaskGraph) else validate(schedule)
    costs = replace(costs, host=None)
    if host == "run":
        from .run_costs import fit_host_overhead  # it reads traces as this module does

        measured_task_times(graph, measured, per)  # a trace of another schedule fails here, in replay's words
        costs = fit_host_overhead(costs, [(graph.schedule, measured)], costs.recv_lookahead)
    timing = resolve(graph, costs, task_times=measured_task_times(graph, measured, per))
    edge_times = measured_edge_times(graph, measured, timing) if transfers else None
    if edge_times is not None:
        timing = resolve(graph, costs, task_times=timing.task_time, edge_times=edge_times)
    trace = to_trace(graph, timing, longest_path(graph, timing),
                     {"engine": "exact", "replay": per, "replayed_transfers": edge_times is not None,
                      "host_from_run": "host_from_runs" in costs.meta})
    if has_tail(timing.stage_costs, costs.data_parallel):  # all-reduces and optimizer as the cost model says
        trace = add_step_tail(trace, graph.schedule, timing.stage_costs, costs.data_parallel)
    return trace
