"""V-Min (Qi, Wan, Amar, Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS
2024): the V placement of ZB-V at about a third of 1F1B's activation memory.

Published: peak activations (p+4)//3 microbatches of one pipeline stage (1F1B: p) and a
bubble rate of about 2p/(3m) with F = B = W, the rate being 1 - m(F+B+W) / makespan.

Rule here: memory-bounded list scheduling (`schedules.bounded`) with each rank holding
at most (p+4)//3 microbatches' activations, counted from F until W; the fastest
play-out under the given op durations is kept. That count is stricter than the paper's
(where B frees most of a microbatch's memory and W keeps little), and the list
scheduler does not find the paper's steady state: measured with F = B = W the bubble
is at most the published one at m = 2p (p = 4: 0.314 against 0.333; p = 8: 0.278
against 0.333) but does not shrink as 2p/3m with more microbatches (p = 8, m = 32:
0.190 against 0.167 and 1F1B's 0.179; p = 16, m = 64: 0.298 against 0.167).
tests/test_controllable.py pins the memory and the m = 2p bubbles. `zb-auto
--max-activations N` gives the fastest order found at a given memory.
Constraints: p >= 1, m >= 1 (v is always 2).
"""
from __future__ import annotations

from .bounded import build_v_at_limit
from .greedy import OpTime
from .ir import Schedule


def v_min_limit(ranks: int) -> int:
    """Peak activations of V-Min, microbatches of one pipeline stage."""
    return (ranks + 4) // 3


def build_v_min(ranks: int, microbatches: int, op_time: OpTime | None = None) -> Schedule:
    return build_v_at_limit("v-min", ranks, microbatches, v_min_limit, op_time)
