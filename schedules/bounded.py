"""List scheduling under a hard activation limit per rank, for any placement.

`schedules.greedy` caps memory op by op; with two chunks per rank that can deadlock: a
rank fills its limit with first-chunk forwards and then cannot run the second-chunk
forward its first backward waits for. Here a rank instead *admits* a microbatch when it
runs the microbatch's first forward on that rank, reserving the activations of all of
the microbatch's stages on the rank at once, and releases each stage's share at the op
that frees it (W, or a fused BW). Microbatches are admitted in increasing order, so as
long as a rank can hold one microbatch the play never deadlocks: the oldest unfinished
microbatch always has room on every rank (everything older is finished).

With two chunks per rank only the admission needs room for both: afterwards the
rank holds what it has run, and a second-chunk forward needs room for itself alone.
The oldest unfinished microbatch still finds it: everything older has been freed and
every admission left room for one second chunk (forwards of a stage run in microbatch
order, so no newer second chunk can take it first).

A rank that is free runs, in turn of preference: a ready backward or forward (which,
when both are ready, is the `Play.prefer` choice), else a deferred W. `Play.eager_w`
runs each W right after its B instead (1F1B-like memory, bubbles unfilled).
Units: activations in microbatches of one pipeline stage (`schedules.activations`),
op durations in seconds from `op_time`; transfers are free while playing.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable

from .greedy import PREFERENCES, OpTime, unit_times
from .ir import B, BW, F, W, Schedule, ScheduleError, Task, VirtualStage, check_positive, uniform_paths, v_stages

@dataclass(frozen=True)
class Play:
    """One way of playing a schedule out.

    limit: activations a rank may hold (microbatches of one pipeline stage).
    prefer: when a forward and a backward are both ready: alternate, backward or forward.
    depth_first: among ready forwards, the deepest model stage first (else the oldest
        microbatch first).
    eager_w: W right after its B (else deferred into gaps: zero bubble).
    split: separate B and W (else fused BW).
    reserve: admission reserves the whole microbatch until its last W (else, with at
        most two chunks per rank, a rank counts what it holds; see above). Holding
        back often plays better at loose limits, where greedy forwards crowd the rank.
    """

    limit: float
    prefer: str = "alternate"
    depth_first: bool = False
    eager_w: bool = False
    split: bool = True
    reserve: bool = False


def play_bounded(name: str, ranks: int, microbatches: int, stages: list[VirtualStage],
                 paths: list[list[int]], microbatch_paths: list[int], how: Play,
                 op_time: OpTime | None = None, params: dict | None = None) -> Schedule:
    """Per-rank programs of a list-scheduling play-out under `how` (see module doc).
    ScheduleError when one microbatch's activations on a rank exceed `how.limit`."""
    return play_timed(name, ranks, microbatches, stages, paths, microbatch_paths, how, op_time, params)[0]


def play_timed(name: str, ranks: int, microbatches: int, stages: list[VirtualStage],
               paths: list[list[int]], microbatch_paths: list[int], how: Play,
               op_time: OpTime | None = None, params: dict | None = None) -> tuple[Schedule, float]:
    """`play_bounded` and the makespan of its play (seconds, free transfers): every op
    starts once its rank is free and its inputs are done, so this is the makespan the
    exact engine gives the programs (`makespan_under`) when no op takes 0 s."""
    op_time = op_time or unit_times(ranks)
    num_model = len(paths[0])
    share = ranks / num_model
    sched = Schedule(name, ranks, microbatches, stages, paths, microbatch_paths,
                     [[] for _ in range(ranks)], dict(params or {}))
    bwd = B if how.split else BW
    kinds = (F, B, W) if how.split else (F, BW)
    # per (mb, k) on the path: stage, rank; ids are (op, mb, k)
    path = [sched.path_of(mb) for mb in range(microbatches)]
    rank_of = [st.rank for st in stages]
    model_of = [st.model_stage for st in stages]
    reserve = [[0.0] * ranks for _ in range(microbatches)]  # activations mb needs on each rank
    first_k = [[-1] * ranks for _ in range(microbatches)]    # where mb enters each rank
    for mb in range(microbatches):
        for k, s in enumerate(path[mb]):
            r = rank_of[s]
            reserve[mb][r] += share
            if first_k[mb][r] < 0:
                first_k[mb][r] = k
    worst = max(max(row) for row in reserve)
    if worst > how.limit + 1e-9:
        raise ScheduleError(f"{name}: one microbatch holds {worst:g} microbatches of activations on a rank, "
                            f"more than the limit {how.limit:g}; raise the limit")
    dur: dict[tuple[str, int], float] = {}
    for s in range(len(stages)):
        for op in kinds:
            d = op_time(op, model_of[s], num_model)
            if not (d >= 0 and math.isfinite(d)):
                raise ScheduleError("op durations used to build a schedule must be finite and >= 0")
            dur[op, s] = d
    positive = [d for d in dur.values() if d > 0]
    tiny = min(positive) * 1e-6 if positive else 1.0  # keeps causality of zero-length ops
    dur = {key: d if d > 0 else tiny for key, d in dur.items()}

    # per virtual stage: its microbatches in order and the next F / backward position
    stage_mbs: list[list[tuple[int, int]]] = [[] for _ in stages]
    for mb in range(microbatches):
        for k, s in enumerate(path[mb]):
            stage_mbs[s].append((mb, k))
    next_f = [0] * len(stages)
    next_b = [0] * len(stages)
    local = [[s for s, st in enumerate(stages) if st.rank == r and stage_mbs[s]] for r in range(ranks)]
    depth = len(paths[0])
    nan = math.nan
    done_at = [nan] * (microbatches * depth * 3)  # end time by _tid(op, mb, k); nan: not played

    def tid(op: str, mb: int, k: int) -> int:
        return (mb * depth + k) * 3 + (0 if op == F else 2 if op == W else 1)

    # With at most two stages of a microbatch on a rank, `held` is what the rank holds:
    # admission asks room for the whole microbatch, its second chunk only for itself
    # (the oldest unfinished microbatch then always finds room, see the module doc).
    # With more, admission reserves the whole microbatch and `held` counts reservations.
    reserving = how.reserve or any(sum(1 for s in path[mb] if rank_of[s] == r) > 2 for mb in range(microbatches) for r in range(ranks))
    held = [0.0] * ranks
    pending_w: list[list[tuple[int, int, int]]] = [[] for _ in range(ranks)]  # (mb, k, stage)
    remaining = [sum(len(stage_mbs[s]) for s in local[r]) * len(kinds) for r in range(ranks)]
    last_kind = [B] * ranks
    programs: list[list[Task]] = [[] for _ in range(ranks)]
    wake = [0.0] * ranks
    heap = [(0.0, r) for r in range(ranks) if remaining[r]]
    # who waits on whom: a finished op may wake the rank of its consumer
    waiting: dict[int, set[int]] = {}
    free = [0.0] * ranks
    # the ready time of each stage's next F / backward, once its inputs are played
    ready_next = {F: [nan] * len(stages), bwd: [nan] * len(stages)}

    def ready_time(op: str, s: int, mb: int, k: int) -> float | None:
        """When (op, mb, k)'s inputs are all done, or None while one is not yet played."""
        cached = ready_next[op][s]
        if cached == cached:
            return cached
        base = mb * depth + k
        if op == F:
            deps = (3 * (base - 1),) if k > 0 else ()
        else:
            deps = (3 * base, 3 * (base + 1) + 1) if k + 1 < depth else (3 * base,)
        t = 0.0
        for d in deps:
            x = done_at[d]
            if x != x:
                waiting.setdefault(d, set()).add(rank_of[s])
                return None
            if x > t:
                t = x
        ready_next[op][s] = t
        return t

    def best(r: int, t: float, op: str) -> tuple[tuple[int, int, int] | None, float]:
        """The preferred ready `op` of rank r at t as (mb, k, stage), and the soonest time
        another one becomes ready (inf when unknown)."""
        pointer = next_f if op == F else next_b
        choice, key_best, soonest = None, None, math.inf
        for s in local[r]:
            if pointer[s] >= len(stage_mbs[s]):
                continue
            mb, k = stage_mbs[s][pointer[s]]
            admits = k == first_k[mb][r]
            if op == F and held[r] > 1e-12 and (admits or not reserving):
                need = reserve[mb][r] if admits else share
                if held[r] + need > how.limit + 1e-9:
                    continue  # no room: not admitted, or (a later chunk) wait for a W
            at = ready_time(op, s, mb, k)
            if at is None:
                continue
            if at > t:
                soonest = min(soonest, at)
                continue
            key = (-model_of[s], mb) if (op == F and how.depth_first) else (mb, -model_of[s])
            if key_best is None or key < key_best:
                choice, key_best = (mb, k, s), key
        return choice, soonest

    def run(r: int, t: float, op: str, mb: int, k: int, s: int) -> float:
        end = t + dur[op, s]
        programs[r].append(Task(op, mb, s))
        remaining[r] -= 1
        done_at[tid(op, mb, k)] = end
        if op == F:
            next_f[s] += 1
            ready_next[F][s] = nan
            if reserving:
                if k == first_k[mb][r]:
                    held[r] += reserve[mb][r]
            else:
                held[r] += share
        elif op in (B, BW):
            next_b[s] += 1
            ready_next[bwd][s] = nan
            last_kind[r] = op
            if op == BW:
                held[r] -= share
            elif how.eager_w:
                programs[r].append(Task(W, mb, s))
                remaining[r] -= 1
                end += dur[W, s]
                done_at[tid(W, mb, k)] = end
                held[r] -= share
            else:
                pending_w[r].append((mb, k, s))
        else:
            held[r] -= share
        if op == F:
            last_kind[r] = F
        free[r] = end
        done = done_at[tid(op, mb, k)]  # an eager W does not delay what its B feeds
        for q in waiting.pop(tid(op, mb, k), ()):
            at = max(free[q], done)
            if q != r and remaining[q] and at < wake[q]:
                wake[q] = at
                heapq.heappush(heap, (at, q))
        return end

    while heap:
        t, r = heapq.heappop(heap)
        if t != wake[r] or not remaining[r]:
            continue  # stale
        f, f_next = best(r, t, F)
        b, b_next = best(r, t, bwd)
        if f is not None and b is not None:
            if how.prefer == "alternate":
                use_b = last_kind[r] == F
            else:
                use_b = how.prefer == "backward"
            op, (mb, k, s) = (bwd, b) if use_b else (F, f)
        elif f is not None or b is not None:
            op, (mb, k, s) = (F, f) if f is not None else (bwd, b)
        elif pending_w[r]:
            op, (mb, k, s) = W, pending_w[r].pop(0)
        else:
            wake[r] = min(f_next, b_next)
            if wake[r] < math.inf:
                heapq.heappush(heap, (wake[r], r))
            continue
        end = run(r, t, op, mb, k, s)
        if remaining[r]:
            wake[r] = end
            heapq.heappush(heap, (end, r))
    stuck = [r for r in range(ranks) if remaining[r]]
    if stuck:  # cannot happen by the admission argument above; kept as a guard
        raise ScheduleError(f"{name}: rank {stuck[0]} cannot proceed under the limit {how.limit:g}")
    sched.programs = programs  # type: ignore[assignment]
    return sched, max(free, default=0.0)


def fastest_play(name: str, ranks: int, microbatches: int, stages: list[VirtualStage],
                 paths: list[list[int]], microbatch_paths: list[int], plays: list[Play],
                 op_time: OpTime | None = None, params: dict | None = None) -> Schedule:
    """The play-out that finishes first under `op_time` with free transfers (ties: the first)."""
    timed = [play_timed(name, ranks, microbatches, stages, paths, microbatch_paths, how, op_time, params)
             for how in plays]
    return min(timed, key=lambda x: x[1])[0]


def plays_at(limit: float, eager: bool = True) -> list[Play]:
    """The play-outs tried at one limit: each `prefer`, counting what a rank holds or
    reserving whole microbatches, plus (when `eager`) W right after B preferring
    forwards. Over p = 4, 8, m = 2p, 4p, F,B,W = 1,1,1 / 1,2,1 / 2,3,1 and limits from
    V-Min's to ZB-H2's, on three placements, these include every winner of the 24
    combinations of Play's options (depth_first never changed the result there)."""
    plays = [Play(limit, prefer, reserve=reserve) for reserve in (False, True) for prefer in PREFERENCES]
    if eager:
        plays.append(Play(limit, "forward", eager_w=True))
    return plays


def build_v_at_limit(name: str, ranks: int, microbatches: int, limit_of: Callable[[int], float],
                     op_time: OpTime | None) -> Schedule:
    """A V-placed schedule (rank r holds model stages r and 2p-1-r) holding at most
    `limit_of(ranks)` microbatches of one pipeline stage's activations: the fastest of
    `plays_at` that limit. ScheduleError unless ranks and microbatches are counts >= 1."""
    check_positive(name, ranks=ranks, microbatches=microbatches)
    stages = v_stages(ranks)
    paths, mb_paths = uniform_paths(stages, microbatches)
    return fastest_play(name, ranks, microbatches, stages, paths, mb_paths, plays_at(limit_of(ranks)), op_time,
                        {"v": 2})
