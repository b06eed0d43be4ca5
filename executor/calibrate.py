"""Calibration: measure the cost model of a model on this machine.

Inside the ranks of a launched process group (the same backend, devices and thread
settings a run gets), each rank in turn profiles the model stages it holds while the
others wait at a barrier, so every profile is of a rank computing alone: T_F, T_B, T_W
and the fused T_BW per model stage (medians after warm-up, through the same
`StageModule` calls the runtime makes), the bytes an F saves for backward and the bytes
a split B keeps for W, and the parameter bytes. Then every pair of ranks the schedule
sends between plays ping-pong over the same process group at several sizes; a straight
line through the one-way times gives latency + bytes / bandwidth. Rank 0 assembles a
`simulator.costs.CostModel` whose `model_stages` are the profiles.

Units: seconds and bytes.
"""
from __future__ import annotations

import os
import socket
import statistics
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from schedules.graph import LOCAL
from schedules.ir import Schedule
from schedules.validate import validate
from simulator.costs import CostModel, HostSharing, Link, Network, StageCost

from .clock import CpuTimer, CudaTimer
from .launch import RankContext, launch_local, run_here, threads_per_rank, under_torchrun
from .memory import MemoryLedger
from .models import ExampleModel, PipelineModel, TensorSpec, check_model
from .clock import now
from .stage import StageModule, held_bytes

PINGPONG_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)  # bytes, besides the model's own boundaries


@dataclass(frozen=True)
class CalibrationOptions:
    repeats: int = 15            # measured repetitions of every op and every ping-pong size
    warmup: int = 3              # unmeasured repetitions first
    sizes: tuple[int, ...] = PINGPONG_SIZES
    timeout: float = 300.0       # seconds, every wait

    def check(self) -> "CalibrationOptions":
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"calibration needs repeats >= 1 and warmup >= 0, got {self.repeats} and {self.warmup}")
        return self


@dataclass
class StageProfile:
    """One model stage profiled on one rank (seconds, bytes)."""

    model_stage: int
    rank: int
    forward: float
    backward_input: float
    backward_weight: float
    backward_full: float
    activation_memory: float
    weight_memory: float
    param_bytes: float
    first_backward_extra: float = 0.0   # the first W or BW of a step allocates the gradients
    samples: dict[str, list[float]] = field(default_factory=dict)

    def cost(self, activation_bytes: float) -> StageCost:
        return StageCost(forward=self.forward, backward_input=self.backward_input,
                         backward_weight=self.backward_weight, backward_full=self.backward_full,
                         activation_bytes=activation_bytes, activation_memory=self.activation_memory,
                         weight_memory=self.weight_memory, param_bytes=self.param_bytes)


@dataclass
class LinkProfile:
    """Ping-pong between two ranks: one-way seconds per size, and the fitted line."""

    ranks: tuple[int, int]
    same_host: bool
    sizes: list[int]
    one_way: list[float]
    latency: float
    bandwidth: float


def _timer(device: torch.device):
    return CudaTimer(device) if device.type == "cuda" else CpuTimer()


def profile_stage(sm: StageModule, x: torch.Tensor, target: torch.Tensor | None, grad: torch.Tensor | None,
                  device: torch.device, repeats: int, warmup: int, rank: int = 0) -> StageProfile:
    """Time F, B, W and BW of one stage module, one op at a time, as the runtime calls them.

    A step starts with no parameter gradients, so the first backward of a stage in a step
    (W or BW) also allocates them; later ones add into them. Each repetition therefore
    runs, from no gradients: F, B, W (the first W), F, B, W, F, BW (steady), then again
    from no gradients F, BW (the first BW). T_W and T_BW are the steady times;
    `first_backward_extra` is what the first one costs on top (median over both kinds).
    """
    timer = _timer(device)
    samples: dict[str, list[float]] = {"F": [], "B": [], "W": [], "BW": [], "W first": [], "BW first": []}
    act, kept = [], []
    plan = (("F", "B", "W first", "F", "B", "W", "F", "BW"), ("F", "BW first"))
    for i in range(warmup + repeats):
        marks = []
        for sequence in plan:
            for p in sm.params:
                p.grad = None
            if isinstance(timer, CudaTimer):
                timer.start_step()
            state = held = None
            for op in sequence:
                start = timer.mark()
                if op == "F":
                    state, _ = sm.forward(0, x.detach().clone(), target)
                elif op == "B":
                    _, held = sm.backward_input(state, grad)
                elif op.startswith("W"):
                    sm.backward_weight(held)
                else:
                    sm.backward_full(state, grad)
                marks.append((op, start, timer.mark()))
                if op == "F" and i >= warmup:
                    act.append(held_bytes(state.boxes, []))
                elif op == "B" and i >= warmup:
                    kept.append(held_bytes(held.boxes, held.groups))
            timer.sync()
            if i >= warmup:
                for op, a, b in marks:
                    samples[op].append(timer.seconds(b) - timer.seconds(a))
            marks = []
    med = {k: statistics.median(v) for k, v in samples.items()}
    extra = max(0.0, statistics.fmean((med["W first"] - med["W"], med["BW first"] - med["BW"])))
    param_bytes = sum(p.numel() * p.element_size() for p in sm.params)
    for p in sm.params:
        p.grad = None
    return StageProfile(sm.model_stage, rank, med["F"], med["B"], med["W"], med["BW"],
                        float(statistics.median(act)), float(statistics.median(kept)), float(param_bytes), extra,
                        samples)


def _stage_inputs(model: PipelineModel, specs: list[TensorSpec], k: int, device: torch.device):
    """(input, target, output gradient) for profiling model stage k on `device`."""
    gen = torch.Generator().manual_seed(1234 + k)
    last = k == len(model.stages) - 1
    x = model.inputs[0] if k == 0 else torch.randn(specs[k - 1].shape, generator=gen, dtype=torch.float64)
    x = x.to(device, specs[k - 1].dtype if k else model.inputs[0].dtype)
    target = model.targets[0].to(device) if last else None
    grad = None if last else torch.randn(specs[k].shape, generator=gen, dtype=torch.float64).to(device, specs[k].dtype)
    return x, target, grad


def links_of(schedule: Schedule) -> list[tuple[int, int]]:
    """Unordered rank pairs the schedule transfers between, sorted."""
    graph = validate(schedule)
    pairs = {tuple(sorted(graph.edge_ranks(e))) for e, edge in enumerate(graph.edges) if edge.kind != LOCAL}
    return sorted(pairs)  # type: ignore[arg-type]


def pingpong(ctx: RankContext, pair: tuple[int, int], sizes: list[int], repeats: int, warmup: int) -> list[float]:
    """One-way seconds per size between the ranks of `pair` (median round trip / 2), with
    isend/irecv and waits as the runtime uses them; the other ranks return []."""
    a, b = pair
    if ctx.rank not in pair:
        return []
    peer = b if ctx.rank == a else a
    staged = ctx.backend == "gloo-cuda"
    device = torch.device("cpu") if ctx.backend in ("gloo", "gloo-cuda") else ctx.device
    wait = timedelta(seconds=ctx.timeout)
    out = []
    for size in sizes:
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
        src = torch.zeros_like(buf, device=ctx.device) if staged else buf
        trips = []
        for i in range(warmup + repeats):
            start = now()
            if ctx.rank == a:
                dist.isend(src.to("cpu") if staged else src, peer, tag=i).wait(wait)
                dist.irecv(buf, peer, tag=i).wait(wait)
            else:
                dist.irecv(buf, peer, tag=i).wait(wait)
                if staged:
                    buf.to(ctx.device)
                dist.isend(src.to("cpu") if staged else buf, peer, tag=i).wait(wait)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            if i >= warmup:
                trips.append(now() - start)
        out.append(statistics.median(trips) / 2)
    return out


def fit_link(sizes: list[int], one_way: list[float]) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of the least-squares line through the points; a
    flat or falling line means no measurable bandwidth limit (infinite)."""
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(one_way, float), 1)
    latency = max(0.0, float(intercept))
    bandwidth = float("inf") if slope <= 0 else 1.0 / float(slope)
    return latency, bandwidth


@dataclass
class _RankProfiles:
    host: str
    stages: list[StageProfile]
    links: dict[tuple[int, int], list[float]]


def calibrate_here(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                   options: CalibrationOptions = CalibrationOptions()) -> CostModel | None:
    """Collective: every rank profiles its model stages in turn, then the links are
    ping-ponged; rank 0 returns the cost model (None elsewhere)."""
    built = model.build(schedule.num_model_stages, schedule.microbatches) if isinstance(model, ExampleModel) else model
    specs = check_model(built, schedule.num_model_stages, schedule.microbatches)
    own = sorted({schedule.stages[s].model_stage for s in schedule.stages_of_rank(ctx.rank)})
    profiles = []
    for turn in range(ctx.world):
        dist.barrier()
        if turn != ctx.rank:
            continue
        for k in own:
            module = built.stages[k].to(ctx.device)
            ledger = MemoryLedger(now, [p for p in module.parameters()])
            sm = StageModule(module, k, schedule.num_model_stages, built.loss_fn, built.scale, ledger)
            x, target, grad = _stage_inputs(built, specs, k, ctx.device)
            profiles.append(profile_stage(sm, x, target, grad, ctx.device, options.repeats, options.warmup, ctx.rank))
            for p in module.parameters():
                p.grad = None
    sizes = sorted(set(options.sizes) | {s.nbytes for s in specs[:-1]})
    links = {}
    for pair in links_of(schedule):
        dist.barrier()
        times = pingpong(ctx, pair, sizes, options.repeats, options.warmup)
        if times:
            links[pair] = times
    dist.barrier()
    mine = _RankProfiles(socket.gethostname(), profiles, links)
    gathered: list | None = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if ctx.rank != 0:
        return None
    return assemble(schedule, specs, gathered, sizes, ctx)


def assemble(schedule: Schedule, specs: list[TensorSpec], reports: list[_RankProfiles], sizes: list[int],
             ctx: RankContext) -> CostModel:
    """The cost model from every rank's profiles (rank 0)."""
    by_stage: dict[int, list[StageProfile]] = {}
    for rep in reports:
        for prof in rep.stages:
            by_stage.setdefault(prof.model_stage, []).append(prof)
    stages = []
    for k in range(schedule.num_model_stages):
        profs = by_stage[k]  # replicas (DualPipe) were profiled on each holder: their mean
        mean = lambda name: statistics.fmean(getattr(p, name) for p in profs)  # noqa: E731
        merged = StageProfile(k, profs[0].rank, mean("forward"), mean("backward_input"), mean("backward_weight"),
                              mean("backward_full"), mean("activation_memory"), mean("weight_memory"),
                              mean("param_bytes"))
        stages.append(merged.cost(float(specs[k].nbytes) if k < len(specs) - 1 else 0.0))
    link_profiles = []
    for rep in reports:
        for pair, times in rep.links.items():
            if pair[0] == reports.index(rep):  # each pair once, from its lower rank
                same = reports[pair[0]].host == reports[pair[1]].host
                lat, bw = fit_link(sizes, times)
                link_profiles.append(LinkProfile(pair, same, sizes, times, lat, bw))
    network = _network(link_profiles, reports)
    host = host_sharing(ctx, schedule.ranks, [r.host for r in reports])
    meta = {"calibrated": {
        "backend": ctx.backend, "device": str(ctx.device.type), "threads_per_rank": torch.get_num_threads(),
        "links": [{"ranks": list(l.ranks), "same_host": l.same_host, "sizes": l.sizes, "one_way": l.one_way,
                   "latency": l.latency, "bandwidth": l.bandwidth} for l in link_profiles],
        "model_stages": schedule.num_model_stages}}
    return CostModel(stages=(stages[0],), model_stages=tuple(stages), network=network, host=host,
                     meta=meta).check()


def _network(links: list[LinkProfile], reports: list[_RankProfiles]) -> Network:
    """One intra-host link (the median of the pairs' fits) and, across hosts, another."""
    def median_link(group: list[LinkProfile]) -> Link:
        return Link(statistics.median(l.latency for l in group), statistics.median(l.bandwidth for l in group))

    intra = [l for l in links if l.same_host]
    inter = [l for l in links if not l.same_host]
    if not inter:
        return Network(median_link(intra) if intra else Link())
    hosts = [r.host for r in reports]
    per_host = {h: hosts.count(h) for h in hosts}
    rpn = next(iter(per_host.values()))
    contiguous = all(hosts[i] == hosts[i - i % rpn] for i in range(len(hosts)))
    if len(set(per_host.values())) != 1 or not contiguous:
        return Network(median_link(inter))  # an irregular placement: the slower link everywhere
    return Network(median_link(intra) if intra else median_link(inter), median_link(inter), rpn)


def host_sharing(ctx: RankContext, ranks: int, hosts: list[str]) -> HostSharing | None:
    """How ranks on one host share it, or None when each has its own cores or GPU.
    gloo-cuda ranks time-slice one GPU when there are more ranks than GPUs; CPU ranks
    share the cores when ranks x threads exceed them. gloo waits sleep, so a waiting
    rank asks for no core."""
    if len(set(hosts)) != 1:
        return None
    if ctx.backend == "gloo-cuda":
        gpus = torch.cuda.device_count()
        return HostSharing(capacity=float(gpus)) if ranks > gpus else None
    if ctx.backend != "gloo":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = threads_per_rank(ranks)
    if ranks * threads <= cores:
        return None
    return HostSharing(capacity=float(cores), compute_demand=float(threads))


def calibrate(schedule: Schedule, model: PipelineModel | ExampleModel,
              options: CalibrationOptions = CalibrationOptions(), backend: str = "gloo") -> CostModel | None:
    """Launch the ranks (or run this one under torchrun) and calibrate; the cost model on
    rank 0 (and locally), None on other torchrun ranks."""
    options.check()
    if under_torchrun():
        return run_here(calibrate_here, (schedule, model, options), backend, options.timeout)
    return launch_local(calibrate_here, (schedule, model, options), schedule.ranks, backend, options.timeout)
