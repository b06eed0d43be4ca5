"""ZB-H1 (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism"), one stage per rank.

1F1B with the backward split: rank r warms up with min(p-r-1, m) forwards, then runs
F, B pairs; from its (r+1)-th pair on, each pair is followed by the oldest deferred W.
The r deferred Ws fill the cool-down gaps that 1F1B leaves idle. Peak activations stay
p microbatches (as 1F1B's rank 0). With m >= p the makespan is
m(F+B+W) + (p-1)(F+B-W): a third of 1F1B's bubble when F = B = W.
Constraints: p >= 1, m >= 1.
"""
from __future__ import annotations

from .ir import B, F, W, Schedule, Task, check_positive, looped_stages, uniform_paths


def build_zb_h1(ranks: int, microbatches: int) -> Schedule:
    check_positive("zb-h1", ranks=ranks, microbatches=microbatches)
    p, m = ranks, microbatches
    stages = looped_stages(p, 1)
    paths, mb_paths = uniform_paths(stages, m)
    programs = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        program = [Task(F, mb, r) for mb in range(warmup)]
        weights = 0
        for mb in range(m):
            if mb + warmup < m:
                program.append(Task(F, mb + warmup, r))
            program.append(Task(B, mb, r))
            if mb >= r:
                program.append(Task(W, weights, r))
                weights += 1
        program += [Task(W, mb, r) for mb in range(weights, m)]
        programs.append(program)
    return Schedule("zb-h1", p, m, stages, paths, mb_paths, programs)
