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
  Links are not contended when transfers are replayed: a measured time already holds any
  wait for the link, and for the receive to be posted (gloo sends only once the receiver
  has posted, which a lagging receiver does late); queued again behind the sends before
  it, that wait counted twice.
- Host time outside ops: `host="run"` fits the runtime's four host costs (per op, send,
  receive posted, receive taken) to the run's own gaps between ops that waited for
  nothing, then scales them per rank to that rank's gaps (`host_time_by_rank`; the cost
  model's where the trace lacks the record); `host="costs"` keeps the cost model's
  calibrated ones. With replayed transfers, a unit that waited for its data starts when
  the run's units did after a wait (`wake_latency`), not a whole fitted take later.
- The data-parallel step tail: each all-reduce bucket and optimizer step takes what the
  run measured (an all-reduce's span holds its wait for the other replicas), in the
  order and on the link the simulator gives them. Memory comes from the cost model
  (`costs`, e.g. the run's own calibration). Ranks sharing cores are not modelled
  again: the measured durations already include the slowdown.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipesched.schedules.graph import LOCAL, TaskGraph
from pipesched.schedules.ir import OPS, Schedule
from pipesched.schedules.validate import validate

from .costs import CostModel, HostOverhead
from .data_parallel import add_step_tail, has_tail
from .exact import longest_path
from .posting import first_task_of_units, receive_posts
from .timing import HostTime, Timing, resolve, to_trace
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
    at = _find(key(measured.op[spans], measured.mb[spans], measured.stage[spans], rank_of[spans]),
               key(op, mb, stage, rank))
    return np.where(at >= 0, spans[at], -1)


def _find(have: np.ndarray, want: np.ndarray) -> np.ndarray:
    """For each key in `want`, the index of the first equal key in `have`, or -1."""
    if not len(have):
        return np.full(len(want), -1)
    order = np.argsort(have, kind="stable")
    where = order[np.minimum(np.searchsorted(have[order], want), len(order) - 1)]
    return np.where(have[where] == want, where, -1)


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


def receive_waits(graph: TaskGraph, measured: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per edge id: the index of its receive span in `measured` (-1: none), when its
    consumer began to take it (seconds; nan where unknown), and whether it then waited for
    the data (its receive ended more than WAIT_MARGIN later). None when the trace does not
    record receive takes (`meta["receive_takes"]`, written by the executor)."""
    takes = measured.meta.get("receive_takes")
    if not takes:
        return None
    sched = graph.schedule
    col = graph.columns()
    src, dst = col["edge_src"], col["edge_dst"]
    n_stages, mbs, ranks = len(sched.stages), sched.microbatches, sched.ranks
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
    at = _find(row_key, want)
    found = (at >= 0) & (recv >= 0)
    taken = np.where(found, rows[at, 5], np.nan)
    waited = found & (measured.end[recv] - taken > WAIT_MARGIN)
    return np.where(found, recv, -1), taken, waited


def measured_edge_times(graph: TaskGraph, measured: Trace, timing: Timing) -> np.ndarray | None:
    """Seconds per edge id: for each transfer its receiver waited for, from its departure
    (the measured end of its op plus `timing`'s time to post it) to its measured arrival;
    for the others `timing`'s link time, cut to arrive by the time the receiver took it.
    None when the trace does not say when receives were taken."""
    waits = receive_waits(graph, measured)
    if waits is None:
        return None
    recv, taken, waited = waits
    col = graph.columns()
    out = timing.edge_time.copy()
    xfer = np.flatnonzero((timing.edge_link >= 0) & (recv >= 0))
    send_offset = timing.host.send_offset[xfer] if timing.host is not None else np.zeros(len(xfer))
    depart = measured.end[task_spans(graph, measured)[col["edge_src"][xfer]]] + send_offset
    wait = waited[xfer]
    out[xfer[wait]] = np.maximum(0.0, measured.end[recv[xfer[wait]]] - depart[wait])
    early = xfer[~wait]
    out[early] = np.clip(out[early], 0.0, np.maximum(0.0, taken[early] - depart[~wait]))
    return out


def host_time_gaps(graph: TaskGraph, measured: Trace, lookahead: int, serial_pairs: bool = True
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """The run's gaps that are host time alone, for `fit_host_time`: on each rank, the gap
    (seconds) between two units whose second waited for no data, and per gap what it
    did: (1, sends posted after the first unit, receives posted before the second,
    inputs the second took); with `serial_pairs` (a cost model without overlap) also
    the gap inside each pair, (1, sends of its first op, 0, 0). None without the run's
    receive takes. Receives posted `lookahead` units ahead, as the run posted them."""
    found = _host_gaps(graph, measured, lookahead, serial_pairs)
    return None if found is None else found[:2]


def _host_gaps(graph: TaskGraph, measured: Trace, lookahead: int, serial_pairs: bool = True
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`host_time_gaps` and the rank of each gap."""
    waits = receive_waits(graph, measured)
    if waits is None:
        return None
    col = graph.columns()
    n_units = len(graph.units)
    remote = col["edge_kind"] != LOCAL
    unit_of_dst = col["unit"][col["edge_dst"]]
    taken = _inputs_taken(graph)
    rank_first = np.asarray([ids[0] if ids else 0 for ids in graph.rank_units], dtype=np.int64)
    posts = receive_posts(graph, lookahead)
    posted = np.bincount(rank_first[col["rank"][col["edge_dst"][remote]]] + posts[remote], minlength=n_units)
    waited = np.bincount(unit_of_dst[waits[2]], minlength=n_units) > 0
    spans = task_spans(graph, measured)
    first_task, last_task, follows = _unit_tasks(graph)
    task_sends = np.bincount(col["edge_src"][remote], minlength=len(graph.tasks))
    rank_of_unit = np.asarray(graph.unit_rank)
    u = np.flatnonzero(follows & ~waited)  # after a unit of their rank, waiting for nothing
    gaps = measured.start[spans[first_task[u]]] - measured.end[spans[last_task[u - 1]]]
    if serial_pairs:  # after a pair only its second op's bookkeeping and sends remain
        sent = task_sends[last_task[u - 1]]
    else:  # an overlapped pair posts both ops' sends after it
        sent = np.bincount(col["unit"][col["edge_src"][remote]], minlength=n_units)[u - 1]
    rows = np.column_stack((np.ones(len(u)), sent, posted[u], taken[u])).astype(float)
    # between the two ops of a serial pair: the first op's bookkeeping and sends, host time alone
    pair = np.flatnonzero(last_task > first_task) if serial_pairs else np.zeros(0, dtype=np.int64)
    a = first_task[pair]
    inner = measured.start[spans[a + 1]] - measured.end[spans[a]]
    inner_rows = np.column_stack((np.ones(len(pair)), task_sends[a], np.zeros(len(pair)), np.zeros(len(pair))))
    return (np.concatenate((rows, inner_rows)), np.concatenate((gaps, inner)),
            np.concatenate((rank_of_unit[u], rank_of_unit[pair])))


def fit_host_time(graph: TaskGraph, measured: Trace, costs: CostModel) -> CostModel:
    """`costs` with the host time outside ops read from the run `measured` (receives
    posted `costs.recv_lookahead` units ahead, as the run posted them): `fit_host_gaps`
    of its `host_time_gaps`. `costs` unchanged without receive takes."""
    found = host_time_gaps(graph, measured, costs.recv_lookahead, costs.overlap == 0)
    return costs if found is None else fit_host_gaps(costs, *found)


def host_time_by_rank(graph: TaskGraph, measured: Trace, costs: CostModel) -> list[HostOverhead] | None:
    """Per rank, the host costs of `fit_host_time` (fitted to every rank's gaps) scaled
    so that they add up to that rank's own gaps (ranks with fewer than 4 gaps keep the
    common fit). Ranks host the same bookkeeping, but where they share cores a rank's
    gaps stretch by what its core's other ranks compute meanwhile, which differs by
    rank; a fit of four costs per rank from a few dozen gaps overfits (docs/accuracy.md).
    None without the run's receive takes or with fewer than 8 gaps."""
    found = _host_gaps(graph, measured, costs.recv_lookahead, costs.overlap == 0)
    if found is None:
        return None
    rows, gaps, ranks = found
    if len(gaps) < 8:
        return None
    o = fit_host_gaps(costs, rows, gaps).host_overhead
    coef = np.array([o.per_op, o.per_send, o.per_recv, o.per_take])
    out = []
    for r in range(graph.schedule.ranks):
        mine = ranks == r
        modelled = float((rows[mine] @ coef).sum())
        k = float(gaps[mine].sum()) / modelled if mine.sum() >= 4 and modelled > 0 else 1.0
        out.append(o.scaled(k))
    return out


def fit_host_gaps(costs: CostModel, rows: np.ndarray, gaps: np.ndarray) -> CostModel:
    """`costs` with the four host costs fitted to `gaps` (`host_time_gaps`, of one run or
    several stacked): least squares of `per_op + sends * per_send + posted * per_recv +
    taken * per_take` (no term below 0); `send_start` keeps its calibrated share of
    `per_send`. `costs` unchanged with fewer than 8 gaps."""
    if len(gaps) < 8:
        return costs
    use = np.ones(4, dtype=bool)
    for _ in range(4):  # drop a term that fits below 0 and fit the rest again
        coef = np.zeros(4)
        coef[use] = np.linalg.lstsq(rows[:, use], gaps, rcond=None)[0]
        if (coef >= 0).all():
            break
        use &= coef > 0
    coef = np.maximum(coef, 0.0)
    o = costs.host_overhead
    share = None if o.send_start is None or o.per_send <= 0 else min(1.0, o.send_start / o.per_send)
    fitted = replace(o, per_op=float(coef[0]), per_send=float(coef[1]), per_recv=float(coef[2]),
                     per_take=float(coef[3]), send_start=None if share is None else share * float(coef[1]))
    meta = {**costs.meta, "host_from_run": {"gaps": len(gaps), "median_gap": float(np.median(gaps))}}
    return replace(costs, host_overhead=fitted, meta=meta).check()


def replay(schedule: Schedule | TaskGraph, measured: Trace, costs: CostModel, per: str = "task",
           transfers: bool = True, host: str = "run") -> Trace:
    """The run `measured` simulated again with its own durations (see the module
    docstring); `costs` gives links, memory and (host="costs") host time outside ops,
    its `recv_lookahead` how the run posted receives. transfers=False keeps the cost
    model's link times for every transfer."""
    if host not in HOST_SOURCES:
        raise ReplayError(f"unknown host source {host!r}; sources are {', '.join(HOST_SOURCES)}")
    graph = schedule if isinstance(schedule, TaskGraph) else validate(schedule)
    times = measured_task_times(graph, measured, per)  # a trace of another schedule fails here
    costs = replace(costs, host=None)
    by_rank = None
    if host == "run":
        by_rank = host_time_by_rank(graph, measured, costs)
    timing = resolve(graph, costs, task_times=times, host_by_rank=by_rank)
    edge_times = measured_edge_times(graph, measured, timing) if transfers else None
    if edge_times is not None:
        timing = resolve(graph, costs, task_times=timing.task_time, edge_times=edge_times, host_by_rank=by_rank)
        timing = replace(timing, contention=False)
        if timing.host is not None:
            timing = replace(timing, host=_take_after_wait(graph, measured, timing.host))
    trace = to_trace(graph, timing, longest_path(graph, timing),
                     {"engine": "exact", "replay": per, "replayed_transfers": edge_times is not None,
                      "host_from_run": by_rank is not None})
    if has_tail(timing.stage_costs, costs.data_parallel):  # all-reduces and optimizer as the run measured them
        trace = add_step_tail(trace, graph.schedule, timing.stage_costs, costs.data_parallel, measured=measured)
    return trace


def wake_latency(graph: TaskGraph, measured: Trace) -> np.ndarray | None:
    """Per rank, the median seconds per input taken from the arrival of the last input a
    unit waited for (after the rank's previous unit had ended) to the unit's start; nan
    for a rank with no such unit. None without the run's receive takes."""
    waits = receive_waits(graph, measured)
    if waits is None:
        return None
    recv, _, waited = waits
    col = graph.columns()
    n_units = len(graph.units)
    spans = task_spans(graph, measured)
    first_task, last_task, follows = _unit_tasks(graph)
    got = np.flatnonzero(recv >= 0)
    unit = col["unit"][col["edge_dst"][got]]
    arrival = np.full(n_units, -np.inf)
    np.maximum.at(arrival, unit, measured.end[recv[got]])
    inputs = _inputs_taken(graph)
    any_wait = np.zeros(n_units, dtype=bool)
    any_wait[col["unit"][col["edge_dst"][waited]]] = True
    rank_of_unit = np.asarray(graph.unit_rank)
    u = np.flatnonzero(follows & any_wait)
    u = u[arrival[u] > measured.end[spans[last_task[u - 1]]]]
    latency = (measured.start[spans[first_task[u]]] - arrival[u]) / np.maximum(inputs[u], 1)
    out = np.full(graph.schedule.ranks, np.nan)
    for r in range(graph.schedule.ranks):
        mine = latency[rank_of_unit[u] == r]
        if len(mine):
            out[r] = float(np.median(mine))
    return out


def _unit_tasks(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per unit, its first and last task id and whether it follows another unit of its
    rank (a rank's units and a unit's tasks are consecutive ids)."""
    first = first_task_of_units(graph)
    last = first + np.bincount(graph.columns()["unit"], minlength=len(graph.units)) - 1
    rank_of_unit = np.asarray(graph.unit_rank)
    follows = np.zeros(len(graph.units), dtype=bool)
    follows[1:] = rank_of_unit[1:] == rank_of_unit[:-1]
    return first, last, follows


def _inputs_taken(graph: TaskGraph) -> np.ndarray:
    """Per unit, how many inputs it receives from other ranks."""
    col = graph.columns()
    remote = col["edge_kind"] != LOCAL
    return np.bincount(col["unit"][col["edge_dst"][remote]], minlength=len(graph.units))


def _take_after_wait(graph: TaskGraph, measured: Trace, host: HostTime) -> HostTime:
    """`host` with a unit that waited for its data starting its rank's `wake_latency` per
    input after the data came, not the fitted time to take inputs: that fit reads the
    gaps of units that waited for nothing, which where ranks share cores also hold time
    the rank sat descheduled (docs/accuracy.md). The rest of the take moves before the
    wait, so a unit whose data is there still takes it all:
    start = max(free + pre + take, arrival + wake)."""
    wake = wake_latency(graph, measured)
    if wake is None:
        return host
    per_input = wake[np.asarray(graph.unit_rank)]
    known = np.isfinite(per_input)  # a rank that never waited keeps its take
    after = host.take.copy()
    after[known] = np.minimum(host.take[known], np.maximum(per_input[known], 0.0) * _inputs_taken(graph)[known])
    return replace(host, pre=host.pre + host.take - after, take=after)
