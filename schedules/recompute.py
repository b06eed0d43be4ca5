"""Activation recomputation as a transform of any schedule.

`add_recompute` puts a recompute-forward R(mb, s) right before every backward (B or BW)
of a recomputed model stage, on the same rank: F then keeps only its stage input, R
re-runs the forward with autograd and the backward uses what R saved. Placing R
immediately before its backward keeps the activations alive for the shortest time
(R -> B), which is the point of recomputing. Builders need no change: every schedule,
built-in or loaded from a file, can be transformed. An overlapped pair holding a
backward gets its R as a unit of its own just before the pair.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from .ir import B, BW, R, ProgramItem, Schedule, ScheduleError, Task, unit_tasks
from .numbers import is_int


def recomputed_stages(schedule: Schedule, choice: bool | Iterable[int] | None) -> set[int]:
    """The model stages `choice` names: True every stage, False or None none, or an
    iterable of model stage indices (ScheduleError for one outside 0..S-1)."""
    if choice is None or choice is False:
        return set()
    if choice is True:
        return set(range(schedule.num_model_stages))
    stages = set()
    for k in choice:
        if not is_int(k) or not 0 <= k < schedule.num_model_stages:
            raise ScheduleError(f"recompute names model stage {k!r}, outside 0..{schedule.num_model_stages - 1}")
        stages.add(k)
    return stages


def add_recompute(schedule: Schedule, model_stages: bool | Iterable[int] | None = True) -> Schedule:
    """A copy of `schedule` in which every backward (B or BW) of the chosen model stages
    is preceded by its R (see `recomputed_stages`). Backwards that already have an R keep
    it (the transform is idempotent). The name gains "+recompute" when anything changed."""
    chosen = recomputed_stages(schedule, model_stages)
    if not chosen:
        return schedule
    model = [st.model_stage for st in schedule.stages]
    have = {(t.mb, t.stage) for t in schedule.tasks() if t.op == R}
    programs: list[list[ProgramItem]] = []
    added = 0
    for program in schedule.programs:
        out: list[ProgramItem] = []
        for item in program:
            for t in unit_tasks(item):
                if t.op in (B, BW) and model[t.stage] in chosen and (t.mb, t.stage) not in have:
                    out.append(Task(R, t.mb, t.stage))
                    have.add((t.mb, t.stage))
                    added += 1
            out.append(item)
        programs.append(out)
    if not added:
        return schedule
    params = dict(schedule.params)
    params["recompute"] = sorted(chosen) if len(chosen) < schedule.num_model_stages else "all"
    name = schedule.name if schedule.name.endswith("+recompute") else schedule.name + "+recompute"
    return replace(schedule, name=name, programs=programs, params=params)


def recomputes(schedule: Schedule) -> bool:
    """Whether the schedule has any R op."""
    return any(t.op == R for t in schedule.tasks())
