"""One executor run inside a rank: build, warm up, measure, gather, check.

`run_schedule(ctx, schedule, model, options)` is called by every rank of an initialised
process group (from `launch_local`, `run_here` or a test's own job); rank 0 returns a
`RunResult` with the measured Trace of the step of median makespan (with data-parallel
replicas the step nearest the mean: `representative_step`), the others None.

With `options.dp` replicas (executor.data_parallel) the process group has p x d ranks;
the Trace is replica 0's (ranks 0..p-1) with its all-reduce and optimizer spans, the
step times span every replica, and the gradients checked are the whole batch's.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import Schedule
from pipesched.schedules.validate import validate
from pipesched.simulator.metrics import Metrics, compute_metrics
from pipesched.simulator.run_costs import typical_step
from pipesched.simulator.trace import ALLREDUCE, COMPUTE, OPTIMIZER, RECV, SEND, Span, Trace

from . import reference, replicas
from . import progress
from .clock import clock_offset
from .data_parallel import Layout, last_weight_tasks, replica_model
from .launch import (RankContext, available_memory, check_backend, check_launchable, deadline, launch_local,
                     run_here, under_torchrun)
from .models import ExampleModel, ModelError, PipelineModel, TensorSpec, check_layer_counts, check_model
from .runtime import RankRuntime, RankStep

MEMORY_COUNTED = ("bytes of tensors saved for backward (saved-tensor hooks) and of the gradients a split B "
                  "keeps for W, plus receive, send and hand-over buffers; one count per storage; parameters "
                  "and transient temporaries excluded")


@dataclass(frozen=True)
class RunOptions:
    """How `run` (and `validate`) run a schedule: at least `steps` measured steps after
    `warmup` unmeasured ones, and more, up to `max_steps`, until `min_time` seconds are
    measured; `timeout`: seconds any wait may take; `check`: compare the loss and
    gradients with the unpipelined model; `lookahead`: gloo receives posted this many
    program units ahead (< 0: all at the step's start); `clock_ping`: estimate clock
    offsets even on one host; `dp`: data-parallel replicas (p x dp processes);
    `bucket_bytes`: all-reduce bucket size in bytes (None: a model stage's gradients at
    once); `lr`: the SGD learning rate under data parallelism (0: weights unchanged);
    `step_barrier`: "all" (every rank waits for the others before each step) or "none"
    (a rank starts its next step as soon as its own step, optimizer step included, is
    done; steps back to back, `simulator.steps`).
    `checked()` raises ValueError for dp < 1, bucket_bytes <= 0, a negative or infinite
    min_time, max_steps < steps, or another step_barrier."""

    steps: int = 1               # measured steps, at least
    warmup: int = 0
    min_time: float = 0.0        # seconds of measured steps, at least: short steps get more of them
    max_steps: int = 200         # the most measured steps `min_time` may ask for
    timeout: float = 300.0       # seconds, every wait
    check: bool = True           # compare with the unpipelined reference
    lookahead: int = 2           # gloo: receives posted this many units ahead (< 0: all at the start)
    clock_ping: bool = False     # estimate clock offsets even on one host
    dp: int = 1                  # data-parallel replicas (p x dp processes; the batch is dp x m microbatches)
    bucket_bytes: float | None = None  # all-reduce buckets (None: a model stage's gradients at once)
    lr: float = 0.0              # the SGD step's learning rate under data parallelism (0: weights unchanged)
    step_barrier: str = "all"    # "all": a barrier before each step; "none": steps back to back

    def checked(self) -> "RunOptions":
        if not isinstance(self.dp, int) or isinstance(self.dp, bool) or self.dp < 1:
            raise ValueError(f"dp must be an integer >= 1 (replicas), got {self.dp!r}")
        if self.bucket_bytes is not None and not self.bucket_bytes > 0:
            raise ValueError(f"bucket_bytes must be > 0, got {self.bucket_bytes!r}")
        if not (0 <= self.min_time < math.inf):
            raise ValueError(f"min_time must be finite and >= 0 (seconds), got {self.min_time!r}")
        if self.max_steps < self.steps:
            raise ValueError(f"max_steps ({self.max_steps}) must be at least steps ({self.steps})")
        if self.step_barrier not in ("all", "none"):
            raise ValueError(f"step_barrier must be 'all' or 'none', got {self.step_barrier!r}")
        return self


@dataclass
class RunResult:
    """What a run measured (rank 0): `trace`, the step it reports (`representative_step`;
    seconds, bytes) and its `metrics`; `step_times`: seconds per measured step;
    `backend`; `check`: loss and gradients against the unpipelined model (None when not
    checked); `per_rank`: per rank, busy and idle seconds, bubble ratio, peak bytes, ops,
    host time per op and waiting seconds;
    `step_traces`: every measured step's trace, in order; `period`: seconds from one
    step's start to the next on rank 0's clock, the median over the measured steps
    (None with one measured step): with `step_barrier` "none", the period of steps back
    to back. `summary()` is the `pipesched run --json` document."""

    trace: Trace                 # the measured step a run reports (`representative_step`; meta["step"] says which)
    metrics: Metrics
    step_times: list[float]      # seconds per measured step (first start to last end over ranks)
    backend: str
    check: reference.Check | None
    per_rank: list[dict] = field(default_factory=list)
    step_traces: list[Trace] = field(default_factory=list)  # every measured step's, in order
    period: float | None = None  # seconds per step: median of rank 0's step-start differences
    step_barrier: str = "all"

    @property
    def step_time_median(self) -> float:
        return statistics.median(self.step_times)

    def summary(self) -> dict:
        """The `pipesched run --json` document."""
        m, t = self.metrics, self.trace
        out = {"schedule": t.schedule, "backend": self.backend, "ranks": t.ranks, "microbatches": t.microbatches,
               "model_stages": t.meta["model_stages"], "model": t.meta["model"], "steps": len(self.step_times),
               "step_time_median": self.step_time_median, "step_times": self.step_times,
               "makespan": m.makespan, "bubble_ratio": m.bubble_ratio,
               "comm_time": m.comm_time, "comm_hidden_fraction": m.comm_hidden_fraction,
               "op_time_mean": t.meta["op_time_mean"], "per_rank": self.per_rank,
               "step_barrier": self.step_barrier, "period": self.period,
               "throughput": None if not self.period else t.microbatches / self.period,
               "max_grad_rel_error": None, "loss_matches_reference": None}
        if "data_parallel" in t.meta:
            out["data_parallel"] = {**t.meta["data_parallel"], "allreduce_time": m.allreduce_time,
                                    "allreduce_exposed": m.allreduce_exposed}
        if self.check is not None:
            out.update(self.check.to_dict())
        return out


def prepare(schedule: Schedule, model: PipelineModel | ExampleModel, backend: str = "gloo",
            dp: int = 1) -> TaskGraph:
    """Everything that can be checked before a process starts: the graph (ScheduleError),
    the backend on this host (ValueError) and the model against the schedule (ModelError).
    Ranks that cannot be launched here are refused first, before any model stage is built.
    With `dp` replicas a PipelineModel holds the global batch: dp x m microbatches."""
    if not under_torchrun() and isinstance(schedule.ranks, int):
        check_launchable(schedule.ranks * dp)
    graph = validate(schedule)
    check_backend(backend, 1 if under_torchrun() else schedule.ranks * dp)
    if isinstance(model, ExampleModel):
        check_fits_host(schedule, model.check(), dp)
        model = model.build(schedule.num_model_stages, schedule.microbatches * dp)
    check_model(model, schedule.num_model_stages, schedule.microbatches * dp)
    return graph


def check_fits_host(schedule: Schedule, model: ExampleModel, dp: int = 1) -> None:
    """ModelError, before anything is allocated, when an example model's parameters and
    gradients on every local rank (each virtual stage's, so DualPipe's two replicas count
    twice; times the data-parallel replicas), plus the one copy this process builds to
    check the model, exceed the memory available on this host. Not under torchrun."""
    check_layer_counts(model.layers_per_stage, schedule.num_model_stages)  # at most MAX_BLOCKS, before counting
    memory = available_memory()
    if memory is None or under_torchrun():
        return
    per_stage = [model.stage_param_bytes(k) for k in range(schedule.num_model_stages)]
    held = 2 * dp * sum(per_stage[stage.model_stage] for stage in schedule.stages)
    need = held + sum(per_stage)
    if need > memory:
        raise ModelError(f"the model's parameters and gradients need about {need / 2**30:,.1f} GiB on this host "
                         f"and {memory / 2**30:,.1f} GiB are available: use a smaller --hidden or fewer "
                         "--layers-per-stage")


def start(schedule: Schedule, model: PipelineModel | ExampleModel, options: RunOptions = RunOptions(),
          backend: str = "gloo") -> RunResult | None:
    """Run a prepared schedule: one local process per rank, or this process's rank under
    torchrun. Rank 0 gets the RunResult (None elsewhere); a failing rank raises
    ExecutorError (locally) or exits 1 (under torchrun)."""
    options.checked()
    if under_torchrun():
        return run_here(run_schedule, (schedule, model, options), backend, options.timeout)
    return launch_local(run_schedule, (schedule, model, options), schedule.ranks * options.dp, backend,
                        options.timeout)


def launch(schedule: Schedule, model: PipelineModel | ExampleModel, options: RunOptions = RunOptions(),
           backend: str = "gloo") -> RunResult | None:
    """`prepare`, then `start`: the library's entry point for running your own modules."""
    prepare(schedule, model, backend, options.dp)
    return start(schedule, model, options, backend)


class OpenRun:
    """One schedule opened on this rank: its runtime built once, then stepped, so that
    several schedules can take steps in turn (`run_in_turn`). Opening and `finish` are
    collective: every rank opens and finishes the same runs in the same order."""

    def __init__(self, ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                 options: RunOptions = RunOptions(), built: PipelineModel | None = None):
        self.graph = graph = validate(schedule)
        d = options.dp
        if schedule.ranks * d != ctx.world:
            raise ValueError(f"schedule {schedule.name!r} has {schedule.ranks} ranks x {d} replicas, "
                             f"the process group {ctx.world}")
        m = schedule.microbatches * d
        self.ctx, self.schedule, self.model, self.options = ctx, schedule, model, options
        if built is None:  # `built`: the model already built for this split (`share_built_models`)
            built = model.build(schedule.num_model_stages, m) if isinstance(model, ExampleModel) else model
        self.built = built
        with deadline(options.timeout, "the model check"):  # the model's own forward: a hang is cut
            self.specs = check_model(built, schedule.num_model_stages, m)
        layout = Layout(ctx.rank, schedule.ranks, d)
        mine = replica_model(built, layout.replica, d) if d > 1 else built
        self.offset = clock_offset(ctx.rank, ctx.world, options.clock_ping,
                                   ctx.device if ctx.backend == "nccl" else None)
        self.runtime = RankRuntime(graph, layout.pipeline_rank, mine, self.specs, ctx.backend, ctx.device,
                                   options.timeout, options.lookahead, layout, options.bucket_bytes, options.lr)
        self.records: list[RankStep] = []
        self.wanted = options.warmup + options.steps  # steps in all; `min_time` may raise it
        self.grads: dict[int, list] | None = None     # after the last step, when checking

    @property
    def done(self) -> bool:
        return len(self.records) >= self.wanted

    def step(self) -> None:
        """Collective: one step (warm-up or measured), after a barrier unless
        `options.step_barrier` is "none"; after the first measured one, the steps
        `options.min_time` asks for are agreed."""
        if self.options.step_barrier == "all":
            dist.barrier()
        self.records.append(self.runtime.step())
        name, options = self.schedule.name, self.options
        progress.say(self.ctx.rank, f"{name}: step {len(self.records)}/{self.wanted} took "
                                    f"{self.records[-1].end - self.records[-1].start:.3g} s", step=True)
        if options.min_time > 0 and len(self.records) == options.warmup + 1:  # warm-up steps run slower
            self.wanted = options.warmup + _steps_for_min_time(self.ctx, name, self.records[-1], options)
        if options.check and self.done:  # now: another run's steps may share these parameters
            # every holder's copy, so that rank 0 can also check the replicas agree; a step
            # replaces .grad rather than zeroing it, so these survive later steps
            self.grads = {k: [None if p.grad is None else p.grad.detach().cpu() for p in sm.module.parameters()
                              if p.requires_grad] for k, sm in self.runtime.modules.items()}

    def close(self) -> None:
        self.runtime.close()

    def finish(self) -> RunResult | None:
        """Collective: gather the measured steps (after the warm-up) to rank 0, which gets
        the RunResult (None elsewhere). Call after `close`."""
        ctx, options, runtime = self.ctx, self.options, self.runtime
        records = self.records[options.warmup:]
        stage_bytes = {k: sum(p.numel() * p.element_size() for p in sm.params) for k, sm in runtime.modules.items()}
        report = RankReport(self.offset, [(r.start - self.offset, r.end - self.offset) for r in records], records,
                            statistics.median(_overhead_per_op(r) for r in records), sum(stage_bytes.values()),
                            stage_bytes)
        report.grads = self.grads
        if ctx.device.type == "cuda":
            report.cuda_max_memory_allocated = torch.cuda.max_memory_allocated(ctx.device)
        gathered: list | None = [None] * ctx.world if ctx.rank == 0 else None
        dist.gather_object(report, gathered, dst=0)
        if ctx.rank != 0:
            return None
        model = self.model
        description = repr(model) if isinstance(model, ExampleModel) else _describe_model(self.built)
        return _result(self.graph, self.built, self.specs, ctx, options, gathered, description)


def run_schedule(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                 options: RunOptions = RunOptions()) -> RunResult | None:
    """Run `options.warmup + options.steps` steps of `schedule` on this rank."""
    return run_in_turn(ctx, [(schedule, model, options)])[0]


def share_built_models(runs: list[tuple[Schedule, PipelineModel | ExampleModel, RunOptions]]
                       ) -> list[PipelineModel]:
    """The model each of `runs` steps, each example model built once per split: runs of the
    same ExampleModel at the same number of model stages and microbatches get one
    PipelineModel, so that comparing eight schedules holds about the memory of comparing
    two (a copy per split, not per schedule). Runs taken in turn may share parameters."""
    built: dict[tuple, PipelineModel] = {}
    out = []
    for schedule, model, options in runs:
        if isinstance(model, ExampleModel):
            key = (model, schedule.num_model_stages, schedule.microbatches * options.dp)
            if key not in built:
                built[key] = model.build(key[1], key[2])
            model = built[key]
        out.append(model)
    return out


def run_in_turn(ctx: RankContext, runs: list[tuple[Schedule, PipelineModel | ExampleModel, RunOptions]],
                before_step: Callable[[int], None] | None = None) -> list[RunResult | None]:
    """Collective: several schedules, each with its model and options; their warm-ups
    first, then one measured step of each in turn until each has its steps, so that a
    host whose speed drifts (shared machines) slows all of them alike. Rank 0 gets a
    RunResult per run; each run's gradients checked are those of its own last step
    (runs may share a PipelineModel's parameters). `before_step(i)`, if given, is called
    before every step of run i (e.g. to set up what that run compares)."""
    opened: list[OpenRun] = []
    try:
        for (schedule, model, options), built in zip(runs, share_built_models(runs)):
            opened.append(OpenRun(ctx, schedule, model, options, built))
        prepare = before_step or (lambda i: None)
        for i, run in enumerate(opened):
            progress.say(ctx.rank, f"running {run.schedule.name}: {run.options.warmup} warm-up and "
                                   f"{run.options.steps} measured steps")
            while len(run.records) < run.options.warmup:
                prepare(i)
                run.step()
        while not all(run.done for run in opened):
            for i, run in enumerate(opened):
                if not run.done:
                    prepare(i)
                    run.step()
    finally:
        for run in opened:
            run.close()
    return [run.finish() for run in opened]


def representative_step(makespans: list[float], replicas: int = 1) -> int:
    """The index of the measured step a run reports (its Trace): the step of median
    makespan (the lower median: a real step), or with data-parallel replicas the step
    nearest the mean makespan, the step time a prediction is held against there
    (`simulator.run_costs.typical_step`)."""
    if replicas > 1:
        mean = typical_step(makespans, replicas)
        return min(range(len(makespans)), key=lambda i: abs(makespans[i] - mean))
    return sorted(range(len(makespans)), key=makespans.__getitem__)[(len(makespans) - 1) // 2]


def _steps_for_min_time(ctx: RankContext, name: str, last: RankStep, options: RunOptions) -> int:
    """Collective: the measured steps that fill `options.min_time` at the pace of rank 0's
    first measured step, within steps..max_steps; every rank gets rank 0's count, so all
    run the same number."""
    took = max(last.end - last.start, 1e-9)
    wanted = [min(options.max_steps, max(options.steps, math.ceil(options.min_time / took)))]
    dist.broadcast_object_list(wanted, src=0)
    if wanted[0] > options.steps:
        progress.say(ctx.rank, f"running {name}: {wanted[0]} measured steps fill "
                               f"--min-time {options.min_time:g} s")
    return int(wanted[0])


@dataclass
class RankReport:
    """What a rank sends rank 0 after its steps (seconds on rank 0's clock)."""

    offset: float                        # this rank's clock offset
    bounds: list[tuple[float, float]]    # (start, end) of each measured step
    steps: list[RankStep]                # every measured step in full
    overhead_per_op: float               # median over steps of host time outside ops and waits, per op
    param_bytes: int                     # trainable parameters (and so weight gradients), bytes
    grad_bytes: dict[int, int] = field(default_factory=dict)  # the same per model stage
    grads: dict[int, list] | None = None  # model stage -> gradients, when checking
    cuda_max_memory_allocated: int | None = None


def _overhead_per_op(step: RankStep) -> float:
    return (step.end - step.start - step.host_op_time - step.host_wait_time) / max(1, len(step.compute))


def _result(graph: TaskGraph, model: PipelineModel, specs: list[TensorSpec], ctx: RankContext,
            options: RunOptions, reports: list[RankReport], description: str) -> RunResult:
    sched = graph.schedule
    steps = len(reports[0].bounds)
    step_times = [max(r.bounds[i][1] for r in reports) - min(r.bounds[i][0] for r in reports) for i in range(steps)]
    everyone, reports = reports, reports[:sched.ranks]  # replica 0's ranks make the trace
    traces = [measured_trace(graph, [(r.offset, r.steps[i]) for r in reports]) for i in range(steps)]
    if options.dp > 1:  # the other replicas' ops, which share cores with replica 0's (simulator.dedicated)
        for i, t in enumerate(traces):
            t0 = min(start - r.offset for r in reports for _, start, _ in r.steps[i].compute)
            t.meta["replica_compute"] = [[q, round(start - r.offset - t0, 9), round(end - r.offset - t0, 9)]
                                         for q, r in enumerate(everyone) if q >= sched.ranks
                                         for _, start, end in r.steps[i].compute]
    makespans = [compute_metrics(t).makespan for t in traces]
    median = representative_step(makespans, options.dp)
    trace = traces[median]
    shared = {
        "makespans": makespans,
        "backend": ctx.backend, "model_stages": sched.num_model_stages, "model": description,
        "step_times": step_times, "clock_offsets": [r.offset for r in reports],
        "activation_bytes": [s.nbytes for s in specs], "memory_counted": MEMORY_COUNTED,
        "param_bytes": [r.param_bytes for r in reports],
        "overhead_per_op": [r.overhead_per_op for r in reports],
        "recv_lookahead": 0 if ctx.backend == "nccl" else options.lookahead,  # as the runtime posted receives
    }
    if options.dp > 1:
        stage_bytes = {k: n for r in reports for k, n in r.grad_bytes.items()}
        shared["data_parallel"] = {"degree": options.dp, "bucket_bytes": options.bucket_bytes, "lr": options.lr,
                                   "grad_bytes": [stage_bytes.get(k, 0) for k in range(sched.num_model_stages)]}
    if ctx.device.type == "cuda":
        shared["cuda_max_memory_allocated"] = [r.cuda_max_memory_allocated for r in reports]
    starts = [start for start, _ in reports[0].bounds]  # rank 0's clock
    period = statistics.median(b - a for a, b in zip(starts, starts[1:])) if len(starts) > 1 else None
    shared["step_losses"] = [_step_loss(everyone, i, sched.ranks, sched.microbatches, options.dp)
                             for i in range(steps)]
    for i, t in enumerate(traces):  # "started": seconds on rank 0's clock, to order steps of runs in turn
        t.meta.update(shared, step=i, started=min(r.bounds[i][0] for r in everyone))
        if options.step_barrier == "none" and period:  # metrics then report the period and throughput
            t.meta["steps"] = {"count": 1, "barrier": "none", "microbatches": sched.microbatches, "period": period,
                               "period_method": "measured", "step_makespan": makespans[i]}
    metrics = compute_metrics(trace, graph)
    check = None
    if options.check:
        holders = replicas.holders(sched)
        grads = {k: reports[ranks[0]].grads[k] for k, ranks in holders.items()}
        p = sched.ranks  # every replica's every holder: the same gradients, bit for bit
        identical = all(_same(everyone[q * p + r].grads[k], grads[k]) for k, ranks in holders.items()
                        for r in ranks for q in range(options.dp))
        check = reference.compare(model, shared["step_losses"][-1], grads, identical)
    per_rank = [{"rank": r, "busy": rm.busy, "idle": rm.idle, "bubble_ratio": rm.bubble_ratio,
                 "peak_memory_bytes": rm.peak_memory_bytes, "ops": len(rep.steps[median].compute),
                 "overhead_per_op": rep.overhead_per_op, "wait_time": rep.steps[median].host_wait_time}
                for r, (rm, rep) in enumerate(zip(metrics.per_rank, reports))]
    return RunResult(trace, metrics, step_times, ctx.backend, check, per_rank, traces, period, options.step_barrier)


def _step_loss(reports: list[RankReport], i: int, p: int, m: int, dp: int) -> float:
    """The whole batch's loss in measured step i: every microbatch's, added in order."""
    # replica q's microbatch i is the batch's q * m + i
    losses = {q * m + mb: v for q in range(dp) for r in reports[q * p:(q + 1) * p]
              for mb, v in r.steps[i].losses.items()}
    loss = 0.0
    for mb in sorted(losses):  # in microbatch order, as the reference adds them
        loss += losses[mb]
    return loss


def measured_trace(graph: TaskGraph, steps: list[tuple[float, RankStep]]) -> Trace:
    """The Trace of one step from every rank's (clock offset, record); times in seconds
    from the earliest op start over ranks."""
    sched = graph.schedule
    t0 = min(start - offset for offset, rec in steps for _, start, _ in rec.compute)
    spans: list[Span] = []
    memory = []
    op_times: dict[tuple[str, int], list[float]] = {}
    forward_bytes: dict[int, list[int]] = {}
    kept_bytes: dict[int, list[int]] = {}
    takes: list[list] = []
    for offset, rec in steps:
        shift = offset + t0
        for t, start, end in rec.compute:
            task = graph.tasks[t]
            paired = len(graph.units[graph.task_unit[t]]) > 1
            spans.append(Span(rec.rank, COMPUTE, task.op, task.mb, task.stage, start - shift, end - shift, -1, paired))
            op_times.setdefault((task.op, sched.stages[task.stage].model_stage), []).append(end - start)
        for lane, e, peer, start, end, taken in rec.transfers:
            src = graph.tasks[graph.edges[e].src]
            spans.append(Span(rec.rank, SEND if lane == "send" else RECV, src.op, src.mb, src.stage,
                              start - shift, end - shift, peer))
            if lane == "recv" and math.isfinite(taken):
                takes.append([rec.rank, src.op, src.mb, src.stage, peer, taken - shift])
        if rec.allreduce or rec.optimizer:
            last = {k: graph.tasks[t] for k, t in last_weight_tasks(graph, rec.rank).items()}
            for k, bucket, start, end in rec.allreduce:
                spans.append(Span(rec.rank, ALLREDUCE, last[k].op, bucket, last[k].stage, start - shift, end - shift))
            for k, start, end in rec.optimizer:
                spans.append(Span(rec.rank, COMPUTE, OPTIMIZER, 0, last[k].stage, start - shift, end - shift))
        times, levels = rec.memory
        memory.append(([x - shift for x in times], levels))
        for k, v in rec.forward_bytes.items():
            forward_bytes.setdefault(k, []).extend(v)
        for k, v in rec.kept_bytes.items():
            kept_bytes.setdefault(k, []).extend(v)
    meta = {
        "op_time_mean": {f"{op}@{k}": statistics.fmean(v) for (op, k), v in sorted(op_times.items())},
        "activation_memory": {str(k): statistics.fmean(v) for k, v in sorted(forward_bytes.items())},
        "weight_memory": {str(k): statistics.fmean(v) for k, v in sorted(kept_bytes.items())},
        # per receive: [rank, op, mb, stage, sender, when its consumer began to take it (s)];
        # see simulator.replay
        "receive_takes": takes,
    }
    return Trace.from_spans(sched.name, sched.ranks, sched.microbatches, "measured", spans, memory, meta)


def _same(a: list, b: list) -> bool:
    """Bitwise equal gradient lists (None and None agree)."""
    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a, b))


def _describe_model(model: PipelineModel) -> str:
    x = model.inputs[0]
    params = sum(p.numel() for p in {id(p): p for m in model.stages for p in m.parameters()}.values())
    named = f"{model.name}: " if model.name else ""
    return (f"{named}{len(model.stages)} stages, {params} parameters, microbatch {tuple(x.shape)} "
            f"{str(x.dtype).replace('torch.', '')}")
