"""A cost model applied to one compiled schedule: what each unit and transfer costs.

Both engines (the exact longest path and the DES) take a `Timing` and give a
`Timeline` (start and end of every unit and transfer); `to_trace` turns a timeline into
the common Trace. Keeping these in one place is what makes the engines comparable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from pipesched.schedules.graph import GRADIENT, LOCAL, TaskGraph
from pipesched.schedules.ir import BW, F, OPS, W

from .costs import CostModel, HostOverhead, StageCost, StageSwitch
from .memory import buffer_intervals, memory_samples
from .posting import receive_posts
from .switches import switch_applies, switch_fractions
from .trace import COMPUTE, RECV, SEND, Trace


@dataclass(frozen=True)
class HostTime:
    """Seconds a rank's host is busy outside ops (bookkeeping, posting transfers): it
    cannot compute meanwhile, but the time is part of no op's span."""

    pre: np.ndarray          # per unit: before it, posting the receives posted there
    take: np.ndarray         # per unit: between its inputs' arrival and its start (taking them)
    post: np.ndarray         # per unit: after it (bookkeeping, posting its sends)
    send_offset: np.ndarray  # per edge: seconds after its task's end until its transfer can leave


@dataclass(frozen=True)
class Timing:
    """What every task, unit and transfer of one graph costs under one cost model (seconds,
    bytes); built complete by `resolve`. Arrays are indexed by task, unit or edge id."""

    task_time: np.ndarray         # per task, op overhead included
    unit_time: np.ndarray         # per unit: its task, or its pair run serially or overlapped
    task_offset: np.ndarray       # per task: its start within its unit
    task_len: np.ndarray          # per task: its span (an overlapped pair's tasks span the pair)
    serial_pairs: bool            # a pair runs its ops one after the other
    edge_time: np.ndarray         # per edge: transfer time; 0 for local edges
    edge_bytes: np.ndarray        # per edge: payload of transfers and V-turn hand-overs; 0 otherwise
    edge_link: np.ndarray         # per edge: link id; -1 for local edges
    links: list[tuple[int, int]]  # (sender, receiver) of each link id
    contention: bool
    blocking_sends: bool
    stage_costs: list[StageCost]  # per model stage
    comm_buffers: bool            # count transfer and hand-over buffers in memory
    recv_posts: np.ndarray | None  # per edge: position in the receiver's program its receive is posted before
    host: HostTime | None          # None: no host time outside ops


@dataclass
class Timeline:
    """Start and end (seconds) of every unit, task and transfer (nan for local edges)."""

    unit_start: np.ndarray
    unit_end: np.ndarray
    edge_start: np.ndarray
    edge_end: np.ndarray
    task_start: np.ndarray
    task_end: np.ndarray
    rank_free: np.ndarray | None = None  # per rank: when it may start a next unit (None: not recorded)
    link_free: np.ndarray | None = None  # per link of Timing.links: when it is free again


def resolve(graph: TaskGraph, costs: CostModel, *, noise_cv: float = 0.0,
            rng: np.random.Generator | None = None, task_times: np.ndarray | None = None,
            edge_times: np.ndarray | None = None, host_by_rank: Sequence[HostOverhead] | None = None
            ) -> Timing:
    """Apply `costs` to `graph`. With noise_cv > 0, every op and transfer time is
    multiplied by an independent lognormal factor of mean 1 and that coefficient of
    variation (drawn from `rng`). `task_times` (seconds per task id, e.g. the durations a
    run measured: see `simulator.replay`) replaces the op times the cost model gives,
    op overhead and cheaper first backwards included; `edge_times` (seconds per edge id)
    likewise replaces the transfer times of the edges between ranks; `host_by_rank` (one
    per rank) the cost model's host time outside ops on each rank."""
    sched = graph.schedule
    col = graph.columns()
    stage_costs = costs.model_stage_costs(sched.ranks, sched.num_model_stages)
    model = np.asarray([st.model_stage for st in sched.stages], dtype=np.int64)
    if task_times is None:
        op_table = np.asarray([[c.op_time(op) for op in OPS] for c in stage_costs]).reshape(-1, len(OPS))
        task_time = op_table[model[col["stage"]], col["op"]] + costs.op_overhead
        _first_backwards_keep(graph, stage_costs, model, task_time)
        if switch_applies(costs, sched.num_model_stages):
            task_time = _after_switches(graph, costs.stage_switch, task_time)
    else:
        task_time = np.array(task_times, dtype=float)
        if task_time.shape != (len(col["op"]),) or not (np.isfinite(task_time) & (task_time >= 0)).all():
            raise ValueError(f"task_times needs {len(col['op'])} finite seconds >= 0, one per task")
    edge_bytes, edge_time, edge_link, links = _transfers(graph, costs, stage_costs)
    if edge_times is not None:
        given = np.asarray(edge_times, dtype=float)
        if given.shape != edge_time.shape or not (np.isfinite(given) & (given >= 0)).all():
            raise ValueError(f"edge_times needs {len(edge_time)} finite seconds >= 0, one per edge")
        edge_time = np.where(edge_link >= 0, given, 0.0)
    if noise_cv > 0:
        rng = rng or np.random.default_rng()
        sigma2 = np.log1p(noise_cv ** 2)
        factors = rng.lognormal(-sigma2 / 2, np.sqrt(sigma2), len(task_time) + len(edge_time))
        task_time = task_time * factors[:len(task_time)]
        edge_time = edge_time * factors[len(task_time):]
    posts = None
    if host_by_rank is not None and len(host_by_rank) != sched.ranks:
        raise ValueError(f"host_by_rank needs one host overhead per rank ({sched.ranks}), got {len(host_by_rank)}")
    overheads = list(host_by_rank) if host_by_rank is not None else [costs.host_overhead]
    if costs.comm_buffers or any(o.per_recv for o in overheads):
        posts = receive_posts(graph, costs.recv_lookahead)
    task_host = _host_time(graph, overheads, edge_link, posts) if any(o.any for o in overheads) else None
    unit_time, task_offset, task_len, host = _units(graph, costs, task_time, edge_link, task_host)
    return Timing(task_time, unit_time, task_offset, task_len, costs.overlap == 0, edge_time, edge_bytes, edge_link,
                  links, costs.contention, costs.blocking_sends, stage_costs, costs.comm_buffers, posts, host)


def _after_switches(graph: TaskGraph, switch: StageSwitch, task_time: np.ndarray) -> np.ndarray:
    """`task_time` with the tasks that follow another stage's task on their rank, and the
    next task of theirs (`simulator.switches`), longer by `switch`'s fraction for their op kind."""
    return task_time * (1.0 + switch_fractions(graph, switch))


def _transfers(graph: TaskGraph, costs: CostModel, stage_costs: list[StageCost]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Per edge: bytes, transfer time and link id (-1: local), and the links' (sender, receiver).
    A transfer carries the activation forward or the gradient backward at its boundary; a
    local edge between two virtual stages (a V turn) hands the same tensor over on the rank."""
    col = graph.columns()
    kind, boundary = col["edge_kind"], col["edge_boundary"]
    activation = np.asarray([c.activation_bytes for c in stage_costs], dtype=float)
    gradient = np.asarray([c.activation_bytes if c.gradient_bytes is None else c.gradient_bytes
                           for c in stage_costs], dtype=float)
    local = kind == LOCAL
    forward = np.where(local, col["op"][col["edge_src"]] == OPS.index(F), kind != GRADIENT)
    nbytes = np.where(forward, activation[boundary], gradient[boundary])
    turn = col["stage"][col["edge_src"]] != col["stage"][col["edge_dst"]]
    edge_bytes = np.where(~local | turn, nbytes, 0.0)
    sender, receiver = col["rank"][col["edge_src"]].astype(np.int64), col["rank"][col["edge_dst"]].astype(np.int64)
    edge_time = np.zeros(len(kind))
    edge_link = np.full(len(kind), -1, dtype=np.int64)
    xfer = np.flatnonzero(~local)
    if len(xfer):
        net = costs.network
        far = np.zeros(len(xfer), dtype=bool)
        if net.ranks_per_node is not None and net.inter is not None:
            far = sender[xfer] // net.ranks_per_node != receiver[xfer] // net.ranks_per_node
        b = edge_bytes[xfer]
        with np.errstate(divide="ignore", invalid="ignore"):
            for link, where in ((net.intra, ~far), (net.inter, far)):
                if link is not None and where.any():
                    edge_time[xfer[where]] = link.latency + np.where(b[where] != 0, b[where] / link.bandwidth, 0.0)
        pair = sender[xfer] * graph.schedule.ranks + receiver[xfer]
        keys, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
        rank_of_key = np.empty(len(keys), dtype=np.int64)
        rank_of_key[np.argsort(first, kind="stable")] = np.arange(len(keys))  # ids in order of first use
        edge_link[xfer] = rank_of_key[inverse.ravel()]
        by_id = keys[np.argsort(rank_of_key)]
        links = [(int(k) // graph.schedule.ranks, int(k) % graph.schedule.ranks) for k in by_id]
    else:
        links = []
    return edge_bytes, edge_time, edge_link, links


def _units(graph: TaskGraph, costs: CostModel, task_time: np.ndarray, edge_link: np.ndarray,
           task_host: _TaskHostTime | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, HostTime | None]:
    """Unit times, each task's offset and span within its unit, and the host time per
    unit. A serial pair (overlap 0) runs its two ops one after the other, the first
    one's bookkeeping and sends in between, so the first op's outputs leave when it
    ends; an overlapped pair (overlap > 0) takes `pair_time` and both ops' outputs leave
    at its end, the second's sends posted after the first's."""
    col = graph.columns()
    size = np.bincount(col["unit"], minlength=len(graph.units))
    first = np.cumsum(size) - size  # a unit's tasks are consecutive ids
    pair = np.flatnonzero(size == 2)
    a, b = first[pair], first[pair] + 1
    task_post = task_host.post if task_host is not None else np.zeros(len(task_time))
    unit_time = task_time[first].copy()
    unit_post = task_post[first].copy()
    task_offset, task_len = np.zeros(len(task_time)), task_time.copy()
    if costs.overlap == 0:
        task_offset[b] = task_time[a] + task_post[a]
        unit_time[pair] = task_offset[b] + task_time[b]
        unit_post[pair] = task_post[b]
    else:
        both = task_time[a] + task_time[b] - costs.overlap * np.minimum(task_time[a], task_time[b])
        task_len[a] = task_len[b] = unit_time[pair] = both
        unit_post[pair] = task_post[a] + task_post[b]
        if task_host is not None:
            second = np.zeros(len(task_time), dtype=bool)
            second[b] = True
            moved = second[col["edge_src"]] & (edge_link >= 0)
            task_host.send_offset[moved] += task_post[col["edge_src"][moved] - 1]
    if task_host is None:
        return unit_time, task_offset, task_len, None
    return unit_time, task_offset, task_len, HostTime(task_host.pre, task_host.take, unit_post, task_host.send_offset)


def _first_backwards_keep(graph: TaskGraph, stage_costs: list[StageCost], model: np.ndarray,
                          task_time: np.ndarray) -> None:
    """The first W or BW of each model stage on each rank keeps its weight gradients
    instead of adding them up: it takes `grad_accumulate` less."""
    keep = np.asarray([c.grad_accumulate for c in stage_costs], dtype=float)
    if not keep.any():
        return
    col = graph.columns()
    backward = np.flatnonzero(np.isin(col["op"], (OPS.index(W), OPS.index(BW))))  # task ids run in program order
    task_model = model[col["stage"][backward]]
    key = col["rank"][backward].astype(np.int64) * len(stage_costs) + task_model
    _, first = np.unique(key, return_index=True)
    t = backward[first]
    task_time[t] = np.maximum(0.0, task_time[t] - keep[task_model[first]])


class _TaskHostTime(NamedTuple):
    """Host time as `_host_time` finds it: `post` per task, which `_units` sums per unit."""

    pre: np.ndarray
    take: np.ndarray
    post: np.ndarray
    send_offset: np.ndarray


def _host_time(graph: TaskGraph, overheads: Sequence[HostOverhead], edge_link: np.ndarray,
               posts: np.ndarray | None) -> _TaskHostTime:
    """Per task, host time after it: bookkeeping then posting each of its sends in turn;
    per edge, when its data can leave after its task's end; per unit, posting the
    receives the executor posts before it and taking its arrived inputs. `overheads`:
    one for every rank, or one per rank (each task, unit and send takes its rank's)."""
    col = graph.columns()
    n_tasks = len(col["op"])
    per_rank = np.array([[o.per_op, o.per_send, o.send_leaves, o.per_take, o.per_recv] for o in overheads])
    per_op, per_send, leaves, per_take, per_recv = np.broadcast_to(per_rank, (graph.schedule.ranks, 5)).T
    xfer = np.flatnonzero(edge_link >= 0)
    src = col["edge_src"][xfer]
    # the k-th send of a task is posted after k others, as the runtime posts them
    by_src = np.argsort(src, kind="stable")  # a task's sends in edge order
    turn = np.empty(len(xfer), dtype=np.int64)
    turn[by_src] = np.arange(len(xfer)) - np.searchsorted(src[by_src], src[by_src])
    sends = np.bincount(src, minlength=n_tasks)
    sender = col["rank"][src]
    send_offset = np.zeros(len(edge_link))
    send_offset[xfer] = per_op[sender] + turn * per_send[sender] + leaves[sender]
    task_post = per_op[col["rank"]] + sends * per_send[col["rank"]]
    receiver = col["rank"][col["edge_dst"][xfer]]
    consumer = col["unit"][col["edge_dst"][xfer]]
    take = np.bincount(consumer, weights=per_take[receiver], minlength=len(graph.units))
    pre = np.zeros(len(graph.units))
    if posts is not None and per_recv.any():
        rank_first = np.asarray([ids[0] if ids else 0 for ids in graph.rank_units], dtype=np.int64)
        at = rank_first[receiver] + posts[xfer]  # a rank's units are consecutive ids
        pre = np.bincount(at, weights=per_recv[receiver], minlength=len(graph.units))
    return _TaskHostTime(pre, take, task_post, send_offset)


def _payload(cost: StageCost, activation: bool) -> float:
    """Bytes crossing a boundary: the activation forward, the gradient backward."""
    if activation or cost.gradient_bytes is None:
        return cost.activation_bytes
    return cost.gradient_bytes


def to_trace(graph: TaskGraph, timing: Timing, timeline: Timeline, meta: dict | None = None) -> Trace:
    """The simulated Trace of a timeline: compute spans, transfer spans and memory."""
    sched = graph.schedule
    col = graph.columns()
    task_start, task_end = np.asarray(timeline.task_start), np.asarray(timeline.task_end)
    xfer = np.flatnonzero(col["edge_kind"] != LOCAL)
    src = col["edge_src"][xfer]
    sender, receiver = col["rank"][src], col["rank"][col["edge_dst"][xfer]]
    a, b = np.asarray(timeline.edge_start)[xfer], np.asarray(timeline.edge_end)[xfer]
    n, k = len(task_start), len(xfer)

    def cat(compute, send, recv):
        return np.concatenate((compute, send, recv))

    trace = Trace(
        sched.name, sched.ranks, sched.microbatches, "simulated",
        rank=cat(col["rank"], sender, receiver).astype(np.int32),
        lane=cat(np.full(n, COMPUTE), np.full(k, SEND), np.full(k, RECV)).astype(np.int8),
        op=cat(col["op"], col["op"][src], col["op"][src]),
        mb=cat(col["mb"], col["mb"][src], col["mb"][src]),
        stage=cat(col["stage"], col["stage"][src], col["stage"][src]),
        start=cat(task_start, a, a), end=cat(task_end, b, b),
        peer=cat(np.full(n, -1), receiver, sender).astype(np.int32),
        overlapped=cat(col["paired"], np.zeros(k, bool), np.zeros(k, bool)),
        memory=memory_samples(graph, timing.stage_costs, task_start, task_end,
                              buffer_intervals(graph, timing.edge_bytes, timing.recv_posts, timeline.unit_start,
                                               timeline.unit_end, timeline.edge_end)
                              if timing.comm_buffers else None),
        meta=dict(meta or {}))
    return trace
