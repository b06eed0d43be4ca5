"""The step's tail under data parallelism: gradient all-reduces, then the optimizer step.

With d replicas of the pipeline (p x d ranks) on their own processors every replica runs
the same timeline, so one replica is simulated and the tail is computed from its Trace,
once, whichever engine made it. Where the replicas share a host's processors
(`CostModel.host`), they are simulated together (`schedules.replicas.replicate`, the
DES): a rank then computes slower while its core's other ranks compute too, and the
replicas drift apart; the Trace is replica 0's, and a stage's all-reduce starts when
every replica's copy of it is ready (`gradients_ready`). Per rank and per virtual stage
(each virtual stage keeps its own weights, so it is one all-reduce group's payload):

- the stage's weight gradients (`StageCost.synced_bytes`) are all-reduced across the d
  replicas as soon as the stage's last W or BW on the rank ends, in buckets
  (`DataParallel.buckets`), each bucket one ring all-reduce of
  2(d-1) * latency + 2(d-1)/d * bytes / bandwidth seconds (`DataParallel.allreduce_time`);
- a rank runs one all-reduce at a time on its DP link (which no pipeline transfer uses),
  stages in the order they became ready (ties: lower stage first);
- then each stage's optimizer step (`StageCost.optimizer_time` seconds) runs on the
  rank's compute lane, after the rank's last pipeline op and the stage's last bucket,
  in the order the stages' all-reduces finished; where model stages are held by
  several ranks (DualPipe), after the sum of their gradients too, which follows the
  rank's last all-reduce (`simulator.shared_grads`; `simulator.steps` passes it in: the
  one-step Trace has no spans for it, as a measured one has none).

Host time outside ops, shared compute and noise do not apply to the tail: it is added
after the pipeline's timeline as these rules say. `exposed_allreduce` says how much
longer the step is than if every all-reduce took no time.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pipesched.schedules.ir import BW, OPS, W, Schedule

from .costs import DataParallel, StageCost
from .dedicated import replica_compute
from .shared_grads import SharedSums
from .trace import ALLREDUCE, COMPUTE, OPTIMIZER, SPAN_OPS, Trace


def has_tail(stage_costs: Sequence[StageCost], dp: DataParallel) -> bool:
    """Whether the step has a tail: replicas to all-reduce with or an optimizer that takes time.
    Without one the trace is the pipeline's alone (degree 1 changes nothing)."""
    return dp.degree > 1 or any(c.optimizer_time > 0 for c in stage_costs)


def gradients_ready(trace: Trace, schedule: Schedule) -> dict[int, list[tuple[float, int, int]]]:
    """Per rank of `schedule` (one replica): (seconds when a virtual stage's gradients
    are final, the stage, the op index of its last W or BW), one entry per stage the
    rank trains. Where `trace` holds every replica (of `schedules.replicas.replicate`),
    a stage's gradients are ready for the all-reduce when every replica's copy is: the
    latest of them."""
    comp = np.flatnonzero(trace.lane == COMPUTE)
    weights = comp[np.isin(trace.op[comp], (OPS.index(W), OPS.index(BW)))]
    p, n_stages = schedule.ranks, len(schedule.stages)
    key = trace.rank[weights].astype(np.int64) % p * n_stages + trace.stage[weights] % n_stages
    order = np.lexsort((trace.end[weights], key))  # the latest W/BW per (rank, stage), over every replica
    weights, key = weights[order], key[order]
    last_of_key = weights[np.flatnonzero(np.append(key[1:] != key[:-1], True))] if len(weights) else weights
    ready: dict[int, list[tuple[float, int, int]]] = {}
    for i in last_of_key.tolist():
        ready.setdefault(int(trace.rank[i]) % p, []).append(
            (float(trace.end[i]), int(trace.stage[i]) % n_stages, int(trace.op[i])))
    return ready


def add_step_tail(trace: Trace, schedule: Schedule, stage_costs: Sequence[StageCost], dp: DataParallel,
                  ready: dict[int, list[tuple[float, int, int]]] | None = None, measured: Trace | None = None,
                  sums: SharedSums | None = None, free: np.ndarray | None = None) -> Trace:
    """`trace` (one replica's pipeline) with the all-reduce and optimizer spans of the
    step's tail appended, and meta["data_parallel"] describing it. stage_costs: per
    model stage (seconds, bytes); `ready`: `gradients_ready` (default: of `trace`, as
    when every replica runs the same timeline). `measured`: a run whose tail gives each
    all-reduce bucket's and optimizer step's duration instead (a replay; its
    all-reduces hold the wait for the other replicas), the costs' where it has none.
    `sums`: the shared gradients summed between the all-reduces and the optimizer steps
    (`simulator.shared_grads`), from each rank's last all-reduce or `free` (seconds per
    rank when it is free after its pipeline; default: its last op's end), whichever is
    later; when each rank is through them (seconds per rank; a rank in no group: that
    time) goes to meta["shared_gradients"]["ends"]."""
    took = _tail_durations(measured) if measured is not None else {}
    comp = np.flatnonzero(trace.lane == COMPUTE)
    pipeline_end = np.full(schedule.ranks, -np.inf)
    np.maximum.at(pipeline_end, trace.rank[comp], trace.end[comp])
    ready_by_rank = gradients_ready(trace, schedule) if ready is None else ready
    by_rank: dict[int, list[tuple]] = {r: [] for r in range(schedule.ranks) if np.isfinite(pipeline_end[r])}
    synced_by_rank = {r: _allreduces(r, sorted(ready_by_rank.get(r, [])), schedule, stage_costs, dp, took, own)
                      for r, own in by_rank.items()}
    floor = pipeline_end.copy()  # per rank: its optimizer steps start after this
    if sums is not None:
        reduced = np.array(pipeline_end if free is None else free, dtype=float)  # through its all-reduces
        for r, done in synced_by_rank.items():
            reduced[r] = max([reduced[r]] + [t for t, _ in done])
        floor = np.maximum(floor, sums.ends(reduced))
    for r, synced in synced_by_rank.items():
        start_at = float(floor[r])
        for done, v in sorted(synced):
            start = max(start_at, done)
            start_at = start + took.get((r, COMPUTE, v, 0), stage_costs[schedule.stages[v].model_stage].optimizer_time)
            by_rank[r].append((r, COMPUTE, SPAN_OPS.index(OPTIMIZER), 0, v, start, start_at))
    out = _appended(trace, [row for own in by_rank.values() for row in own])
    out.meta["data_parallel"] = {
        "degree": dp.degree, "latency": dp.latency,
        "bandwidth": None if np.isinf(dp.bandwidth) else dp.bandwidth, "bucket_bytes": dp.bucket_bytes,
        "exposed_allreduce": exposed_allreduce(out)}
    if sums is not None:
        out.meta["shared_gradients"] = {"ends": floor.tolist()}
    return out


def _allreduces(r: int, stages_ready: list[tuple[float, int, int]], schedule: Schedule,
                stage_costs: Sequence[StageCost], dp: DataParallel, took: dict, rows: list[tuple]
                ) -> list[tuple[float, int]]:
    """Rank r's all-reduce spans appended to `rows` (rank, lane, op, mb, stage, start,
    end): a stage's buckets once its gradients are ready, stages in the order
    `stages_ready` (seconds, stage, op) lists them, one bucket at a time on the DP link;
    returns (seconds its all-reduces finish, stage) per stage."""
    link_free = -np.inf  # free from the start (times may be any: simulator.steps starts from -inf)
    synced = []
    for t, v, op in stages_ready:
        cost = stage_costs[schedule.stages[v].model_stage]
        done = t
        for k, nbytes in enumerate(dp.buckets(cost.synced_bytes) if dp.degree > 1 else []):
            start = max(done, link_free)
            done = link_free = start + took.get((r, ALLREDUCE, v, k), dp.allreduce_time(nbytes))
            rows.append((r, ALLREDUCE, op, k, v, start, done))
        synced.append((done, v))
    return synced


def allreduce_after_ready(trace: Trace) -> list[tuple[int, int, int, float]]:
    """(rank, virtual stage, bucket, seconds) per all-reduce span of a measured data-
    parallel `trace`: how long the bucket took once every replica's copy of the stage was
    ready and the rank's previous bucket had ended, which is what the simulated link
    must cost (the simulation waits for the replicas itself, `gradients_ready`). A span
    starts when its own rank's gradients are ready, so it also holds the wait for the
    other replicas; their readiness comes from meta["replica_compute"], whose spans per
    global rank are in program order, as the rank's own are (every replica runs the same
    program). Without those spans (or where they do not match the rank's program), the
    span's own start counts."""
    p = trace.ranks
    comp = np.flatnonzero((trace.lane == COMPUTE) & (trace.op < len(OPS)))
    others = replica_compute(trace)
    weight_ops = (OPS.index(W), OPS.index(BW))
    out = []
    for r in range(p):
        own = comp[trace.rank[comp] == r]
        own = own[np.argsort(trace.start[own], kind="stable")]
        replica_ends = []
        for q in sorted({int(g) for g in others[:, 0] if int(g) % p == r and int(g) != r}):
            theirs = others[others[:, 0] == q]
            if len(theirs) == len(own):
                replica_ends.append(theirs[np.argsort(theirs[:, 1], kind="stable"), 2])
        spans = np.flatnonzero((trace.lane == ALLREDUCE) & (trace.rank == r))
        previous = -np.inf
        for i in spans[np.argsort(trace.start[spans], kind="stable")].tolist():
            last = [k for k, j in enumerate(own.tolist())
                    if trace.stage[j] == trace.stage[i] and trace.op[j] in weight_ops]
            ready = float(trace.start[i])
            if last:
                ready = max([ready] + [float(ends[last[-1]]) for ends in replica_ends])
            began = max(ready, previous)
            out.append((r, int(trace.stage[i]), int(trace.mb[i]), max(0.0, float(trace.end[i]) - began)))
            previous = float(trace.end[i])
    return out


def _tail_durations(trace: Trace) -> dict[tuple[int, int, int, int], float]:
    """(rank, lane, virtual stage, bucket) -> seconds of each all-reduce (lane ALLREDUCE)
    and optimizer step (lane COMPUTE, bucket 0) of `trace`'s tail."""
    opt = SPAN_OPS.index(OPTIMIZER)
    tail = np.flatnonzero((trace.lane == ALLREDUCE) | ((trace.lane == COMPUTE) & (trace.op == opt)))
    return {(int(trace.rank[i]), int(trace.lane[i]), int(trace.stage[i]), int(trace.mb[i]) if trace.lane[i] == ALLREDUCE
             else 0): float(trace.end[i] - trace.start[i]) for i in tail}


def _appended(trace: Trace, rows: list[tuple]) -> Trace:
    cols = list(zip(*rows)) if rows else [[]] * 7

    def cat(old: np.ndarray, new, dtype) -> np.ndarray:
        return np.concatenate((old, np.asarray(new, dtype=dtype)))

    n = len(rows)
    return Trace(trace.schedule, trace.ranks, trace.microbatches, trace.source,
                 rank=cat(trace.rank, cols[0], np.int32), lane=cat(trace.lane, cols[1], np.int8),
                 op=cat(trace.op, cols[2], np.int8), mb=cat(trace.mb, cols[3], np.int32),
                 stage=cat(trace.stage, cols[4], np.int32), start=cat(trace.start, cols[5], np.float64),
                 end=cat(trace.end, cols[6], np.float64), peer=cat(trace.peer, [-1] * n, np.int32),
                 overlapped=cat(trace.overlapped, [False] * n, bool), memory=trace.memory, meta=dict(trace.meta))


def exposed_allreduce(trace: Trace) -> float:
    """Seconds the step (first op's start to the end of the last op, optimizer step or
    all-reduce) lasts beyond what it would if every all-reduce took no time: then each
    rank would end at its last pipeline op's end plus its optimizer steps. Works on
    measured traces too; 0 without all-reduce spans."""
    ar = trace.lane == ALLREDUCE
    if not ar.any():
        return 0.0
    comp = trace.lane == COMPUTE
    opt = comp & (trace.op == SPAN_OPS.index(OPTIMIZER))
    pipe = comp & ~opt
    step_end = max(float(trace.end[comp].max(initial=-np.inf)), float(trace.end[ar].max()))
    free_end = -np.inf
    for r in range(trace.ranks):
        mine = pipe & (trace.rank == r)
        if mine.any():
            optimizer = opt & (trace.rank == r)
            free_end = max(free_end, float(trace.end[mine].max())
                           + float((trace.end[optimizer] - trace.start[optimizer]).sum()))
    return max(0.0, step_end - free_end) if np.isfinite(free_end) else 0.0
