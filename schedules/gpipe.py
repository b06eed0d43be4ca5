"""GPipe (Huang et al. 2019): every forward, then every backward.

Rank r runs F(0..m-1) then BW(0..m-1) on its one stage. Idle per rank (p-1)(F+B+W);
makespan (m+p-1)(F+B+W); activations for all m microbatches are held at the turn.
Constraints: p >= 1, m >= 1.
"""
from __future__ import annotations

from .ir import BW, F, Schedule, Task, check_positive, looped_stages, uniform_paths


def build_gpipe(ranks: int, microbatches: int) -> Schedule:
    check_positive("gpipe", ranks=ranks, microbatches=microbatches)
    stages = looped_stages(ranks, 1)
    paths, mb_paths = uniform_paths(stages, microbatches)
    programs = [[Task(F, mb, r) for mb in range(microbatches)] +
                [Task(BW, mb, r) for mb in range(microbatches)] for r in range(ranks)]
    return Schedule("gpipe", ranks, microbatches, stages, paths, mb_paths, programs)
