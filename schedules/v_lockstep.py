"""The ready plays of many V building blocks at once: one numpy step advances every play.

`schedules.v_pattern.play` runs one block's ready play op by op in Python; a search plays
a few hundred blocks on the same ops and durations, and on tight limits many of them end
at the same makespan, so cutoffs spare little. Here all of them run side by side: each
step takes, in every play still running, the event the play's own heap would take next
(the rank of least wake-up time, the lowest such rank on ties) and decides it as `play`
does (the ready op of least slot that memory admits, else sleep until the soonest known
input), with the same floating-point sums, so every play ends with the same programs and
makespan as `play` gives it alone. A rank whose input has just been timed is woken as
`play` wakes its waiters (also where `play` would not have looked at that input yet: a
rank woken with nothing it may run goes back to sleep, so such a wake-up changes
nothing).

Units: as `schedules.v_pattern`: durations in seconds, memory in chunk activations.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

F0, F1, B1, B0, W1, W0 = range(6)
LOCKSTEP_FROM = 12  # ready plays from which a search runs them side by side (fewer: one by one)
LOCKSTEP_OPS = 4_000_000  # ops of the plays run side by side at once (their arrays: about 50 MB)
_BIG = np.iinfo(np.int64).max
_BACKS = np.array([False, False, True, True, False, False])
_WS = np.array([False, False, False, False, True, True])


def _consumers(p: int) -> np.ndarray:
    """Per rank and kind, the other rank whose op takes this op as input (-1: none, or
    the rank itself): F0 flows down the V, F1 and B0 up it, B1 down it."""
    out = np.full((p, 6), -1, dtype=np.int64)
    for r in range(p):
        out[r, F0] = r + 1 if r < p - 1 else -1
        out[r, F1] = r - 1 if r > 0 else -1
        out[r, B1] = r + 1 if r < p - 1 else -1
        out[r, B0] = r - 1 if r > 0 else -1
    return out


class Lockstep:
    """The ready plays of `tables` (slot tables, p x 6) on `ops` under `limit_units` and
    `caps` (see `v_pattern.play`), all run to their end: `makespans[j]` (seconds) or
    NaN where play j deadlocks; `programs(j)` its per-rank [(kind, microbatch)]. `ops`
    is a `v_pattern.Ops` (its p, m, dur and inputs(); not imported: v_pattern imports
    this module)."""

    def __init__(self, ops: Any, tables: list[list[list[int]]], limit_units: int, caps: list[int]):
        p, m, n = ops.p, ops.m, len(tables)
        self.p, self.m, self.n = p, m, n
        self.size = 6 * p * m + 2  # one play's ops as in `timing`, then 0.0 (no input) and a slot for no op
        self.rows = np.asarray(tables, dtype=np.int64).reshape(n * p, 6)
        self.limit, self.caps = limit_units, np.asarray(caps, dtype=np.int64)
        self.dur = np.asarray(ops.dur, dtype=np.float64)
        inputs = np.asarray(ops.inputs(), dtype=np.int64)
        self.inp = np.where(inputs >= 0, inputs, 6 * p * m)  # rank 0's F0 reads the 0.0 after the ops
        self.per_mb = (inputs >= 0).astype(np.int64)  # its input does not move with the microbatch
        self.cons = _consumers(p)
        self.end = np.full(n * self.size, math.nan)
        self.end[6 * p * m::self.size] = 0.0
        self.nxt = np.zeros((n * p, 6), dtype=np.int64)
        self.held = np.zeros(n * p, dtype=np.int64)
        self.fwd = np.zeros(n * p, dtype=np.int64)
        self.left = np.full(n * p, 6 * m, dtype=np.int64)
        self.free = np.zeros(n * p)
        self.wake = np.zeros(n * p)  # inf: asleep until woken, or done
        self.prog = np.zeros((n * p, 6 * m + 1), dtype=np.int32)  # the last column takes no op
        self.makespans = np.full(n, math.nan)
        self._run()

    def programs(self, j: int) -> list[list[tuple[int, int]]]:
        """Play j's programs: per rank, (kind, microbatch) in the order run."""
        m = self.m
        rows = self.prog[j * self.p:(j + 1) * self.p, :6 * m].tolist()
        return [[divmod(c, m) for c in row] for row in rows]

    def _run(self) -> None:
        p, n = self.p, self.n
        act = np.arange(n)
        wake2 = self.wake.reshape(n, p)
        ahead = float(self.dur.min())  # no op ends sooner after it starts
        while act.size:
            lw = wake2 if act.size == n else wake2[act]
            tmin = lw.min(1)
            over = tmin == math.inf  # done, or deadlocked (a rank left with ops it never runs)
            if over.any():
                for j in act[over].tolist():
                    if not self.left[j * p:(j + 1) * p].any():
                        self.makespans[j] = self.free[j * p:(j + 1) * p].max()
                act, lw, tmin = act[~over], lw[~over], tmin[~over]
                if not act.size:
                    break
            # Every event before tmin + ahead: none of them sees an op another one runs
            # (it ends at tmin + ahead or later), so they are decided together. Where
            # that sum rounds to tmin, only the heap's next event (the lowest rank).
            horizon = tmin + ahead
            window = lw < horizon[:, None]
            if not (horizon > tmin).all():
                window[np.arange(act.size), lw.argmin(1)] = True
            play, r = window.nonzero()
            self._step(act[play], r, lw[play, r])

    def _step(self, a: np.ndarray, r: np.ndarray, t: np.ndarray) -> None:
        """Events, one per (play a[x], rank r[x]) at time t[x] (seconds)."""
        p, m, size = self.p, self.m, self.size
        left, wake, free = self.left, self.wake, self.free
        fr = a * p + r
        nr = self.nxt[fr]
        off = a * size
        at = self.end[self.inp[r] + nr * self.per_mb[r] + off[:, None]]
        tc = t[:, None]
        due = at <= tc  # NaN (input not timed yet) is neither due nor later
        later = at > tc
        valid = nr < m
        h = self.held[fr]
        cool = self.fwd[fr] == 2 * m
        admit = valid.copy()
        admit[:, F0] &= (h + 2 <= self.limit) & ((nr[:, B1] != 0) | (nr[:, F0] < self.caps[r]))
        admit[:, F1] &= h + 1 <= self.limit
        consider = np.where(cool[:, None], valid & _BACKS, admit)
        elig = consider & due
        fallback = cool & ~elig.any(1)  # cool-down, no backward ready: a W whose B has run
        if fallback.any():
            elig[fallback] = valid[fallback] & due[fallback] & _WS
        k = np.where(elig, self.rows[fr] + 6 * nr, _BIG).argmin(1)
        rows_a = np.arange(a.size)
        got = elig[rows_a, k]
        i = nr[rows_a, k]
        e = t + self.dur[r, k]
        soon = np.where(consider & later, at, math.inf).min(1)
        ran = got.astype(np.int64)
        self.end[np.where(got, (6 * r + k) * m + i, size - 1) + off] = e
        self.nxt[fr, k] += ran
        self.prog[fr, np.where(got, 6 * m - left[fr], 6 * m)] = k * m + i
        left[fr] -= ran
        forward = ran * (k <= F1)
        self.held[fr] += forward - ran * (k >= W1)
        self.fwd[fr] += forward
        free[fr] = np.where(got, e, free[fr])
        wake[fr] = np.where(got, np.where(left[fr] > 0, e, math.inf), soon)
        q = self.cons[r, k]
        woken = got & (q >= 0)
        if woken.any():
            qa = (a * p + q)[woken]
            when = np.maximum(e[woken], free[qa])
            np.minimum.at(wake, qa, np.where(left[qa] > 0, when, math.inf))
