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
from pipesched.schedules.ir import OPS

from .costs import CostModel


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


def switched_share(graph: TaskGraph) -> dict[tuple[str, int], float]:
    """(op, model stage) -> the share of those tasks that `switched_tasks` marks: how many
    of them a run of the schedule executes right after another stage's op."""
    col = graph.columns()
    model = np.asarray([s.model_stage for s in graph.schedule.stages], dtype=np.int64)[col["stage"]]
    switched = switched_tasks(graph)
    return {(OPS[o], int(k)): float(switched[(col["op"] == o) & (model == k)].mean())
            for o, k in {(int(a), int(b)) for a, b in zip(col["op"], model)}}


def switch_applies(costs: CostModel, num_model_stages: int) -> bool:
    """Whether `costs.stage_switch` lengthens ops of a schedule with this many model
    stages: yes unless its `model_stages` are cut for it (module docstring)."""
    return costs.stage_switch.any and (costs.model_stages is None or len(costs.model_stages) >= num_model_stages)
