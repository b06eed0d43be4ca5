"""Validation of any schedule, built-in or hand-written.

`validate` checks structure (placement, paths, exactly one F and either one BW or one
B and one W per (microbatch, virtual stage) on the microbatch's path, and at most one R,
the recompute-forward), then proves the
combined graph of data and program-order edges acyclic. A cycle is a deadlock and the
error spells it out as ops per rank.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .graph import TaskGraph, build_graph, unit_label
from .ir import B, BW, F, OPS, R, W, Overlap, Schedule, ScheduleError, unit_tasks
from .timeline import graph_waves
from .numbers import is_int


def _is_count(value: object) -> bool:
    return is_int(value)


def check_structure(s: Schedule) -> None:
    """Raise ScheduleError naming the first structural problem found."""
    if not _is_count(s.ranks) or s.ranks < 1:
        raise ScheduleError(f"ranks must be an integer >= 1, got {s.ranks!r}")
    if not _is_count(s.microbatches) or s.microbatches < 1:
        raise ScheduleError(f"microbatches must be an integer >= 1, got {s.microbatches!r}")
    if len(s.programs) != s.ranks:
        raise ScheduleError(f"need one program per rank: {s.ranks} ranks, {len(s.programs)} programs")
    if not s.stages:
        raise ScheduleError("schedule has no virtual stages")
    for i, st in enumerate(s.stages):
        if not (_is_count(st.rank) and 0 <= st.rank < s.ranks):
            raise ScheduleError(f"virtual stage {i} is placed on rank {st.rank!r}, outside 0..{s.ranks - 1}")
        if not _is_count(st.model_stage) or st.model_stage < 0:
            raise ScheduleError(f"virtual stage {i} has model_stage {st.model_stage!r}, need an integer >= 0")
    _check_paths(s)
    if not _programs_are_sound(s):
        _check_programs(s)  # names the first problem


def _programs_are_sound(s: Schedule) -> bool:
    """True when `_check_programs` would find nothing, checked on arrays; False says only
    that something is wrong (`_check_programs` then finds what)."""
    items = [(rank, item) for rank, program in enumerate(s.programs) for item in program]
    if any(isinstance(item, Overlap) and item.first == item.second for _, item in items):
        return False
    tasks = [(rank, t) for rank, item in items for t in unit_tasks(item)]
    if not tasks:
        return False
    ranks, flat = zip(*tasks)
    ops, mbs, stages = zip(*flat)
    if not (all(type(x) is int for x in mbs) and all(type(x) is int for x in stages)):
        return False
    bits = [_BIT.get(op, 0) for op in ops]
    if 0 in bits:
        return False
    mb, stage, bit = np.asarray(mbs), np.asarray(stages), np.asarray(bits)
    n_stages, m = len(s.stages), s.microbatches
    if mb.min() < 0 or mb.max() >= m or stage.min() < 0 or stage.max() >= n_stages:
        return False
    if not (np.asarray([st.rank for st in s.stages])[stage] == np.asarray(ranks)).all():
        return False
    visits = np.zeros((len(s.paths), n_stages), dtype=bool)
    for p, path in enumerate(s.paths):
        visits[p, path] = True
    mb_path = np.asarray(s.microbatch_paths)
    if not visits[mb_path[mb], stage].all():
        return False
    cell = mb * n_stages + stage
    if len(np.unique(cell * 16 + bit)) != len(cell):  # an op twice
        return False
    have = np.zeros(m * n_stages, dtype=np.int64)
    np.bitwise_or.at(have, cell, bit)
    needed = visits[mb_path].ravel()  # every (microbatch, virtual stage) on its path
    return bool(np.isin(have[needed], COMPLETE).all())


def _check_paths(s: Schedule) -> None:
    if not s.paths:
        raise ScheduleError("schedule has no paths")
    depth = len(s.paths[0])
    for p, path in enumerate(s.paths):
        if len(path) != depth:
            raise ScheduleError(f"path {p} has {len(path)} stages, path 0 has {depth}: every path must cross the whole model")
        for k, st in enumerate(path):
            if not (_is_count(st) and 0 <= st < len(s.stages)):
                raise ScheduleError(f"path {p} names virtual stage {st!r}, outside 0..{len(s.stages) - 1}")
            if s.stages[st].model_stage != k:
                raise ScheduleError(
                    f"path {p} position {k} is virtual stage {st} running model stage "
                    f"{s.stages[st].model_stage}; a path must run model stages 0..{depth - 1} in order")
    if len(s.microbatch_paths) != s.microbatches:
        raise ScheduleError(f"microbatch_paths has {len(s.microbatch_paths)} entries for {s.microbatches} microbatches")
    for mb, p in enumerate(s.microbatch_paths):
        if not (_is_count(p) and 0 <= p < len(s.paths)):
            raise ScheduleError(f"microbatch {mb} follows path {p!r}, outside 0..{len(s.paths) - 1}")


_BIT = {F: 1, B: 2, W: 4, BW: 8, R: 16}
# the ops one (microbatch, virtual stage) may have: F and a fused or split backward, with or without R
COMPLETE = (1 | 8, 1 | 2 | 4, 1 | 16 | 8, 1 | 16 | 2 | 4)


def _check_programs(s: Schedule) -> None:
    n_stages, m = len(s.stages), s.microbatches
    stage_rank = [st.rank for st in s.stages]
    path_sets = [set(p) for p in s.paths]
    on_path = [path_sets[s.microbatch_paths[mb]] for mb in range(m)]
    ops_of: dict[tuple[int, int], int] = {}
    for rank, program in enumerate(s.programs):
        for item in program:
            if isinstance(item, Overlap) and item.first == item.second:
                raise ScheduleError(f"rank {rank} overlaps {item.first} with itself")
            for t in unit_tasks(item):
                bit = _BIT.get(t.op)
                if bit is None:
                    raise ScheduleError(f"rank {rank} has unknown op {t.op!r}; ops are {', '.join(OPS)}")
                if type(t.mb) is not int or not 0 <= t.mb < m:
                    raise ScheduleError(f"rank {rank} has {t}: microbatch outside 0..{m - 1}")
                if type(t.stage) is not int or not 0 <= t.stage < n_stages:
                    raise ScheduleError(f"rank {rank} has {t}: virtual stage outside 0..{n_stages - 1}")
                if stage_rank[t.stage] != rank:
                    raise ScheduleError(f"rank {rank} has {t} but virtual stage {t.stage} is placed on rank {stage_rank[t.stage]}")
                if t.stage not in on_path[t.mb]:
                    raise ScheduleError(f"rank {rank} has {t} but microbatch {t.mb}'s path does not visit virtual stage {t.stage}")
                key = (t.mb, t.stage)
                have = ops_of.get(key, 0)
                if have & bit:
                    raise ScheduleError(f"{t} appears more than once; each op runs exactly once")
                ops_of[key] = have | bit
    for mb in range(m):
        for st in s.path_of(mb):
            have = ops_of.get((mb, st), 0)
            if have in COMPLETE:
                continue
            where = f"microbatch {mb} on virtual stage {st} (rank {stage_rank[st]})"
            if not have & 1:
                raise ScheduleError(f"{where} has no F")
            if have & 8:
                raise ScheduleError(f"{where} has both BW and B/W; use either the fused or the split backward")
            if not have & 14:
                missing = "BW, or B and W" + (" (its R recomputes F for a backward)" if have & 16 else "")
            else:
                missing = "W" if have & 2 else "B"
            raise ScheduleError(f"{where} has no {missing}")


def topological_units(graph: TaskGraph) -> tuple[list[int], list[tuple[int, int]]]:
    """(order, residual): a topological order of the units (wave by wave, see
    `schedules.timeline`) and the unit edges among the units left out, which are empty
    unless some units can never start: a deadlock."""
    waves = graph_waves(graph)
    order = waves.order.tolist()
    if waves.complete:
        return order, []
    left = np.ones(len(graph.units), dtype=bool)
    left[waves.order] = False
    prev = waves.prev
    col = graph.columns()
    a = np.concatenate((prev[prev >= 0], col["unit"][col["edge_src"]]))
    b = np.concatenate((np.flatnonzero(prev >= 0), col["unit"][col["edge_dst"]]))
    keep = left[a] & left[b]
    return order, list(zip(a[keep].tolist(), b[keep].tolist()))


def describe_cycle(graph: TaskGraph, residual: list[tuple[int, int]], limit: int = 16) -> str:
    """The cycle as 'rank r: op' steps, back to its start; long cycles are elided."""
    import networkx as nx  # only to spell out a deadlock; importing it costs more than validating

    cycle = [u for u, _ in nx.find_cycle(nx.DiGraph(residual))]
    steps = [f"rank {graph.unit_rank[u]}: {unit_label(graph, u)}" for u in cycle + cycle[:1]]
    if len(steps) > limit:
        steps = steps[:limit - 2] + [f"... ({len(steps) - limit + 1} more)", steps[-1]]
    return " -> ".join(steps)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a large acyclic structure is built:
    its collections would rescan the growing graph again and again (40 % of validation
    time at p=64, m=256). Nothing built here forms a cycle, so nothing is left behind."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def validate(schedule: Schedule) -> TaskGraph:
    """Check a schedule and return its compiled graph (with a topological unit order)."""
    with gc_paused():
        check_structure(schedule)
        graph = build_graph(schedule)
        order, residual = topological_units(graph)
    if residual:
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks: {describe_cycle(graph, residual)}")
    graph.topo_units = order
    return graph
