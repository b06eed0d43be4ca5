"""Steps back to back: K training steps in one Trace, and the steady-state period.

Each rank runs its program, then its step's tail (the data-parallel all-reduces and the
optimizer step, `simulator.data_parallel`, where the cost model has them; and where a
model stage is held by several ranks, as DualPipe holds each on two, the sum of their
gradients, `simulator.shared_grads`, which no member ends before the group's slowest
member has ended its pipeline), then the next step's program. Between steps:

- barrier "all" (what `pipesched run` does by default): every rank finishes step k
  before any starts step k+1, so every step is the first one shifted by the period,
  the step's end (its last op, all-reduce, optimizer step or host time after an op)
  measured from the barrier;
- barrier "none": only the data dependencies within a step and each rank's program
  order across steps; a rank starts step k+1 as soon as its own step k (tail included)
  is done, and a link carries step k+1's first transfer once step k's last one on it
  has arrived. The next step's forwards may then overlap the previous step's last
  backwards on other ranks.

Without a barrier the steps form a max-plus linear system x(k+1) = A (x) x(k) over the
ranks (and the links, when transfers contend for them; `simulator.period`): A[i, j] is
the longest path within one step from resource j's start to resource i's end, computed
by the exact engine in one walk with a column per resource, then the tail and the
shared-gradient sums applied to each column (both are max-plus linear in the ranks'
ends; the sums make a group's rows nearly one: its ranks start each step together).
The period, seconds per step once the pattern repeats, is A's maximum cycle mean
(Karp's algorithm). Where ranks
share compute (`CostModel.host`) nothing is max-plus linear: the DES simulates the
steps as one graph, every rank's programs one after another (so the next step's ops
share the cores with the previous step's), and the period is the mean step over the
second half of at least PERIOD_STEPS steps, the last left out (nothing slows it); that
graph has no place for a step's tail, so shared compute without a barrier takes no
optimizer step or data parallelism, and leaves the shared-gradient sums out (the
replicas of a model stage are not held together there).

The one-step Trace has no spans for the shared-gradient sums (a measured step has none
either: its makespan is compared like for like); they are in the step's end: in when
the next step may start, the barrier's period and meta["steps"]["ends"].

In the Trace of K steps, step k's microbatches are numbered k*m .. k*m+m-1 (m per
step), memory is summed over the steps (a rank's peak across the step boundary), and
meta["steps"] says: count, barrier, microbatches (per step), period (seconds),
period_method ("barrier", "max-plus" or "simulated"), critical (the ranks and links on
a cycle that sets the period, max-plus only), step_makespan (the first step's first op
to its end), starts and ends (seconds, per step: its first op, and when its last rank
is done). Seconds and bytes throughout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import OPS, Overlap, Schedule, ScheduleError, Task
from pipesched.schedules.numbers import is_int
from pipesched.schedules.registry import MAX_OPS
from pipesched.schedules.validate import validate

from .costs import CostError, CostModel
from .data_parallel import add_step_tail, has_tail
from .des import run_des
from .exact import longest_path
from .period import critical_nodes, max_cycle_mean
from .shared_grads import SharedSums, shared_sums
from .timing import Timing, resolve, to_trace
from .trace import ALLREDUCE, COMPUTE, OPTIMIZER, SPAN_OPS, Trace

BARRIERS = ("all", "none")
MAX_STEPS = 1000
PERIOD_STEPS = 16  # steps the DES simulates for the period where ranks share compute
COLUMN_ELEMENTS = 4_000_000  # step_matrix walks this many (task, edge or unit) x column times at once


def check_steps(steps, step_barrier) -> None:
    """ValueError unless `steps` is an integer in 1..MAX_STEPS and `step_barrier` one of BARRIERS."""
    if not is_int(steps) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an integer in 1..{MAX_STEPS}, got {steps!r}")
    if step_barrier not in BARRIERS:
        raise ValueError(f"step_barrier must be 'all' or 'none', got {step_barrier!r}")


def check_step_ops(graph: TaskGraph, costs: CostModel, steps: int, step_barrier: str) -> None:
    """ScheduleError when the steps would simulate more than MAX_OPS ops in all (the
    shared-compute period simulates at least PERIOD_STEPS steps)."""
    simulated = max(steps, PERIOD_STEPS) if step_barrier == "none" and costs.host is not None else steps
    if simulated * len(graph.tasks) > MAX_OPS:
        raise ScheduleError(f"{simulated} steps of {len(graph.tasks):,} ops are more than the {MAX_OPS:,} ops a "
                            f"simulation takes; ask for at most {max(1, MAX_OPS // len(graph.tasks)):,} steps")


def check_step_costs(costs: CostModel, step_barrier: str, stage_costs: list | None = None) -> None:
    """CostError where steps without a barrier cannot be simulated: ranks sharing compute
    with a step's tail (data parallelism, or an optimizer step taking time, among
    `stage_costs` when given), which the steps simulated as one graph have no place for."""
    if step_barrier != "none" or costs.host is None:
        return
    stages = list(stage_costs if stage_costs is not None else (*costs.stages, *(costs.model_stages or ())))
    if has_tail(stages, costs.data_parallel):
        raise CostError("steps without a barrier where ranks share compute are simulated without the step's tail: "
                        "leave out data parallelism and the optimizer time, or keep the barrier")


@dataclass
class StepMatrix:
    """A of x(k+1) = A (x) x(k), seconds: rows and columns are `names` (ranks, then the
    links transfers contend for); A[i, j] = -inf where resource j's start does not reach
    resource i's end within a step."""

    a: np.ndarray
    names: list[str]

    def period(self) -> float:
        """Seconds per step without a barrier: the maximum cycle mean."""
        return max_cycle_mean(self.a)

    def barrier_period(self) -> float:
        """Seconds per step with a barrier: every resource starts when the last is done."""
        return float(self.a.max())

    def critical(self) -> list[str]:
        """The ranks and links on a cycle of maximum mean: what sets the period."""
        return [self.names[i] for i in critical_nodes(self.a, self.period())]


def step_matrix(graph: TaskGraph, timing: Timing, costs: CostModel) -> StepMatrix:
    """A of the step (deterministic op times, ranks on their own processors)."""
    sched = graph.schedule
    p = sched.ranks
    links = len(timing.links) if timing.contention else 0
    n = p + links
    a = np.empty((n, n))
    sums = step_sums(graph, timing, costs)
    tail = has_tail(timing.stage_costs, costs.data_parallel)
    col = graph.columns()
    k = len(col["op"])
    width = max(1, COLUMN_ELEMENTS // max(1, k + len(graph.edges) + len(graph.units)))
    for lo in range(0, n, width):  # a few columns at a time: each column is a copy of every time
        hi = min(n, lo + width)
        ready = np.full((p, hi - lo), -np.inf)
        link_ready = np.full((len(timing.links), hi - lo), -np.inf if links else 0.0)
        for c in range(lo, hi):
            if c < p:
                ready[c, c - lo] = 0.0
            else:
                link_ready[c - p, c - lo] = 0.0
        timeline = longest_path(graph, timing, ready, link_ready)
        a[:p, lo:hi] = timeline.rank_free
        if links:
            a[p:, lo:hi] = timeline.link_free[:links]
        for c in range(lo, hi) if tail else ():  # the tail from this column's timeline: its compute spans
            pipeline = Trace(sched.name, p, sched.microbatches, "simulated", col["rank"].astype(np.int32),
                             np.full(k, COMPUTE, dtype=np.int8), col["op"].astype(np.int8),
                             col["mb"].astype(np.int32), col["stage"].astype(np.int32), timeline.task_start[:, c - lo],
                             timeline.task_end[:, c - lo], np.full(k, -1, dtype=np.int32), np.zeros(k, dtype=bool), [])
            a[:p, c] = np.maximum(a[:p, c], _tail_ends(add_step_tail(pipeline, sched, timing.stage_costs,
                                                                     costs.data_parallel, sums=sums,
                                                                     free=timeline.rank_free[:, c - lo]), p))
        if sums is not None and not tail:  # the sums couple their groups' rows (with a tail: applied in it)
            for c in range(lo, hi):
                a[:p, c] = sums.ends(a[:p, c])
    names = [f"rank {r}" for r in range(p)] + [f"link {s}->{r}" for s, r in timing.links[:links]]
    return StepMatrix(a, names)


def step_sums(graph: TaskGraph, timing: Timing, costs: CostModel) -> SharedSums | None:
    """The sums of gradients shared between ranks that end each step (`simulator.shared_grads`;
    None where every model stage is on one rank)."""
    return shared_sums(graph.schedule, timing.stage_costs, costs.network, costs.host_overhead, costs.gradient_sum)


def _tail_ends(trace: Trace, ranks: int) -> np.ndarray:
    """Per rank, the end of its last all-reduce, optimizer step or shared-gradient sum (-inf: none)."""
    tail = (trace.lane == ALLREDUCE) | ((trace.lane == COMPUTE) & (trace.op == SPAN_OPS.index(OPTIMIZER)))
    out = np.full(ranks, -np.inf)
    np.maximum.at(out, trace.rank[tail], trace.end[tail])
    if "shared_gradients" in trace.meta:
        out = np.maximum(out, trace.meta["shared_gradients"]["ends"])
    return out


def steady_period(graph: TaskGraph, costs: CostModel, step_barrier: str = "none") -> float:
    """Seconds per step of `graph` repeated under `costs` with or without a barrier
    (exact; ValueError where ranks share compute, which the DES alone models)."""
    check_steps(1, step_barrier)
    if costs.host is not None:
        raise ValueError("the period is max-plus only where ranks do not share compute; simulate steps with the DES")
    matrix = step_matrix(graph, resolve(graph, costs), costs)
    return matrix.period() if step_barrier == "none" else matrix.barrier_period()


def one_step(graph: TaskGraph, timing: Timing, costs: CostModel, engine: str, meta: dict,
             ready: np.ndarray | None = None, link_ready: np.ndarray | None = None
             ) -> tuple[Trace, np.ndarray, np.ndarray]:
    """One step from ranks free at `ready` and links at `link_ready` (default 0): its
    Trace (tail included; the shared-gradient sums have no spans), and when each rank
    (through its tail and sums) and link is free after it."""
    if engine == "exact":
        timeline = longest_path(graph, timing, ready, link_ready)
    else:
        timeline = run_des(graph, timing, costs.host, ready, link_ready)
    trace = to_trace(graph, timing, timeline, meta)
    done = np.asarray(timeline.rank_free, dtype=float).copy()
    sums = step_sums(graph, timing, costs)
    if has_tail(timing.stage_costs, costs.data_parallel):
        trace = add_step_tail(trace, graph.schedule, timing.stage_costs, costs.data_parallel, sums=sums, free=done)
        done = np.maximum(done, _tail_ends(trace, graph.schedule.ranks))
    elif sums is not None:
        done = sums.ends(done)
    return trace, done, np.asarray(timeline.link_free, dtype=float)


def simulate_steps(graph: TaskGraph, costs: CostModel, engine: str, meta: dict, steps: int, step_barrier: str,
                   first: Trace | None = None) -> Trace:
    """The Trace of `steps` steps (module doc) on `engine` ("exact" or "des"). `first`:
    the first step already simulated (with a barrier, where the data-parallel replicas
    share the host and are simulated together); only the barrier takes it."""
    check_steps(steps, step_barrier)
    timing = resolve(graph, costs)
    p = graph.schedule.ranks
    if step_barrier == "all":
        if first is None:
            first, done, _ = one_step(graph, timing, costs, engine, meta)
            period = float(done.max())
        else:
            period = _span_end(first)
        traces = [first] + [first.shifted(k * period) for k in range(1, steps)]
        info = {"period": period, "period_method": "barrier"}
        ends = [period * (k + 1) for k in range(steps)]
    else:
        check_step_costs(costs, step_barrier, timing.stage_costs)
        if costs.host is not None:
            return _shared_steps(graph, costs, meta, steps)
        ready, link_ready = np.zeros(p), None
        traces, ends = [], []
        for k in range(steps):
            trace, ready, link_ready = one_step(graph, timing, costs, engine, meta, ready, link_ready)
            traces.append(trace)
            ends.append(float(ready.max()))
        matrix = step_matrix(graph, timing, costs)
        info = {"period": matrix.period(), "period_method": "max-plus", "critical": matrix.critical()}
    starts = [float(t.start[t.lane == COMPUTE].min()) for t in traces]
    m = graph.schedule.microbatches
    out = concatenate(traces, m)
    out.meta["steps"] = {"count": steps, "barrier": step_barrier, "microbatches": m, **info,
                         "step_makespan": _span_end(traces[0]) - starts[0], "starts": starts, "ends": ends}
    return out


def _shared_steps(graph: TaskGraph, costs: CostModel, meta: dict, steps: int) -> Trace:
    """Steps without a barrier on ranks that share compute: the DES on the unrolled graph."""
    trace, starts, ends = _unrolled_run(graph, costs, meta, steps)
    if steps < PERIOD_STEPS:
        _, _, ends_for_period = _unrolled_run(graph, costs, meta, PERIOD_STEPS)
    else:
        ends_for_period = ends
    # the second half of the steps but the last, which no next step's ops slow down
    ends_for_period = ends_for_period[:-1]
    half = len(ends_for_period) // 2
    period = (ends_for_period[-1] - ends_for_period[half - 1]) / (len(ends_for_period) - half)
    trace.meta["steps"] = {"count": steps, "barrier": "none", "microbatches": graph.schedule.microbatches,
                           "period": period, "period_method": "simulated", "step_makespan": ends[0] - starts[0],
                           "starts": starts, "ends": ends}
    return trace


def _unrolled_run(graph: TaskGraph, costs: CostModel, meta: dict, steps: int
                  ) -> tuple[Trace, list[float], list[float]]:
    """The DES of `steps` steps as one graph (`unrolled`): its Trace, and each step's
    first op start and last op end."""
    sched = graph.schedule
    big = validate(unrolled(sched, steps))
    timing = resolve(big, costs)
    timeline = run_des(big, timing, costs.host)
    trace = to_trace(big, timing, timeline, meta)
    step = big.columns()["mb"] // sched.microbatches
    starts, ends = np.full(steps, np.inf), np.full(steps, -np.inf)
    np.minimum.at(starts, step, timeline.task_start)
    np.maximum.at(ends, step, timeline.task_end)
    return trace, starts.tolist(), ends.tolist()


def unrolled(schedule: Schedule, steps: int) -> Schedule:
    """`schedule` run `steps` times as one schedule: each rank's program repeated, step
    k's microbatches numbered k*m .. k*m+m-1."""
    m = schedule.microbatches

    def moved(item, k: int):
        if isinstance(item, Overlap):
            return Overlap(*(Task(t.op, t.mb + k * m, t.stage) for t in item))
        return Task(item.op, item.mb + k * m, item.stage)

    return Schedule(schedule.name, schedule.ranks, m * steps, schedule.stages, schedule.paths,
                    schedule.microbatch_paths * steps, [[moved(item, k) for k in range(steps) for item in program]
                                                        for program in schedule.programs], dict(schedule.params))


def _span_end(trace: Trace) -> float:
    """The end of a step's last op, all-reduce or optimizer step."""
    spans = (trace.lane == COMPUTE) | (trace.lane == ALLREDUCE)
    return float(trace.end[spans].max())


def concatenate(traces: list[Trace], microbatches: int) -> Trace:
    """One Trace of consecutive steps (the first's schedule and meta): step k's
    microbatches renumbered k * `microbatches` + mb (transfers and ops; an all-reduce's
    mb is its bucket and an optimizer step's 0, kept), memory summed over the steps."""
    if len(traces) == 1:
        return traces[0]
    first = traces[0]
    renumber = [np.where((t.lane == ALLREDUCE) | (t.op >= len(OPS)), 0, k * microbatches) for k, t in
                enumerate(traces)]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(t, name) for t in traces])

    mb = np.concatenate([t.mb + shift for t, shift in zip(traces, renumber)]).astype(np.int32)
    memory = [_summed([t.memory[r] for t in traces]) for r in range(first.ranks)]
    return Trace(first.schedule, first.ranks, first.microbatches * len(traces), first.source, cat("rank"),
                 cat("lane"), cat("op"), mb, cat("stage"), cat("start"), cat("end"), cat("peer"), cat("overlapped"),
                 memory, dict(first.meta))


def _summed(samples: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One rank's memory over several steps: the first step's samples with every later
    step's changes added (each step starts from the resident bytes at its first sample),
    at the same instant frees before allocations."""
    t0, b0 = samples[0]
    times = [np.asarray(t0[:1], dtype=float)]
    deltas = [np.asarray(b0[:1], dtype=float)]
    for t, b in samples:
        t, b = np.asarray(t, dtype=float), np.asarray(b, dtype=float)
        times.append(t[1:])
        deltas.append(np.diff(b))
    when, delta = np.concatenate(times), np.concatenate(deltas)
    order = np.lexsort((delta > 0, when))
    order = np.concatenate(([0], order[order != 0]))  # the first sample (resident bytes) leads
    return when[order], np.cumsum(delta[order])
