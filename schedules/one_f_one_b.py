"""1F1B, PipeDream-Flush (Narayanan et al. 2021): warm up, then one forward, one backward.

Rank r runs min(p-r-1, m) warm-up forwards, then alternates F and BW until the
forwards run out, then drains the remaining BWs. Idle per rank (p-1)(F+B+W), makespan
(m+p-1)(F+B+W) like GPipe, but rank r holds at most p-r microbatches' activations.
Constraints: p >= 1, m >= 1.
"""
from __future__ import annotations

from .ir import BW, F, Schedule, Task, check_positive, looped_stages, uniform_paths


def build_1f1b(ranks: int, microbatches: int) -> Schedule:
    check_positive("1f1b", ranks=ranks, microbatches=microbatches)
    stages = looped_stages(ranks, 1)
    paths, mb_paths = uniform_paths(stages, microbatches)
    programs = []
    for r in range(ranks):
        warmup = min(ranks - r - 1, microbatches)
        program = [Task(F, mb, r) for mb in range(warmup)]
        for mb in range(warmup, microbatches):
            program += [Task(F, mb, r), Task(BW, mb - warmup, r)]
        program += [Task(BW, mb, r) for mb in range(microbatches - warmup, microbatches)]
        programs.append(program)
    return Schedule("1f1b", ranks, microbatches, stages, paths, mb_paths, programs)
