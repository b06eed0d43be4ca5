"""Op times read from pipeline runs: each op's cost under the run's own concurrency.

Solo profiling times each op with the other ranks idle. In a pipeline most ops run while
other ranks compute, and where ranks share a host (cores, memory bandwidth, caches) they
take longer, by an amount that depends on the machine and the model and that one factor
measured in lockstep catches poorly. A short run of a pipeline schedule measures it
directly: the mean duration of each op kind on each model stage becomes the cost model's
op time. The mean within a step, not the median: a step is a sum of durations. Across
steps, the median of those means: one step that stalls (a page fault, a preemption)
would otherwise move the whole calibration (docs/accuracy.md has the case).

Where each rank has its own core, the durations already are slowed and the simulation
no longer slows compute for sharing. Where ranks are pinned to shared cores, how much an
op is slowed follows the schedule, so the durations are turned into dedicated work first
(`simulator.dedicated`) and the simulation shares the cores again.

Runs at two splits of the same model (model stages per rank v and 2v) also give each
op kind's fixed cost, the part that does not shrink when a model stage is cut in half
(dispatch, autograd bookkeeping, taking the input): the cost model's `fixed_op_times`,
which `CostModel.model_stage_costs` keeps whole in every part; halving the whole op
predicted v = 2 schedules short.

An op kind no run executed is scaled from the solo profile: T_BW from T_B + T_W in the
ratio the profile measured, T_B and T_W from T_BW likewise. Links and memory stay as
calibrated; host time outside ops too, unless asked to be fitted to the runs' gaps
between ops (`simulator.replay.fit_host_gaps`) where each rank has its own core: a
calibration with the other ranks idle misses the runtime's cost under a running
pipeline. On shared cores the gaps also hold waits for the core, which the simulation
models, so host time stays as profiled there.

The first W or BW of each model stage on each rank in a step keeps its weight gradients
rather than adding them up and takes `grad_accumulate` less; a run's mean of those ops
holds that saving, which the simulation takes off the first again, so its share is added
back first (at the calibration's split).

Where calibration measured a stage switch (`StageSwitch`: ops right after another
stage's ops on their rank run longer), a run at the calibration's split whose ranks
switch stages (DualPipe's) has each op kind's mean divided by what its switched share
added: the op's own time, which the simulation lengthens again where a schedule switches.
Runs at the other split keep it: their fixed times hold it (`simulator.switches`).

Last, the step residual: every op and host time is scaled by how much longer the runs'
steps took than steps simulated with their own mean op times (per run, the median over
its steps; the geometric mean over the runs at the calibration's split). A step over
noisy ops is longer than one over their means (a rank waits for the later of two
inputs), and the part of a step the model misses shows up the same way; without it
predictions on a noisy host came out short (docs/accuracy.md). Held against each step's
own op times, the residual leaves out how the runs' op times differ from the pooled ones.
Runs with another number of data-parallel replicas than the costs are left out:
`executor.dp_calibrate` takes the whole step's residual once the all-reduce is in the
costs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import B, BW, F, OPS, W, Schedule
from pipesched.schedules.validate import validate

from .api import simulate
from .costs import CostError, CostModel, FixedOpTimes, HostSharing, StageCost, StageSwitch
from .dedicated import dedicated_durations, shares_cores, world_ranks
from .metrics import compute_metrics
from .replay import fit_host_gaps, host_time_gaps, task_spans
from .switches import switch_factors
from .trace import COMPUTE, Trace


def op_time_samples(schedule: Schedule, trace: Trace, durations: np.ndarray | None = None
                    ) -> dict[tuple[str, int], np.ndarray]:
    """(op, model stage) -> the measured durations (seconds) of those ops in `trace`
    (`durations`, per span, instead of the spans' own, e.g. `dedicated_durations`)."""
    comp = np.flatnonzero((trace.lane == COMPUTE) & (trace.op < len(OPS)))  # not the optimizer step
    model = np.asarray([s.model_stage for s in schedule.stages], dtype=np.int64)
    if len(comp) and int(trace.stage[comp].max()) >= len(model):
        raise CostError(f"the run of {trace.schedule!r} has stages its schedule {schedule.name!r} lacks")
    ms, op = model[trace.stage[comp]], trace.op[comp]
    took = (trace.end - trace.start if durations is None else durations)[comp]
    return {(OPS[o], int(k)): took[(op == o) & (ms == k)] for o, k in {(int(a), int(b)) for a, b in zip(op, ms)}}


def relative_iqr(values) -> float:
    """The interquartile range of `values` over their median: how much repeated
    measurements agree; unlike max - min it does not grow with their number."""
    q1, median, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(q3 - q1) / float(median)


def typical_step(makespans: Sequence[float], replicas: int = 1) -> float:
    """The measured step time (seconds) a prediction is held against, of a run's steps'
    `makespans`: their median, or with data-parallel replicas their mean. A data-parallel
    step ends with gradient all-reduces whose time varies with the host more than ops do
    (they took one of two quite different times while each step made new bucket
    buffers), so its steps can fall into groups and the median jump between them with a
    single step; the mean does not. Pipeline steps have rare outliers, which the median
    rejects (docs/data_parallel.md has the measurements)."""
    values = np.asarray(makespans, dtype=float)
    if not len(values):
        raise ValueError("no measured step")
    return float(values.mean()) if replicas > 1 else float(np.median(values))


def step_halves(values, replicas: int = 1) -> tuple[float, float] | None:
    """(`typical_step` of the even-numbered values, of the odd-numbered ones): two halves
    of one series of measurements (steps taken in turn with other work); None under two
    values."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return None
    return typical_step(values[0::2], replicas), typical_step(values[1::2], replicas)


def halves_apart(values, replicas: int = 1) -> float | None:
    """|even half / odd half - 1| (`step_halves`): how well a measurement repeats itself."""
    halves = step_halves(values, replicas)
    return None if halves is None else abs(halves[0] / halves[1] - 1.0)


def costs_from_runs(base: CostModel, runs: Sequence[tuple[Schedule, Trace]], host_time: bool = False,
                    sharing: HostSharing | None = None, residual: bool = True) -> CostModel:
    """`base` (a calibration with `model_stages`) with each model stage's op times read
    from `runs` (see the module docstring): per op kind and model stage, the median over
    the runs' steps of each step's mean. Runs split the model into as many model stages
    as `base`, or some into twice or half as many: those give the ops' fixed cost
    (`fixed_op_times`). `sharing`: how the runs' ranks shared the host; where they were
    pinned to fewer cores than ranks, durations become dedicated work and the result
    shares the cores again (`host` = `sharing` without interference, host time first).
    Otherwise `host` is None and, with `host_time`, the host time outside ops is fitted
    to every run's gaps (`replay.fit_host_gaps`; receives posted as each trace's
    meta["recv_lookahead"] says). The spread of the samples, the largest interquartile
    range over median of any op kind and stage, is kept in `meta["from_runs"]["spread"]`.
    With `residual`, op and host times are then scaled by the step residual (module
    docstring; `meta["from_runs"]["residual"]`, 1 where no run could give it)."""
    if base.model_stages is None:
        raise CostError("costs from runs need a calibration with model_stages")
    stages = len(base.model_stages)
    per_split: dict[int, dict[tuple[str, int], list[float]]] = {}
    pooled: dict[tuple[str, int], list[np.ndarray]] = {}
    dedicated = False
    for schedule, trace in runs:
        split = schedule.num_model_stages
        if split not in (stages, 2 * stages) and 2 * split != stages:
            raise CostError(f"the run of {schedule.name!r} has {split} model stages, the calibration {stages} "
                            "(runs must have as many, twice or half as many)")
        durations = None
        if sharing is not None and shares_cores(sharing, world_ranks(trace)):
            durations, dedicated = dedicated_durations(trace, sharing), True
        unswitched = _switch_factors(base.stage_switch, schedule) if split == stages else {}
        unkept = _kept_seconds(schedule, base.model_stages) if split == stages else {}
        for key, values in op_time_samples(schedule, trace, durations).items():
            if len(values):
                own_time = (float(np.mean(values)) + unkept.get(key, 0.0)) / unswitched.get(key, 1.0)
                per_split.setdefault(split, {}).setdefault(key, []).append(own_time)
                if split == stages:
                    pooled.setdefault(key, []).append(values)
    measured = {split: {key: float(np.median(v)) for key, v in means.items()}
                for split, means in per_split.items()}
    if stages not in measured:
        raise CostError(f"no run splits the model into the calibration's {stages} model stages")
    here = measured[stages]
    fixed = _fixed_op_time(here, stages, measured)
    samples = [np.concatenate(v) for v in pooled.values()]
    spread = max((relative_iqr(v) for v in samples if np.median(v) > 0), default=0.0)
    new = tuple(_measured_stage(solo, {op: here.get((op, k)) for op in OPS}, k)
                for k, solo in enumerate(base.model_stages))
    meta = {**base.meta, "from_runs": {"schedules": list(dict.fromkeys(s.name for s, _ in runs)), "steps": len(runs),
                                       "spread": spread, "samples": int(sum(len(v) for v in samples)),
                                       "dedicated": dedicated, "typical_steps": run_typical_steps(runs)}}
    host = replace(sharing, interference=0.0, host_time_first=True) if dedicated else None
    out = replace(base, stages=new[:1], model_stages=new, host=host, fixed_op_times=fixed, meta=meta).check()
    out = _host_time_from(out, runs) if host_time and not dedicated else out
    return with_step_residual(out, runs) if residual else out


def _steps_by_run(runs: Sequence[tuple[Schedule, Trace]]
                  ) -> dict[str, tuple[Schedule, list[Trace], int, list[float]]]:
    """Per run (by schedule name): (its schedule, its steps' traces, its data-parallel
    replicas, every step's makespan in seconds); empty traces left out."""
    steps: dict[str, tuple[Schedule, list[Trace], int, list[float]]] = {}
    for schedule, trace in runs:
        if len(trace):
            replicas = trace.meta.get("data_parallel", {}).get("degree", 1)
            _, traces, _, makespans = steps.setdefault(schedule.name, (schedule, [], replicas, []))
            traces.append(trace)
            makespans.append(compute_metrics(trace).makespan)
    return steps


def run_typical_steps(runs: Sequence[tuple[Schedule, Trace]]) -> dict[str, list]:
    """Per calibration run (by schedule name): [its model stages, its typical step in
    seconds] (`typical_step` over its steps' makespans): what a validated run of the same
    schedule is held against to say how well two runs of one schedule agree."""
    return {name: [schedule.num_model_stages, typical_step(makespans, replicas)]
            for name, (schedule, _, replicas, makespans) in _steps_by_run(runs).items()}


def with_step_residual(costs: CostModel, runs: Sequence[tuple[Schedule, Trace]]) -> CostModel:
    """`costs` with op and host times scaled by the step residual of `runs` (module
    docstring), kept in `meta["from_runs"]["residual"]`."""
    k = step_residual(costs, runs)
    out = costs.slower(k).check()
    return replace(out, meta={**out.meta, "from_runs": {**out.meta.get("from_runs", {}), "residual": k}})


def step_residual(costs: CostModel, runs: Sequence[tuple[Schedule, Trace]]) -> float:
    """How much longer the runs' steps took than `costs` predicts them, the geometric
    mean over the schedules run (1 with no run to read). Only runs at the split of
    `costs.model_stages` and with as many data-parallel replicas as `costs` count;
    receives posted as each run's meta says.

    Without data parallelism, per schedule the median over its steps of each step's
    makespan over the step simulated with that step's own mean op times (per op kind,
    model stage and rank; dedicated work where ranks share cores): what a step holds
    beyond its op times (a rank waiting for the later of two inputs, the step's first op,
    the runtime between ops), not how the schedule's op times differ from the pooled ones
    (1F1B's ops run longer than ZB-H1's, and scaling every schedule by that predicted
    the others long: docs/accuracy.md, "Where the error sits"). With data-parallel
    replicas, whose steps end in all-reduces that op times do not hold, its typical step
    (the mean) over the predicted one."""
    replicas = costs.data_parallel.degree
    split = len(costs.model_stages or costs.stages)
    ratios = []
    for schedule, traces, degree, makespans in _steps_by_run(runs).values():
        if schedule.num_model_stages != split or degree != replicas:
            continue
        here = replace(costs, recv_lookahead=traces[0].meta.get("recv_lookahead", costs.recv_lookahead))
        graph = validate(schedule)
        if replicas == 1:
            found = [r for r in (_over_own_means(graph, here, t) for t in traces) if r is not None]
            if found:
                ratios.append(float(np.median(found)))
            continue
        predicted = compute_metrics(simulate(graph, here)).makespan
        if predicted > 0:
            ratios.append(typical_step(makespans, replicas) / predicted)
    return float(np.exp(np.mean(np.log(ratios)))) if ratios else 1.0


def op_groups(graph: TaskGraph, by_rank: bool = True) -> list[np.ndarray]:
    """The task ids of each op kind and model stage (`by_rank`: and rank) of `graph`."""
    col, sched = graph.columns(), graph.schedule
    model = np.asarray([s.model_stage for s in sched.stages], dtype=np.int64)[col["stage"]]
    rank = col["rank"].astype(np.int64) if by_rank else np.zeros_like(model)
    key = (rank * (sched.num_model_stages + 1) + model) * 8 + col["op"]
    return [np.flatnonzero(key == k) for k in np.unique(key)]


def group_means(durations: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """`durations` (seconds per task id) with each group's replaced by their mean."""
    out = np.array(durations, dtype=float)
    for idx in groups:
        out[idx] = out[idx].mean()
    return out


def _over_own_means(graph: TaskGraph, costs: CostModel, trace: Trace) -> float | None:
    """A measured step's makespan over the step simulated under `costs` with every op
    the mean of the step's own ops of its kind, model stage and rank (dedicated work
    where `costs.host` shares cores), each first backward still its kept gradients
    shorter (`_kept_by_task`); None where the trace lacks some of the tasks."""
    span = task_spans(graph, trace)
    if (span < 0).any():
        return None
    shared = costs.host is not None and shares_cores(costs.host, trace.ranks)
    took = (dedicated_durations(trace, costs.host) if shared else trace.end - trace.start)[span]
    kept = _kept_by_task(graph, costs.model_stages or ())
    own = group_means(took + kept, op_groups(graph)) - kept
    simulated = compute_metrics(simulate(graph, costs, task_times=own)).makespan
    return compute_metrics(trace).makespan / simulated if simulated > 0 else None


def _kept_by_task(graph: TaskGraph, stages: Sequence[StageCost]) -> np.ndarray:
    """Seconds per task id: `grad_accumulate` of its model stage (`stages`) for the first
    W or BW of each model stage on each rank in a step, which only keeps its weight
    gradients rather than adding them into earlier ones (as `simulator.timing` simulates
    it); 0 for every other op."""
    col = graph.columns()
    model = np.asarray([s.model_stage for s in graph.schedule.stages], dtype=np.int64)[col["stage"]]
    backward = np.flatnonzero(np.isin(col["op"], (OPS.index(W), OPS.index(BW))))  # task ids in program order
    key = col["rank"][backward].astype(np.int64) * (graph.schedule.num_model_stages + 1) + model[backward]
    first = backward[np.unique(key, return_index=True)[1]]
    saved = np.asarray([s.grad_accumulate for s in stages] + [0.0], dtype=float)
    out = np.zeros(len(col["op"]))
    out[first] = saved[np.minimum(model[first], len(stages))]
    return out


def _kept_seconds(schedule: Schedule, stages: Sequence[StageCost]) -> dict[tuple[str, int], float]:
    """(op, model stage) -> the seconds a mean of those ops in a run of `schedule` is
    short of an op that adds its weight gradients into earlier ones: the first ones only
    keep them (`_kept_by_task`), so their share of the mean is added back."""
    graph = validate(schedule)
    col, kept = graph.columns(), _kept_by_task(graph, stages)
    model = np.asarray([s.model_stage for s in schedule.stages], dtype=np.int64)[col["stage"]]
    out = {}
    for o, k in {(int(a), int(b)) for a, b, c in zip(col["op"], model, kept) if c > 0}:
        out[(OPS[o], k)] = float(kept[(col["op"] == o) & (model == k)].mean())
    return out


def _switch_factors(switch: StageSwitch, schedule: Schedule) -> dict[tuple[str, int], float]:
    """(op, model stage) -> how much longer those ops run on average in a run of
    `schedule` for running right after another stage's ops (`StageSwitch`; 1 where none do)."""
    return switch_factors(validate(schedule), switch) if switch.any else {}


def _fixed_op_time(here: dict[tuple[str, int], float], stages: int,
                   measured: dict[int, dict[tuple[str, int], float]]) -> FixedOpTimes:
    """Each op kind's seconds that do not shrink with its model stage: with a stage
    measured whole (T) and in two halves (t1, t2) at the other split, T = c + x and
    t1 + t2 = 2c + x, so c = t1 + t2 - T; the mean over the model stages measured both
    ways (for B and W not the first: it computes no input gradient, so its W does the
    whole backward, and its halves split it otherwise), at least 0. A fused
    backward not measured both ways takes the larger of B's and W's: it is one backward
    call. All 0 without runs at another split."""
    samples: dict[str, list[float]] = {}
    for split, other in measured.items():
        if split == stages:
            continue
        whole, halves = (here, other) if split > stages else (other, here)
        for (op, k), t in whole.items():
            parts = [halves.get((op, 2 * k)), halves.get((op, 2 * k + 1))]
            if None not in parts and not (op in (B, W) and k == 0):
                samples.setdefault(op, []).append(parts[0] + parts[1] - t)
    c = {op: max(0.0, float(np.mean(v))) for op, v in samples.items()}
    b, w = c.get(B, 0.0), c.get(W, 0.0)
    return FixedOpTimes(forward=c.get(F, 0.0), backward_input=b, backward_weight=w,
                        backward_full=c.get(BW, max(b, w)))


def _host_time_from(costs: CostModel, runs: Sequence[tuple[Schedule, Trace]]) -> CostModel:
    found = [host_time_gaps(validate(schedule), trace, trace.meta.get("recv_lookahead", costs.recv_lookahead),
                            costs.overlap == 0) for schedule, trace in runs]
    found = [f for f in found if f is not None]
    if not found:
        return costs
    return fit_host_gaps(costs, np.concatenate([rows for rows, _ in found]), np.concatenate([g for _, g in found]))


def _measured_stage(solo: StageCost, measured: dict[str, float | None], k: int) -> StageCost:
    """`solo` with the op times `measured` gives; the others scaled from the solo ratios."""
    if measured[F] is None:
        raise CostError(f"no run measured a forward of model stage {k}")
    b, w, bw = measured[B], measured[W], measured[BW]
    split = solo.backward_input + solo.backward_weight
    if b is None or w is None:
        if bw is None:
            raise CostError(f"no run measured a backward of model stage {k}")
        share = solo.backward_input / split if split > 0 else 0.5
        b, w = bw * share, bw * (1 - share)
    if bw is None:
        bw = (b + w) * (solo.op_time(BW) / split if split > 0 else 1.0)
    return replace(solo, forward=measured[F], backward_input=b, backward_weight=w, backward_full=bw)
