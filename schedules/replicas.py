"""Data-parallel replicas of a schedule, as one schedule over all their ranks.

d replicas of a p-rank schedule run side by side on p x d ranks, global rank
g = q*p + r holding rank r of replica q (as `executor.data_parallel.Layout` places
them). Replica q's copy of virtual stage v is stage q*V + v, of microbatch i is
microbatch q*m + i, of path j is path q*P + j; no dependency crosses replicas (their
only meeting point, the gradient all-reduce, comes after the pipeline). Where the
replicas share a host's processors (`simulator.sharing`) their timelines are not the
same: simulating them together shows how they interleave.

    replica 0: ranks 0..p-1,      stages 0..V-1,      microbatches 0..m-1
    replica q: ranks qp..qp+p-1,  stages qV..qV+V-1,  microbatches qm..qm+m-1
"""
from __future__ import annotations

from .ir import Overlap, ProgramItem, Schedule, ScheduleError, Task, VirtualStage


def replicate(schedule: Schedule, replicas: int) -> Schedule:
    """The schedule of `replicas` copies of `schedule` (see the module docstring);
    `schedule` itself when replicas is 1. ScheduleError unless replicas >= 1."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ScheduleError(f"replicas must be an integer >= 1, got {replicas!r}")
    if replicas == 1:
        return schedule
    p, m, v, n_paths = schedule.ranks, schedule.microbatches, len(schedule.stages), len(schedule.paths)

    def moved(task: Task, q: int) -> Task:
        return Task(task.op, task.mb + q * m, task.stage + q * v)

    def item(it: ProgramItem, q: int) -> ProgramItem:
        return Overlap(moved(it.first, q), moved(it.second, q)) if isinstance(it, Overlap) else moved(it, q)

    qs = range(replicas)
    return Schedule(
        name=schedule.name, ranks=p * replicas, microbatches=m * replicas,
        stages=[VirtualStage(s.rank + q * p, s.model_stage) for q in qs for s in schedule.stages],
        paths=[[i + q * v for i in path] for q in qs for path in schedule.paths],
        microbatch_paths=[j + q * n_paths for q in qs for j in schedule.microbatch_paths],
        programs=[[item(it, q) for it in program] for q in qs for program in schedule.programs],
        params={**schedule.params, "replicas": replicas})
