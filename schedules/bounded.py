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
from collections import Counter, OrderedDict, deque
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
    kept: the fraction of a stage's activations a split B leaves held until its W
        (the rest is freed at B; 1: all held until W). Freeing earlier only makes room,
        so the admission argument above still holds.
    """

    limit: float
    prefer: str = "alternate"
    depth_first: bool = False
    eager_w: bool = False
    split: bool = True
    reserve: bool = False
    kept: float = 1.0


CUTOFF_ROUNDING = 1e-7
"""Relative slack on a play's cutoff: its running sums of op durations (at most ten
million ops) round by far less, so a play is dropped only when it must end later."""


def play_bounded(name: str, ranks: int, microbatches: int, stages: list[VirtualStage],
                 paths: list[list[int]], microbatch_paths: list[int], how: Play,
                 op_time: OpTime | None = None, params: dict | None = None) -> Schedule:
    """Per-rank programs of a list-scheduling play-out under `how` (see module doc).
    ScheduleError when one microbatch's activations on a rank exceed `how.limit`."""
    return play_timed(name, ranks, microbatches, stages, paths, microbatch_paths, how, op_time, params)[0]


def play_timed(name: str, ranks: int, microbatches: int, stages: list[VirtualStage],
               paths: list[list[int]], microbatch_paths: list[int], how: Play,
               op_time: OpTime | None = None, params: dict | None = None,
               cutoff: float = math.inf) -> tuple[Schedule, float] | None:
    """`play_bounded` and the makespan of its play (seconds, free transfers): every op
    starts once its rank is free and its inputs are done, so this is the makespan the
    exact engine gives the programs (`makespan_under`) when no op takes 0 s.

    `cutoff` (seconds): a search that only keeps plays finishing by `cutoff` gets None,
    without the rest of the play, once a rank's end so far plus the work it has left
    exceeds it (by more than rounding: a play returned is never one that would finish
    after `cutoff`, a play dropped always would).

    Plays are remembered (`_PLAYED`): the same play on the same ops and durations, or one
    that differs only in what cannot change its course (a limit no rank can reach;
    reserving when no rank holds two stages of a microbatch), returns the order
    already played, in a new Schedule named `name` with `params`."""
    op_time = op_time or unit_times(ranks)
    num_model = len(paths[0])
    share = ranks / num_model
    kinds = (F, B, W) if how.split else (F, BW)
    path = [paths[microbatch_paths[mb]] for mb in range(microbatches)]
    rank_of = [st.rank for st in stages]
    reserve = [[0.0] * ranks for _ in range(microbatches)]  # activations mb needs on each rank
    first_k = [[-1] * ranks for _ in range(microbatches)]    # where mb enters each rank
    for mb in range(microbatches):
        need_mb, first_mb = reserve[mb], first_k[mb]
        for k, s in enumerate(path[mb]):
            r = rank_of[s]
            need_mb[r] += share
            if first_mb[r] < 0:
                first_mb[r] = k
    worst = max(max(row) for row in reserve)
    if worst > how.limit + 1e-9:
        raise ScheduleError(f"{name}: one microbatch holds {worst:g} microbatches of activations on a rank, "
                            f"more than the limit {how.limit:g}; raise the limit")
    dur = play_durations(stages, num_model, kinds, op_time)
    # most stages of one microbatch's path on one rank
    most = max(max(Counter(rank_of[s] for s in paths[i]).values()) for i in set(microbatch_paths))
    # With at most two stages of a microbatch on a rank, `held` is what the rank holds:
    # admission asks room for the whole microbatch, its second chunk only for itself
    # (the oldest unfinished microbatch then always finds room, see the module doc).
    # With more, admission reserves the whole microbatch and `held` counts reservations.
    reserving = how.reserve or most > 2
    # A limit no rank can reach (all it ever holds, with room for the rounding of the
    # running sums) never holds a forward back.
    most_held = max(sum(row[r] for row in reserve) for r in range(ranks))
    rounding = 4 * microbatches * num_model * most_held * 2.0 ** -53
    binding = most_held + rounding > how.limit + 1e-9
    key = (ranks, microbatches, tuple(stages), tuple(tuple(p) for p in paths), tuple(microbatch_paths),
           how.split, how.prefer, how.depth_first, how.eager_w, how.kept,
           binding and reserving and most > 1, how.limit if binding else None, tuple(dur.items()))
    played = _PLAYED.get(key)
    if played is None:
        played = _play(ranks, microbatches, stages, path, how, dur, share, reserve, first_k, reserving,
                       cutoff * (1 + CUTOFF_ROUNDING) if cutoff < math.inf else math.inf)
        if played is None:
            return None
        _PLAYED.put(key, played, sum(len(program or ()) for program in played[0]))
    programs, makespan = played
    stuck = [r for r, program in enumerate(programs) if program is None]
    if stuck:  # cannot happen by the admission argument in the module doc; kept as a guard
        raise ScheduleError(f"{name}: rank {stuck[0]} cannot proceed under the limit {how.limit:g}")
    return Schedule(name, ranks, microbatches, stages, paths, microbatch_paths,
                    [list(program) for program in programs], dict(params or {})), makespan


def play_durations(stages: list[VirtualStage], num_model: int, kinds: tuple[str, ...],
                   op_time: OpTime) -> dict[tuple[str, int], float]:
    """Seconds each op kind takes on each virtual stage in a play, by (op, stage): zero
    lengths become a millionth of the shortest other one, which keeps their causality."""
    dur: dict[tuple[str, int], float] = {}
    for s, st in enumerate(stages):
        for op in kinds:
            d = op_time(op, st.model_stage, num_model)
            if not (d >= 0 and math.isfinite(d)):
                raise ScheduleError("op durations used to build a schedule must be finite and >= 0")
            dur[op, s] = d
    positive = [d for d in dur.values() if d > 0]
    tiny = min(positive) * 1e-6 if positive else 1.0
    return {key: d if d > 0 else tiny for key, d in dur.items()}


def exact_bound(ranks: int, microbatches: int, stages: list[VirtualStage], paths: list[list[int]],
                microbatch_paths: list[int], op_time: OpTime, split: bool = True) -> float | None:
    """A makespan no play of these ops can beat (seconds): the busiest rank's work after
    the forwards its first op needs. None unless the plays' sums are exact in floating
    point (every duration a multiple of one power of two, all of them together below
    2**53 of it): then every play's makespan is >= the bound exactly, and a play at the
    bound cannot be beaten, only tied."""
    kinds = (F, B, W) if split else (F, BW)
    num_model = len(paths[0])
    dur = play_durations(stages, num_model, kinds, op_time)
    visits = [0] * len(stages)
    for i in microbatch_paths:
        for s in paths[i]:
            visits[s] += 1
    ratios = [d.as_integer_ratio() for d in dur.values()]
    unit = max(den for _, den in ratios)  # a power of two: durations are multiples of 1/unit
    total = sum(num * (unit // den) * visits[s] for (num, den), (_, s) in zip(ratios, dur))
    if total >= 2 ** 53:
        return None
    forward = [0.0] * num_model  # F's seconds at each model stage
    for (op, s), d in dur.items():
        if op == F:
            forward[stages[s].model_stage] = d
    work, head = [0.0] * ranks, [math.inf] * ranks
    for s, st in enumerate(stages):
        if visits[s]:
            work[st.rank] += visits[s] * sum(dur[op, s] for op in kinds)
            head[st.rank] = min(head[st.rank], sum(forward[:st.model_stage]))
    return max((h + w for h, w in zip(head, work) if h < math.inf), default=0.0)


def _play(ranks: int, microbatches: int, stages: list[VirtualStage], path: list[list[int]], how: Play,
          dur: dict[tuple[str, int], float], share: float, reserve: list[list[float]],
          first_k: list[list[int]], reserving: bool, cutoff: float = math.inf) -> tuple[list, float] | None:
    """The list-scheduling play itself: per-rank programs (None for a rank left with ops
    it cannot run) and the makespan (seconds); None once a rank cannot finish by
    `cutoff` (seconds, rounding margin included). One loop with local state: it runs for
    every op of every candidate a search tries."""
    bwd = B if how.split else BW
    n_stages = len(stages)
    model_of = [st.model_stage for st in stages]
    num_model = len(path[0]) if path else 0
    dur_f = [dur[F, s] for s in range(n_stages)]
    dur_b = [dur[bwd, s] for s in range(n_stages)]
    dur_w = [dur.get((W, s), 0.0) for s in range(n_stages)]
    limit, prefer, depth_first, eager_w = how.limit + 1e-9, how.prefer, how.depth_first, how.eager_w
    freed_at_b = share * (1.0 - how.kept)  # a deferred W frees the rest
    fused = bwd == BW
    # per virtual stage: its microbatches in order and the next F / backward position
    stage_mbs: list[list[tuple[int, int]]] = [[] for _ in stages]
    for mb in range(microbatches):
        for k, s in enumerate(path[mb]):
            stage_mbs[s].append((mb, k))
    n_of = [len(x) for x in stage_mbs]
    next_f = [0] * n_stages
    next_b = [0] * n_stages
    local = [[s for s, st in enumerate(stages) if st.rank == r and stage_mbs[s]] for r in range(ranks)]
    depth = num_model
    nan, inf = math.nan, math.inf
    # end time by id (mb * depth + k) * 3 + (0 for F, 1 for B or BW, 2 for W); nan: not played
    done_at = [nan] * (microbatches * depth * 3)
    per_stage = 3 if how.split else 2
    held = [0.0] * ranks
    pending_w: list[deque[tuple[int, int, int]]] = [deque() for _ in range(ranks)]  # (mb, k, stage)
    remaining = [sum(n_of[s] for s in local[r]) * per_stage for r in range(ranks)]
    work = [sum(n_of[s] * (dur_f[s] + dur_b[s] + (dur_w[s] if per_stage == 3 else 0.0)) for s in local[r])
            for r in range(ranks)]  # seconds of ops each rank has still to run
    last_f = [False] * ranks  # whether the rank's last F or backward was an F
    programs: list[list[Task]] = [[] for _ in range(ranks)]
    wake = [0.0] * ranks
    heap = [(0.0, r) for r in range(ranks) if remaining[r]]
    # who waits on whom: a finished op may wake the rank of its consumer
    waiting: dict[int, set[int]] = {}
    free = [0.0] * ranks
    # the ready time of each stage's next F / backward, once its inputs are played
    ready_f = [nan] * n_stages
    ready_b = [nan] * n_stages
    push, pop = heapq.heappush, heapq.heappop
    new = tuple.__new__  # new(Task, ...) skips the NamedTuple's Python-level constructor

    while heap:
        t, r = pop(heap)
        if t != wake[r] or not remaining[r]:
            continue  # stale
        # the preferred ready forward, and the soonest another becomes ready
        f = None
        f_key = f_next = inf
        h = held[r]
        for s in local[r]:
            i = next_f[s]
            if i >= n_of[s]:
                continue
            mb, k = stage_mbs[s][i]
            admits = k == first_k[mb][r]
            if h > 1e-12 and (admits or not reserving):
                if h + (reserve[mb][r] if admits else share) > limit:
                    continue  # no room: not admitted, or (a later chunk) wait for a W
            at = ready_f[s]
            if at != at:
                if k > 0:
                    d = 3 * (mb * depth + k - 1)
                    x = done_at[d]
                    if x != x:
                        if d in waiting:  # (no new set per look when one is there)
                            waiting[d].add(r)
                        else:
                            waiting[d] = {r}
                        continue
                    at = x if x > 0.0 else 0.0
                else:
                    at = 0.0
                ready_f[s] = at
            if at > t:
                if at < f_next:
                    f_next = at
                continue
            key = (num_model - 1 - model_of[s]) * microbatches + mb if depth_first else \
                mb * num_model + num_model - 1 - model_of[s]
            if key < f_key:
                f, f_key = (mb, k, s), key
        # the same for backwards: the oldest microbatch, then the deepest stage
        b = None
        b_key = b_next = inf
        for s in local[r]:
            i = next_b[s]
            if i >= n_of[s]:
                continue
            mb, k = stage_mbs[s][i]
            at = ready_b[s]
            if at != at:
                base = mb * depth + k
                x = done_at[3 * base]
                if x != x:
                    if 3 * base in waiting:  # (no new set per look when one is there)
                        waiting[3 * base].add(r)
                    else:
                        waiting[3 * base] = {r}
                    continue
                at = x if x > 0.0 else 0.0
                if k + 1 < depth:
                    x = done_at[3 * base + 4]
                    if x != x:
                        if 3 * base + 4 in waiting:  # (no new set per look when one is there)
                            waiting[3 * base + 4].add(r)
                        else:
                            waiting[3 * base + 4] = {r}
                        continue
                    if x > at:
                        at = x
                ready_b[s] = at
            if at > t:
                if at < b_next:
                    b_next = at
                continue
            key = mb * num_model + num_model - 1 - model_of[s]
            if key < b_key:
                b, b_key = (mb, k, s), key
        if f is not None and b is not None:
            use_b = last_f[r] if prefer == "alternate" else prefer == "backward"
            code, (mb, k, s) = (1, b) if use_b else (0, f)
        elif f is not None:
            code, (mb, k, s) = 0, f
        elif b is not None:
            code, (mb, k, s) = 1, b
        elif pending_w[r]:
            code, (mb, k, s) = 2, pending_w[r].popleft()
        else:
            wake[r] = f_next if f_next < b_next else b_next
            if wake[r] < inf:
                push(heap, (wake[r], r))
            continue
        # run it
        tid = (mb * depth + k) * 3 + code
        remaining[r] -= 1
        if code == 0:
            end = t + dur_f[s]
            programs[r].append(new(Task, (F, mb, s)))
            done_at[tid] = end
            next_f[s] += 1
            ready_f[s] = nan
            if reserving:
                if k == first_k[mb][r]:
                    held[r] += reserve[mb][r]
            else:
                held[r] += share
            last_f[r] = True
        elif code == 1:
            end = t + dur_b[s]
            programs[r].append(new(Task, (bwd, mb, s)))
            done_at[tid] = end
            next_b[s] += 1
            ready_b[s] = nan
            last_f[r] = False
            if fused:
                held[r] -= share
            elif eager_w:
                programs[r].append(new(Task, (W, mb, s)))
                remaining[r] -= 1
                end += dur_w[s]
                done_at[tid + 1] = end
                held[r] -= share
            else:
                held[r] -= freed_at_b
                pending_w[r].append((mb, k, s))
        else:
            end = t + dur_w[s]
            programs[r].append(new(Task, (W, mb, s)))
            done_at[tid] = end
            held[r] -= share - freed_at_b
        free[r] = end
        work[r] -= dur_f[s] if code == 0 else dur_w[s] if code == 2 else \
            dur_b[s] + (dur_w[s] if eager_w and not fused else 0.0)
        if end + work[r] > cutoff:
            return None  # its remaining ops cannot all fit before the cutoff
        waiters = waiting.pop(tid, None)
        if waiters:
            done = done_at[tid]  # an eager W does not delay what its B feeds
            for q in waiters:
                fq = free[q]
                at = done if done > fq else fq
                if q != r and remaining[q] and at < wake[q]:
                    wake[q] = at
                    push(heap, (at, q))
        if remaining[r]:
            wake[r] = end
            push(heap, (end, r))
    out: list = [None if remaining[r] else programs[r] for r in range(ranks)]
    return out, max(free, default=0.0)


class _PlayCache:
    """Plays by what decides them, least recently used dropped first once they hold more
    than `max_ops` ops in all (a search tries a few dozen plays of one schedule size)."""

    def __init__(self, max_ops: int):
        self.max_ops, self.ops = max_ops, 0
        self.items: OrderedDict[tuple, tuple[tuple, int]] = OrderedDict()

    def get(self, key: tuple) -> tuple | None:
        hit = self.items.get(key)
        if hit is None:
            return None
        self.items.move_to_end(key)
        return hit[0]

    def put(self, key: tuple, value: tuple, ops: int) -> None:
        if ops > self.max_ops:
            return
        self.items[key] = (value, ops)
        self.ops += ops
        while self.ops > self.max_ops:
            _, (_, dropped) = self.items.popitem(last=False)
            self.ops -= dropped


_PLAYED = _PlayCache(max_ops=2_000_000)  # about 160 MB of Task tuples at most


def fastest_play(name: str, ranks: int, microbatches: int, stages: list[VirtualStage],
                 paths: list[list[int]], microbatch_paths: list[int], plays: list[Play],
                 op_time: OpTime | None = None, params: dict | None = None) -> Schedule:
    """The play-out that finishes first under `op_time` with free transfers (ties: the first).
    One at `exact_bound` cannot be beaten, only tied, so the plays after it are not played;
    one that cannot finish by the fastest so far is dropped part-way."""
    op_time = op_time or unit_times(ranks)
    same_ops = len({how.split for how in plays}) == 1
    timed, bound = [], None
    for how in plays:
        played = play_timed(name, ranks, microbatches, stages, paths, microbatch_paths, how, op_time, params,
                            min((t for _, t in timed), default=math.inf))
        if played is None:
            continue  # it would finish after the fastest so far
        timed.append(played)
        if bound is None:  # after a play, which has checked the durations
            bound = (exact_bound(ranks, microbatches, stages, paths, microbatch_paths, op_time, how.split)
                     if same_ops else None) or -math.inf
        if timed[-1][1] <= bound:
            break
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
