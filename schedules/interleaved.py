"""Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): v chunks per rank.

Model stage k runs on rank k mod p as its chunk k // p. Microbatches go in rounds of
about p (max(1, m // p) rounds, sizes differing by at most one, so any m works):
within a round every chunk's forwards run before the next chunk's, chunk 0 first;
backwards mirror that with the last chunk first. Rank r warms up with
(v-1)*g + 2(p-1-r) forwards (g: the largest round, capped at m*v), then alternates one
F and one BW, then drains.
With m a multiple of p: makespan m(F+B+W) + (p-1)(F+B+W)/v.
Constraints: p >= 1, m >= 1, v >= 1 (v = 1 is plain 1F1B).
"""
from __future__ import annotations

from .ir import BW, F, Schedule, Task, check_positive, looped_stages, uniform_paths


def rounds(microbatches: int, ranks: int) -> list[range]:
    """max(1, m // p) consecutive rounds of microbatches, the larger ones first."""
    count = max(1, microbatches // ranks)
    size, extra = divmod(microbatches, count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        out.append(range(start, end))
        start = end
    return out


def chunk_order(groups: list[range], chunks: int, reverse: bool) -> list[tuple[int, int]]:
    """(microbatch, chunk) in Megatron order; `reverse` runs chunks last to first."""
    order = []
    for mbs in groups:
        for c in (reversed(range(chunks)) if reverse else range(chunks)):
            order += [(mb, c) for mb in mbs]
    return order


def build_interleaved_1f1b(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    check_positive("interleaved-1f1b", ranks=ranks, microbatches=microbatches, v=chunks)
    p, m, v = ranks, microbatches, chunks
    stages = looped_stages(p, v)
    paths, mb_paths = uniform_paths(stages, m)
    groups = rounds(m, p)
    largest = max(len(g) for g in groups)
    fwd = chunk_order(groups, v, reverse=False)
    bwd = chunk_order(groups, v, reverse=True)
    programs = []
    for r in range(p):
        warmup = min((v - 1) * largest + 2 * (p - 1 - r), m * v)
        f_tasks = [Task(F, mb, c * p + r) for mb, c in fwd]
        b_tasks = [Task(BW, mb, c * p + r) for mb, c in bwd]
        program = f_tasks[:warmup]
        for i in range(warmup, m * v):
            program += [f_tasks[i], b_tasks[i - warmup]]
        program += b_tasks[m * v - warmup:]
        programs.append(program)
    return Schedule("interleaved-1f1b", p, m, stages, paths, mb_paths, programs, {"v": v})
