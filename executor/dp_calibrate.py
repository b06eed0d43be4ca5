"""Calibrating data parallelism: what p x d ranks cost beyond one pipeline's calibration.

Inside a launch of p x d ranks (as `run --dp d` launches them), every rank measures:

1. how much slower its model stage's back-to-back F + BW run when every replica
   computes than when only replica 0 does (`replica_slowdown`): the other replicas' ranks
   share this host's cores, which a single replica's calibration cannot see; the
   pipeline's op times are scaled by it;
2. its model stages' SGD step (`optimizer_time`, seconds, every rank at once as at the
   end of a step) and their gradient bytes;
3. a ring all-reduce over its DP group at several sizes, every group at once; the line
   through the medians, t = a + b * n, gives the DP link of
   `simulator.costs.DataParallel`: latency a / (2(d-1)) per ring step and bandwidth
   2(d-1)/d / b.

`with_data_parallel` folds these into the pipeline's calibrated cost model.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from pipesched.schedules.ir import Schedule
from pipesched.simulator.costs import CostModel, DataParallel

from .calibrate import CalibrationOptions, _free_running
from .clock import now
from .data_parallel import Layout, dp_groups, trainable
from .launch import RankContext
from .links import fit_link
from .models import ExampleModel, PipelineModel, check_model
from .profile import stage_for_profiling

ROUNDS = 3  # alternating rounds of replica 0 alone and every replica computing
ALLREDUCE_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)  # bytes, besides each stage's gradients


@dataclass
class DataParallelProfile:
    """What rank 0 gathers: per model stage, and the all-reduce fit (seconds, bytes)."""

    degree: int
    replica_slowdown: dict[int, float]   # model stage -> op time factor (every replica / replica 0 alone)
    optimizer_time: dict[int, float]     # model stage -> seconds of its SGD step
    grad_bytes: dict[int, float]         # model stage -> bytes of its weight gradients
    sizes: list[int]
    allreduce: list[float]               # median seconds per size (the slowest DP group)
    latency: float
    bandwidth: float

    def to_meta(self) -> dict:
        return {"degree": self.degree, "replica_slowdown": {str(k): v for k, v in self.replica_slowdown.items()},
                "allreduce_sizes": self.sizes, "allreduce_seconds": self.allreduce}


def measure_here(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel, replicas: int,
                 options: CalibrationOptions = CalibrationOptions()) -> DataParallelProfile | None:
    """Collective over p x `replicas` ranks; rank 0 returns the profile (None elsewhere)."""
    p = schedule.ranks
    layout = Layout(ctx.rank, p, replicas)
    m = schedule.microbatches * replicas
    built = model.build(schedule.num_model_stages, m) if isinstance(model, ExampleModel) else model
    specs = check_model(built, schedule.num_model_stages, m)
    own = sorted({schedule.stages[s].model_stage for s in schedule.stages_of_rank(layout.pipeline_rank)})
    stages = {k: stage_for_profiling(built, specs, k, ctx.device) for k in own}
    group = dp_groups(p, replicas)[layout.pipeline_rank]
    iterations = 3 * options.repeats

    # 1. ops with every replica computing, against replica 0 alone: a warm-up round first
    # (first calls allocate), then rounds in turn, the ratio of the medians (a busy host is noisy)
    _free_running(ctx, list(range(ctx.world)), stages[own[0]], iterations)
    alone, together = [], []
    for _ in range(ROUNDS):
        alone.append(_free_running(ctx, list(range(p)), stages[own[0]], iterations))
        together.append(_free_running(ctx, list(range(ctx.world)), stages[own[0]], iterations))
    slowdown = statistics.median(together) / statistics.median(alone) if layout.replica == 0 else 1.0

    # 2. the optimizer step of each own stage, every rank at once
    optimizer, grad_bytes = {}, {}
    for k in own:
        params = trainable(stages[k][0].module)
        grads = [torch.ones_like(q) for q in params]
        grad_bytes[k] = float(sum(q.numel() * q.element_size() for q in params))
        times = []
        for i in range(options.warmup + options.repeats):
            dist.barrier()
            start = now()
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-0.0)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            if i >= options.warmup:
                times.append(now() - start)
        optimizer[k] = statistics.median(times)
    for k in own:
        for q in stages[k][0].params:
            q.grad = None

    # 3. all-reduces over the DP groups, every group at once
    sizes = sorted(set(ALLREDUCE_SIZES) | {int(n) for n in grad_bytes.values() if n > 0})
    medians = []
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32)
        if ctx.backend == "nccl":
            buf = buf.to(ctx.device)
        times = []
        for i in range(options.warmup + options.repeats):
            dist.barrier()
            start = now()
            dist.all_reduce(buf, group=group)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            if i >= options.warmup:
                times.append(now() - start)
        medians.append(statistics.median(times))

    mine = (layout.pipeline_rank, slowdown, optimizer, grad_bytes, medians)
    gathered: list | None = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if ctx.rank != 0:
        return None
    return _assemble(schedule, replicas, sizes, gathered)


def _assemble(schedule: Schedule, replicas: int, sizes: list[int], reports: list) -> DataParallelProfile:
    p = schedule.ranks
    slow: dict[int, list[float]] = {}
    optimizer: dict[int, list[float]] = {}
    grad_bytes: dict[int, float] = {}
    for rank, (_, slowdown, opt, nbytes, _) in enumerate(reports):
        for k in opt:
            if rank < p:  # replica 0's ranks measured the factor of their stages
                slow.setdefault(k, []).append(slowdown)
            optimizer.setdefault(k, []).append(opt[k])
            grad_bytes[k] = nbytes[k]
    # a step waits for the slowest group: the slowest rank's median at each size
    allreduce = [max(r[4][i] for r in reports) for i in range(len(sizes))]
    d = replicas
    a, line_bandwidth = fit_link(sizes, allreduce)
    latency = a / (2 * (d - 1))
    bandwidth = line_bandwidth * 2 * (d - 1) / d
    return DataParallelProfile(d, {k: statistics.fmean(v) for k, v in sorted(slow.items())},
                               {k: statistics.median(v) for k, v in sorted(optimizer.items())},
                               dict(sorted(grad_bytes.items())), sizes, allreduce, latency, bandwidth)


def with_data_parallel(costs: CostModel, profile: DataParallelProfile, bucket_bytes: float | None = None) -> CostModel:
    """The pipeline's calibrated `costs` (with model_stages) as a data-parallel step:
    op times scaled by the replicas' slowdown, each model stage's optimizer time and
    gradient bytes, and the DP link."""
    stages = []
    for k, s in enumerate(costs.model_stages or ()):
        f = profile.replica_slowdown.get(k, 1.0)
        stages.append(replace(s, forward=s.forward * f, backward_input=s.backward_input * f,
                              backward_weight=s.backward_weight * f,
                              backward_full=None if s.backward_full is None else s.backward_full * f,
                              grad_accumulate=s.grad_accumulate * f,
                              optimizer_time=profile.optimizer_time.get(k, 0.0),
                              weight_grad_bytes=profile.grad_bytes.get(k, s.param_bytes)))
    meta = dict(costs.meta)
    meta["data_parallel_calibrated"] = profile.to_meta()
    return replace(costs, stages=(stages[0],) if stages else costs.stages,
                   model_stages=tuple(stages) if stages else costs.model_stages,
                   data_parallel=DataParallel(profile.degree, profile.latency, profile.bandwidth, bucket_bytes),
                   meta=meta).check()


def calibrate_data_parallel(schedule: Schedule, model: PipelineModel | ExampleModel, replicas: int,
                            options: CalibrationOptions = CalibrationOptions(), backend: str = "gloo",
                            bucket_bytes: float | None = None) -> CostModel:
    """Two local launches: the pipeline's calibration on p ranks (executor.calibrate),
    then the data-parallel measurements on p x `replicas` ranks; the whole step's costs."""
    from .calibrate import calibrate_here
    from .launch import launch_local

    options.check()
    costs = launch_local(calibrate_here, (schedule, model, options), schedule.ranks, backend, options.timeout)
    profile = launch_local(measure_here, (schedule, model, replicas, options), schedule.ranks * replicas, backend,
                           options.timeout)
    return with_data_parallel(costs, profile, bucket_bytes)
