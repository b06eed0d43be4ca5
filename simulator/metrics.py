"""Metrics of any Trace, simulated or measured. Units: seconds and bytes.

- makespan: first compute start to last compute end;
- per rank: busy (union of its compute spans), idle = makespan - busy, bubble ratio =
  idle / makespan, peak memory;
- bubble ratio = 1 - sum(busy) / (ranks x makespan);
- comm time: the summed duration of all transfers; hidden fraction: the part of it
  during which the receiving rank was computing (so it did not wait for the data);
- critical path: walking back from the last op, the chain of ops and transfers each of
  which ended when the next one could start;
- data parallelism (simulator.data_parallel): the makespan runs to the end of the step's
  tail (optimizer steps, all-reduces); allreduce_time: the summed duration of the
  all-reduce spans; allreduce_exposed: how much longer the step is than with free
  all-reduces;
- steps back to back (simulator.steps; a trace whose meta["steps"] says so, simulated
  or measured): the makespan, busy, idle and peak memory cover every step of the trace;
  step_makespan is the first step's, period the seconds per step once the pattern
  repeats and throughput the microbatches per step (of one pipeline replica) over it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from pipesched.schedules.graph import LOCAL, TaskGraph
from pipesched.schedules.ir import OPS

from .data_parallel import exposed_allreduce
from .memory import peak_bytes
from .trace import ALLREDUCE, COMPUTE, SEND, Trace


@dataclass
class RankMetrics:
    """One rank's share of a Metrics: busy and idle seconds, idle / makespan, peak bytes."""

    rank: int
    busy: float
    idle: float
    bubble_ratio: float
    peak_memory_bytes: float


@dataclass
class PathStep:
    """One step of the critical path: an op computing or a transfer, start and end in seconds."""

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
    """Metrics of one trace (module doc; `metrics` / `compute_metrics` make it).

    schedule, ranks, microbatches: what ran.
    makespan: seconds from the first op's start to the step's end.
    bubble_ratio: the idle fraction of ranks x makespan (0 to 1).
    per_rank: RankMetrics per rank (busy, idle seconds, bubble ratio, peak memory bytes).
    comm_time: seconds of all transfers summed; comm_hidden_fraction: the part of it
        during which the receiving rank was computing (0 to 1).
    critical_path: PathSteps from the first op to the last (empty without the graph).
    allreduce_time: seconds of the data-parallel all-reduces summed; allreduce_exposed:
        seconds they add to the step.
    steps, step_barrier: the steps in the trace and whether a barrier ("all") or
        nothing ("none") separates them; with more than one step or no barrier also
        step_makespan (seconds, the first step's), period (seconds per step in the
        steady state) and throughput (microbatches per second, one pipeline replica's);
        None otherwise. `microbatches` counts every step's.
    """

    schedule: str
    ranks: int
    microbatches: int
    makespan: float
    bubble_ratio: float
    per_rank: list[RankMetrics]
    comm_time: float
    comm_hidden_fraction: float
    critical_path: list[PathStep] = field(default_factory=list)
    allreduce_time: float = 0.0
    allreduce_exposed: float = 0.0
    steps: int = 1
    step_barrier: str = "all"
    step_makespan: float | None = None
    period: float | None = None
    throughput: float | None = None

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
    ar = trace.lane == ALLREDUCE
    t0, t1 = float(trace.start[comp].min()), max(float(trace.end[comp].max()), float(trace.end[ar].max(initial=-np.inf)))
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
    out = Metrics(trace.schedule, trace.ranks, trace.microbatches, makespan, bubble, per_rank,
                  comm_time, hidden / comm_time if comm_time > 0 else 1.0, path,
                  float((trace.end[ar] - trace.start[ar]).sum()), exposed_allreduce(trace))
    steps = trace.meta.get("steps")
    if isinstance(steps, dict):
        _add_steps(out, steps)
    return out


def _add_steps(out: Metrics, steps: dict) -> None:
    """The period and throughput a trace's meta["steps"] gives (simulator.steps); left
    out where a field is missing or not a positive number (a hand-edited trace)."""
    def number(key: str) -> float | None:
        x = steps.get(key)
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf") else None

    count, m = steps.get("count"), number("microbatches")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 1:
        out.steps = count
    if steps.get("barrier") in ("all", "none"):
        out.step_barrier = steps["barrier"]
    out.step_makespan, out.period = number("step_makespan"), number("period")
    out.throughput = m / out.period if m is not None and out.period is not None else None


def critical_path(trace: Trace, graph: TaskGraph) -> list[PathStep]:
    """The chain that sets the makespan, first step first.

    From the op that ends last, repeatedly step to whatever it waited for last: the
    rank's previous op, a local input, the transfer of a remote input, or (with blocking
    sends) a transfer the previous op sent; from a transfer, to its producer or to the
    transfer ahead of it on the same link. Only what ended by the time the step started
    can have held it up, so a transfer that ran concurrently on an uncontended link, or
    a send that did not block, is never taken for a cause.
    """
    return _PathWalk(trace, graph).walk()


class _PathWalk:
    """The spans of a trace matched to the graph's tasks, and the walk back from the last op.
    A state is ("task", task id) or ("xfer", send span index)."""

    def __init__(self, trace: Trace, graph: TaskGraph):
        self.trace, self.graph = trace, graph
        col = graph.columns()
        width = np.int64(max(int(trace.mb.max(initial=0)), int(col["mb"].max(initial=0))) + 1)
        depth = np.int64(max(int(trace.stage.max(initial=0)), int(col["stage"].max(initial=0))) + 1)

        def keys(op, mb, stage):  # (op, mb, stage) as one integer
            return (op.astype(np.int64) * width + mb) * depth + stage

        task_key = keys(col["op"], col["mb"], col["stage"])
        comp = np.flatnonzero(trace.lane == COMPUTE)
        self.span = self._lookup(keys(trace.op[comp], trace.mb[comp], trace.stage[comp]), comp, task_key)
        if (self.span < 0).any():
            missing = graph.tasks[int(np.flatnonzero(self.span < 0)[0])]
            raise ValueError(f"trace has no span for {missing}; it does not match the schedule")
        sends = np.flatnonzero(trace.lane == SEND)
        send_key = keys(trace.op[sends], trace.mb[sends], trace.stage[sends])
        by_key = np.argsort(task_key, kind="stable")
        at = np.minimum(np.searchsorted(task_key[by_key], send_key), max(len(by_key) - 1, 0))
        # only the transfers of the graph's own tasks: a trace of several steps has the later steps' too
        own = (task_key[by_key][at] == send_key) if len(by_key) else np.zeros(len(sends), dtype=bool)
        sends, send_key, at = sends[own], send_key[own], at[own]
        self.send_of = self._lookup(send_key, sends, task_key).tolist()  # per task: the transfer of its output
        self.task_of_send = dict(zip(sends.tolist(), by_key[at].tolist()))
        # send span -> the one before it on its link, in start order
        by_start = sends[np.argsort(trace.start[sends], kind="stable")]
        link = trace.rank[by_start].astype(np.int64) * trace.ranks + trace.peer[by_start]
        queue = by_start[np.argsort(link, kind="stable")]
        same = link[np.argsort(link, kind="stable")]
        follows = np.flatnonzero(same[1:] == same[:-1]) + 1
        self.ahead = dict(zip(queue[follows].tolist(), queue[follows - 1].tolist()))
        self.start, self.end = trace.start.tolist(), trace.end.tolist()
        span = self.span
        self.tolerance = 1e-9 * float(trace.end[span].max() - trace.start[span].min()) if len(span) else 0.0
        self.previous_unit = {b: a for ids in graph.rank_units for a, b in zip(ids, ids[1:])}
        # per task, the ids of the edges into it, in edge order (a CSR: cheaper than graph.task_inputs)
        self.in_edges = np.argsort(col["edge_dst"], kind="stable").tolist()
        self.in_ptr = np.searchsorted(col["edge_dst"][self.in_edges], np.arange(len(graph.tasks) + 1)).tolist()
        self.span = span.tolist()

    @staticmethod
    def _lookup(span_keys: np.ndarray, spans: np.ndarray, task_key: np.ndarray) -> np.ndarray:
        """Per task, the last span with its key (-1: none)."""
        order = np.argsort(span_keys, kind="stable")
        sorted_keys = span_keys[order]
        last = np.searchsorted(sorted_keys, task_key, side="right") - 1
        found = (last >= 0) & (sorted_keys[np.maximum(last, 0)] == task_key) if len(sorted_keys) else \
            np.zeros(len(task_key), dtype=bool)
        return np.where(found, spans[order][np.maximum(last, 0)] if len(spans) else -1, -1)

    def index_of(self, state: tuple[str, int]) -> int:
        return self.span[state[1]] if state[0] == "task" else state[1]

    def waited_for(self, state: tuple[str, int]) -> list[tuple[tuple[str, int], int]]:
        """What `state` may have waited for, each with a priority for ties (a data or
        program-order dependency wins over a blocking send)."""
        kind, ref = state
        graph = self.graph
        if kind == "xfer":
            out = [(("task", self.task_of_send[ref]), 1)]
            return out + ([(("xfer", self.ahead[ref]), 1)] if ref in self.ahead else [])
        u = graph.task_unit[ref]
        out = []
        first = graph.units[u][0]
        if first != ref and self.end[self.span[first]] <= self.start[self.span[ref]] + self.tolerance:
            out.append((("task", first), 1))  # the second op of a serial pair runs after the first
        if u in self.previous_unit:
            before = graph.units[self.previous_unit[u]]
            out.append((("task", before[-1]), 1))
            out += [(("xfer", self.send_of[t]), 0) for t in before if self.send_of[t] >= 0]
        for t in graph.units[u]:
            for e in self.in_edges[self.in_ptr[t]:self.in_ptr[t + 1]]:
                edge = graph.edges[e]
                if graph.task_unit[edge.src] == u:
                    continue
                if edge.kind == LOCAL:
                    out.append((("task", edge.src), 1))
                elif self.send_of[edge.src] >= 0:
                    out.append((("xfer", self.send_of[edge.src]), 1))
        return out

    def step(self, state: tuple[str, int]) -> PathStep:
        kind, ref = state
        i = self.index_of(state)
        t = self.trace
        return PathStep("compute" if kind == "task" else "transfer", int(t.rank[i]), OPS[t.op[i]], int(t.mb[i]),
                        int(t.stage[i]), self.start[i], self.end[i], -1 if kind == "task" else int(t.peer[i]))

    def walk(self) -> list[PathStep]:
        end = self.end
        state = ("task", max(range(len(self.span)), key=lambda t: end[self.span[t]]))
        steps = [self.step(state)]
        while True:
            options = self.waited_for(state)
            if not options:
                break
            began = self.start[self.index_of(state)] + self.tolerance
            # a measured trace may have nothing that ended in time (clock offsets): then the latest
            held_up = [o for o in options if end[self.index_of(o[0])] <= began] or options
            state = max(held_up, key=lambda o: (end[self.index_of(o[0])], o[1]))[0]
            steps.append(self.step(state))
        steps.reverse()
        return steps
