"""Predicted against measured, end to end: calibrate, simulate, execute, compare.

One launch: the ranks first calibrate (`executor.calibrate`: each rank profiles its
model stages alone, then the links are ping-ponged), then run the schedule's steps
(`executor.job`); where op times come from calibration runs
(`executor.run_calibration`), the schedule's steps alternate with theirs, so that a
host whose speed drifts slows both alike. The parent simulates the schedule under the
calibrated costs and compares the simulation with the measured step of median makespan
(`simulator.compare`); a data-parallel step's makespan with the mean over the measured
steps (`simulator.run_costs.typical_step`: an all-reduce's time varies more than an
op's, docs/data_parallel.md).

Memory is compared like for like: the executor counts activations and communication
buffers, not parameters, so the prediction compared with it leaves parameters out too;
parameter bytes per rank are reported beside it (predicted from the cost model,
measured from the modules).

Beside the prediction, the run is replayed (`simulator.replay`): simulated again with
the durations it measured, so the replay's error is the simulator's own and the rest of
the prediction's error is cost estimation.

`validate_schedules` asks which of several schedules wins: one calibration predicts all
of them, and their runs (on the same network) take their steps in turn, so the measured
ranking is not the host's drift.

With `step_barrier` "none" the steady-state period is compared too: steps taken in turn
with other runs' cannot follow each other back to back, so after the comparison above each
schedule runs its steps once more on its own, without a barrier between them, and the
median of rank 0's step-start differences is held against the simulator's period of steps
back to back (`simulator.steps`) under the same calibrated costs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pipesched.schedules.ir import Schedule
from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.compare import Comparison, compare
from pipesched.simulator.costs import CostModel
from pipesched.simulator.memory import resident_bytes
from pipesched.simulator.metrics import compute_metrics
from pipesched.simulator.replay import replay
from pipesched.simulator.run_costs import halves_apart, relative_iqr, typical_step
from pipesched.simulator.trace import Trace

from .solo_calibration import CalibrationOptions, oversubscribed
from .dp_calibrate import calibrate_data_parallel
from .job import RunOptions, RunResult, run_in_turn
from .run_calibration import calibrate_then_run, same_network
from .launch import RankContext, launch_local, run_here, under_torchrun
from .models import ExampleModel, PipelineModel


SHORT_OPS = 5.0           # warn when an op is shorter than this many times the host time per op
NOISY_STEPS = 0.05        # ... when measured steps spread (`relative_iqr`) more than this
NOISY_CALIBRATION = 0.10  # ... when interference samples differ by more than this


def shortest_op(costs: CostModel) -> tuple[float, float]:
    """(seconds of the shortest F or BW of any model stage, the runtime's own seconds per
    op outside ops: host time per op, per send, per receive and per take)."""
    o = costs.host_overhead
    stages = costs.model_stages or costs.stages
    return min(min(s.forward, s.op_time("BW")) for s in stages), o.per_op + o.per_send + o.per_recv + o.per_take


def too_short(costs: CostModel) -> bool:
    """Whether the shortest op is within SHORT_OPS times the runtime's own time per op,
    where predictions are less reliable (`validate` warns)."""
    shortest, per_op = shortest_op(costs)
    return per_op > 0 and shortest < SHORT_OPS * per_op


def median_uncertainty(spread: float, steps: int) -> float:
    """The standard error of the median of `steps` steps as a fraction of it, from their
    spread (`relative_iqr`): 1.2533 sigma / sqrt(steps), sigma = IQR / 1.349 (normal)."""
    return 1.2533 * spread / 1.349 / math.sqrt(steps)


def warnings_for(costs: CostModel, makespans: list[float]) -> list[str]:
    """Why a comparison may not carry over: ops too short next to the runtime's own time
    per op, measured steps (`makespans`, seconds) that spread more than NOISY_STEPS
    (`relative_iqr`), calibration samples that disagree."""
    out = []
    if too_short(costs):
        shortest, per_op = shortest_op(costs)
        out.append(f"the shortest op takes {shortest * 1e3:.3g} ms, within {shortest / per_op:.1f}x the runtime's own "
                   f"time per op ({per_op * 1e3:.3g} ms outside ops): predictions of such short ops are less "
                   "reliable; a larger model (--hidden, --microbatch-size) predicts better")
    if len(makespans) > 1:
        spread = relative_iqr(makespans)
        if spread > NOISY_STEPS:
            n = len(makespans)
            out.append(f"the middle half of the measured steps spans {100 * spread:.1f} % of their median: the "
                       f"machine is noisy (other processes?); the median of these {n} steps is itself uncertain "
                       f"by about {100 * median_uncertainty(spread, n):.1f} % (errors within that are the "
                       f"measurement's), and {4 * n} steps (--steps) would halve that")
    samples = (costs.meta.get("calibrated") or {}).get("interference_samples") or []
    if len(samples) > 1 and max(samples) - min(samples) > NOISY_CALIBRATION:
        out.append(f"calibration measured the slowdown of busy cores as {100 * min(samples):.0f} % to "
                   f"{100 * max(samples):.0f} % in repeated samples: the machine is noisy, predictions may be off "
                   "by that much")
    return out


@dataclass
class Validation:
    """A prediction checked against a run of the same schedule (`validate`): the
    calibrated `costs`, the `predicted` and `measured` traces (seconds, bytes) and their
    `comparison`; `run`: the RunResult; `param_bytes`: per rank, (predicted, measured)
    parameter bytes; `replayed`: the run simulated again with its own measured
    durations, and `replay_comparison` against the run (the simulator's share of the
    error). `summary()` is the `pipesched validate --json` document; `warnings()` says
    what makes the measurement less trustworthy."""

    costs: CostModel        # the calibrated cost model (parameters included)
    predicted: Trace        # the simulation; its memory leaves parameters out, like the executor's
    measured: Trace         # the measured step the run reports (`executor.job.representative_step`)
    comparison: Comparison
    run: RunResult
    param_bytes: list[tuple[float, float]]  # per rank: (predicted, measured)
    replayed: Trace                # the run simulated again with its measured durations
    replay_comparison: Comparison
    period_run: RunResult | None = None     # steps back to back without a barrier (step_barrier "none")
    predicted_period: float | None = None   # seconds per step, steps back to back (simulator.steps)

    @property
    def period_rel_error(self) -> float | None:
        """Predicted / measured period - 1, where the period was measured."""
        measured = None if self.period_run is None else self.period_run.period
        if not measured or self.predicted_period is None:
            return None
        return self.predicted_period / measured - 1

    @property
    def calibration_run_apart(self) -> float | None:
        """`calibration_run_apart` of this run under its costs."""
        return calibration_run_apart(self.costs, self.measured)

    @property
    def shared(self) -> bool:
        """Whether the ranks asked for more processors than the host has (the simulation
        shares them; timings on dedicated hardware will differ)."""
        return oversubscribed(self.costs.host, self.measured.ranks)

    def warnings(self) -> list[str]:
        """`warnings_for` this validation's costs and measured steps."""
        return warnings_for(self.costs, self.measured.meta.get("makespans") or [])

    def summary(self) -> dict:
        """The `pipesched validate --json` document."""
        c = self.comparison

        def side(metrics, trace: Trace) -> dict:
            return {"makespan": metrics.makespan, "bubble_ratio": metrics.bubble_ratio,
                    "comm_time": metrics.comm_time, "comm_hidden_fraction": metrics.comm_hidden_fraction,
                    "per_rank": [{"rank": r.rank, "busy": r.busy, "idle": r.idle, "bubble_ratio": r.bubble_ratio,
                                  "peak_memory_bytes": r.peak_memory_bytes} for r in metrics.per_rank],
                    "source": trace.source}

        host = self.costs.host
        rc = self.replay_comparison
        steps = self.measured.meta.get("makespans") or []
        replicas = self.costs.data_parallel.degree
        measured = side(c.measured, self.measured)
        measured["step_makespan"] = c.measured.makespan  # the reported step's own (the replay's reference)
        measured["makespan"] = measured_makespan(self.measured, replicas)
        return {
            "schedule": self.measured.schedule, "ranks": self.measured.ranks,
            "microbatches": self.measured.microbatches, "backend": self.run.backend,
            "model": self.measured.meta.get("model"),
            "shared_compute": self.shared,
            "host": None if host is None else {"capacity": host.capacity, "compute_demand": host.compute_demand,
                                               "wait_demand": host.wait_demand, "interference": host.interference,
                                               "pinned": host.pinned, "switching": host.switching, "gpu": host.gpu},
            "predicted": side(c.predicted, self.predicted), "measured": measured,
            "makespan_rel_error": c.makespan_rel_error, "bubble_abs_error": c.bubble_abs_error,
            "start_time_error_p50": c.start_time_error_p50, "start_time_error_p90": c.start_time_error_p90,
            "peak_memory_rel_error": c.peak_memory_rel_error,
            "replay_makespan_rel_error": rc.makespan_rel_error,
            "replay": {"makespan": rc.predicted.makespan, "bubble_ratio": rc.predicted.bubble_ratio,
                       "bubble_abs_error": rc.bubble_abs_error, "start_time_error_p50": rc.start_time_error_p50,
                       "start_time_error_p90": rc.start_time_error_p90,
                       "transfers_replayed": bool(self.replayed.meta.get("replayed_transfers")),
                       "per_rank": [{"rank": r.rank, "finish": r.predicted_finish,
                                     "finish_rel_error": r.finish_rel_error, "bubble_error": r.bubble_error}
                                    for r in rc.per_rank]},
            "per_rank": [{"rank": r.rank, "predicted_finish": r.predicted_finish,
                          "measured_finish": r.measured_finish, "finish_rel_error": r.finish_rel_error,
                          "predicted_bubble": r.predicted_bubble, "measured_bubble": r.measured_bubble,
                          "bubble_error": r.bubble_error, "predicted_peak_memory": r.predicted_peak_memory,
                          "measured_peak_memory": r.measured_peak_memory,
                          "peak_memory_rel_error": r.peak_memory_rel_error,
                          "predicted_param_bytes": pp, "measured_param_bytes": mp}
                         for r, (pp, mp) in zip(c.per_rank, self.param_bytes)],
            "per_op": [{"op": o.op, "count": o.count, "predicted_median": o.predicted_median,
                        "measured_median": o.measured_median, "rel_error": o.rel_error} for o in c.per_op],
            "step_times": self.run.step_times, "measured_makespans": steps,
            "measured_steps_spread": relative_iqr(steps) if len(steps) > 1 else None,
            "measured_halves_apart": halves_apart(steps, replicas),
            "calibration_run_apart": self.calibration_run_apart,
            "max_grad_rel_error": None if self.run.check is None else self.run.check.max_grad_rel_error,
            "loss_matches_reference": None if self.run.check is None else self.run.check.loss_matches,
            "warnings": self.warnings(),
            "period": None if self.period_run is None else {
                "predicted": self.predicted_period, "measured": self.period_run.period,
                "rel_error": self.period_rel_error, "steps": len(self.period_run.step_times),
                "predicted_throughput": self.measured.microbatches / self.predicted_period
                if self.predicted_period else None,
                "measured_throughput": self.measured.microbatches / self.period_run.period
                if self.period_run.period else None},
            "data_parallel": None if self.costs.data_parallel.degree == 1 else {
                "degree": self.costs.data_parallel.degree,
                "predicted_exposed": c.predicted.allreduce_exposed, "measured_exposed": c.measured.allreduce_exposed,
                "predicted_allreduce_time": c.predicted.allreduce_time,
                "measured_allreduce_time": c.measured.allreduce_time},
        }


def measured_makespan(trace: Trace, replicas: int = 1) -> float:
    """The measured makespan (seconds) a prediction is held against: the reported step's
    own, or with data-parallel replicas the mean over the run's measured steps
    (`simulator.run_costs.typical_step`; the step reported is the one nearest it)."""
    steps = trace.meta.get("makespans") or []
    return typical_step(steps, replicas) if replicas > 1 and steps else compute_metrics(trace).makespan


def calibration_run_apart(costs: CostModel, measured: Trace) -> float | None:
    """Where the calibration behind `costs` also ran `measured`'s schedule (at its split)
    in the same launch: this run's typical step over the calibration run's, - 1, both
    `typical_step` of their steps (how well two runs of one schedule agree here); None
    otherwise."""
    typical = (costs.meta.get("from_runs") or {}).get("typical_steps") or {}
    split, seconds = typical.get(measured.schedule, (None, None))
    steps = measured.meta.get("makespans") or []
    if split is None or split != measured.meta.get("model_stages") or not seconds or not steps:
        return None
    return typical_step(steps, costs.data_parallel.degree) / seconds - 1


def without_parameters(costs: CostModel) -> CostModel:
    """The same costs with no parameter bytes (what the executor's memory count leaves
    out); the weight-gradient bytes, which default to the parameter bytes, are kept: the
    data-parallel all-reduces and the shared-gradient sums still send them."""
    def strip(stages):
        return None if stages is None else tuple(replace(s, param_bytes=0.0, weight_grad_bytes=s.synced_bytes)
                                                 for s in stages)

    return replace(costs, stages=strip(costs.stages), model_stages=strip(costs.model_stages))


def predict(schedule: Schedule, costs: CostModel) -> Trace:
    """The simulation to hold against a measured run of `schedule`."""
    trace = simulate(validate(schedule), without_parameters(costs))
    trace.meta["memory_counted"] = "activations and communication buffers; parameters excluded"
    return trace


def calibrate_and_run(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                      calibration: CalibrationOptions, options: RunOptions):
    """Collective: calibrate, then run (with op times from runs, the run's steps in turn
    with the calibration runs'); rank 0 returns (costs, RunResult)."""
    out = calibrate_and_run_all(ctx, [schedule], [model], calibration, options)
    return None if out is None else (out[0], out[1][0], out[2] and out[2][0])


def calibrate_and_run_all(ctx: RankContext, schedules: list[Schedule], models: list, calibration: CalibrationOptions,
                          options: RunOptions):
    """Collective: calibrate once (as for the first schedule), then run every schedule on
    its model, their steps in turn with each other's and the calibration runs'; rank 0
    returns (costs, one RunResult per schedule, and with step_barrier "none" one RunResult
    per schedule of its steps back to back, else None)."""
    costs, results = calibrate_then_run(ctx, schedules[0], models[0], calibration,
                                        replace(options, step_barrier="all"),
                                        also=list(zip(schedules[1:], models[1:])))
    periods = period_runs(ctx, schedules, models, options) if options.step_barrier == "none" else None
    return (costs, results, periods) if ctx.rank == 0 else None


def check_period_options(options: RunOptions) -> None:
    """ValueError for steps back to back with data parallelism: validate --dp compares one
    step (its all-reduces are the tail of that step), not a period."""
    if options.dp > 1 and options.step_barrier == "none":
        raise ValueError("validate --dp compares one step: validate steps back to back (--step-barrier none) "
                         "without --dp")


def period_runs(ctx: RankContext, schedules: list[Schedule], models: list, options: RunOptions
                ) -> list[RunResult | None]:
    """Collective: each schedule's warm-up and measured steps once more, on its own and
    without a barrier between steps, one schedule after the other (not in turn: the period
    is the time between a schedule's own consecutive steps). Gradients are not checked
    again; rank 0 gets a RunResult each."""
    again = replace(options, step_barrier="none", check=False, warmup=max(1, options.warmup))
    return [run_in_turn(ctx, [(s, m, again)])[0] for s, m in zip(schedules, models)]


def validate_schedule(schedule: Schedule, model: PipelineModel | ExampleModel, options: RunOptions = RunOptions(),
                      calibration: CalibrationOptions = CalibrationOptions(), backend: str = "gloo"
                      ) -> Validation | None:
    """Calibrate, run, simulate, compare (None on torchrun ranks other than 0). With
    options.dp > 1 (not under torchrun) two launches (`dp_calibrate.calibrate_data_parallel`):
    solo profiles on p ranks, then on p x d ranks the data-parallel costs and the run;
    the prediction is the whole step, tail included."""
    calibration = _checked(calibration, options)
    check_period_options(options)
    if options.dp > 1:
        if under_torchrun():
            raise ValueError("validate --dp runs two launches; start it without torchrun")
        costs, result = calibrate_data_parallel(schedule, model, options.dp, calibration, backend,
                                                options.bucket_bytes, beside=options)
        return assemble(schedule, costs, result, options)
    args = (schedule, model, calibration, options)
    if under_torchrun():
        out = run_here(calibrate_and_run, args, backend, options.timeout)
    else:
        out = launch_local(calibrate_and_run, args, schedule.ranks, backend, options.timeout)
    if out is None:
        return None
    costs, result, period = out
    return assemble(schedule, costs, result, options, period)


def validate_schedules(schedules: list[Schedule], model: PipelineModel | ExampleModel,
                       options: RunOptions = RunOptions(), calibration: CalibrationOptions = CalibrationOptions(),
                       backend: str = "gloo") -> list[Validation]:
    """Which of several schedules wins on one network, predicted and measured: one
    calibration (as `validate_schedule` calibrates the first schedule), then every
    schedule run on the same network, a step of each in turn, and each compared with its
    prediction from that one cost model. The schedules need the same ranks; `model` is
    the network as split for the first, the others get it split for them
    (`network_for`). One local launch: not under torchrun, no data parallelism."""
    if not schedules:
        raise ValueError("no schedule to validate")
    if options.dp > 1 or under_torchrun():
        raise ValueError("several schedules are validated in one local launch, without --dp or torchrun")
    first = schedules[0]
    if any(s.ranks != first.ranks for s in schedules):
        raise ValueError("the schedules compared must have as many ranks: "
                         + ", ".join(f"{s.name} {s.ranks}" for s in schedules))
    models = [network_for(model, first, s) for s in schedules]
    calibration = _checked(calibration, options)
    out = launch_local(calibrate_and_run_all, (schedules, models, calibration, options), first.ranks, backend,
                       options.timeout * len(schedules))
    costs, results, periods = out
    return [assemble(s, costs, r, options, q) for s, r, q in zip(schedules, results, periods or [None] * len(results))]


def network_for(model: PipelineModel | ExampleModel, split_for: Schedule, schedule: Schedule
                ) -> PipelineModel | ExampleModel:
    """`model` (split into `split_for`'s model stages) split into `schedule`'s
    (`run_calibration.same_network`); ValueError where it cannot be."""
    have, want = split_for.num_model_stages, schedule.num_model_stages
    resplit = same_network(model, have, want)
    if resplit is None:
        raise ValueError(f"{schedule.name} cuts the network into {want} model stages and {split_for.name} into "
                         f"{have}: only an example model whose stages' blocks halve can run both "
                         "(e.g. --layers-per-stage 2)")
    return resplit


def _checked(calibration: CalibrationOptions, options: RunOptions) -> CalibrationOptions:
    """`calibration`, checked, with the run's timeout."""
    calibration.check()
    return replace(calibration, timeout=options.timeout)


def assemble(schedule: Schedule, costs: CostModel, result: RunResult, options: RunOptions = RunOptions(),
             period_run: RunResult | None = None) -> Validation:
    """Simulate under `costs` (receives posted as the run posted them) and compare with the
    run; with `period_run` (its steps back to back without a barrier) also predict the
    period of steps back to back."""
    costs = replace(costs, recv_lookahead=0 if result.backend == "nccl" else options.lookahead)
    graph = validate(schedule)
    predicted = predict(schedule, costs)
    comparison = compare(predicted, result.trace, measured_makespan(result.trace, costs.data_parallel.degree))
    params = resident_bytes(graph, costs.model_stage_costs(schedule.ranks, schedule.num_model_stages))
    measured = result.trace.meta.get("param_bytes", [float("nan")] * schedule.ranks)
    replayed = replay(graph, result.trace, without_parameters(costs))
    period = None
    if period_run is not None:
        steps = simulate(graph, without_parameters(costs), step_barrier="none")
        period = steps.meta["steps"]["period"]
    return Validation(costs, predicted, result.trace, comparison, result,
                      [(float(p), float(m)) for p, m in zip(params, measured)],
                      replayed, compare(replayed, result.trace), period_run, period)
