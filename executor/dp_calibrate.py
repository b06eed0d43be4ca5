"""Calibrating data parallelism: what p x d ranks cost beyond one pipeline's calibration.

Inside a launch of p x d ranks (as `run --dp d` launches them), every rank measures:

1. how much slower its model stage's back-to-back F + BW run when every replica
   computes than when only replica 0 does (`replica_slowdown`): the other replicas' ranks
   share this host's cores, which a single replica's calibration cannot see. Measured
   only where op times come from solo profiles: with more ranks than cores, the ranks share them
   pinned round-robin (`replica_sharing`), the factor beyond the ranks per core is the
   switching cost, and the simulator runs every replica together, so a rank is slowed
   only while its core's other ranks compute; with a core each, the factor is the other
   cores' interference and scales the op times;
2. its model stages' SGD step (`optimizer_time`, seconds, every rank at once as at the
   end of a step) and their gradient bytes;
3. a bucket of gradients all-reduced over its DP group as the run does it
   (`data_parallel.allreduce_bucket`: flattened, all-reduced, copied back) at several
   sizes, every group at once; the line through the medians, t = a + b * n, gives the
   DP link of `simulator.costs.DataParallel`: latency a / (2(d-1)) per ring step and
   bandwidth 2(d-1)/d / b;
4. where op times come from runs (`run_calibration.uses_runs`: on CPUs by default),
   steps of the calibration runs with every replica running (with `validate`, in turn
   with the validated run's steps): their op times replace the pipeline's (where the
   p x d ranks share cores, as dedicated work with the other replicas' ops undone,
   `simulator.dedicated`, and the replicas are simulated sharing the cores; the
   free-running factor over-states the sharing, since in a step a rank often computes
   while its core's other rank waits: docs/data_parallel.md), and their all-reduce spans
   slow the link (a rank's all-reduce also waits for the other replicas).

`with_data_parallel` folds these into the pipeline's calibrated cost model.
"""
from __future__ import annotations

import concurrent.futures as cf
import math
import socket
import statistics
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from pipesched.schedules.ir import Schedule
from pipesched.simulator.costs import CostModel, DataParallel, HostSharing
from pipesched.simulator.run_costs import costs_from_runs, with_step_residual
from pipesched.simulator.trace import Trace
from pipesched.simulator.data_parallel import allreduce_after_ready

from .solo_calibration import CalibrationOptions, _free_running
from .clock import now
from .data_parallel import Layout, allreduce_bucket, bucket_buffer, dp_groups, sgd_step, trainable
from .job import RunOptions, RunResult, run_schedule
from .launch import RankContext, deadline
from .placement import host_cores
from .links import fit_link
from .models import ExampleModel, PipelineModel, check_model
from .profile import stage_for_profiling
from .run_calibration import run_traces, uses_runs

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
    cores: int = 1        # the host's cores the launch shared (`placement.host_cores`)
    threads: int = 1      # intra-op threads per rank in the launch
    one_host: bool = True
    runs: list = field(default_factory=list)  # (Schedule, replica 0's Trace) per measured step of the calibration runs

    def to_meta(self) -> dict:
        return {"degree": self.degree, "replica_slowdown": {str(k): v for k, v in self.replica_slowdown.items()},
                "allreduce_sizes": self.sizes, "allreduce_seconds": self.allreduce, "cores": self.cores,
                "threads_per_rank": self.threads, "one_host": self.one_host,
                "runs": sorted({schedule.name for schedule, _ in self.runs}), "run_steps": len(self.runs)}


def measure_here(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel, replicas: int,
                 options: CalibrationOptions = CalibrationOptions(), beside: RunOptions | None = None
                 ) -> tuple[DataParallelProfile | None, RunResult | None]:
    """Collective over p x `replicas` ranks; rank 0 returns (the profile, RunResult or
    None), the other ranks (None, None). With `beside` (a run of `schedule` with
    `replicas` replicas) `schedule` also runs: its steps in turn with the calibration
    runs' where op times come from runs (`run_calibration.run_traces`), after the
    measurements otherwise."""
    p = schedule.ranks
    layout = Layout(ctx.rank, p, replicas)
    m = schedule.microbatches * replicas
    built = model.build(schedule.num_model_stages, m) if isinstance(model, ExampleModel) else model
    with deadline(ctx.timeout, "the model check"):  # the model's own forward: a hang is cut
        specs = check_model(built, schedule.num_model_stages, m)
    own = sorted({schedule.stages[s].model_stage for s in schedule.stages_of_rank(layout.pipeline_rank)})
    stages = {k: stage_for_profiling(built, specs, k, ctx.device) for k in own}
    group = dp_groups(p, replicas)[layout.pipeline_rank]
    iterations = 3 * options.repeats

    from_runs = uses_runs(options, ctx)

    # 1. without runs: ops with every replica computing, against replica 0 alone: a warm-up
    # round first (first calls allocate), then rounds in turn, the ratio of the medians
    slowdown = None
    if not from_runs:
        _free_running(ctx, list(range(ctx.world)), stages[own[0]], iterations)
        alone, together = [], []
        for _ in range(ROUNDS):
            alone.append(_free_running(ctx, list(range(p)), stages[own[0]], iterations))
            together.append(_free_running(ctx, list(range(ctx.world)), stages[own[0]], iterations))
        if layout.replica == 0:  # the other replicas' ranks sat out the rounds "alone"
            slowdown = statistics.median(together) / statistics.median(alone)

    # 2. the optimizer step of each own stage as the run takes it (`sgd_step`), every rank at once
    optimizer, grad_bytes = {}, {}
    for k in own:
        params = trainable(stages[k][0].module)
        for q in params:
            q.grad = torch.ones_like(q)
        grad_bytes[k] = float(sum(q.numel() * q.element_size() for q in params))
        times = []
        for i in range(options.warmup + options.repeats):
            dist.barrier()
            start = now()
            sgd_step(params, 0.0)
            if i >= options.warmup:
                times.append(now() - start)
        optimizer[k] = statistics.median(times)
        for q in params:
            q.grad = None

    # 3. gradient buckets all-reduced as the run does (`allreduce_bucket`), every group at
    # once, in a thread as the run's DP lane does: two gradients of n/2 bytes per size
    sizes = sorted(set(ALLREDUCE_SIZES) | {int(n) for n in grad_bytes.values() if n > 0})
    medians = []
    with cf.ThreadPoolExecutor(max_workers=1) as lane:
        for n in sizes:
            half = max(1, n // 8)
            grads = [torch.zeros(half, dtype=torch.float32, device=ctx.device) for _ in range(2)]
            flat = bucket_buffer(grads)  # kept over the repeats, as a run keeps its buckets'
            times = []
            for i in range(options.warmup + options.repeats):
                dist.barrier()
                start = now()
                lane.submit(allreduce_bucket, grads, group, options.timeout, flat).result()
                if i >= options.warmup:
                    times.append(now() - start)
            medians.append(statistics.median(times))

    # 4. op times with every replica running: the calibration runs (1F1B and ZB-H1 for one
    # model stage per rank), d replicas of each
    runs, results = run_traces(ctx, schedule, model, options, replicas, beside) if from_runs else ([], [])
    result = results[0] if results else None
    if beside is not None and not from_runs:
        result = run_schedule(ctx, schedule, model, beside)

    mine = (layout.pipeline_rank, slowdown, optimizer, grad_bytes, medians, socket.gethostname())
    gathered: list | None = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if ctx.rank != 0:
        return None, None
    profile = _assemble(schedule, replicas, sizes, gathered)
    return replace(profile, cores=host_cores(), threads=torch.get_num_threads(),
                   one_host=len({r[5] for r in gathered}) == 1, runs=runs), result


def _assemble(schedule: Schedule, replicas: int, sizes: list[int], reports: list) -> DataParallelProfile:
    p = schedule.ranks
    slow: dict[int, list[float]] = {}
    optimizer: dict[int, list[float]] = {}
    grad_bytes: dict[int, float] = {}
    for rank, (_, slowdown, opt, nbytes, *_) in enumerate(reports):
        for k in opt:
            if rank < p and slowdown is not None:  # replica 0's ranks measured the factor of their stages
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


def cores_shared(rank: int, ranks: int, cores: int) -> int:
    """How many of `ranks` ranks, pinned round-robin (`placement.rank_cores`), share
    `rank`'s core: 1 where every rank has cores of its own."""
    return 1 if ranks <= cores else len(range(rank % cores, ranks, cores))


def replica_sharing(costs: CostModel, profile: DataParallelProfile, ranks: int) -> HostSharing | None:
    """How the `ranks` x profile.degree ranks of a CPU launch on one host share its cores
    (None where each has cores of its own, or on GPUs): pinned round-robin, and on a
    shared core `switching` slower than a fair share. The switching is what makes
    replica_slowdown (all ranks computing against replica 0's alone) exceed the ratio of
    ranks per core; where replica 0's ranks already shared cores, the ratio holds the
    switching on both sides and the pipeline's calibrated one is kept."""
    world = ranks * profile.degree
    if not profile.one_host or costs.meta.get("calibrated", {}).get("device", "cpu") != "cpu" or world <= profile.cores:
        return None
    before = costs.host
    interference = before.interference if before is not None else 0.0
    alone, together = cores_shared(0, ranks, profile.cores), cores_shared(0, world, profile.cores)
    if alone > 1 and before is not None:
        switching = before.switching
    else:
        factors = list(profile.replica_slowdown.values()) or [float(together)]
        switching = max(0.0, statistics.median(factors) / together - 1.0)
    return HostSharing(capacity=float(profile.cores), compute_demand=1.0, interference=interference, pinned=True,
                       switching=switching).check()


def allreduce_in_runs(profile: DataParallelProfile, link: DataParallel) -> float:
    """How much longer the gradient all-reduces of the calibration runs took than `link`
    says: the median over their buckets of measured over predicted seconds (1 without
    any), over the buckets the size of the profiled split's own (within 1.5x of the
    nearest size the runs have): on a shared host a large bucket is slowed more than a
    small one (docs/data_parallel.md), and the calibration runs at the other split have
    buckets half or twice the size. Measured from when every replica's copy of the
    stage was ready (`simulator.data_parallel.allreduce_after_ready`), since the
    simulation waits for the replicas itself; what is left is the all-reduce sharing
    its core with the run's compute and the step's other threads, which the
    all-reduces timed alone do not show."""
    own = [n for k in sorted(profile.grad_bytes) for n in link.buckets(profile.grad_bytes[k])]
    samples = []  # (log distance to the nearest own bucket size, measured over predicted)
    for schedule, trace in profile.runs:
        stage_bytes = run_grad_bytes(profile, schedule, trace)
        run_link = replace(link, bucket_bytes=(trace.meta.get("data_parallel") or {}).get("bucket_bytes"))
        for _, stage, bucket, took in allreduce_after_ready(trace):
            sizes = run_link.buckets(stage_bytes[schedule.stages[stage].model_stage])
            nbytes = sizes[min(bucket, len(sizes) - 1)] if sizes else 0.0
            predicted = run_link.allreduce_time(nbytes)
            if predicted > 0 and nbytes > 0:
                near = min((abs(math.log(nbytes / n)) for n in own if n > 0), default=0.0)
                samples.append((near, took / predicted))
    if not samples:
        return 1.0
    nearest = min(near for near, _ in samples)
    return statistics.median(r for near, r in samples if near <= nearest + math.log(1.5))


def run_grad_bytes(profile: DataParallelProfile, schedule: Schedule, trace: Trace) -> list[float]:
    """Bytes of each model stage's weight gradients in a calibration run of `schedule`:
    as the run recorded them, else the profile's where the run splits the network as the
    profile does, else the profile's total split evenly (a run at another split of the
    same network, `run_calibration.other_split_run`)."""
    recorded = (trace.meta.get("data_parallel") or {}).get("grad_bytes")
    if recorded and len(recorded) == schedule.num_model_stages:
        return [float(n) for n in recorded]
    if len(profile.grad_bytes) == schedule.num_model_stages:
        return [float(profile.grad_bytes.get(k, 0.0)) for k in range(schedule.num_model_stages)]
    return [sum(profile.grad_bytes.values()) / schedule.num_model_stages] * schedule.num_model_stages


def with_data_parallel(costs: CostModel, profile: DataParallelProfile, ranks: int,
                       bucket_bytes: float | None = None) -> CostModel:
    """The pipeline's calibrated `costs` (with model_stages, for `ranks` pipeline ranks)
    as a data-parallel step: each model stage's optimizer time and gradient bytes, the
    DP link (slowed as the calibration runs' all-reduces were, `allreduce_in_runs`), and
    the op times with every replica running. Those are, in order of
    preference: what the calibration runs of every replica measured (`profile.runs`;
    where the p x d ranks share cores, read as dedicated work and simulated sharing
    them, `simulator.dedicated`; otherwise the sharing is in them); the profiled op
    times, with the p x d ranks simulated sharing the host (`replica_sharing`); the
    profiled op times scaled by the replicas' slowdown where each rank has cores of its
    own. With runs, op and host times then take the whole step's residual
    (`run_costs.with_step_residual`: the runs' steps, all-reduce included, over their
    prediction)."""
    host = None
    link = DataParallel(profile.degree, profile.latency, profile.bandwidth, bucket_bytes)
    slower = 1.0
    if profile.runs:  # on shared cores: dedicated work, the p x d ranks simulated sharing them again
        costs = costs_from_runs(costs, profile.runs, host_time=True, sharing=replica_sharing(costs, profile, ranks),
                                residual=False)
        slower = allreduce_in_runs(profile, link)
        link = replace(link, latency=link.latency * slower, bandwidth=link.bandwidth / slower)
    else:
        host = replica_sharing(costs, profile, ranks)
    stages = [replace(s if profile.runs or host is not None else s.slower(profile.replica_slowdown.get(k, 1.0)),
                      optimizer_time=profile.optimizer_time.get(k, 0.0),
                      weight_grad_bytes=profile.grad_bytes.get(k, s.param_bytes))
              for k, s in enumerate(costs.model_stages or ())]
    meta = dict(costs.meta)
    meta["data_parallel_calibrated"] = {**profile.to_meta(), "allreduce_slower_in_runs": slower}
    out = replace(costs, stages=(stages[0],) if stages else costs.stages,
                  model_stages=tuple(stages) if stages else costs.model_stages,
                  host=host if host is not None else costs.host,
                  data_parallel=link, meta=meta).check()
    return with_step_residual(out, profile.runs) if profile.runs else out


def calibrate_data_parallel(schedule: Schedule, model: PipelineModel | ExampleModel, replicas: int,
                            options: CalibrationOptions = CalibrationOptions(), backend: str = "gloo",
                            bucket_bytes: float | None = None, beside: RunOptions | None = None
                            ) -> tuple[CostModel, RunResult | None]:
    """Two local launches: each rank's solo profile and the links on p ranks
    (`calibrate.calibrate_here`; where op and host times come from runs, the second
    launch's runs of every replica replace them), then the data-parallel measurements
    on p x `replicas` ranks (`measure_here`, with the run `beside` when given). Returns
    (the whole step's costs, the RunResult of `beside` or None)."""
    from .solo_calibration import calibrate_here
    from .launch import launch_local

    options.check()
    costs = launch_local(calibrate_here, (schedule, model, options), schedule.ranks, backend, options.timeout)
    profile, result = launch_local(measure_here, (schedule, model, replicas, options, beside),
                                   schedule.ranks * replicas, backend, options.timeout)
    return with_data_parallel(costs, profile, schedule.ranks, bucket_bytes), result
