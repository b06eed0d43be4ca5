"""DualPipe (DeepSeek-V3 report): two pipelines in opposite directions at once.

Each rank r holds two replicas' worth of stages: model stage r for microbatches that
flow 0 -> p-1 (the first half) and model stage p-1-r for those that flow p-1 -> 0 (the
second half), so parameters are held twice and the two replicas' gradients must be
summed after the step. The order is DualPipe's eight phases
(`schedules.dualpipe_phases`) with n = p/2 and h = min(r, p-1-r); phase 0 is the
direction whose forwards reach the rank first. Bubble (DualPipe README):
(PP/2-1)(F&B + B - 3W) with PP = p, B a full backward and F&B an overlapped pair.
Constraints: p even, m even (DeepSeek's code also asks m >= 2p; below that the phases
are laid out for p microbatches per direction and the missing ones dropped).
"""
from __future__ import annotations

from .dualpipe_phases import phase_program
from .ir import Schedule, ScheduleError, VirtualStage, check_positive


def build_dualpipe(ranks: int, microbatches: int) -> Schedule:
    check_positive("dualpipe", ranks=ranks, microbatches=microbatches)
    p, m = ranks, microbatches
    if p % 2:
        raise ScheduleError(f"dualpipe needs an even number of ranks, got {p}")
    if m % 2:
        raise ScheduleError(f"dualpipe needs an even number of microbatches (half flow each way), got {m}")
    # virtual stages 0..p-1: the downward replicas (model stage k on rank k);
    # p..2p-1: the upward replicas (model stage k on rank p-1-k)
    stages = [VirtualStage(k, k) for k in range(p)] + [VirtualStage(p - 1 - k, k) for k in range(p)]
    down, up = list(range(p)), [p + k for k in range(p)]
    half = m // 2
    first, second = list(range(half)), list(range(half, m))
    programs = []
    for r in range(p):
        mine_down, mine_up = r, p + (p - 1 - r)
        if r < p // 2:
            chunk, mbs = (mine_down, mine_up), (first, second)
        else:
            chunk, mbs = (mine_up, mine_down), (second, first)
        programs.append(phase_program(chunk, mbs, p // 2, min(r, p - 1 - r)))
    return Schedule("dualpipe", p, m, stages, [down, up], [0] * half + [1] * half, programs)
