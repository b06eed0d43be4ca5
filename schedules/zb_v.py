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
    new = tuple.__new__  # new(Task, ...) skips the NamedTuple's Python-level constructor
    programs = []
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r  # virtual stage index == model stage here
        f0, f1, b0, b1, w0, w1 = range(6)  # (op, chunk) of F0, F1, B0, B1, W0, W1
        # The steady phase runs until both chunks have had n forwards: chunk 0 starts it
        # with 2p-r-1, chunk 1 with p, so n-2p+r+1 rounds begin with an F of chunk 0 and
        # p-r-1 more do not. Each op of each chunk takes microbatches 0, 1, ... in turn.
        order = ([f0] * (2 * (p - r) - 1) + [f1, f0] * r + [f1, b1, w1] * (p - r)
                 + [f0, b0, w0, f1, b1, w1] * (n - 2 * p + r + 1) + [b0, w0, f1, b1, w1] * (p - r - 1)
                 + [b0, b1] * r + [b0, w0] * (p - r) + [w1] * r + [w0] * r)
        # microbatches past m (the order is built for n >= 2p-1) are dropped
        runs = [[new(Task, (op, mb, c)) for mb in range(microbatches)] + [None] * (n - microbatches)
                for op, c in ((F, c0), (F, c1), (B, c0), (B, c1), (W, c0), (W, c1))]
        take = [iter(run).__next__ for run in runs]
        program = [take[k]() for k in order]
        programs.append(program if n == microbatches else [t for t in program if t is not None])
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
