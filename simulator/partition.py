"""Placing consecutive layers on model stages.

A model is a list of n layers with a weight each (seconds per microbatch, e.g. F + B + W),
plus an extra weight on the first model stage (the embedding) and one on the last (the
LM head and loss). A split gives model stage k `counts[k]` consecutive layers; its load
is the sum of its layers' weights plus its extras. A stage may hold no layer only when
it holds an extra (the embedding or the head), else it would compute nothing.

`balanced_split` minimises the slowest stage's load exactly, then, among the splits that
reach that minimum, the sum of squared loads (so the stages that are not the bottleneck
are as even as they can be too). Both are dynamic programmes over (stage, layers placed
so far): O(S n^2) time, the inner minimum vectorised with numpy, O(S n) memory plus an
O(n x 512) block at a time.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pipesched.schedules.numbers import is_int, is_real

MAX_LAYERS = 100_000
"""The most layers a split takes (the DP is quadratic in them)."""
_ROWS = 512  # rows of the (j, i) matrix handled at once, to bound memory


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
    for name, value in [("first-stage extra", first), ("last-stage extra", last)] + \
            [(f"layer {i}", w) for i, w in enumerate(weights)]:
        if not is_real(value) or not math.isfinite(value) or value < 0:
            raise PartitionError(f"{name}'s weight must be a finite number >= 0 seconds, got {value!r}")


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
        loads.append(math.fsum(weights[start:start + c]) + (first if k == 0 else 0.0)
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
    bottleneck = max(stage_loads(weights, _dp(prefix, lows, first, last, None), first, last))
    # prefix sums and fsum may differ in the last bits: allow the bottleneck that much more
    cap = bottleneck * (1 + 1e-9) + 1e-300
    return _dp(prefix, lows, first, last, cap)
