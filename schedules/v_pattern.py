"""Periodic V orders: repeated building blocks, played out under the real op durations.

On the V placement (rank r holds model stages r and 2p-1-r) each rank runs six kinds of
op per microbatch: F0 (forward of its first chunk), F1 (forward of its second chunk),
B1, B0 (their input backwards; a microbatch's backward runs the second chunks first)
and W1, W0 (weight gradients). In a steady state every rank runs the six once per
period of six slots, so a schedule is fixed by the slot each kind of op of microbatch 0
takes on each rank: microbatch i's op sits 6i slots later (the building blocks of Qi et
al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024).

The blocks tried here: rank 0 puts F0 in slot 0 and F1, B1, B0 in any three of the other
five; going one rank down, F0 and B1 move `offset` slots later (1 to 5; one offset for
the first `split` ranks, a smaller one after, as in the paper's appendix) and F1 and
B0 one slot earlier (they flow up the ranks); each W takes the first slot left free after
its B. Each kind of op of microbatch 0 then takes the first slot of its residue after
its input, so inputs always come first. How long a microbatch's activations live on a
rank, and so the peak memory, follows from those slots (`steady_peak`).

A block fixes a priority for every op (its slot); the play (`play`) runs it under the
real durations, and until the rank's last forward either
  - follows the order exactly ("strict"; the block's own memory), or
  - runs, whenever the rank is free, the ready op of highest priority that memory admits
    ("ready": a forward of a new microbatch needs room for both of its chunks, so the
    play cannot deadlock; see `schedules.bounded`), with at most U - min(r + 1, U // 2)
    first-chunk forwards before rank r's first backward (U: the limit in chunks, twice
    the microbatches): a warm-up that leaves room for the second-chunk forwards the
    first backwards wait for, more of them further down the V;
then runs its backwards as soon as they are ready and fills the gaps with deferred W's
(a tight cool-down: no forward is left, so deferring W's holds no more memory).
`fill_gaps` then moves a later op of the same rank into an idle gap wherever it fits
there whole, its input is ready and memory allows: no op starts later, so the makespan
never grows. The best orders are returned as Schedules with their makespans.

Units: activations in microbatches of one pipeline stage (a chunk holds half of one;
internally chunk units, one per chunk); durations in seconds from `op_time`; transfers
free while playing (the caller scores with its own costs).
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from functools import lru_cache
from itertools import permutations
from typing import Callable, Iterator

from .bounded import play_durations
from .greedy import OpTime
from .ir import B, F, W, Schedule, Task, uniform_paths, v_stages
from .v_lockstep import LOCKSTEP_FROM, LOCKSTEP_OPS, Lockstep

F0, F1, B1, B0, W1, W0 = range(6)
OPS = (F, F, B, B, W, W)
CHUNK = (0, 1, 1, 0, 1, 0)  # which chunk each kind runs: 0 = model stage r, 1 = 2p-1-r
MAX_OFFSET = 5


def slots(ranks: int, base: tuple[int, int, int], offsets: list[int]) -> list[list[int]] | None:
    """Slot of each kind of op of microbatch 0 on each rank (`module doc`), or None when
    two kinds of a rank fall on one residue. base: rank 0's slots of F1, B1, B0 (1-5,
    distinct; F0 is in slot 0); offsets[r]: how far F0 and B1 move from rank r to r+1."""
    p = ranks
    res = []
    cur = [0, *base]
    for r in range(p):
        if r:
            d = offsets[r - 1]
            cur = [(cur[0] + d) % 6, (cur[1] - 1) % 6, (cur[2] + d) % 6, (cur[3] - 1) % 6]
        if len(set(cur)) < 4:
            return None
        used = set(cur)
        row = cur + [0, 0]
        for k, after in ((W1, cur[2]), (W0, cur[3])):
            for j in range(1, 7):
                x = (after + j) % 6
                if x not in used:
                    row[k] = x
                    used.add(x)
                    break
        res.append(row)

    def first(t: int, residue: int) -> int:  # the first slot >= t with that residue
        return t + (residue - t) % 6

    s = [[0] * 6 for _ in range(p)]
    s[0][F0] = res[0][F0]
    for r in range(1, p):
        s[r][F0] = first(s[r - 1][F0] + 1, res[r][F0])
    s[p - 1][F1] = first(s[p - 1][F0] + 1, res[p - 1][F1])
    for r in range(p - 2, -1, -1):
        s[r][F1] = first(s[r + 1][F1] + 1, res[r][F1])
    s[0][B1] = first(s[0][F1] + 1, res[0][B1])
    for r in range(1, p):
        s[r][B1] = first(s[r - 1][B1] + 1, res[r][B1])
    s[p - 1][B0] = first(s[p - 1][B1] + 1, res[p - 1][B0])
    for r in range(p - 2, -1, -1):
        s[r][B0] = first(s[r + 1][B0] + 1, res[r][B0])
    for r in range(p):
        s[r][W1] = first(s[r][B1] + 1, res[r][W1])
        s[r][W0] = first(s[r][B0] + 1, res[r][W0])
    return s


@lru_cache(maxsize=1 << 15)
def _slots_of(ranks: int, base: tuple[int, int, int], big: int, small: int, split: int
              ) -> tuple[tuple[int, ...], ...] | None:
    """`slots` with offset `big` for the first `split` ranks and `small` after, as tuples:
    remembered, since every search at any m and limit walks the same blocks."""
    table = slots(ranks, base, [big] * split + [small] * (ranks - 1 - split))
    return None if table is None else tuple(map(tuple, table))


def steady_peak(table: list[list[int]], microbatches: int) -> int:
    """Most chunk activations any rank holds when it runs `table` strictly (an upper bound
    for few microbatches): a chunk's activations live from its F to its W."""
    m = microbatches
    worst = 0
    for s in table:
        n0 = min(m, (s[W0] - s[F0]) // 6 + 1)  # live first chunks when an F0 has just run
        n1 = min(m, (s[W1] - s[F1]) // 6 + 1)
        with1 = min(m, max(0, (s[F0] - s[F1]) // 6 - (s[F0] - s[W1]) // 6))  # second chunks live then
        with0 = min(m, max(0, (s[F1] - s[F0]) // 6 - (s[F1] - s[W0]) // 6))
        worst = max(worst, n0 + with1, n1 + with0)
    return worst


def family(ranks: int, microbatches: int, limit_units: int) -> list[list[list[int]]]:
    """Distinct slot tables whose strict play holds at most `limit_units` chunk
    activations: for each rank-0 block and pair of offsets, the split that lets the
    larger offset run longest (more slack, the same memory or less) and the one below it."""
    p = ranks
    out, seen = [], set()
    for base in permutations(range(1, 6), 3):
        for big in range(1, MAX_OFFSET + 1):
            for small in range(1, big + 1):
                splits = [p - 1] if small == big or p == 1 else list(range(p - 1, 0, -1))
                kept = 0
                for split in splits:
                    key = _slots_of(p, base, big, small, split)
                    if key is None or steady_peak(key, microbatches) > limit_units:
                        continue
                    if key not in seen:
                        seen.add(key)
                        out.append([list(row) for row in key])
                    kept += 1
                    if kept == 2:
                        break
    return out


class Ops:
    """The ops of a V play: durations by (rank, kind) (zero lengths made a millionth of the
    shortest other one, as `schedules.bounded` plays them, unless not `played`) and the
    input of each kind."""

    def __init__(self, ranks: int, microbatches: int, op_time: OpTime, played: bool = True):
        p = ranks
        self.p, self.m = p, microbatches
        stages = v_stages(p)
        dur = play_durations(stages, 2 * p, (F, B, W), op_time)  # checked; zero lengths made tiny
        if not played:  # the durations as given
            dur = {key: op_time(key[0], stages[key[1]].model_stage, 2 * p) for key in dur}
        self.dur = [[dur[OPS[k], r if CHUNK[k] == 0 else 2 * p - 1 - r] for k in range(6)] for r in range(p)]
        # the input of kind k on rank r: (rank, kind), or None for rank 0's F0
        self.dep: list[list[tuple[int, int] | None]] = []
        for r in range(p):
            self.dep.append([
                (r - 1, F0) if r else None,
                (p - 1, F0) if r == p - 1 else (r + 1, F1),
                (0, F1) if r == 0 else (r - 1, B1),
                (p - 1, B1) if r == p - 1 else (r + 1, B0),
                (r, B1),
                (r, B0),
            ])

    def inputs(self) -> list[list[int]]:
        """Per rank and kind, the flat index (6 * rank + kind) * m of microbatch 0's input
        (add the microbatch), -1 for rank 0's F0: the layout `timing` and `play` use."""
        return [[-1 if d is None else (6 * d[0] + d[1]) * self.m for d in row] for row in self.dep]

    def schedule(self, programs: list[list[tuple[int, int]]], name: str) -> Schedule:
        p, m = self.p, self.m
        stages = v_stages(p)
        paths, mb_paths = uniform_paths(stages, m)
        new = tuple.__new__
        progs = [[new(Task, (OPS[k], i, r if CHUNK[k] == 0 else 2 * p - 1 - r)) for k, i in prog]
                 for r, prog in enumerate(programs)]
        return Schedule(name, p, m, stages, paths, mb_paths, progs, {"v": 2})


def timing(ops: Ops, programs: list[list[tuple[int, int]]], end: list[float] | None = None,
           since: list[int] | None = None) -> tuple[float, list[float]] | None:
    """Makespan (seconds) and end of every op, at (6 * rank + kind) * m + microbatch, when
    each rank runs its program in order and starts an op once it is free and the input
    is done; None if the programs deadlock. Given `end` (updated in place) and `since[r]`,
    the ops before position since[r] of each rank keep their ends and only the rest is
    timed."""
    p, m, dur, dep = ops.p, ops.m, ops.dur, ops.dep
    nan = math.nan
    if end is None or since is None:
        end = [nan] * (6 * p * m)
        since = [0] * p
    base = [[(6 * r + k) * m for k in range(6)] for r in range(p)]
    inp = [[-1 if d is None else (6 * d[0] + d[1]) * m for d in dep[r]] for r in range(p)]
    ptr = list(since)
    free = [0.0] * p
    left = 0
    for r, prog in enumerate(programs):
        br = base[r]
        for k, i in prog[ptr[r]:]:
            end[br[k] + i] = nan
        left += len(prog) - ptr[r]
        if ptr[r]:
            k, i = prog[ptr[r] - 1]
            free[r] = end[br[k] + i]
    while left:  # each rank in turn runs until it waits for an input not yet timed
        moved = False
        for r in range(p):
            prog, j, t0 = programs[r], ptr[r], free[r]
            n = len(prog)
            if j == n:
                continue
            dr, br, ir = dur[r], base[r], inp[r]
            while j < n:
                k, i = prog[j]
                d = ir[k]
                if d < 0:
                    at = 0.0
                else:
                    at = end[d + i]
                    if at != at:
                        break
                t0 = (at if at > t0 else t0) + dr[k]
                end[br[k] + i] = t0
                j += 1
            if j != ptr[r]:
                left -= j - ptr[r]
                ptr[r], free[r] = j, t0
                moved = True
        if not moved:
            return None
    return max((free[r] for r, prog in enumerate(programs) if prog), default=0.0), end


class _PlayState:
    """Everything a play changes as it runs (`_advance`): plays of several blocks that
    agree on their ops so far share one, and copy it where they part."""

    def __init__(self, ops: Ops):
        p, m, dur = ops.p, ops.m, ops.dur
        # op (rank r, kind k, microbatch i) at (6r + k) m + i, as in `timing`: one flat index
        self.end = [math.nan] * (6 * p * m)
        self.nxt = [[0] * 6 for _ in range(p)]  # next microbatch of each kind
        self.at_of = [[math.nan] * 6 for _ in range(p)]  # when that op's input is done (nan: not yet known)
        self.held, self.forwards = [0] * p, [0] * p
        self.programs: list[list[tuple[int, int]]] = [[] for _ in range(p)]
        self.work = [m * sum(dur[r]) for r in range(p)]
        self.wake, self.free = [0.0] * p, [0.0] * p
        self.heap = [(0.0, r) for r in range(p)]
        self.waiting: dict[int, list[int]] = {}  # an op's index -> the ranks that wait for it
        self.left = [6 * m] * p

    def copy(self) -> "_PlayState":
        new = object.__new__(_PlayState)
        new.end, new.heap = list(self.end), list(self.heap)
        for name in ("nxt", "at_of", "programs"):
            setattr(new, name, [list(x) for x in getattr(self, name)])
        for name in ("held", "forwards", "work", "wake", "free", "left"):
            setattr(new, name, list(getattr(self, name)))
        new.waiting = {key: list(q) for key, q in self.waiting.items()}
        return new


def _advance(ops: Ops, st: _PlayState, rows: list[list[list[int]]], limit_units: int, ready: bool,
             caps: list[int], cutoff: float, start: tuple[float, int, int] | None) -> tuple:
    """Run the play in `st` (see `play`) for the blocks whose slot tables are `rows`
    (all of them agree on the ops run so far), from `start` (time, rank, kind: that op
    runs first) or the next event. Returns ("done", programs, makespan), ("none",) when
    it deadlocks or cannot end by `cutoff` (rounding margin included), or ("part", t, r,
    picks) where the blocks choose different ops: picks[j] is rows[j]'s kind for rank r
    at t, the state left as before that choice. Not `ready`: the strict play (one block)."""
    m, dur = ops.m, ops.dur
    nan, inf = math.nan, math.inf
    end, nxt, at_of, held, forwards = st.end, st.nxt, st.at_of, st.held, st.forwards
    programs, work, wake, free, heap, waiting, left = st.programs, st.work, st.wake, st.free, st.heap, \
        st.waiting, st.left
    inp = ops.inputs()
    push, pop = heapq.heappush, heapq.heappop
    two_m = 2 * m
    backs, ws, every = (B1, B0), (W1, W0), range(6)
    single = len(rows) == 1
    while True:
        if start is not None:
            t, r, pick = start
            start = None
            nr = nxt[r]
        else:
            if not heap:
                break
            t, r = pop(heap)
            if t != wake[r] or not left[r]:
                continue
            soon = inf
            nr, ar, ir = nxt[r], at_of[r], inp[r]
            no_f0 = no_f1 = False  # whether memory holds a forward of each chunk back
            if forwards[r] < two_m and not ready:  # the block's order, waiting for inputs
                kinds = (_first(rows[0][r], every, nr, m),)
            elif forwards[r] < two_m:  # any kind the block ranks first, if memory admits it
                kinds = every
                h = held[r]
                no_f0 = h + 2 > limit_units or (nr[B1] == 0 and nr[F0] >= caps[r])
                no_f1 = h + 1 > limit_units
            else:  # cool-down: backwards, then W's
                kinds = backs
            # the ready ops memory admits: one block picks the one it ranks first (its slot)
            # as it looks; several collect them all and part where they disagree
            found = []
            pick, best = -1, inf
            row = rows[0][r]
            for k in kinds:
                i = nr[k]
                if i >= m:
                    continue
                if k < 2 and (no_f1 if k else no_f0):
                    continue
                at = ar[k]
                if at != at:
                    d = ir[k]
                    if d < 0:
                        at = 0.0
                    else:
                        d += i
                        at = end[d]
                        if at != at:
                            if d in waiting:
                                waiting[d].append(r)
                            else:
                                waiting[d] = [r]
                            continue
                    ar[k] = at
                if at > t:
                    if at < soon:
                        soon = at
                    continue
                if single:
                    key = row[k] + 6 * i
                    if key < best:
                        best, pick = key, k
                else:
                    found.append(k)
            if pick < 0 and not found and forwards[r] == two_m:
                br = 6 * r * m
                for k in ws:
                    i = nr[k]
                    if i < m and end[br + (k - 2) * m + i] <= t:
                        if single:
                            key = row[k] + 6 * i
                            if key < best:
                                best, pick = key, k
                        else:
                            found.append(k)
            if found:
                pick = found[0] if len(found) == 1 else _parting(rows, r, found, nr)
                if pick < 0:
                    return "part", t, r, [_first(rows_j[r], found, nr, m) for rows_j in rows]
            if pick < 0:
                wake[r] = soon
                if soon < inf:
                    push(heap, (soon, r))
                continue
        # run it
        k = pick
        i = nr[k]
        dk = dur[r][k]
        e = t + dk
        x = 6 * r * m + k * m + i
        end[x] = e
        nr[k] = i + 1
        at_of[r][k] = nan
        left[r] -= 1
        programs[r].append((k, i))
        if k <= F1:
            held[r] += 1
            forwards[r] += 1
        elif k >= W1:
            held[r] -= 1
        free[r] = e
        work[r] -= dk
        if e + work[r] > cutoff:
            return ("none",)
        waiters = waiting.pop(x, None)
        if waiters:
            for q in waiters:
                fq = free[q]
                at = e if e > fq else fq
                if q != r and left[q] and at < wake[q]:
                    wake[q] = at
                    push(heap, (at, q))
        if left[r]:
            wake[r] = e
            push(heap, (e, r))
    if any(left):
        return ("none",)
    return "done", programs, max(free, default=0.0)


def _first(row: list[int], found, nxt: list[int], m: int) -> int:
    """The kind among `found` whose next op (microbatch nxt[kind], those below `m`) `row`
    ranks first. (The strict order's next op: a rank has run its first ops in it, the
    first nxt[kind] of each kind.)"""
    pick, best = -1, math.inf
    for k in found:
        i = nxt[k]
        if i < m:
            key = row[k] + 6 * i
            if key < best:
                best, pick = key, k
    return pick


def _parting(rows: list[list[list[int]]], r: int, found: list[int], nxt: list[int]) -> int:
    """The kind every block of `rows` picks on rank r among `found`, or -1 when they differ."""
    pick = _first(rows[0][r], found, nxt, math.inf)
    for rows_j in rows:
        if _first(rows_j[r], found, nxt, math.inf) != pick:
            return -1
    return pick


def _margin(cutoff: float) -> float:
    """`cutoff` with the relative 1e-7 rounding margin `play` allows."""
    return cutoff * (1 + 1e-7) if cutoff < math.inf else math.inf


def play(ops: Ops, table: list[list[int]], limit_units: int, ready: bool,
         caps: list[int] | None = None, cutoff: float = math.inf
         ) -> tuple[list[list[tuple[int, int]]], float] | None:
    """Per-rank programs [(kind, microbatch)] of one play of `table` (module doc) and its
    makespan (seconds); None when it deadlocks or cannot end by `cutoff` (seconds, a
    relative 1e-7 margin for rounding). `ready`: the ready play (else the strict one);
    `caps[r]`: most first-chunk forwards rank r runs before its first backward."""
    p, m = ops.p, ops.m
    out = _advance(ops, _PlayState(ops), [table], limit_units, ready,
                   caps if caps is not None else [m] * p, _margin(cutoff), None)
    return (out[1], out[2]) if out[0] == "done" else None


def play_ready(ops: Ops, tables: list[list[list[int]]], limit_units: int, caps: list[int],
               cutoff: Callable[[], float]) -> Iterator[tuple[list[int], list[list[tuple[int, int]]], float]]:
    """The ready plays of `tables` (`play` of each with `ready`), played together: the
    ops they agree on run once, and a play is copied where the blocks choose
    differently. Yields (indices into `tables`, their programs, makespan) for each
    distinct play that ends by `cutoff()` (asked again after each yield: a caller
    keeping the fastest lowers it), in no fixed order; the others are left out, as
    `play` gives them None."""
    # no tables where a screen kept only strict plays
    todo = [(_PlayState(ops), list(range(len(tables))), None)] if tables else []
    while todo:
        st, members, start = todo.pop()
        out = _advance(ops, st, [tables[j] for j in members], limit_units, True, caps,
                       _margin(cutoff()), start)
        if out[0] == "done":
            yield members, out[1], out[2]
        elif out[0] == "part":
            _, t, r, picks = out
            parts: dict[int, list[int]] = {}
            for j, k in zip(members, picks):
                parts.setdefault(k, []).append(j)
            groups = list(parts.items())
            for n, (k, group) in enumerate(groups):  # the state itself goes to the last
                todo.append((st if n == len(groups) - 1 else st.copy(), group, (t, r, k)))


def _after(prog: list[tuple[int, int]], br: list[int], end: list[float], since: float) -> int:
    """The position of rank's first op whose previous op ends at `since` or later."""
    lo, hi = 0, len(prog)
    while lo < hi:
        mid = (lo + hi) // 2
        if mid == 0:
            hi = mid
            continue
        k, i = prog[mid - 1]
        if end[br[k] + i] < since:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _first_gap(ops: Ops, prog: list[tuple[int, int]], r: int, end: list[float], since: float) -> float | None:
    """When rank r's first idle gap at `since` or later starts (its first fillable one
    starts no sooner), or None without one."""
    m, dr = ops.m, ops.dur[r]
    br = [(6 * r + k) * m for k in range(6)]
    lo = _after(prog, br, end, since)
    prev = end[br[prog[lo - 1][0]] + prog[lo - 1][1]] if lo else 0.0
    for j in range(lo, len(prog)):
        k, i = prog[j]
        e = end[br[k] + i]
        if e - dr[k] > prev * (1 + 1e-12) + 1e-15:
            return prev
        prev = e
    return None


def _rank_move(ops: Ops, prog: list[tuple[int, int]], r: int, end: list[float], limit_units: int,
               since: float) -> tuple[float, int, int, int] | None:
    """Rank r's earliest gap starting at `since` or later that a later op can fill (see
    `fill_gaps`): (gap start, r, position of the gap's op, position of the op), or None."""
    m, dr = ops.m, ops.dur[r]
    br = [(6 * r + k) * m for k in range(6)]
    ir = [-1 if d is None else (6 * d[0] + d[1]) * m for d in ops.dep[r]]
    lo = _after(prog, br, end, since)
    held = 0
    for k, i in prog[:lo]:
        held += 1 if k <= F1 else -1 if k >= W1 else 0
    prev = end[br[prog[lo - 1][0]] + prog[lo - 1][1]] if lo else 0.0
    for j in range(lo, len(prog)):
        k, i = prog[j]
        start = end[br[k] + i] - dr[k]
        if start > prev * (1 + 1e-12) + 1e-15:
            gap = start - prev
            seen = 1 << k  # each kind keeps its order: only its first op after the gap may move
            h = held + (1 if k <= F1 else -1 if k >= W1 else 0)
            top = max(held, h)
            for x in range(j + 1, len(prog)):
                kx, ix = prog[x]
                bit = 1 << kx
                if not seen & bit:
                    seen |= bit
                    if dr[kx] <= gap:
                        d = ir[kx]
                        ready = 0.0 if d < 0 else end[d + ix]
                        if ready <= prev and (kx > F1 or top + 1 <= limit_units):
                            return prev, r, j, x
                    if seen == 63:
                        break
                # what the rank holds after each op the moved one would now precede
                h += 1 if kx <= F1 else -1 if kx >= W1 else 0
                if h > top:
                    top = h
        held += 1 if k <= F1 else -1 if k >= W1 else 0
        prev = end[br[k] + i]
    return None


def _gap_moves(ops: Ops, programs: list[list[tuple[int, int]]], end: list[float], limit_units: int,
               since: float, earliest: bool = False) -> list[tuple[float, int, int, int]]:
    """Per rank, its earliest gap starting at `since` or later that a later op can fill
    (see `fill_gaps`): (gap start, rank, position of the gap's op, position of the op).
    With `earliest` only the least of them: ranks are looked at in the order of their
    first gap, and no further once a gap found starts before the next rank's first."""
    if not earliest:
        return [move for r, prog in enumerate(programs)
                if (move := _rank_move(ops, prog, r, end, limit_units, since)) is not None]
    firsts = sorted((g, r) for r, prog in enumerate(programs)
                    if (g := _first_gap(ops, prog, r, end, since)) is not None)
    best = None
    for g, r in firsts:
        if best is not None and g > best[0]:
            break  # its moves start later than the best, or tie it from a later rank
        move = _rank_move(ops, programs[r], r, end, limit_units, since)
        if move is not None and (best is None or move < best):
            best = move
    return [] if best is None else [best]


def fill_gaps(ops: Ops, programs: list[list[tuple[int, int]]], limit_units: int, max_rounds: int
              ) -> tuple[list[list[tuple[int, int]]], float]:
    """Move a later op of a rank into an idle gap of that rank where it fits whole, its
    input is done by the gap's start and the rank stays within `limit_units` chunk
    activations; ops of one kind keep their order. One such move starts no op later, so
    the makespan never grows, and nothing before the gap changes, so earlier gaps stay
    as they were and are not looked at again. Each round fills the earliest such gap;
    on plays of more than SINGLE_MOVES_UP_TO ops it fills the earliest of every rank at
    once and keeps them all when the makespan did not grow, else only the earliest. At
    most `max_rounds` rounds. Returns the programs (new lists) and their makespan."""
    m, dur = ops.m, ops.dur
    programs = [list(prog) for prog in programs]
    timed = timing(ops, programs)
    assert timed is not None
    makespan, end = timed
    since = 0.0
    for _ in range(max_rounds):
        moves = _gap_moves(ops, programs, end, limit_units, since, len(end) <= SINGLE_MOVES_UP_TO)
        if not moves:
            break
        moves.sort()
        if len(end) <= SINGLE_MOVES_UP_TO:
            moves = moves[:1]
        for batch in (moves, moves[:1]) if len(moves) > 1 else (moves,):
            trial = [list(prog) for prog in programs]
            for _, r, j, x in batch:
                trial[r].insert(j, trial[r].pop(x))
            first = batch[0][0]
            keep = []  # per rank, the first op starting after `first`: those before keep their times
            for q, prog in enumerate(trial):
                lo, hi = 0, len(prog)
                for gap_at, r, j, _ in batch:
                    if r == q:
                        hi = min(hi, j)
                while lo < hi:
                    mid = (lo + hi) // 2
                    k, i = prog[mid]
                    if end[(6 * q + k) * m + i] - dur[q][k] <= first:
                        lo = mid + 1
                    else:
                        hi = mid
                keep.append(lo)
            new_end = list(end)
            timed = timing(ops, trial, new_end, keep)
            if timed is not None and timed[0] <= makespan:
                programs, (makespan, end), since = trial, timed, first
                break
        else:
            break  # cannot happen: one move never makes the play longer (kept as a guard)
    return programs, makespan


READY_SLACK = 4  # chunk activations past the limit in the blocks whose priorities the ready plays follow
KEEP = 4  # plays kept for `fill_gaps` (the best after filling is often not the best before)
SCREEN = 6  # plays replayed in full after the screening on 3p microbatches
SCREEN_BEYOND = 4  # screening from this many times p microbatches on
FILL_ROUNDS = 64  # rounds of `fill_gaps` per play, fewer on large schedules:
FILL_WORK = 1_000_000  # ops timed by the rounds of one play (at least 8 rounds)
SINGLE_MOVES_UP_TO = 20_000  # ops of a play whose rounds move one op each (the earliest gap only)


_REMEMBERED: OrderedDict[tuple, list[tuple[list, float]]] = OrderedDict()  # the last searches' results
REMEMBER = 16


def v_pattern_plays(ranks: int, microbatches: int, op_time: OpTime, limit: float, name: str = "zb-auto",
                    keep: int = 2) -> list[tuple[Schedule, float]]:
    """The `keep` fastest orders found (module doc) holding at most `limit` microbatches
    of one pipeline stage's activations, with their makespans (seconds, free transfers),
    fastest first; [] when a microbatch does not fit. Beyond SCREEN_BEYOND * p
    microbatches every way is first played on 3p of them (the warm-up, a steady stretch
    and the cool-down) and only the SCREEN fastest are played on all. The last searches are remembered by what
    decides them (p, m, the limit in chunks, the op durations); each call gets new
    Schedules."""
    p, m = ranks, microbatches
    units = int(math.floor(2 * limit + 1e-9))
    if units < 2:
        return []
    ops = Ops(p, m, op_time)
    key = (p, m, units, keep, tuple(map(tuple, ops.dur)))
    found = _REMEMBERED.get(key)
    if found is None:
        found = _search(ops, units, op_time, keep)
        if any(d != x for row, real in zip(ops.dur, Ops(p, m, op_time, played=False).dur) for d, x in zip(row, real)):
            real = Ops(p, m, op_time, played=False)  # ops of no length: the makespan they really give
            found = sorted(((programs, timing(real, programs)[0]) for programs, _ in found), key=lambda x: x[1])
        _REMEMBERED[key] = found
        while len(_REMEMBERED) > REMEMBER:
            _REMEMBERED.popitem(last=False)
    else:
        _REMEMBERED.move_to_end(key)
    return [(ops.schedule(programs, name), makespan) for programs, makespan in found]


def _search(ops: Ops, units: int, op_time: OpTime, keep: int) -> list[tuple[list, float]]:
    p, m = ops.p, ops.m
    caps = [units - min(r + 1, units // 2) for r in range(p)]
    tables, slack = family(p, m, units + READY_SLACK), READY_SLACK
    while not tables and slack < 12 * p:  # a tight limit: the ready plays follow the leanest blocks
        slack *= 2
        tables = family(p, m, units + slack)
    ways = [(table, ready) for table in tables for ready in (False, True) if ready or steady_peak(table, m) <= units]

    if m > SCREEN_BEYOND * p:
        ways = [way for *_, way in _fastest(Ops(p, 3 * p, op_time), ways, SCREEN, units, caps)]
    filled = []
    for makespan, n, programs, _ in _fastest(ops, ways, KEEP, units, caps):
        programs, makespan = fill_gaps(ops, programs, units, max(8, min(FILL_ROUNDS, FILL_WORK // (6 * p * m))))
        filled.append((makespan, n, programs))
    filled.sort(key=lambda x: (x[0], x[1]))
    return [(programs, makespan) for makespan, _, programs in filled[:keep]]


def _fastest(ops: Ops, ways: list, count: int, units: int, caps: list[int]) -> list[tuple[float, int, list, tuple]]:
    """The `count` fastest of `ways` ((table, ready) pairs) on `ops`: (makespan in
    seconds, index in `ways`, programs, way), fastest first (ties: the first in `ways`)."""
    best: list[tuple[float, int, list, tuple]] = []  # (makespan, order, programs, way), fastest first

    def cutoff() -> float:
        return best[-1][0] if len(best) >= count else math.inf

    def add(makespan: float, n: int, programs: list) -> None:
        best.append((makespan, n, programs, ways[n]))
        best.sort(key=lambda x: (x[0], x[1]))
        del best[count:]

    # A play is dropped only when it must end after `cutoff()`, the count-th fastest so
    # far, so it could not be among the count fastest of all (ties: the first in
    # `ways`): the order the plays run in does not change what is kept.
    # The ready plays first: they are the faster as a rule, and a low cutoff drops
    # the strict plays early.
    readies = [n for n, (_, ready) in enumerate(ways) if ready]
    for makespan, j, programs in _ready_plays(ops, [ways[n][0] for n in readies], units, caps, count, cutoff):
        add(makespan, readies[j], programs)
    for n, (table, ready) in enumerate(ways):
        if not ready:
            played = play(ops, table, units, False, None, cutoff())
            if played is not None:
                add(played[1], n, played[0])
    return best


def _ready_plays(ops: Ops, tables: list, units: int, caps: list[int], count: int,
                 cutoff: Callable[[], float]) -> Iterator[tuple[float, int, list]]:
    """(makespan in seconds, index into `tables`, programs) of the ready plays of
    `tables`, at least the `count` fastest of them (ties: the first): from
    LOCKSTEP_FROM tables on, all played side by side (`schedules.v_lockstep`), which
    gives the same plays (every one to its end, LOCKSTEP_OPS ops of plays at a time;
    only the `count` fastest are yielded), else `play_ready` (each play dropped once it cannot end by `cutoff()`)."""
    if len(tables) >= LOCKSTEP_FROM:
        best: list[tuple[float, int, list]] = []
        group = max(1, LOCKSTEP_OPS // (6 * ops.p * ops.m))  # plays at once: their arrays hold this many ops
        for lo in range(0, len(tables), group):
            lock = Lockstep(ops, tables[lo:lo + group], units, caps)
            ended = sorted((x, j) for j, x in enumerate(lock.makespans.tolist()) if x == x)[:count]
            best = sorted(best + [(makespan, lo + j, lock.programs(j)) for makespan, j in ended])[:count]
        yield from best
        return
    for members, programs, makespan in play_ready(ops, tables, units, caps, cutoff):
        for j in members:  # blocks that agree on every op: one play, a copy each
            yield makespan, j, [list(prog) for prog in programs]
