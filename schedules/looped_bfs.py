"""Looped BFS, breadth-first pipelining (Lamy-Poirier 2022): v chunks per rank.

Model stage k runs on rank k mod p. Each rank runs every microbatch's forward through
its chunk 0, then chunk 1, ... (breadth first), then the backwards chunk by chunk from
the last, newest microbatch first. Like GPipe it holds all m microbatches' activations;
its bubble shrinks with v like interleaved 1F1B's.
Constraints: p >= 1, m >= 1, v >= 1 (v = 1 is GPipe with last-in-first-out backwards).
"""
from __future__ import annotations

from .ir import BW, F, Schedule, Task, check_positive, looped_stages, uniform_paths


def build_looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    check_positive("looped-bfs", ranks=ranks, microbatches=microbatches, v=chunks)
    p, m, v = ranks, microbatches, chunks
    stages = looped_stages(p, v)
    paths, mb_paths = uniform_paths(stages, m)
    programs = []
    for r in range(p):
        program = [Task(F, mb, c * p + r) for c in range(v) for mb in range(m)]
        program += [Task(BW, mb, c * p + r) for c in reversed(range(v)) for mb in reversed(range(m))]
        programs.append(program)
    return Schedule("looped-bfs", p, m, stages, paths, mb_paths, programs, {"v": v})
