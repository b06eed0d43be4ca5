"""DualPipeV (DeepSeek): DualPipe cut in half and folded into a V.

2p model stages; rank r holds model stages r (phase 0) and 2p-1-r (phase 1), one
copy of the parameters, and every microbatch runs down the ranks and back (loss on
rank 0). The order is DualPipe's eight phases (`schedules.dualpipe_phases`) with n = p
and h = r. Bubble (DualPipe README): (PP/2-1)(F&B + B - 3W) with PP = 2p model stages,
B a full backward and F&B an overlapped pair, all of one chunk.
Constraints: p >= 1, m >= 1 (DeepSeek's code asks m >= 2p; below that the phases are
laid out for 2p microbatches and the missing ones dropped).
"""
from __future__ import annotations

from .dualpipe_phases import phase_program
from .ir import Schedule, check_positive, uniform_paths, v_stages


def build_dualpipev(ranks: int, microbatches: int) -> Schedule:
    check_positive("dualpipev", ranks=ranks, microbatches=microbatches)
    stages = v_stages(ranks)
    paths, mb_paths = uniform_paths(stages, microbatches)
    everyone = list(range(microbatches))
    programs = [phase_program((r, 2 * ranks - 1 - r), (everyone, everyone), ranks, r)
                for r in range(ranks)]
    return Schedule("dualpipev", ranks, microbatches, stages, paths, mb_paths, programs, {"v": 2})
