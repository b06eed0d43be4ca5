"""Calibration from runs: solo profiles, then op times read from short pipeline runs.

`calibrate_here` profiles each op with the other ranks idle. Here the ranks then run a
few steps of two built-in schedules on the same split of the same model, one with fused
backwards (BW) and one with split ones (B, W), and `simulator.run_costs` replaces the
profiled op times with the medians those runs measured: op times under the concurrency
of a real pipeline. Links, host time and memory stay as profiled.

    split (model stages per rank)   runs
    1                               1F1B, ZB-H1
    2                               interleaved 1F1B, ZB-V

Other splits, or an m the runs cannot be built for, keep the solo profile (the cost
model's meta says which).

By default (`CalibrationOptions.from_runs` None) the runs are used where each rank has a
CPU core of its own: on seeded random models (benchmarks/accuracy_random.py, numbers in
docs/accuracy.md) op times from runs predicted better there, and worse where ranks share
cores, where the solo profile's model of sharing applies. GPUs keep the solo profile.
With data parallelism (`executor.dp_calibrate`) the same runs are made with every replica
running.
"""
from __future__ import annotations

from pipesched.schedules.ir import Schedule, ScheduleError
from pipesched.schedules.registry import build
from pipesched.simulator.costs import CostModel
from pipesched.simulator.run_costs import costs_from_runs
from pipesched.simulator.trace import Trace

from . import progress
from .calibrate import CalibrationOptions, calibrate_here
from .job import RunOptions, run_schedule
from .launch import RankContext, host_cores
from .models import ExampleModel, PipelineModel

RUNS_BY_SPLIT = {1: ("1f1b", "zb-h1"), 2: ("interleaved-1f1b", "zb-v")}
RUN_STEPS, RUN_WARMUP = 3, 1


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


def uses_runs(options: CalibrationOptions, ctx: RankContext, ranks: int | None = None) -> bool:
    """Whether op times come from runs: as `options.from_runs` says, or (None) where every
    rank of one pipeline (`ranks`, default the launch's) has a CPU core of its own."""
    if options.from_runs is not None:
        return options.from_runs
    return ctx.device.type == "cpu" and (ctx.world if ranks is None else ranks) <= host_cores()


def calibrate_with_runs(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                        options: CalibrationOptions = CalibrationOptions()) -> CostModel | None:
    """Collective: `calibrate_here`, then the calibration runs; rank 0 returns the cost
    model with op times from the runs (None elsewhere)."""
    base = calibrate_here(ctx, schedule, model, options)
    if not uses_runs(options, ctx):
        return base
    traces = run_traces(ctx, schedule, model, options)
    if ctx.rank != 0:
        return None
    return costs_from_runs(base, traces) if traces else base


def run_traces(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
               options: CalibrationOptions, replicas: int = 1) -> list[tuple[Schedule, Trace]]:
    """Collective: a few steps of each of `schedule`'s calibration runs, `replicas` data-
    parallel replicas of each; on rank 0 every run with replica 0's measured Trace."""
    traces = []
    for run in calibration_runs(schedule):
        progress.say(ctx.rank, f"calibrating: op times from {RUN_STEPS} steps of {run.name}"
                     + (f" x {replicas} replicas" if replicas > 1 else ""))
        result = run_schedule(ctx, run, model, RunOptions(steps=RUN_STEPS, warmup=RUN_WARMUP, timeout=options.timeout,
                                                          check=False, dp=replicas))
        if ctx.rank == 0:
            traces.append((run, result.trace))
    return traces
