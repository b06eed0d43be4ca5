"""ZB-H2 (Qi et al., ICLR 2024): zero bubble by spending memory, one stage per rank.

Every rank may hold up to 2p-1 microbatches' activations (from F until W), enough to
keep forwarding until the first backward returns. The order is played out greedily
(see `schedules.greedy`): a ready B or F, alternating when both are ready, and a
deferred W whenever neither is. With F = B = W and m >= p the only idle time is the
start skew: makespan m(F+B+W) + (p-1)F. Given op durations (or m < p), every
preference of the rule is played out under them and the fastest order kept.
Constraints: p >= 1, m >= 1.
"""
from __future__ import annotations

from .greedy import PREFERENCES, OpTime, Rule, equal_durations, play, unit_times
from .ir import B, F, W, Schedule, check_positive, looped_stages, uniform_paths
from .timeline import fastest


def build_zb_h2(ranks: int, microbatches: int, op_time: OpTime | None = None) -> Schedule:
    check_positive("zb-h2", ranks=ranks, microbatches=microbatches)
    stages = looped_stages(ranks, 1)
    paths, mb_paths = uniform_paths(stages, microbatches)
    # with equal op times and m >= p the alternating order is at the lower bound (start skew plus
    # one rank's work), so a search would return it, the first candidate (see equal_durations)
    tuned = microbatches < ranks or (op_time is not None and not equal_durations(op_time, (F, B, W), ranks))
    candidates = [play("zb-h2", ranks, microbatches, stages, paths, mb_paths,
                       Rule(memory_limit=lambda r: 2 * ranks - 1, prefer=prefer), op_time)
                  for prefer in (PREFERENCES if tuned else PREFERENCES[:1])]
    return fastest(candidates, op_time or unit_times(ranks)) if tuned else candidates[0]
