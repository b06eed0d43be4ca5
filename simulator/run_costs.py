"""Op times read from pipeline runs: each op's cost under the run's own concurrency.

Solo profiling times each op with the other ranks idle. In a pipeline most ops run while
other ranks compute, and where ranks share a host (cores, memory bandwidth, caches) they
take longer, by an amount that depends on the machine and the model and that one factor
measured in lockstep catches poorly. A short run of a pipeline schedule measures it
directly: the mean duration of each op kind on each model stage, over the runs' spans,
becomes the cost model's op time, and the simulation no longer slows compute for shared
cores (the durations already are slowed). The mean, not the median: a step is a sum of
durations, and where two ranks share a core an op takes about 1x or 2x as its core's
other rank waits or computes, a two-humped distribution whose median jumps between the
humps (docs/accuracy.md compares the two).

An op kind no run executed is scaled from the solo profile: T_BW from T_B + T_W in the
ratio the profile measured, T_B and T_W from T_BW likewise. Links and memory stay as
calibrated; host time outside ops too, unless asked to be fitted to the runs' gaps
between ops (`simulator.replay.fit_host_gaps`): where ranks share cores, a rank also
waits for its core between ops, which a calibration with the other ranks idle cannot see.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from pipesched.schedules.ir import B, BW, F, OPS, W, Schedule
from pipesched.schedules.validate import validate

from .costs import CostError, CostModel, StageCost
from .replay import fit_host_gaps, host_time_gaps
from .trace import COMPUTE, Trace


def op_time_samples(schedule: Schedule, trace: Trace) -> dict[tuple[str, int], np.ndarray]:
    """(op, model stage) -> the measured durations (seconds) of those ops in `trace`."""
    comp = np.flatnonzero((trace.lane == COMPUTE) & (trace.op < len(OPS)))  # not the optimizer step
    model = np.asarray([s.model_stage for s in schedule.stages], dtype=np.int64)
    if len(comp) and int(trace.stage[comp].max()) >= len(model):
        raise CostError(f"the run of {trace.schedule!r} has stages its schedule {schedule.name!r} lacks")
    ms, op = model[trace.stage[comp]], trace.op[comp]
    took = trace.end[comp] - trace.start[comp]
    return {(OPS[o], int(k)): took[(op == o) & (ms == k)] for o, k in {(int(a), int(b)) for a, b in zip(op, ms)}}


def relative_iqr(values) -> float:
    """The interquartile range of `values` over their median: how much repeated
    measurements agree; unlike max - min it does not grow with their number."""
    q1, median, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(q3 - q1) / float(median)


def costs_from_runs(base: CostModel, runs: Sequence[tuple[Schedule, Trace]], host_time: bool = False
                    ) -> CostModel:
    """`base` (a calibration with `model_stages`) with each model stage's op times the
    mean of what `runs` measured (see the module docstring) and, with `host_time`, the
    host time outside ops fitted to every run's gaps (`replay.fit_host_gaps`; receives
    posted as each trace's meta["recv_lookahead"] says). Every run must split the model
    into as many model stages as `base`. The spread of the samples, the largest
    interquartile range over median of any op kind and stage, is kept in
    `meta["from_runs"]["spread"]`."""
    if base.model_stages is None:
        raise CostError("costs from runs need a calibration with model_stages")
    stages = len(base.model_stages)
    samples: dict[tuple[str, int], list[np.ndarray]] = {}
    for schedule, trace in runs:
        if schedule.num_model_stages != stages:
            raise CostError(f"the run of {schedule.name!r} has {schedule.num_model_stages} model stages, "
                            f"the calibration {stages}")
        for key, values in op_time_samples(schedule, trace).items():
            samples.setdefault(key, []).append(values)
    pooled = {key: np.concatenate(parts) for key, parts in samples.items()}
    mean = {key: float(np.mean(v)) for key, v in pooled.items() if len(v)}
    spread = max((relative_iqr(v) for key, v in pooled.items() if len(v) and np.median(v) > 0), default=0.0)
    new = tuple(_measured_stage(solo, {op: mean.get((op, k)) for op in OPS}, k)
                for k, solo in enumerate(base.model_stages))
    meta = {**base.meta, "from_runs": {"schedules": list(dict.fromkeys(s.name for s, _ in runs)), "steps": len(runs),
                                       "spread": spread, "samples": int(sum(len(v) for v in pooled.values()))}}
    out = replace(base, stages=new[:1], model_stages=new, host=None, meta=meta).check()
    return _host_time_from(out, runs) if host_time else out


def _host_time_from(costs: CostModel, runs: Sequence[tuple[Schedule, Trace]]) -> CostModel:
    found = [host_time_gaps(validate(schedule), trace, trace.meta.get("recv_lookahead", costs.recv_lookahead))
             for schedule, trace in runs]
    found = [f for f in found if f is not None]
    if not found:
        return costs
    return fit_host_gaps(costs, np.concatenate([rows for rows, _ in found]), np.concatenate([g for _, g in found]))


def _measured_stage(solo: StageCost, measured: dict[str, float | None], k: int) -> StageCost:
    """`solo` with the op times `measured` gives; the others scaled from the solo ratios."""
    if measured[F] is None:
        raise CostError(f"no run measured a forward of model stage {k}")
    b, w, bw = measured[B], measured[W], measured[BW]
    split = solo.backward_input + solo.backward_weight
    if b is None or w is None:
        if bw is None:
            raise CostError(f"no run measured a backward of model stage {k}")
        share = solo.backward_input / split if split > 0 else 0.5
        b, w = bw * share, bw * (1 - share)
    if bw is None:
        bw = (b + w) * (solo.op_time(BW) / split if split > 0 else 1.0)
    return replace(solo, forward=measured[F], backward_input=b, backward_weight=w, backward_full=bw)
