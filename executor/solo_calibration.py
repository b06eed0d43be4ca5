"""Calibration from solo profiles: measure the cost model of a model on this machine.

`calibrate_here`, the collective `executor.calibrate.calibrate` starts (and
`executor.run_calibration` builds on). Inside the ranks of a launched process group (the same backend, devices and thread
settings a run gets):

1. each rank in turn profiles the model stages it holds while the others wait at a
   barrier (gloo waits sleep), so every profile is of a rank computing alone
   (`executor.profile`): T_F, T_B, T_W, T_BW, what the first backward of a step saves,
   the bytes F saves and B keeps, parameter bytes, the runtime's bookkeeping per op;
   then, on CPUs where each rank has its own cores, every rank at once measures how much
   longer its ops run right after a copy of its stage's, and the ops after those
   (`stage_switch`);
2. where ranks share a host, as many as its cores hold profile again side by side in
   lockstep: how much slower compute gets when all cores are busy (`interference`);
   where ranks outnumber the cores (and are pinned round-robin), each rank runs
   back-to-back F + BW alone, then with the ranks of its core, then with all ranks: how
   much less than a fair share of its core a rank gets (`switching`) and how much slower
   again with the other cores busy (`interference`);
3. every pair of ranks the schedule sends between plays ping-pong at several sizes
   (latency and bandwidth), and measures what posting a send and a receive costs right
   after an op (`executor.links`);
4. with two ranks or more, ranks 0 and 1 run the runtime's sum of shared gradients on
   a small tensor and on once and twice the largest model stage's parameters, whatever
   the schedule (one calibration also predicts DualPipe): `gradient_sum`
   (`executor.sum_timing`).

Rank 0 assembles a `simulator.costs.CostModel`: `model_stages` from the profiles, the
network, `host_overhead`, `gradient_sum` and, on one host, `host` (sharing and
interference).
Units: seconds and bytes.
"""
from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pipesched.schedules.ir import Schedule
from pipesched.schedules.validate import validate
from pipesched.simulator.costs import (CostModel, GradientSum, HostOverhead, HostSharing, Link, Network, StageCost,
                                      StageSwitch)

from . import progress
from .comm import link_groups
from .launch import RankContext, deadline
from .placement import host_cores
from .links import PostingCosts, fit_link, pingpong, posting_costs
from .models import ExampleModel, PipelineModel, TensorSpec, check_model
from .sum_timing import fit_gradient_sum, pair_medians, stage_shapes, time_gradient_sum
from .profile import (OPS_PER_REPETITION, StageProfile, iteration_ends, profile_stage, seconds_per_iteration,
                      slowdown, stage_for_profiling, switch_slowdown)

PINGPONG_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)  # bytes, besides the model's own boundaries


@dataclass(frozen=True)
class CalibrationOptions:
    """How `calibrate` (and `validate`) measure: `repeats` measured repetitions of every
    op and every ping-pong size after `warmup` unmeasured ones; `sizes`: the ping-pong
    message sizes in bytes (besides the model's own boundaries); `timeout`: seconds any
    wait may take; `from_runs`: op times read from short pipeline runs
    (`executor.run_calibration`), True, False or None (default: where every rank has a
    CPU core of its own). `check()` raises ValueError for repeats < 1 or warmup < 0."""

    repeats: int = 15            # measured repetitions of every op and every ping-pong size
    warmup: int = 3              # unmeasured repetitions first
    sizes: tuple[int, ...] = PINGPONG_SIZES
    timeout: float = 300.0       # seconds, every wait
    from_runs: bool | None = None  # op times from short pipeline runs (executor.run_calibration);
                                   # None: where every rank has a CPU core of its own

    def check(self) -> "CalibrationOptions":
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"calibration needs repeats >= 1 and warmup >= 0, got {self.repeats} and {self.warmup}")
        if self.from_runs not in (None, True, False):
            raise ValueError(f"calibration's from_runs is True, False or None (auto), got {self.from_runs!r}")
        return self


@dataclass
class _RankReport:
    """What one rank measured (gathered to rank 0)."""

    host: str
    cores: int
    threads: int
    stages: list[StageProfile]
    slowdowns: list[float]                          # side by side against alone, per own stage
    loops: dict[str, float]                         # seconds per free-running F + BW: alone, sharing
                                                    # the rank's core, all ranks at once (oversubscribed)
    links: dict[tuple[int, int], list[float]]       # pair -> one-way seconds per size (lower rank only)
    isend_posting: dict[tuple[int, int], float]     # pair -> seconds of the ping-pong's isend call
    posting: dict[tuple[int, int], PostingCosts]    # pair -> this rank's side of handling its transfers
    switches: list[tuple[float, ...]] = field(default_factory=list)  # per own stage (switch_slowdown)
    grad_sum: dict[int, list[float]] = field(default_factory=dict)  # bytes -> seconds per repeat (sum_timing)


def directed_links(schedule: Schedule) -> list[tuple[int, int]]:
    """(sender, receiver) of every link the schedule transfers over, sorted."""
    graph = validate(schedule)
    return sorted({graph.edge_ranks(e) for e in graph.transfers})


def links_of(schedule: Schedule) -> list[tuple[int, int]]:
    """Unordered rank pairs the schedule transfers between, sorted."""
    return sorted({tuple(sorted(link)) for link in directed_links(schedule)})  # type: ignore[misc]


def core_groups(world: int, cores: int) -> list[list[int]]:
    """Ranks pinned to the same core (where ranks outnumber the cores)."""
    if world <= cores:
        return []
    return [g for g in ([r for r in range(world) if r % cores == c] for c in range(cores)) if len(g) > 1]


def side_by_side_groups(world: int, cores: int, threads: int) -> list[list[int]]:
    """Ranks that profile together: as many as the host's cores hold at once."""
    size = max(1, cores // max(1, threads))
    groups = [list(range(i, min(world, i + size))) for i in range(0, world, size)] if size > 1 else []
    return [g for g in groups if len(g) > 1]


def calibrate_here(ctx: RankContext, schedule: Schedule, model: PipelineModel | ExampleModel,
                   options: CalibrationOptions = CalibrationOptions()) -> CostModel | None:
    """Collective: every rank calls it; rank 0 returns the cost model (None elsewhere)."""
    progress.say(ctx.rank, f"calibrating: each rank profiles its model stages alone ({options.repeats} repeats), "
                           "then side by side, then the links")
    built = model.build(schedule.num_model_stages, schedule.microbatches) if isinstance(model, ExampleModel) else model
    with deadline(ctx.timeout, "the model check"):  # the model's own forward: a hang is cut
        specs = check_model(built, schedule.num_model_stages, schedule.microbatches)
    own = sorted({schedule.stages[s].model_stage for s in schedule.stages_of_rank(ctx.rank)})
    stages = {k: stage_for_profiling(built, specs, k, ctx.device) for k in own}
    hosts: list = [None] * ctx.world
    dist.all_gather_object(hosts, socket.gethostname())
    one_host = len(set(hosts)) == 1
    cores = host_cores()
    threads = torch.get_num_threads()

    sharing = core_groups(ctx.world, cores) if one_host and ctx.device.type == "cpu" else []
    iterations = 3 * options.repeats
    alone, loops, switches = [], {}, []
    for turn in range(ctx.world):
        dist.barrier()
        if turn == ctx.rank:
            alone = [profile_stage(*stages[k], ctx.device, options.repeats, options.warmup, ctx.rank) for k in own]
    # Stage switches: every rank at once, as a schedule whose ranks hold two stages runs
    # them (all ranks switch, and the cores share their last-level cache). On a GPU ops
    # stream from memory either way; where ranks share a core, the other rank's ops refill
    # its caches between any two ops, so runs of one stage per rank already show the cost
    # (docs/accuracy.md, "The stage switch").
    if ctx.device.type == "cpu" and not sharing:
        dist.barrier()
        switches = [switch_slowdown(*stages[k], options.repeats, options.warmup) for k in own]
    slowdowns = []
    if sharing:  # ranks outnumber the cores: how they share a core, and all the cores, free-running
        loops["alone"] = [_free_running(ctx, [r], stages[own[0]], iterations) for r in range(ctx.world)][ctx.rank]
        for group in sharing:
            mine = _free_running(ctx, group, stages[own[0]], iterations)
            if mine is not None:
                loops["core"] = mine
        loops["all"] = _free_running(ctx, list(range(ctx.world)), stages[own[0]], iterations)
    else:  # as many ranks as the cores hold, side by side in lockstep (a barrier before every op)
        groups = side_by_side_groups(ctx.world, cores, threads) if one_host and ctx.device.type == "cpu" else []
        barriers = (options.warmup + options.repeats) * OPS_PER_REPETITION
        for group in groups:
            for i in range(_max_stages(schedule)):
                dist.barrier()
                if ctx.rank in group and i < len(own):
                    together = profile_stage(*stages[own[i]], ctx.device, options.repeats, options.warmup, ctx.rank,
                                             before_op=dist.barrier)
                    slowdowns.append(slowdown(alone[i], together))
                else:
                    for _ in range(barriers):
                        dist.barrier()

    sizes = sorted(set(options.sizes) | {s.nbytes for s in specs[:-1]})
    links, isend_posting, posting = {}, {}, {}
    first = own[0]
    sm, x, target, grad = stages[first]

    def run_op() -> None:  # one of this rank's own ops, as before a transfer in a step
        state, _ = sm.forward(0, x.detach().clone(), target)
        sm.backward_full(state, grad)

    groups = None if ctx.backend == "nccl" else link_groups(directed_links(schedule))  # as the runtime's
    for pair in links_of(schedule):
        dist.barrier()
        times, isend = pingpong(ctx, pair, sizes, options.repeats, options.warmup, groups)
        if times and ctx.rank == pair[0]:
            links[pair], isend_posting[pair] = times, isend
        spec = specs[min(len(specs) - 2, max(0, own[-1]))] if len(specs) > 1 else specs[0]
        dist.barrier()
        costs = posting_costs(ctx, pair, spec, run_op, options.repeats, options.warmup, groups)
        if ctx.rank in pair:
            posting[pair] = costs
    for p in sm.params:
        p.grad = None
    grad_sum = time_gradient_sum(ctx.rank, ctx.world, stage_shapes(built.stages), ctx.device, ctx.timeout)
    mine = _RankReport(hosts[ctx.rank], cores, threads, alone, slowdowns, loops, links, isend_posting, posting,
                       switches, grad_sum)
    gathered: list | None = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if ctx.rank != 0:
        return None
    return assemble(schedule, specs, gathered, sizes, ctx.backend, str(ctx.device.type))


def _free_running(ctx: RankContext, group: list[int], stage, iterations: int) -> float | None:
    """Collective: the ranks of `group` run back-to-back F + BW of `stage` together; each
    member gets its seconds per iteration while every member still ran (None elsewhere)."""
    dist.barrier()
    ends = iteration_ends(*stage, iterations) if ctx.rank in group else []
    everyone: list = [None] * ctx.world
    dist.all_gather_object(everyone, ends)
    if ctx.rank not in group:
        return None
    return seconds_per_iteration(ends, min(everyone[r][-1] for r in group))


def _max_stages(schedule: Schedule) -> int:
    """The most model stages any rank holds (every rank loops this often in lockstep)."""
    return max(len({schedule.stages[s].model_stage for s in held}) for held in schedule.stages_by_rank())


def assemble(schedule: Schedule, specs: list[TensorSpec], reports: list[_RankReport], sizes: list[int],
             backend: str = "gloo", device: str = "cpu") -> CostModel:
    """The cost model from every rank's report (on rank 0)."""
    by_stage: dict[int, list[StageProfile]] = {}
    for rep in reports:
        for prof in rep.stages:
            by_stage.setdefault(prof.model_stage, []).append(prof)
    stages = []
    for k in range(schedule.num_model_stages):
        profs = by_stage[k]  # replicas (DualPipe) were profiled on each holder: their mean

        def mean(name: str) -> float:
            return statistics.fmean(getattr(p, name) for p in profs)

        stages.append(StageCost(
            forward=mean("forward"), backward_input=mean("backward_input"), backward_weight=mean("backward_weight"),
            backward_full=mean("backward_full"), activation_bytes=float(specs[k].nbytes) if k < len(specs) - 1 else 0.0,
            activation_memory=mean("activation_memory"), weight_memory=mean("weight_memory"),
            param_bytes=mean("param_bytes"), grad_accumulate=mean("grad_accumulate")))
    hosts = [r.host for r in reports]
    link_rows = []
    for rep in reports:
        for pair, times in rep.links.items():
            latency, bandwidth = fit_link(sizes, times)
            # the ping-pong's one-way time includes posting the isend, which the simulator charges to the sender
            latency = max(0.0, latency - rep.isend_posting[pair])
            link_rows.append({"ranks": list(pair), "same_host": hosts[pair[0]] == hosts[pair[1]], "sizes": sizes,
                              "one_way": times, "latency": latency, "bandwidth": bandwidth,
                              "isend_posting": rep.isend_posting[pair]})
    sends = [c for i, r in enumerate(reports) for pair, c in r.posting.items() if pair[0] == i]
    recvs = [c for i, r in enumerate(reports) for pair, c in r.posting.items() if pair[1] == i]

    def median(xs) -> float:
        xs = list(xs)
        return statistics.median(xs) if xs else 0.0

    per_send = median(c.send for c in sends)
    overhead = HostOverhead(per_op=median(p.bookkeeping for r in reports for p in r.stages), per_send=per_send,
                            per_recv=median(c.recv for c in recvs), send_start=min(per_send, median(c.leave for c in sends)),
                            per_take=median(c.take for c in recvs))
    cores, threads = reports[0].cores, reports[0].threads
    slowdowns = [s for r in reports for s in r.slowdowns]
    switching = []
    if any(r.loops for r in reports):  # oversubscribed: from the free-running loops
        groups = core_groups(len(reports), cores)
        size = {r: len(g) for g in groups for r in g}
        switching = [r.loops["core"] / (size[i] * r.loops["alone"]) - 1.0 for i, r in enumerate(reports) if i in size]
        slowdowns = [r.loops["all"] / r.loops["core"] - 1.0 for i, r in enumerate(reports) if i in size]
    host = host_sharing(backend, cores, threads, schedule.ranks, hosts, max(0.0, median(slowdowns)),
                        max(0.0, median(switching)))
    meta = {"calibrated": {"backend": backend, "device": device, "threads_per_rank": threads, "cores": cores,
                           "links": link_rows, "interference_samples": slowdowns, "switching_samples": switching,
                           "free_running": [r.loops for r in reports], "model_stages": schedule.num_model_stages}}
    switches = [f for r in reports for f in r.switches]
    switch = StageSwitch(*(median(s[i] for s in switches) for i in range(4)))
    meta["calibrated"]["switch_samples"] = switches
    gradient_sum = _gradient_sum(reports, meta["calibrated"])
    return CostModel(stages=(stages[0],), model_stages=tuple(stages), network=_network(link_rows, hosts),
                     host=host, host_overhead=overhead, stage_switch=switch, gradient_sum=gradient_sum,
                     meta=meta).check()


def _gradient_sum(reports: list[_RankReport], meta: dict) -> GradientSum | None:
    """The fitted sum of shared gradients (`executor.sum_timing`), its points added to
    `meta` (bytes, median seconds); None where it was not timed (one rank)."""
    timed = [r.grad_sum for r in reports if r.grad_sum]
    medians = pair_medians(timed) if len(timed) == 2 else {}
    fit = fit_gradient_sum(medians)
    if fit is None:
        return None
    meta["gradient_sum"] = {"sizes": list(medians), "seconds": list(medians.values())}
    return GradientSum(*fit)


def _network(rows: list[dict], hosts: list[str]) -> Network:
    """One link within a host (the median of the pairs' fits) and, across hosts, another."""
    def median_link(group: list[dict]) -> Link:
        return Link(statistics.median(r["latency"] for r in group), statistics.median(r["bandwidth"] for r in group))

    intra = [r for r in rows if r["same_host"]]
    inter = [r for r in rows if not r["same_host"]]
    if not inter:
        return Network(median_link(intra) if intra else Link())
    per_host = {h: hosts.count(h) for h in hosts}
    rpn = next(iter(per_host.values()))
    contiguous = all(hosts[i] == hosts[i - i % rpn] for i in range(len(hosts)))
    if len(set(per_host.values())) != 1 or not contiguous:
        return Network(median_link(inter))  # an irregular placement: the slower link everywhere
    return Network(median_link(intra) if intra else median_link(inter), median_link(inter), rpn)


def host_sharing(backend: str, cores: int, threads: int, ranks: int, hosts: list[str],
                 interference: float = 0.0, switching: float = 0.0) -> HostSharing | None:
    """How ranks on one host share it, or None when it is not modelled (several hosts,
    or one GPU per rank). gloo-cuda ranks time-slice the GPUs; CPU ranks slow each other
    down by `interference` when all cores are busy, and where they outnumber the cores
    they are pinned round-robin (`executor.placement.rank_cores`) and share their core.
    gloo waits sleep, so a waiting rank asks for no core."""
    if len(set(hosts)) != 1:
        return None
    if backend == "gloo-cuda":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 1
        return HostSharing(capacity=float(gpus), gpu=True) if ranks > gpus else None
    if backend != "gloo":
        return None
    if ranks * threads <= cores and interference == 0.0:
        return None
    return HostSharing(capacity=float(cores), compute_demand=float(threads), interference=interference,
                       pinned=ranks > cores, switching=switching if ranks > cores else 0.0)


def oversubscribed(host: HostSharing | None, ranks: int) -> bool:
    """Whether the ranks ask for more processors than the host has."""
    return host is not None and ranks * host.compute_demand > host.capacity

