"""Stage switches: an op that runs right after an op of another stage on the same rank.

A rank that holds two stages (DualPipe's two replicas, the chunks of interleaved and V
schedules) alternates between their weights and activations, and on a CPU an op right
after the other stage's ops finds its data out of the caches and runs longer, most on
small models (measured in one process on a 2-core VM: a forward up to 67 % longer). Runs of
1F1B and ZB-H1 hold one stage per rank and never show it. Calibration measures it with a
copy of each stage where each rank has its own cores (`executor.profile.switch_slowdown`);
the cost model keeps it as `StageSwitch`, each op kind's fraction of its time, and
`simulator.timing.resolve` adds it to the ops this module marks.

Here "after another stage" means: the previous task in the rank's program (the pair's
other task, for the second task of an overlapped pair) has another virtual stage. The
task after such a one, when it is of the same stage again, runs longer too, by less
(`StageSwitch.forward_second`, `backward_second`): the other stage's data still shares
the caches, for stages larger than a core's own (DualPipe's ops that do not switch are
mostly these, docs/accuracy.md).

Where a calibration's `model_stages` are cut for a finer split (v = 2 schedules from a
v = 1 calibration), the switch is not added: those op times come with each op kind's
fixed time, read from a run that switches stages on most ops (ZB-V), so they already
hold it; adding it there too predicted v = 2 schedules long (docs/accuracy.md).
"""
from __future__ import annotations

import numpy as np

from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import OPS, F, R

from .costs import CostModel, StageSwitch


def switched_tasks(graph: TaskGraph, second: bool = False) -> np.ndarray:
    """Per task id: True where the rank's previous task in program order is of another
    virtual stage (the first task of each rank: False); with `second`, True where the
    previous task is of the same stage and the one before it of another."""
    stage = graph.columns()["stage"]
    out = np.zeros(len(stage), dtype=bool)
    for units in graph.rank_units:
        ids = np.asarray([t for u in units for t in graph.units[u]], dtype=np.int64)
        changed = stage[ids[1:]] != stage[ids[:-1]]  # per task from the second: switched
        if not second:
            out[ids[1:]] = changed
        elif len(ids) > 2:
            out[ids[2:]] = changed[:-1] & ~changed[1:]
    return out


def switch_fractions(graph: TaskGraph, switch: StageSwitch) -> np.ndarray:
    """Per task id: how much longer it runs for the stage switches before it (a fraction
    of its own time: `StageSwitch`'s, on the tasks `switched_tasks` marks)."""
    forward = np.isin(graph.columns()["op"], [OPS.index(F), OPS.index(R)])
    return (np.where(forward, switch.forward, switch.backward) * switched_tasks(graph)
            + np.where(forward, switch.forward_second, switch.backward_second) * switched_tasks(graph, second=True))


def switch_factors(graph: TaskGraph, switch: StageSwitch) -> dict[tuple[str, int], float]:
    """(op, model stage) -> how much longer those tasks run on average in a run of the
    schedule for the stage switches before them (1 where none follow a switch)."""
    col = graph.columns()
    model = np.asarray([s.model_stage for s in graph.schedule.stages], dtype=np.int64)[col["stage"]]
    longer = 1.0 + switch_fractions(graph, switch)
    return {(OPS[o], int(k)): float(longer[(col["op"] == o) & (model == k)].mean())
            for o, k in {(int(a), int(b)) for a, b in zip(col["op"], model)}}


def switch_applies(costs: CostModel, num_model_stages: int) -> bool:
    """Whether `costs.stage_switch` lengthens ops of a schedule with this many model
    stages: yes unless its `model_stages` are cut for it (module docstring)."""
    return costs.stage_switch.any and (costs.model_stages is None or len(costs.model_stages) >= num_model_stages)
