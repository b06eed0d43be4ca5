"""Op times and host time read from pipeline runs: each cost under the run's own concurrency.

Solo profiling times each op with the other ranks idle. In a pipeline most ops run while
other ranks compute, and where ranks share a host (cores, memory bandwidth, caches) they
take longer, by an amount that depends on the machine and the model and that one factor
measured in lockstep catches poorly. A short run of a pipeline schedule measures it
directly: the median duration of each op kind on each model stage, over the runs' spans,
becomes the cost model's op time, and the simulation no longer slows compute for shared
cores (the durations already are slowed).

An op kind no run executed is scaled from the solo profile: T_BW from T_B + T_W in the
ratio the profile measured, T_B and T_W from T_BW likewise. Links, host time outside
ops and memory stay as calibrated; `fit_host_overhead` reads the host time outside ops
from runs too (what `simulator.replay` uses).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from pipesched.schedules.ir import B, BW, F, OPS, W, Schedule

from .costs import CostError, CostModel, StageCost
from .trace import COMPUTE, RECV, Trace


def op_time_samples(schedule: Schedule, trace: Trace) -> dict[tuple[str, int], np.ndarray]:
    """(op, model stage) -> the measured durations (seconds) of those ops in `trace`."""
    comp = np.flatnonzero((trace.lane == COMPUTE) & (trace.op < len(OPS)))  # not the optimizer step
    model = np.asarray([s.model_stage for s in schedule.stages], dtype=np.int64)
    if len(comp) and int(trace.stage[comp].max()) >= len(model):
        raise CostError(f"the run of {trace.schedule!r} has stages its schedule {schedule.name!r} lacks")
    ms, op = model[trace.stage[comp]], trace.op[comp]
    took = trace.end[comp] - trace.start[comp]
    return {(OPS[o], int(k)): took[(op == o) & (ms == k)] for o, k in {(int(a), int(b)) for a, b in zip(op, ms)}}


def costs_from_runs(base: CostModel, runs: Sequence[tuple[Schedule, Trace]]) -> CostModel:
    """`base` (a calibration with `model_stages`) with each model stage's op times the
    median of what `runs` measured (see the module docstring). Every run must split the
    model into as many model stages as `base`. The spread of the samples, the largest
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
    median = {key: float(np.median(v)) for key, v in pooled.items() if len(v)}
    spread = max((float(np.subtract(*np.percentile(v, [75, 25]))) / median[key]
                  for key, v in pooled.items() if len(v) and median[key] > 0), default=0.0)
    new = tuple(_measured_stage(solo, {op: median.get((op, k)) for op in OPS}, k)
                for k, solo in enumerate(base.model_stages))
    meta = {**base.meta, "from_runs": {"schedules": [s.name for s, _ in runs], "spread": spread,
                                       "samples": int(sum(len(v) for v in pooled.values()))}}
    return replace(base, stages=new[:1], model_stages=new, host=None, meta=meta).check()


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


def fit_host_overhead(base: CostModel, runs: Sequence[tuple[Schedule, Trace]], lookahead: int) -> CostModel:
    """`base` with its host time outside ops read from `runs` (each run's receives posted
    `lookahead` units ahead, as the run posted them). On each rank, the gap between two
    ops whose second did not wait for data (every receive it took had arrived) is host
    time: bookkeeping after the first op, posting its sends, posting the receives due
    before the second, taking the second's inputs. A least-squares fit of those gaps to
    `per_op + sends * per_send + posted * per_recv + taken * per_take` (no term below 0)
    gives the four; `send_start` keeps its calibrated share of `per_send`. Needs runs that
    recorded when receives were taken (`meta["receive_takes"]`), else returns `base`."""
    from pipesched.schedules.graph import LOCAL
    from pipesched.schedules.validate import validate

    from .posting import receive_posts
    from .replay import WAIT_MARGIN

    rows, gaps = [], []
    for schedule, trace in runs:
        takes = trace.meta.get("receive_takes")
        if not takes:
            continue
        graph = validate(schedule)
        col = graph.columns()
        posts = receive_posts(graph, lookahead)
        remote = col["edge_kind"] != LOCAL
        start, end = _task_times(graph, trace)
        taken = {tuple(row[:5]): row[5] for row in takes}
        waited = set()
        for i in np.flatnonzero(trace.lane == RECV):
            key = (int(trace.rank[i]), OPS[int(trace.op[i])], int(trace.mb[i]), int(trace.stage[i]), int(trace.peer[i]))
            if key in taken and trace.end[i] - taken[key] > WAIT_MARGIN:
                waited.add(key)
        sends = np.bincount(col["unit"][col["edge_src"][remote]], minlength=len(graph.units))
        takes_in = np.bincount(col["unit"][col["edge_dst"][remote]], minlength=len(graph.units))
        first = np.asarray([ids[0] if ids else 0 for ids in graph.rank_units])
        posted = np.bincount(first[col["rank"][col["edge_dst"][remote]]] + posts[remote], minlength=len(graph.units))
        unit_first = np.cumsum(np.bincount(col["unit"], minlength=len(graph.units))) - \
            np.bincount(col["unit"], minlength=len(graph.units))
        for rank_units in graph.rank_units:
            for prev, u in zip(rank_units, rank_units[1:]):
                inputs = [e for t in graph.units[u] for e in graph.task_inputs[t] if remote[e]]
                keys = [(int(col["rank"][graph.edges[e].dst]), graph.tasks[graph.edges[e].src].op,
                         graph.tasks[graph.edges[e].src].mb, graph.tasks[graph.edges[e].src].stage,
                         int(col["rank"][graph.edges[e].src])) for e in inputs]
                if any(k in waited for k in keys):
                    continue
                rows.append((1.0, sends[prev], posted[u], takes_in[u]))
                gaps.append(start[unit_first[u]] - end[unit_first[prev] + len(graph.units[prev]) - 1])
    if len(gaps) < 8:
        return base
    a, g = np.asarray(rows, dtype=float), np.asarray(gaps)
    use = np.ones(4, dtype=bool)
    for _ in range(4):  # drop a term that fits below 0 and fit the rest again
        coef = np.zeros(4)
        coef[use] = np.linalg.lstsq(a[:, use], g, rcond=None)[0]
        if (coef >= 0).all():
            break
        use &= coef > 0
    coef = np.maximum(coef, 0.0)
    o = base.host_overhead
    share = None if o.send_start is None or o.per_send <= 0 else min(1.0, o.send_start / o.per_send)
    fitted = replace(o, per_op=float(coef[0]), per_send=float(coef[1]), per_recv=float(coef[2]),
                     per_take=float(coef[3]), send_start=None if share is None else share * float(coef[1]))
    meta = {**base.meta, "host_from_runs": {"gaps": len(gaps), "median_gap": float(np.median(g))}}
    return replace(base, host_overhead=fitted, meta=meta).check()


def _task_times(graph, trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Measured start and end (seconds) per task id of `graph`."""
    from .replay import task_spans

    span = task_spans(graph, trace)
    return trace.start[span], trace.end[span]
