"""A cost model applied to one compiled schedule: what each unit and transfer costs.

Both engines (the exact longest path and the DES) take a `Timing` and give a
`Timeline` (start and end of every unit and transfer); `to_trace` turns a timeline into
the common Trace. Keeping these in one place is what makes the engines comparable.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.schedules.graph import GRADIENT, LOCAL, TaskGraph
from pipesched.schedules.ir import BW, F, W
from .costs import CostModel, StageCost
from .memory import buffer_intervals, memory_samples
from .trace import COMPUTE, RECV, SEND, Trace


@dataclass
class Timing:
    task_time: list[float]        # seconds per task, op overhead included
    unit_time: list[float]        # seconds per unit (an overlapped pair combined)
    edge_time: list[float]        # seconds per transfer edge; 0 for local edges
    edge_bytes: list[float]       # payload per edge: transfers and V-turn hand-overs; 0 otherwise
    edge_link: list[int]          # link id per edge; -1 for local edges
    links: list[tuple[int, int]]  # (sender, receiver) of each link id
    contention: bool
    blocking_sends: bool
    stage_costs: list[StageCost]  # per model stage
    comm_buffers: bool = False    # count transfer and hand-over buffers in memory
    recv_posts: list[int] | None = None     # per edge: the receiver's unit its receive is posted before
    unit_pre: list[float] | None = None     # host seconds before each unit (posting receives)
    unit_post: list[float] | None = None    # host seconds after each unit (bookkeeping, posting sends)
    unit_take: list[float] | None = None    # host seconds between its inputs' arrival and its start
    edge_offset: list[float] | None = None  # per transfer: seconds after its task's end until it is posted
    task_offset: list[float] | None = None  # each task's start within its unit (None: all at the start)
    task_len: list[float] | None = None     # each task's span (None: its unit's)
    serial_pairs: bool = False              # a pair runs its ops one after the other


@dataclass
class Timeline:
    unit_start: list[float]
    unit_end: list[float]
    edge_start: list[float]  # transfer start (nan for local edges)
    edge_end: list[float]    # transfer end (nan for local edges)
    task_start: list[float] | None = None  # None: every task spans its unit
    task_end: list[float] | None = None


def resolve(graph: TaskGraph, costs: CostModel, *, noise_cv: float = 0.0,
            rng: np.random.Generator | None = None) -> Timing:
    """Apply `costs` to `graph`. With noise_cv > 0, every op and transfer time is
    multiplied by an independent lognormal factor of mean 1 and that coefficient of
    variation (drawn from `rng`)."""
    sched = graph.schedule
    stage_costs = costs.model_stage_costs(sched.ranks, sched.num_model_stages)
    model_stage = [st.model_stage for st in sched.stages]
    task_time = [stage_costs[model_stage[t.stage]].op_time(t.op) + costs.op_overhead for t in graph.tasks]
    _first_backwards_keep(graph, stage_costs, task_time)
    edge_time = [0.0] * len(graph.edges)
    edge_bytes = [0.0] * len(graph.edges)
    edge_link = [-1] * len(graph.edges)
    link_ids: dict[tuple[int, int], int] = {}
    tasks = graph.tasks
    for i, e in enumerate(graph.edges):
        if e.kind == LOCAL:
            src_task, dst_task = tasks[e.src], tasks[e.dst]
            if src_task.stage != dst_task.stage:  # a V turn hands a tensor over on the rank
                edge_bytes[i] = _payload(stage_costs[e.boundary], src_task.op == F)
            continue
        src, dst = graph.edge_ranks(i)
        nbytes = edge_bytes[i] = _payload(stage_costs[e.boundary], e.kind != GRADIENT)
        edge_time[i] = costs.network.link(src, dst).time(nbytes)
        edge_link[i] = link_ids.setdefault((src, dst), len(link_ids))
    if noise_cv > 0:
        rng = rng or np.random.default_rng()
        sigma2 = np.log1p(noise_cv ** 2)
        factors = rng.lognormal(-sigma2 / 2, np.sqrt(sigma2), len(task_time) + len(edge_time))
        task_time = list(np.asarray(task_time) * factors[:len(task_time)])
        edge_time = list(np.asarray(edge_time) * factors[len(task_time):])
    links = sorted(link_ids, key=link_ids.get)
    timing = Timing(task_time, [], edge_time, edge_bytes, edge_link, links, costs.contention,
                    costs.blocking_sends, stage_costs, costs.comm_buffers)
    if costs.comm_buffers or costs.host_overhead.per_recv:
        from .posting import receive_posts  # posting times a unit-time run with the exact engine, which imports this
        timing.recv_posts = receive_posts(graph, costs.recv_lookahead)
    _units(graph, costs, timing)
    return timing


def _units(graph: TaskGraph, costs: CostModel, timing: Timing) -> None:
    """Unit times and host time around them. A serial pair (overlap 0) runs its two
    ops one after the other, the first one's bookkeeping and sends in between, so the
    first op's outputs leave when it ends; an overlapped pair (overlap > 0) takes
    `pair_time` and both ops' outputs leave at its end."""
    task_time = timing.task_time
    task_post, offset, pre, take = _host_time(graph, costs, timing) if costs.host_overhead.any else (None,) * 4
    serial = costs.overlap == 0
    unit_time, unit_post = [], []
    task_offset, task_len = [0.0] * len(task_time), list(task_time)
    for members in graph.units:
        a = members[0]
        if len(members) == 1:
            unit_time.append(task_time[a])
            unit_post.append(task_post[a] if task_post else 0.0)
            continue
        b = members[1]
        if serial:
            between = task_post[a] if task_post else 0.0
            task_offset[b] = task_time[a] + between
            unit_time.append(task_offset[b] + task_time[b])
            unit_post.append(task_post[b] if task_post else 0.0)
        else:
            both = costs.pair_time(task_time[a], task_time[b])
            task_len[a] = task_len[b] = both
            unit_time.append(both)
            if offset is not None:  # both ops' sends after the pair, the second's after the first's
                for e in graph.task_outputs[b]:
                    if timing.edge_link[e] >= 0:
                        offset[e] += task_post[a]
            unit_post.append(task_post[a] + task_post[b] if task_post else 0.0)
    timing.unit_time = unit_time
    timing.task_offset, timing.task_len, timing.serial_pairs = task_offset, task_len, serial
    if task_post is not None:
        timing.unit_pre, timing.unit_post, timing.edge_offset, timing.unit_take = pre, unit_post, offset, take


def _first_backwards_keep(graph: TaskGraph, stage_costs: list[StageCost], task_time: list[float]) -> None:
    """The first W or BW of each model stage on each rank keeps its weight gradients
    instead of adding them up: it takes `grad_accumulate` less."""
    if not any(c.grad_accumulate for c in stage_costs):
        return
    stages = graph.schedule.stages
    seen: set[tuple[int, int]] = set()
    for rank, ids in enumerate(graph.rank_units):
        for u in ids:
            for t in graph.units[u]:
                task = graph.tasks[t]
                if task.op in (W, BW):
                    key = (rank, stages[task.stage].model_stage)
                    if key not in seen:
                        seen.add(key)
                        task_time[t] = max(0.0, task_time[t] - stage_costs[key[1]].grad_accumulate)


def _host_time(graph: TaskGraph, costs: CostModel, timing: Timing
               ) -> tuple[list[float], list[float], list[float], list[float]]:
    """(per task: host time after it, bookkeeping then posting each of its sends in
    turn; per edge: when its data can leave, after its task's end; per unit: host time
    before it, posting the receives the executor posts there; per unit: host time taking
    its arrived inputs)."""
    o = costs.host_overhead
    task_post = [0.0] * len(graph.tasks)
    offset = [0.0] * len(graph.edges)
    pre = [0.0] * len(graph.units)
    take = [0.0] * len(graph.units)
    posts = timing.recv_posts if o.per_recv else None
    for ids in graph.rank_units:
        for u in ids:
            for t in graph.units[u]:
                done = o.per_op
                for e in graph.task_outputs[t]:
                    if timing.edge_link[e] >= 0:
                        offset[e] = done + o.send_leaves
                        done += o.per_send
                task_post[t] = done
                for e in graph.task_inputs[t]:
                    if timing.edge_link[e] >= 0:
                        take[u] += o.per_take
                        if posts is not None:
                            pre[ids[posts[e]]] += o.per_recv
    return task_post, offset, pre, take


def _payload(cost: StageCost, activation: bool) -> float:
    """Bytes crossing a boundary: the activation forward, the gradient backward."""
    if activation or cost.gradient_bytes is None:
        return cost.activation_bytes
    return cost.gradient_bytes


def to_trace(graph: TaskGraph, timing: Timing, timeline: Timeline, meta: dict | None = None) -> Trace:
    """The simulated Trace of a timeline: compute spans, transfer spans and memory."""
    sched = graph.schedule
    col = graph.columns()
    if timeline.task_start is not None:
        task_start, task_end = np.asarray(timeline.task_start), np.asarray(timeline.task_end)
    else:
        unit_start, unit_end = np.asarray(timeline.unit_start), np.asarray(timeline.unit_end)
        task_start, task_end = unit_start[col["unit"]], unit_end[col["unit"]]
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
        memory=memory_samples(graph, timing.stage_costs, list(task_start), list(task_end),
                              buffer_intervals(graph, timing.edge_bytes, timing.recv_posts, timeline.unit_start,
                                               timeline.unit_end, timeline.edge_end)
                              if timing.comm_buffers else None),
        meta=dict(meta or {}))
    return trace
