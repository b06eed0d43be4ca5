"""V-Min (Qi, Wan, Amar, Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS
2024): the V placement of ZB-V at about a third of 1F1B's activation memory.

Published: peak activations (p+4)//3 microbatches of one pipeline stage (1F1B: p) and a
bubble rate of about 2p/(3m) with F = B = W, the rate being idle time over useful
compute, (makespan - m(F+B+W)) / (m(F+B+W)).

Rule here: memory-bounded list scheduling (`schedules.bounded`) with each rank holding
at most (p+4)//3 microbatches' activations, counted from F until W; the fastest
play-out under the given op durations is kept. That count is stricter than the paper's
(where B frees most of a microbatch's memory and W keeps little), and under it the
bubble is larger than published: measured with F = B = W, 0.25 at p = 8, m = 32 against
the published 0.17, and above 1F1B's for p >= 12 (tests/test_controllable.py pins the
memory, and the bubble where it is at most 1F1B's). Use `zb-auto
--max-activations N` for the fastest order found at a given memory.
Constraints: p >= 1, m >= 1 (v is always 2).
"""
from __future__ import annotations

from .bounded import fastest_play, plays_at
from .greedy import OpTime
from .ir import Schedule, check_positive, uniform_paths, v_stages


def v_min_limit(ranks: int) -> int:
    """Peak activations of V-Min, microbatches of one pipeline stage."""
    return (ranks + 4) // 3


def build_v_min(ranks: int, microbatches: int, op_time: OpTime | None = None) -> Schedule:
    check_positive("v-min", ranks=ranks, microbatches=microbatches)
    stages = v_stages(ranks)
    paths, mb_paths = uniform_paths(stages, microbatches)
    return fastest_play("v-min", ranks, microbatches, stages, paths, mb_paths,
                        plays_at(v_min_limit(ranks)), op_time, {"v": 2})
