"""ZB-V (Qi et al., ICLR 2024, section 6): two chunks per rank in a V.

Rank r holds model stages r and 2p-1-r, so a microbatch runs down the ranks and back
and its loss is on rank 0. The published order, per rank r:
  F0 x (2(p-r)-1); (F1, F0) x r; (F1, B1, W1) x (p-r);
  steady: F0 (while any remain), B0, W0, F1, B1, W1;
  cool-down: (B0, B1) x r; (B0, W0) x (p-r); then the remaining W1s and W0s.
For m < 2p-1 the order is built for 2p-1 microbatches and the extra ones dropped.
Peak activations: p microbatches' worth, as 1F1B. With F = B = W the only idle time is
the start skew, (p-1)F/2. That order stops being bubble-free when F, B and W differ
(or m < 2p-1), so the builder then also plays out the greedy zero-bubble rule
(`schedules.greedy`, each of its preferences, same memory limit) under the given op
durations and keeps whichever order finishes first.
Constraints: p >= 1, m >= 1 (v is always 2).
"""
from __future__ import annotations

from .greedy import PREFERENCES, OpTime, Rule, equal_durations, play, unit_times
from .ir import B, F, W, Schedule, ScheduleError, Task, check_positive, uniform_paths, v_stages
from .timeline import fastest


def published_order(ranks: int, microbatches: int) -> list[list[Task]]:
    p, n = ranks, max(microbatches, 2 * ranks - 1)
    programs = []
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r  # virtual stage index == model stage here
        nxt = {(op, c): 0 for op in (F, B, W) for c in (c0, c1)}
        program: list[Task] = []

        def emit(op: str, c: int) -> None:
            program.append(Task(op, nxt[op, c], c))
            nxt[op, c] += 1

        for _ in range(2 * (p - r) - 1):
            emit(F, c0)
        for _ in range(r):
            emit(F, c1)
            emit(F, c0)
        for _ in range(p - r):
            emit(F, c1), emit(B, c1), emit(W, c1)
        while nxt[F, c1] < nxt[F, c0] or nxt[F, c0] < n:
            if nxt[F, c0] < n:
                emit(F, c0)
            emit(B, c0), emit(W, c0), emit(F, c1), emit(B, c1), emit(W, c1)
        for _ in range(r):
            emit(B, c0), emit(B, c1)
        for _ in range(p - r):
            emit(B, c0), emit(W, c0)
        while nxt[W, c1] < nxt[B, c1]:
            emit(W, c1)
        while nxt[W, c0] < nxt[B, c0]:
            emit(W, c0)
        programs.append([t for t in program if t.mb < microbatches])
    return programs


def build_zb_v(ranks: int, microbatches: int, op_time: OpTime | None = None) -> Schedule:
    check_positive("zb-v", ranks=ranks, microbatches=microbatches)
    stages = v_stages(ranks)
    paths, mb_paths = uniform_paths(stages, microbatches)
    published = Schedule("zb-v", ranks, microbatches, stages, paths, mb_paths,
                         published_order(ranks, microbatches), {"v": 2})
    if microbatches >= 2 * ranks - 1 and (op_time is None or equal_durations(op_time, (F, B, W), 2 * ranks)):
        # at the lower bound, (p-1) forwards of skew plus one rank's work, so no candidate beats it
        # and a search would return it (the first candidate wins ties); see equal_durations
        return published
    greedy = []
    for prefer in PREFERENCES:
        try:
            greedy.append(play("zb-v", ranks, microbatches, stages, paths, mb_paths,
                               Rule(memory_limit=lambda r: ranks, prefer=prefer), op_time, {"v": 2}))
        except ScheduleError:
            # under uneven model stages a greedy play-out can deadlock at the memory limit;
            # the published order always runs, so that candidate is simply dropped
            continue
    return fastest([published, *greedy], op_time or unit_times(ranks))
