"""One call from a schedule and a cost model to a Trace."""
from __future__ import annotations

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import Schedule
from pipesched.schedules.replicas import replicate
from pipesched.schedules.validate import gc_paused, validate

from .costs import CostError, CostModel
from .data_parallel import add_step_tail, gradients_ready, has_tail
from .des import run_des
from .exact import longest_path
from .steps import check_step_ops, check_steps, simulate_steps
from .timing import resolve, to_trace
from .trace import Trace

ENGINES = ("auto", "des", "exact")


def simulate(schedule: Schedule | TaskGraph, costs: CostModel, engine: str = "auto", *, steps: int = 1,
             step_barrier: str = "all", **options) -> Trace:
    """Predict the timeline of `schedule` under `costs` (seconds, bytes).

    engine "des" runs the discrete-event simulation (simulator.des); "exact" computes
    the longest path (simulator.exact), which cannot share compute between ranks
    (`costs.host`). Both give the same Trace for the same inputs (to 1e-9), so "auto"
    runs the exact engine, much the faster, unless ranks share compute. The Trace's
    meta names the engine that ran ("engine") and, for "auto", that it was chosen.
    options: noise_cv and rng, or task_times (seconds per task id instead of the cost
    model's op times, e.g. a run's own; see simulator.timing.resolve).

    `costs.data_parallel` (degree > 1) or a stage's optimizer_time adds the step's tail
    after the pipeline: the gradient all-reduces (lane ALLREDUCE) and the optimizer steps
    (op OPT), computed once from the pipeline's timeline (simulator.data_parallel). Where
    the replicas share the host (`costs.host`), all of them are simulated and the Trace is
    replica 0's.

    `steps` (1..1000) steps run back to back in one Trace, step k's microbatches
    numbered k*m .. k*m+m-1; `step_barrier` "all" (default: every rank finishes a step
    before any starts the next) or "none" (a rank starts the next step once its own is
    done, optimizer step included). With more than one step or no barrier,
    meta["steps"] holds the steady-state period (seconds per step: exact, the max-plus
    cycle mean, where ranks do not share compute) and `metrics` reports it with the
    throughput (simulator.steps). Noisy op times (noise_cv) take one step.

    The schedule is validated (ScheduleError) and the cost model checked (CostError)
    first; CostError too when times or memory overflow to infinity (each cost may be
    finite while their sums are not).
    """
    if not isinstance(costs, CostModel):
        raise CostError(f"costs must be a CostModel, got {type(costs).__name__}")
    costs.check()
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; engines are {', '.join(ENGINES)}")
    if engine == "exact" and costs.host is not None:
        raise ValueError("the exact engine cannot model ranks sharing compute; use the DES")
    check_steps(steps, step_barrier)
    several = steps > 1 or step_barrier != "all"
    if several and (options.get("noise_cv") or options.get("task_times") is not None):
        raise ValueError("noisy or given op times (noise_cv, task_times) take one step with a barrier; "
                         "leave steps and step_barrier out")
    graph = schedule if isinstance(schedule, TaskGraph) else validate(schedule)
    if several:
        check_step_ops(graph, costs, steps, step_barrier)
    with gc_paused(), np.errstate(over="ignore", invalid="ignore"):
        # the DES allocates millions of acyclic objects; collections would rescan them
        if several:
            trace = _simulate_steps(graph, costs, engine, steps, step_barrier)
        else:
            trace = _simulate(graph, costs, engine, **options)
        finite = np.isfinite(trace.end).all() and all(np.isfinite(b).all() for _, b in trace.memory)
    if not finite:
        raise CostError("the costs are too large: predicted times or memory overflow to infinity")
    return trace


def _engine(costs: CostModel, engine: str) -> tuple[str, dict]:
    """The engine that runs for `engine` ("auto" chooses) and the Trace's meta saying so."""
    meta = {"engine": engine}
    if engine == "auto":
        engine = "des" if costs.host is not None else "exact"
        meta = {"engine": engine, "engine_choice": "auto: " + (
            "ranks share compute" if engine == "des" else "no ranks share compute; the DES gives the same timeline")}
    if costs.host is not None:
        meta["shared_compute"] = {"capacity": costs.host.capacity, "compute_demand": costs.host.compute_demand,
                                  "wait_demand": costs.host.wait_demand}
    return engine, meta


def _simulate_steps(graph: TaskGraph, costs: CostModel, engine: str, steps: int, step_barrier: str) -> Trace:
    first = None
    if costs.data_parallel.degree > 1 and costs.host is not None and step_barrier == "all":
        first = _simulate(graph, costs, engine)  # the replicas simulated together
    engine, meta = _engine(costs, engine)
    return simulate_steps(graph, costs, engine, meta, steps, step_barrier, first)


def _simulate(graph: TaskGraph, costs: CostModel, engine: str, **options) -> Trace:
    noise = {k: v for k, v in options.items() if k in ("noise_cv", "rng", "task_times")}
    engine, meta = _engine(costs, engine)
    dp, schedule = costs.data_parallel, graph.schedule
    if dp.degree > 1 and costs.host is not None:  # the replicas share the host: simulate them together
        if noise.get("task_times") is not None:
            raise ValueError("task_times give one pipeline's ops; replicas sharing the host are simulated together")
        everyone = validate(replicate(schedule, dp.degree))
        timing = resolve(everyone, costs, **noise)
        full = to_trace(everyone, timing, run_des(everyone, timing, costs.host), meta)
        trace = full.first_ranks(schedule.ranks, schedule.microbatches)
        trace.meta["replicas_simulated"] = dp.degree
        return add_step_tail(trace, schedule, timing.stage_costs, dp, gradients_ready(full, schedule))
    timing = resolve(graph, costs, **noise)
    timeline = longest_path(graph, timing) if engine == "exact" else run_des(graph, timing, costs.host)
    trace = to_trace(graph, timing, timeline, meta)
    if has_tail(timing.stage_costs, dp):
        trace = add_step_tail(trace, schedule, timing.stage_costs, dp)
    return trace


def exact_makespan(schedule: Schedule | TaskGraph, costs: CostModel) -> float:
    """The makespan (seconds, first op start to last op end) that `simulate` with the
    exact engine and `metrics.compute_metrics` give, without building the Trace (no
    transfer spans, no memory samples): what a search needs to rank candidates. With a
    data-parallel step tail it simulates in full (the tail is computed on the trace).
    ScheduleError, CostError and ValueError as `simulate(..., engine="exact")`."""
    if not isinstance(costs, CostModel):
        raise CostError(f"costs must be a CostModel, got {type(costs).__name__}")
    costs.check()
    if costs.host is not None:
        raise ValueError("the exact engine cannot model ranks sharing compute; use the DES")
    graph = schedule if isinstance(schedule, TaskGraph) else validate(schedule)
    if has_tail(costs.model_stage_costs(graph.schedule.ranks, graph.schedule.num_model_stages), costs.data_parallel):
        from .metrics import compute_metrics  # the step's tail is worked out on the trace
        return compute_metrics(simulate(graph, costs, engine="exact")).makespan
    with gc_paused(), np.errstate(over="ignore", invalid="ignore"):
        timeline = longest_path(graph, resolve(graph, costs))
        start, end = np.asarray(timeline.task_start), np.asarray(timeline.task_end)
        if not (len(end) and np.isfinite(end).all()):
            raise CostError("the costs are too large: predicted times or memory overflow to infinity")
        return float(end.max()) - float(start.min())
