"""Calibration from runs: solo profiles, then op times read from short pipeline runs.

`calibrate_here` profiles each op with the other ranks idle. Here the ranks then run a
few steps of two built-in schedules on the same split of the same model, one with fused
backwards (BW) and one with split ones (B, W), and `simulator.run_costs` replaces the
profiled op times with the medians over every measured step of those runs (op times
under the concurrency of a real pipeline) and the host time outside ops with the one
fitted to their gaps between ops. Links and memory stay as profiled.

Where a run is calibrated for (`validate`), it takes its steps in turn with the
calibration runs (`job.run_in_turn`), and they take as many as it: a shared host's
speed drifts by tens of percent within seconds, and calibrating first, then running,
let that drift into the prediction's error.

    split (model stages per rank)   runs
    1                               1F1B, ZB-H1
    2                               interleaved 1F1B, ZB-V

Other splits, or an m the runs cannot be built for, keep the solo profile (the cost
model's meta says which).

By default (`CalibrationOptions.from_runs` None) the runs are used on CPUs: on seeded
random models (benchmarks/accuracy_random.py, numbers in docs/accuracy.md) op and host
times from runs predicted better than solo profiles with a core per rank, and, once the
host time came from the runs too, also where two ranks share a core (before, op times
alone from runs predicted worse there than the solo profile's model of sharing). GPUs
keep the solo profile. With data parallelism (`executor.dp_calibrate`) the same runs are
made with every replica running.
"""
from __future__ import annotations

from dataclasses import replace

from pipesched.schedules.ir import Schedule, ScheduleError
from pipesched.schedules.registry import build
from pipesched.simulator.costs import CostModel
from pipesched.simulator.run_costs import costs_from_runs
from pipesched.simulator.trace import Trace

from . import progress
from .calibrate import CalibrationOptions, calibrate_here
from .job import RunOptions, RunResult, run_in_turn, run_schedule
from .launch import RankContext
from .models import ExampleModel, PipelineModel

RUNS_BY_SPLIT = {1: ("1f1b", "zb-h1"), 2: ("interleaved-1f1b", "zb-v")}
RUN_STEPS, RUN_WARMUP = 5, 1  # a calibration run's measured steps, pooled, without a run beside


def calibration_runs(schedule: Schedule) -> list[Schedule]:
    """The schedules whose runs calibrate `schedule`'s op times (see the table)."""
    p, m = schedule.ranks, schedule.microbatches
    split, rest = divmod(schedule.num_model_stages, p)
    runs = []
    for name in RUNS_BY_SPLIT.get(split, ()) if rest == 0 else ():
        try:
            runs.append(build(name, p, m))
        except ScheduleError:  # e.g. an m the schedule does not take
            pass
    return runs


def uses_runs(options: CalibrationOptions, ctx: RankContext) -> bool:
    """Whether op times come from runs: as `options.from_runs` says, or (None) on CPUs."""
    if options.from_runs is not None:
        return options.from_runs
    return ctx.device.type == "cpu"


def calibrate_with_runs(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                        options: CalibrationOptions = CalibrationOptions()) -> CostModel | None:
    """Collective: `calibrate_here`, then the calibration runs; rank 0 returns the cost
    model with op and host times from the runs (None elsewhere)."""
    costs, _ = calibrate_then_run(ctx, schedule, model, options)
    return costs


def calibrate_then_run(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                       options: CalibrationOptions, run: RunOptions | None = None
                       ) -> tuple[CostModel | None, RunResult | None]:
    """Collective: `calibrate_here`, the calibration runs where op times come from runs,
    and with `run` also `schedule`'s own run, its steps in turn with theirs
    (`run_traces`). Rank 0 gets (the cost model, `schedule`'s RunResult or None); the
    other ranks (None, None)."""
    base = calibrate_here(ctx, schedule, model, options)
    if not uses_runs(options, ctx):
        result = run_schedule(ctx, schedule, model, run) if run is not None else None
        return base, result
    traces, result = run_traces(ctx, schedule, model, options, beside=run)
    if ctx.rank != 0:
        return None, None
    return (costs_from_runs(base, traces, host_time=True) if traces else base), result


def run_traces(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
               options: CalibrationOptions, replicas: int = 1, beside: RunOptions | None = None
               ) -> tuple[list[tuple[Schedule, Trace]], RunResult | None]:
    """Collective: steps of each of `schedule`'s calibration runs, `replicas` data-parallel
    replicas of each. With `beside` (its `dp` must be `replicas`), `schedule` runs too, as
    `beside` says, and the calibration runs take as many steps as it, one step of each in
    turn (`job.run_in_turn`): a host whose speed drifts, as shared machines' does, then
    slows the calibration and the run alike. Rank 0 gets (every measured step of every
    calibration run as (run, replica 0's Trace), `schedule`'s RunResult or None)."""
    runs = calibration_runs(schedule)
    if beside is not None and beside.dp != replicas:
        raise ValueError(f"the run beside the calibration has {beside.dp} replicas, the calibration {replicas}")
    steps = RunOptions(steps=RUN_STEPS, warmup=RUN_WARMUP, timeout=options.timeout, dp=replicas) if beside is None \
        else replace(beside, lr=0.0)  # a PipelineModel's parameters are shared with the run beside
    what = f"{steps.steps}+ steps" if steps.min_time > 0 else f"{steps.steps} steps"
    progress.say(ctx.rank, f"calibrating: op times from {what} of {', '.join(r.name for r in runs) or 'no run'}"
                 + (f" x {replicas} replicas" if replicas > 1 else "")
                 + (f", in turn with {schedule.name}'s" if beside is not None else ""))
    plan = [(r, model, replace(steps, check=False)) for r in runs] + \
        ([(schedule, model, beside)] if beside is not None else [])
    results = run_in_turn(ctx, plan) if plan else []
    if ctx.rank != 0:
        return [], None
    traces = [(r, t) for r, result in zip(runs, results) for t in result.step_traces]
    return traces, (results[-1] if beside is not None else None)
