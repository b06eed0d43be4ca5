"""Placing consecutive layers on model stages.

A model is a list of n layers with a weight each (seconds per microbatch, e.g. F + B + W),
plus an extra weight on the first model stage (the embedding) and one on the last (the
LM head and loss). A split gives model stage k `counts[k]` consecutive layers; its load
is the sum of its layers' weights plus its extras. A stage may hold no layer only when
it holds an extra (the embedding or the head), else it would compute nothing.

`balanced_split` minimises the slowest stage's load exactly, then, among the splits that
reach that minimum, the sum of squared loads (so the stages that are not the bottleneck
are as even as they can be too). Small problems (S n^2 up to `_DP_CELLS`) run a dynamic
programme over (stage, layers placed so far): O(S n^2) time, the inner minimum
vectorised with numpy. Larger ones find the least bottleneck by bisection on its value
(a greedy fill checks each candidate in O(S log n)) and the sum of squares by the same
programme with its inner minimum found by divide and conquer, one numpy pass per level
(the squared load is convex, so the best cut moves right as the stage's end does):
O(S n log n) time. Both keep O(S n) cut indices (int32); S x n is bounded by
`MAX_STAGE_LAYERS`.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from typing import Sequence

import numpy as np

from pipesched.schedules.numbers import is_int, is_real

from .stage_costs import fsum

MAX_LAYERS = 100_000
"""The most layers a split takes."""
MAX_STAGE_LAYERS = 4_000_000
"""The most model stages x layers a balanced split takes (its time and its cut table
grow with the product: about 1 s and 16 MB at the bound)."""
_ROWS = 512  # rows of the (j, i) matrix handled at once, to bound memory
_DP_CELLS = 2_000_000  # S x n^2 up to which the plain O(S n^2) programme runs


class PartitionError(ValueError):
    """A split that cannot exist: more stages than layers, negative weights, bad counts."""


def min_layers(num_stages: int, has_first: bool, has_last: bool) -> list[int]:
    """The least layers each stage must hold: 0 for a stage holding an extra, else 1."""
    return [0 if (k == 0 and has_first) or (k == num_stages - 1 and has_last) else 1 for k in range(num_stages)]


def _check(weights: Sequence[float], num_stages: int, first: float, last: float) -> None:
    if not is_int(num_stages) or num_stages < 1:
        raise PartitionError(f"the number of model stages must be an integer >= 1, got {num_stages!r}")
    if len(weights) > MAX_LAYERS:
        raise PartitionError(f"{len(weights)} layers is more than the {MAX_LAYERS:,} a split takes")
    if num_stages * len(weights) > MAX_STAGE_LAYERS:
        raise PartitionError(f"a balanced split of {len(weights):,} layers on {num_stages:,} model stages is more "
                             f"than the {MAX_STAGE_LAYERS:,} stages x layers it takes; split them even or as "
                             "given (counts)")
    for name, value in [("first-stage extra", first), ("last-stage extra", last)] + \
            [(f"layer {i}", w) for i, w in enumerate(weights)]:
        if not is_real(value) or not math.isfinite(value) or value < 0:
            raise PartitionError(f"{name}'s weight must be a finite number >= 0 seconds, got {value!r}")
    if not math.isfinite(fsum([*weights, first, last])):
        raise PartitionError("the layers' times add up to more than the largest float (about 1.8e308 s): "
                             "the costs are too large")


def _check_fits(n: int, lows: list[int]) -> None:
    if n < sum(lows):
        raise PartitionError(f"{n} layers cannot fill {len(lows)} model stages: {sum(lows)} of them hold "
                             "no embedding or head and need a layer each")


def check_counts(counts: Sequence[int], num_layers: int, num_stages: int, has_first: bool = False,
                 has_last: bool = False) -> list[int]:
    """`counts` as a list, or PartitionError unless it is a split of `num_layers` layers on
    `num_stages` stages (integers >= the least each stage holds, adding up)."""
    counts = list(counts)
    if len(counts) != num_stages or any(not is_int(c) or c < 0 for c in counts):
        raise PartitionError(f"layers per stage {counts} must be {num_stages} integers >= 0, one per model stage")
    if sum(counts) != num_layers:
        raise PartitionError(f"layers per stage {counts} add up to {sum(counts)}, the model has {num_layers} layers")
    lows = min_layers(num_stages, has_first, has_last)
    empty = next((k for k, (c, lo) in enumerate(zip(counts, lows)) if c < lo), None)
    if empty is not None:
        raise PartitionError(f"layers per stage {counts}: model stage {empty} holds no layer and no embedding "
                             "or head, so it would compute nothing")
    return counts


def even_split(num_layers: int, num_stages: int, has_first: bool = False, has_last: bool = False) -> list[int]:
    """Layers per stage as even as counts go; the remainder goes to the middle stages
    first (the first and last stages already hold the embedding and the head)."""
    lows = min_layers(num_stages, has_first, has_last)
    _check_fits(num_layers, lows)
    base, extra = divmod(num_layers, num_stages)
    order = list(range(1, num_stages - 1)) + [0, num_stages - 1] if num_stages > 2 else list(range(num_stages))
    counts = [base] * num_stages
    for k in order[:extra]:
        counts[k] += 1
    return counts


def stage_loads(weights: Sequence[float], counts: Sequence[int], first: float = 0.0, last: float = 0.0) -> list[float]:
    """Each stage's load under the split `counts` (the weights' unit, e.g. seconds)."""
    loads, start = [], 0
    for k, c in enumerate(counts):
        loads.append(fsum(weights[start:start + c]) + (first if k == 0 else 0.0)
                     + (last if k == len(counts) - 1 else 0.0))
        start += c
    return loads


def _dp(prefix: np.ndarray, lows: list[int], first: float, last: float, cap: float | None) -> list[int]:
    """Backtracked counts of the DP. cap None: minimise the largest load; else minimise
    the sum of squared loads among splits whose every load is <= cap."""
    n, s = len(prefix) - 1, len(lows)
    value = np.full(n + 1, np.inf)
    value[0] = 0.0
    cuts = np.zeros((s, n + 1), dtype=np.int64)
    idx = np.arange(n + 1)
    for k in range(s):
        extra = (first if k == 0 else 0.0) + (last if k == s - 1 else 0.0)
        new = np.full(n + 1, np.inf)
        for j0 in range(0, n + 1, _ROWS):
            js = idx[j0:j0 + _ROWS]
            load = prefix[js, None] - prefix[None, :] + extra          # (j, i): stage k holds layers [i, j)
            allowed = idx[None, :] <= js[:, None] - lows[k]
            if cap is None:
                total = np.maximum(value[None, :], load)
            else:
                total = np.where(load <= cap, value[None, :] + load * load, np.inf)
            total = np.where(allowed, total, np.inf)
            best = np.argmin(total, axis=1)
            new[js] = total[np.arange(len(js)), best]
            cuts[k, js] = best
        value = new
    if not np.isfinite(value[n]):
        raise PartitionError("no split fits")  # unreachable after _check_fits: a safeguard
    counts, j = [], n
    for k in range(s - 1, -1, -1):
        i = int(cuts[k, j])
        counts.append(j - i)
        j = i
    return counts[::-1]


def _rest_lows(lows: list[int]) -> list[int]:
    """For each stage, the least layers the stages after it hold."""
    rest, out = 0, []
    for lo in reversed(lows):
        out.append(rest)
        rest += lo
    return out[::-1]


def _greedy(prefix: list[float], lows: list[int], first: float, last: float, cap: float) -> list[int] | None:
    """Counts of the split that gives each stage in turn as many layers as fit under
    `cap` (leaving the later stages their least), or None when none fits under it."""
    n, s = len(prefix) - 1, len(lows)
    rest = _rest_lows(lows)
    counts, i = [], 0
    for k in range(s):
        extra = (first if k == 0 else 0.0) + (last if k == s - 1 else 0.0)
        if k == s - 1:
            j = n
        else:
            j = min(bisect_right(prefix, prefix[i] + (cap - extra)) - 1, n - rest[k])
        if j < i + lows[k] or prefix[j] - prefix[i] + extra > cap:
            return None
        counts.append(j - i)
        i = j
    return counts


def _least_bottleneck(prefix: list[float], lows: list[int], first: float, last: float) -> list[int]:
    """A split whose largest load is the least any split has: bisection over the
    non-negative doubles (ordered as their bit patterns), each checked by `_greedy`."""
    top = (prefix[-1] + first + last) * (1 + 1e-12) + 1e-300
    while _greedy(prefix, lows, first, last, top) is None:  # rounding only
        top = top * 2 + 1e-300
    bits = lambda x: int(np.float64(x).view(np.int64))  # noqa: E731
    lo, hi = 0, bits(top)
    while lo < hi:
        mid = (lo + hi) // 2
        if _greedy(prefix, lows, first, last, float(np.int64(mid).view(np.float64))) is None:
            lo = mid + 1
        else:
            hi = mid
    return _greedy(prefix, lows, first, last, float(np.int64(hi).view(np.float64)))  # type: ignore[return-value]


def _squares_dp(prefix: np.ndarray, lows: list[int], first: float, last: float, cap: float) -> list[int]:
    """The counts minimising the sum of squared loads among splits whose every load is
    <= cap, as `_dp` finds them, with each stage's inner minimum by divide and conquer.

    For stage k ending at j the cut i ranges over [lo(j), hi(j)] (both ends grow with j)
    and the cost value[i] + (P[j] - P[i] + extra)^2 is Monge, so the leftmost best cut
    grows with j: the middle row of every open range of rows is solved at once per level,
    and splits the cuts its neighbours may take."""
    n, s = len(prefix) - 1, len(lows)
    rest = _rest_lows(lows)
    value = np.full(n + 1, np.inf)
    value[0] = 0.0
    cuts: list[tuple[int, np.ndarray]] = []  # per stage: (first row, best cut of each row)
    for k in range(s):
        extra = (first if k == 0 else 0.0) + (last if k == s - 1 else 0.0)
        reach = np.flatnonzero(np.isfinite(value))
        if not len(reach):
            raise PartitionError("no split fits")  # unreachable after _check_fits: a safeguard
        lo_prev, hi_prev = int(reach[0]), int(reach[-1])
        j_lo, j_hi = (n, n) if k == s - 1 else (lo_prev + lows[k], n - rest[k])
        js = np.arange(j_lo, j_hi + 1)
        lo_i = np.maximum(np.searchsorted(prefix, prefix[js] + extra - cap, side="left"), lo_prev)
        hi_i = np.minimum(js - lows[k], hi_prev)
        rows = np.flatnonzero(lo_i <= hi_i)  # positions in js
        new = np.full(n + 1, np.inf)
        best_cut = np.zeros(len(js), dtype=np.int32)
        r_lo, r_hi = np.array([0]), np.array([len(rows) - 1])
        o_lo, o_hi = np.array([lo_prev]), np.array([hi_prev])
        while len(r_lo):
            mid = (r_lo + r_hi) // 2
            pos = rows[mid]
            j = js[pos]
            a = np.maximum(o_lo, lo_i[pos])
            b = np.minimum(o_hi, hi_i[pos])
            off = a > b  # only where rounding broke the order: the row's whole range
            a[off], b[off] = lo_i[pos][off], hi_i[pos][off]
            lens = b - a + 1
            starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
            seg = np.repeat(np.arange(len(mid)), lens)
            i = a[seg] + (np.arange(int(lens.sum())) - starts[seg])
            load = prefix[j[seg]] - prefix[i] + extra
            cost = value[i] + load * load
            low = np.minimum.reduceat(cost, starts)
            hit = np.flatnonzero(cost == low[seg])
            hit = hit[np.concatenate(([True], seg[hit][1:] != seg[hit][:-1]))]
            pick = i[hit]
            new[j] = low
            best_cut[pos] = pick
            left, right = r_lo <= mid - 1, mid + 1 <= r_hi
            r_lo, r_hi, o_lo, o_hi = (np.concatenate((r_lo[left], (mid + 1)[right])),
                                      np.concatenate(((mid - 1)[left], r_hi[right])),
                                      np.concatenate((o_lo[left], pick[right])),
                                      np.concatenate((pick[left], o_hi[right])))
        value = new
        cuts.append((j_lo, best_cut))
    if not np.isfinite(value[n]):
        raise PartitionError("no split fits")  # unreachable after _check_fits: a safeguard
    counts, j = [], n
    for k in range(s - 1, -1, -1):
        j_lo, best_cut = cuts[k]
        i = int(best_cut[j - j_lo])
        counts.append(j - i)
        j = i
    return counts[::-1]


def balanced_split(weights: Sequence[float], num_stages: int, first: float = 0.0, last: float = 0.0,
                   has_first: bool | None = None, has_last: bool | None = None) -> list[int]:
    """Layers per stage (consecutive) minimising the largest stage load, ties broken by
    the smallest sum of squared loads. `first`/`last`: the first and last stage's extra
    weights; `has_first`/`has_last`: whether those stages hold an embedding/head and so
    may hold no layer (default: when their extra weight is > 0)."""
    _check(weights, num_stages, first, last)
    has_first = first > 0 if has_first is None else has_first
    has_last = last > 0 if has_last is None else has_last
    lows = min_layers(num_stages, has_first, has_last)
    _check_fits(len(weights), lows)
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(weights, dtype=float))))
    small = num_stages * (len(weights) + 1) ** 2 <= _DP_CELLS
    least = _dp(prefix, lows, first, last, None) if small else _least_bottleneck(prefix.tolist(), lows, first, last)
    bottleneck = max(stage_loads(weights, least, first, last))
    # prefix sums and fsum may differ in the last bits: allow the bottleneck that much more
    cap = bottleneck * (1 + 1e-9) + 1e-300
    return (_dp if small else _squares_dp)(prefix, lows, first, last, cap)
