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

    split (model stages per rank)   runs                       and at the other split
    1                               1F1B, ZB-H1                ZB-V (v = 2)
    2                               interleaved 1F1B, ZB-V     ZB-H1 (v = 1)

The run at the other split splits the same network in twice or half as many model
stages; with it each op kind's fixed cost, which does not shrink when a stage is cut,
is known, and one cost file predicts v = 1 and v = 2 schedules alike. It needs a model
that can be split both ways: the example models (`ExampleModel`) with even block counts
to halve; other models go without it. Where ranks are pinned to shared cores the op
durations are read as dedicated work and shared again in the simulation
(`simulator.dedicated`). Other splits, or an m the runs cannot be built for, keep the
solo profile (the cost model's meta says which).

By default (`CalibrationOptions.from_runs` None) the runs are used on CPUs: on seeded
random models (benchmarks/accuracy_random.py, numbers in docs/accuracy.md) op and host
times from runs predicted better than solo profiles with a core per rank, and, once the
host time came from the runs too, also where two ranks share a core (before, op times
alone from runs predicted worse there than the solo profile's model of sharing). GPUs
keep the solo profile. With data parallelism (`executor.dp_calibrate`) the same runs are
made with every replica running.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pipesched.schedules.ir import Schedule, ScheduleError
from pipesched.schedules.registry import build
from pipesched.simulator.costs import CostModel
from pipesched.simulator.run_costs import costs_from_runs
from pipesched.simulator.trace import Trace

from . import progress
from .solo_calibration import CalibrationOptions, calibrate_here
from .job import RunOptions, RunResult, run_in_turn, run_schedule
from .launch import RankContext
from .models import ExampleModel, PipelineModel

RUNS_BY_SPLIT = {1: ("1f1b", "zb-h1"), 2: ("interleaved-1f1b", "zb-v")}
OTHER_SPLIT = {1: ("zb-v", 2), 2: ("zb-h1", 1)}  # split -> (run, its split): the ops' fixed cost
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


def other_split_run(schedule: Schedule, model: PipelineModel | ExampleModel
                    ) -> tuple[Schedule, ExampleModel] | None:
    """The run at the other split (see the table) with the same network split for it,
    or None where the model cannot be split so or the run not built."""
    p, m = schedule.ranks, schedule.microbatches
    split, rest = divmod(schedule.num_model_stages, p)
    if rest or split not in OTHER_SPLIT or not isinstance(model, ExampleModel):
        return None
    name, to = OTHER_SPLIT[split]
    resplit = same_network(model, schedule.num_model_stages, p * to)
    if resplit is None:
        return None
    try:
        return build(name, p, m), resplit
    except ScheduleError:
        return None


def same_network(model: PipelineModel | ExampleModel, stages: int, to: int) -> PipelineModel | ExampleModel | None:
    """`model` (in `stages` model stages) as the same network in `to`: itself where they
    are as many, an example model with its blocks halved or paired (`resplit_blocks`),
    None where it cannot be split so."""
    if stages == to:
        return model
    blocks = resplit_blocks(model.layers_per_stage, stages, to) if isinstance(model, ExampleModel) else None
    return None if blocks is None else replace(model, layers_per_stage=blocks)


def resplit_blocks(blocks: int | tuple[int, ...], stages: int, to: int) -> int | tuple[int, ...] | None:
    """Blocks per model stage of the same network in `to` model stages instead of
    `stages` (twice or half as many), or None where a stage's blocks do not halve."""
    counts = [blocks] * stages if isinstance(blocks, int) else list(blocks)
    if to == 2 * stages:
        if any(c % 2 for c in counts):
            return None
        out = [c // 2 for c in counts for _ in range(2)]
    elif 2 * to == stages:
        out = [counts[2 * k] + counts[2 * k + 1] for k in range(to)]
    else:
        return None
    return out[0] if isinstance(blocks, int) and len(set(out)) == 1 else tuple(out)


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
                       options: CalibrationOptions, run: RunOptions | None = None,
                       also: Sequence[tuple[Schedule, PipelineModel | ExampleModel]] = ()
                       ) -> tuple[CostModel | None, list[RunResult]]:
    """Collective: `calibrate_here`, the calibration runs where op times come from runs,
    and with `run` also `schedule`'s own run and those of `also` (other schedules of the
    same network, each with its model), their steps in turn with theirs (`run_traces`).
    Rank 0 gets (the cost model, the RunResults of `schedule` and `also`, none without
    `run`); the other ranks (None, [])."""
    base = calibrate_here(ctx, schedule, model, options)
    if not uses_runs(options, ctx):
        results = [run_schedule(ctx, s, m, run) for s, m in [(schedule, model), *also]] if run is not None else []
        return (base, results) if ctx.rank == 0 else (None, [])
    traces, results = run_traces(ctx, schedule, model, options, beside=run, also=also)
    if ctx.rank != 0:
        return None, []
    return (costs_from_runs(base, traces, host_time=True, sharing=base.host) if traces else base), results


def run_traces(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
               options: CalibrationOptions, replicas: int = 1, beside: RunOptions | None = None,
               also: Sequence[tuple[Schedule, PipelineModel | ExampleModel]] = ()
               ) -> tuple[list[tuple[Schedule, Trace]], list[RunResult]]:
    """Collective: steps of each of `schedule`'s calibration runs, `replicas` data-parallel
    replicas of each. With `beside` (its `dp` must be `replicas`), `schedule` and the
    schedules of `also` run too, as `beside` says, and the calibration runs take as many
    steps as they do, one step of each in turn (`job.run_in_turn`): a host whose speed
    drifts, as shared machines' does, then slows the calibration and the runs alike.
    Rank 0 gets (every measured step of every calibration run as (run, replica 0's
    Trace), the RunResults of `schedule` and `also`, none without `beside`)."""
    runs = [(r, model) for r in calibration_runs(schedule)]
    other = other_split_run(schedule, model) if runs else None
    runs += [other] if other is not None else []
    if beside is not None and beside.dp != replicas:
        raise ValueError(f"the run beside the calibration has {beside.dp} replicas, the calibration {replicas}")
    steps = RunOptions(steps=RUN_STEPS, warmup=RUN_WARMUP, timeout=options.timeout, dp=replicas) if beside is None \
        else replace(beside, lr=0.0)  # a PipelineModel's parameters are shared with the run beside
    what = f"{steps.steps}+ steps" if steps.min_time > 0 else f"{steps.steps} steps"
    progress.say(ctx.rank, f"calibrating: op times from {what} of {', '.join(r.name for r, _ in runs) or 'no run'}"
                 + (f" x {replicas} replicas" if replicas > 1 else "")
                 + (f", in turn with {', '.join(s.name for s, _ in [(schedule, model), *also])}'s"
                    if beside is not None else ""))
    if also and beside is None:
        raise ValueError("other schedules run beside the calibration only with run options (beside)")
    plan = [(r, m, replace(steps, check=False)) for r, m in runs] + \
        ([(s, m, beside) for s, m in [(schedule, model), *also]] if beside is not None else [])
    results = run_in_turn(ctx, plan) if plan else []
    if ctx.rank != 0:
        return [], []
    traces = [(r, t) for (r, _), result in zip(runs, results) for t in result.step_traces]
    return traces, results[len(runs):]
