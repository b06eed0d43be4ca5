"""Predicted against measured: how far a simulation is from a run, op by op.

Both traces are first put on their own step clock (the first compute start is 0), so a
constant clock offset between them costs nothing. Errors:
- makespan_rel_error: (predicted - measured) / measured;
- bubble_abs_error: |predicted - measured| total bubble ratio (a ratio, not points);
  per rank the same for each rank's bubble ratio;
- start-time error of every op present in both: |start_pred - start_meas| divided by
  the measured makespan; its median (p50) and 90th percentile (p90);
- per op kind: median measured and predicted duration, to see which op is mis-costed;
- peak memory per rank: (predicted - measured) / measured.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


from .metrics import Metrics, compute_metrics
from .trace import COMPUTE, SPAN_OPS, Trace


@dataclass
class RankComparison:
    """One rank predicted against measured: bubble ratios, peak memory (bytes) and the
    end of its last op (seconds on the step clock), with their errors."""

    rank: int
    predicted_bubble: float
    measured_bubble: float
    bubble_error: float          # predicted - measured (ratio)
    predicted_peak_memory: float
    measured_peak_memory: float
    peak_memory_rel_error: float  # nan when nothing was measured
    predicted_finish: float = float("nan")  # seconds from the step's first op to the rank's last op end
    measured_finish: float = float("nan")
    finish_rel_error: float = float("nan")


@dataclass
class OpKindComparison:
    """One op kind predicted against measured: how many ops matched, median durations (s)."""

    op: str
    count: int
    predicted_median: float  # seconds
    measured_median: float   # seconds
    rel_error: float


@dataclass
class Comparison:
    """A prediction against a measurement of the same schedule (`compare`; module doc).

    predicted, measured: the two traces' Metrics.
    makespan_rel_error: (predicted - measured) / measured makespan.
    bubble_abs_error: |predicted - measured| total bubble ratio (a ratio, not points).
    start_time_error_p50, start_time_error_p90: median and 90th percentile of
        |start predicted - start measured| over every matched op, divided by the
        measured makespan.
    peak_memory_rel_error: the worst rank's (predicted - measured) / measured peak bytes.
    per_rank: RankComparison per rank; per_op: OpKindComparison per op kind;
    matched_ops: ops present in both traces.
    """

    schedule: str
    predicted: Metrics
    measured: Metrics
    makespan_rel_error: float
    bubble_abs_error: float
    start_time_error_p50: float
    start_time_error_p90: float
    peak_memory_rel_error: float  # the worst rank's, by magnitude
    per_rank: list[RankComparison]
    per_op: list[OpKindComparison]
    matched_ops: int

    def to_dict(self) -> dict:
        d = asdict(self)
        for side in ("predicted", "measured"):
            d[side].pop("critical_path", None)
        return d


def _keyed_compute(trace: Trace) -> dict[tuple[int, int, int, int], tuple[float, float]]:
    """(rank, op, mb, stage) -> (start, end) of every compute span, from the first op start."""
    comp = np.flatnonzero(trace.lane == COMPUTE)
    t0 = float(trace.start[comp].min()) if len(comp) else 0.0
    return {(int(trace.rank[i]), int(trace.op[i]), int(trace.mb[i]), int(trace.stage[i])):
            (float(trace.start[i]) - t0, float(trace.end[i]) - t0) for i in comp}


def _rank_finish(keyed: dict[tuple[int, int, int, int], tuple[float, float]], ranks: int) -> list[float]:
    """Per rank, the end of its last op (seconds on the trace's step clock); nan without ops."""
    return [max((end for (rank, *_), (_, end) in keyed.items() if rank == r), default=float("nan"))
            for r in range(ranks)]


def _rel(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def compare(predicted: Trace, measured: Trace, held_makespan: float | None = None) -> Comparison:
    """Compare two traces of the same schedule (same ranks, ops keyed by op/mb/stage).
    `held_makespan` (seconds): what the makespan error is against, where not the measured
    trace's own makespan (a data-parallel run's mean step: `executor.validation`)."""
    if (predicted.ranks, predicted.microbatches) != (measured.ranks, measured.microbatches):
        raise ValueError(f"traces differ in shape: {predicted.ranks} ranks x {predicted.microbatches} microbatches "
                         f"vs {measured.ranks} x {measured.microbatches}")
    pm, mm = compute_metrics(predicted), compute_metrics(measured)
    pk, mk = _keyed_compute(predicted), _keyed_compute(measured)
    common = sorted(set(pk) & set(mk))
    if not common:
        raise ValueError("the traces share no op: are they of the same schedule?")
    start_err = np.array([abs(pk[k][0] - mk[k][0]) for k in common]) / mm.makespan
    per_op = []
    for op_index, op in enumerate(SPAN_OPS):  # the optimizer step (OPT) too
        keys = [k for k in common if k[1] == op_index]
        if keys:
            p_med = float(np.median([pk[k][1] - pk[k][0] for k in keys]))
            m_med = float(np.median([mk[k][1] - mk[k][0] for k in keys]))
            per_op.append(OpKindComparison(op, len(keys), p_med, m_med, _rel(p_med, m_med)))
    per_rank = []
    p_end, m_end = _rank_finish(pk, predicted.ranks), _rank_finish(mk, measured.ranks)
    for a, b in zip(pm.per_rank, mm.per_rank):
        per_rank.append(RankComparison(a.rank, a.bubble_ratio, b.bubble_ratio, a.bubble_ratio - b.bubble_ratio,
                                       a.peak_memory_bytes, b.peak_memory_bytes,
                                       _rel(a.peak_memory_bytes, b.peak_memory_bytes),
                                       p_end[a.rank], m_end[a.rank], _rel(p_end[a.rank], m_end[a.rank])))
    memory_errors = [r.peak_memory_rel_error for r in per_rank if np.isfinite(r.peak_memory_rel_error)]
    return Comparison(
        schedule=measured.schedule, predicted=pm, measured=mm,
        makespan_rel_error=_rel(pm.makespan, mm.makespan if held_makespan is None else held_makespan),
        bubble_abs_error=abs(pm.bubble_ratio - mm.bubble_ratio),
        start_time_error_p50=float(np.percentile(start_err, 50)),
        start_time_error_p90=float(np.percentile(start_err, 90)),
        peak_memory_rel_error=max(memory_errors, key=abs) if memory_errors else float("nan"),
        per_rank=per_rank, per_op=per_op, matched_ops=len(common))
