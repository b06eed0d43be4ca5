"""V-Half (Qi, Wan, Amar, Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS
2024): the V placement of ZB-V (rank r holds model stages r and 2p-1-r) at half of
1F1B's activation memory.

Published: peak activations (p+2)//2 microbatches of one pipeline stage (1F1B: p) and a
bubble rate of about p/(2m) with F = B = W (1F1B: about p/m), the rate being
1 - m(F+B+W) / makespan.

Rule here: the paper's building blocks are replaced by memory-bounded list scheduling
(`schedules.bounded`): each rank may hold (p+2)//2 microbatches' activations, counted
from F until W (stricter than the paper, where B frees most of them), every
preference is played out under the given op durations and the fastest order kept.
Measured with F = B = W (tests/test_controllable.py): peak exactly (p+2)//2 and a
bubble rate at most p/(2m) for p = 4, 8, 12, 16 and m = 2p, 4p (e.g. 0.107 at p = 8,
m = 32, published 0.125; 1F1B 0.179).
Constraints: p >= 1, m >= 1 (v is always 2).
"""
from __future__ import annotations

from .bounded import build_v_at_limit
from .greedy import OpTime
from .ir import Schedule


def v_half_limit(ranks: int) -> int:
    """Peak activations of V-Half, microbatches of one pipeline stage."""
    return (ranks + 2) // 2


def build_v_half(ranks: int, microbatches: int, op_time: OpTime | None = None) -> Schedule:
    return build_v_at_limit("v-half", ranks, microbatches, v_half_limit, op_time)
