"""Stage switches: an op that runs right after an op of another stage on the same rank.

A rank that holds two stages (DualPipe's two replicas, the chunks of interleaved and V
schedules) alternates between their weights and activations, and on a CPU an op right
after the other stage's ops finds its data out of the caches and runs longer, most on
small models (`benchmarks/stage_alternation.py` measures it in one process). Runs of
1F1B and ZB-H1 hold one stage per rank and never show it. Calibration measures it with a
copy of each stage where each rank has its own cores (`executor.profile.switch_slowdown`);
the cost model keeps it as `StageSwitch`, each op kind's fraction of its time, and
`simulator.timing.resolve` adds it to the ops this module marks.

Here "after another stage" means: the previous task in the rank's program (the pair's
other task, for the second task of an overlapped pair) has another virtual stage.

Where a calibration's `model_stages` are cut for a finer split (v = 2 schedules from a
v = 1 calibration), the switch is not added: those op times come with each op kind's
fixed time, read from a run that switches stages on most ops (ZB-V), so they already
hold it; adding it there too predicted v = 2 schedules long (docs/accuracy.md).
"""
from __future__ import annotations

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import OPS, Schedule

from .costs import CostModel
from .trace import COMPUTE, Trace


def switched_tasks(graph: TaskGraph) -> np.ndarray:
    """Per task id: True where the rank's previous task in program order is of another
    virtual stage (the first task of each rank: False)."""
    stage = graph.columns()["stage"]
    out = np.zeros(len(stage), dtype=bool)
    for units in graph.rank_units:
        order = [t for u in units for t in graph.units[u]]
        if len(order) > 1:
            ids = np.asarray(order, dtype=np.int64)
            out[ids[1:]] = stage[ids[1:]] != stage[ids[:-1]]
    return out


def switched_share(schedule: Schedule, trace: Trace) -> dict[tuple[str, int], float]:
    """(op, model stage) -> the share of those ops in `trace` that ran right after an op
    of another virtual stage on their rank (by start time)."""
    comp = np.flatnonzero((trace.lane == COMPUTE) & (trace.op < len(OPS)))
    model = np.asarray([s.model_stage for s in schedule.stages], dtype=np.int64)
    counts: dict[tuple[str, int], list[int]] = {}
    for r in np.unique(trace.rank[comp]):
        ids = comp[trace.rank[comp] == r]
        ids = ids[np.argsort(trace.start[ids], kind="stable")]
        after_other = np.r_[False, trace.stage[ids[1:]] != trace.stage[ids[:-1]]]
        for i, switched in zip(ids, after_other):
            seen = counts.setdefault((OPS[trace.op[i]], int(model[trace.stage[i]])), [0, 0])
            seen[0] += int(switched)
            seen[1] += 1
    return {key: s / n for key, (s, n) in counts.items()}


def switch_applies(costs: CostModel, num_model_stages: int) -> bool:
    """Whether `costs.stage_switch` lengthens ops of a schedule with this many model
    stages: yes unless its `model_stages` are cut for it (module docstring)."""
    return costs.stage_switch.any and (costs.model_stages is None or costs.layers is not None
                                       or len(costs.model_stages) >= num_model_stages)
