"""Metrics of any Trace, simulated or measured. Units: seconds and bytes.

- makespan: first compute start to last compute end;
- per rank: busy (union of its compute spans), idle = makespan - busy, bubble ratio =
  idle / makespan, peak memory;
- bubble ratio = 1 - sum(busy) / (ranks x makespan);
- comm time: the summed duration of all transfers; hidden fraction: the part of it
  during which the receiving rank was computing (so it did not wait for the data);
- critical path: walking back from the last op, the chain of ops and transfers each of
  which ended when the next one could start.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from pipesched.schedules.graph import LOCAL, TaskGraph
from pipesched.schedules.ir import OPS, Task

from .memory import peak_bytes
from .trace import COMPUTE, SEND, Trace


@dataclass
class RankMetrics:
    rank: int
    busy: float
    idle: float
    bubble_ratio: float
    peak_memory_bytes: float


@dataclass
class PathStep:
    kind: str   # "compute" or "transfer"
    rank: int   # the rank computing, or the sender
    op: str
    mb: int
    stage: int
    start: float
    end: float
    peer: int = -1  # the receiver of a transfer

    def __str__(self) -> str:
        where = f"rank {self.rank}" if self.kind == "compute" else f"{self.rank}->{self.peer}"
        verb = "" if self.kind == "compute" else "send "
        return f"{verb}{self.op}{self.mb}@{self.stage} ({where}, {self.start:.6g}-{self.end:.6g})"


@dataclass
class Metrics:
    schedule: str
    ranks: int
    microbatches: int
    makespan: float
    bubble_ratio: float
    per_rank: list[RankMetrics]
    comm_time: float
    comm_hidden_fraction: float
    critical_path: list[PathStep] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def merged_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (starts, ends)."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(new)
    return s[heads], np.maximum.reduceat(e, heads)


def covered(union: tuple[np.ndarray, np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How much of each [a, b] the disjoint sorted union covers."""
    us, ue = union
    if len(us) == 0:
        return np.zeros_like(a)
    prefix = np.concatenate(([0.0], np.cumsum(ue - us)))

    def upto(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(us, x, side="right")  # intervals starting at or before x
        full = prefix[np.maximum(i - 1, 0)]
        partial = np.where(i > 0, np.clip(x - us[np.maximum(i - 1, 0)], 0, None)
                           .clip(max=(ue - us)[np.maximum(i - 1, 0)]), 0.0)
        return full + partial

    return upto(b) - upto(a)


def compute_metrics(trace: Trace, graph: TaskGraph | None = None) -> Metrics:
    """Metrics of a trace; the critical path needs the schedule's graph."""
    comp = trace.lane == COMPUTE
    if not comp.any():
        raise ValueError("trace has no compute spans")
    t0, t1 = float(trace.start[comp].min()), float(trace.end[comp].max())
    makespan = t1 - t0
    unions = []
    per_rank = []
    for r in range(trace.ranks):
        m = comp & (trace.rank == r)
        union = merged_intervals(trace.start[m], trace.end[m])
        unions.append(union)
        busy = float((union[1] - union[0]).sum())
        idle = makespan - busy
        per_rank.append(RankMetrics(r, busy, idle, idle / makespan if makespan > 0 else 0.0,
                                    peak_bytes(trace.memory[r]) if r < len(trace.memory) else 0.0))
    total_busy = sum(x.busy for x in per_rank)
    bubble = 1.0 - total_busy / (trace.ranks * makespan) if makespan > 0 else 0.0
    sends = trace.lane == SEND
    durations = trace.end[sends] - trace.start[sends]
    comm_time = float(durations.sum())
    hidden = 0.0
    if comm_time > 0:
        peers, a, b = trace.peer[sends], trace.start[sends], trace.end[sends]
        for r in range(trace.ranks):
            m = peers == r
            if m.any():
                hidden += float(covered(unions[r], a[m], b[m]).sum())
    path = critical_path(trace, graph) if graph is not None else []
    return Metrics(trace.schedule, trace.ranks, trace.microbatches, makespan, bubble, per_rank,
                   comm_time, hidden / comm_time if comm_time > 0 else 1.0, path)


def critical_path(trace: Trace, graph: TaskGraph) -> list[PathStep]:
    """The chain that sets the makespan, first step first.

    From the op that ends last, repeatedly step to whatever it waited for last: the
    rank's previous op, a local input, the transfer of a remote input, or (with blocking
    sends) a transfer the previous op sent; from a transfer, to its producer or to the
    transfer ahead of it on the same link. Only what ended by the time the step started
    can have held it up, so a transfer that ran concurrently on an uncontended link, or
    a send that did not block, is never taken for a cause.
    """
    key_of = lambda i: (OPS[trace.op[i]], int(trace.mb[i]), int(trace.stage[i]))  # noqa: E731
    comp = {key_of(i): int(i) for i in np.flatnonzero(trace.lane == COMPUTE)}
    sends = np.flatnonzero(trace.lane == SEND)
    xfer = {key_of(i): int(i) for i in sends}
    span = [comp.get(t) for t in graph.tasks]
    if None in span:
        raise ValueError(f"trace has no span for {graph.tasks[span.index(None)]}; it does not match the schedule")
    start, end = trace.start, trace.end
    tolerance = 1e-9 * float(end[span].max() - start[span].min()) if span else 0.0
    previous_unit: dict[int, int] = {b: a for ids in graph.rank_units for a, b in zip(ids, ids[1:])}
    ahead: dict[int, int] = {}  # transfer -> the one before it on its link
    by_link: dict[tuple[int, int], int] = {}
    for i in sends[np.argsort(trace.start[sends], kind="stable")]:
        link = (int(trace.rank[i]), int(trace.peer[i]))
        if link in by_link:
            ahead[int(i)] = by_link[link]
        by_link[link] = int(i)

    def waited_for(state: tuple[str, int]) -> list[tuple[tuple[str, int], int]]:
        """What `state` may have waited for, each with a priority for ties (a data or
        program-order dependency wins over a blocking send)."""
        kind, ref = state
        if kind == "xfer":
            out = [(("task", graph.index[Task(*key_of(ref))]), 1)]
            return out + ([(("xfer", ahead[ref]), 1)] if ref in ahead else [])
        u = graph.task_unit[ref]
        out = []
        first = graph.units[u][0]
        if first != ref and end[span[first]] <= start[span[ref]] + tolerance:
            out.append((("task", first), 1))  # the second op of a serial pair runs after the first
        if u in previous_unit:
            before = graph.units[previous_unit[u]]
            out.append((("task", before[-1]), 1))
            out += [(("xfer", xfer[graph.tasks[t]]), 0) for t in before if graph.tasks[t] in xfer]
        for t in graph.units[u]:
            for e in graph.task_inputs[t]:
                edge = graph.edges[e]
                if graph.task_unit[edge.src] == u:
                    continue
                if edge.kind == LOCAL:
                    out.append((("task", edge.src), 1))
                elif graph.tasks[edge.src] in xfer:
                    out.append((("xfer", xfer[graph.tasks[edge.src]]), 1))
        return out

    def index_of(state: tuple[str, int]) -> int:
        return span[state[1]] if state[0] == "task" else state[1]

    def step(state: tuple[str, int]) -> PathStep:
        kind, ref = state
        i = index_of(state)
        op, mb, stage = key_of(i)
        return PathStep("compute" if kind == "task" else "transfer", int(trace.rank[i]), op, mb, stage,
                        float(trace.start[i]), float(end[i]), -1 if kind == "task" else int(trace.peer[i]))

    state = ("task", max(range(len(graph.tasks)), key=lambda t: end[span[t]]))
    steps = [step(state)]
    while True:
        options = waited_for(state)
        if not options:
            break
        began = float(start[index_of(state)]) + tolerance
        # a measured trace may have nothing that ended in time (clock offsets): then the latest
        held_up = [o for o in options if end[index_of(o[0])] <= began] or options
        state = max(held_up, key=lambda o: (float(end[index_of(o[0])]), o[1]))[0]
        steps.append(step(state))
    steps.reverse()
    return steps
