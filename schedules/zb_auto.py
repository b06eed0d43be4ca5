"""zb-auto: the fastest order found for the given op durations under a memory limit.

Candidates, for v = 1 (one stage per rank), v = 2 (both the V placement of ZB-V and the
looped placement of interleaved 1F1B) or both (v not given):
  - memory-bounded list-scheduling play-outs (`schedules.bounded`) at the limit, with
    every preference; on two chunks also at limits a little above it, kept only where
    the order actually holds no more than the limit (admission reserves a whole
    microbatch, so a play often holds less than it was allowed);
  - on the V, under a given limit below 2p, the V's periodic building blocks played
    out under the durations (`schedules.v_pattern`): below 1F1B's memory the list
    scheduler's greedy forwards leave bubbles that a steady repeated block avoids;
  - every built-in schedule with those v (built for the same durations) that keeps one
    copy of each model stage (not DualPipe, whose two replicas are another layout).
Each play-out is first timed with free transfers (cheap) and the best few are scored
with `score`, as every built-in is; the lowest score wins.

The objective follows `step_barrier`, how the steps the schedule runs follow each other:
"all" (a barrier between steps, the default) minimizes the one-step makespan; "none"
(each rank starts the next step once its own ops are done) minimizes the steady-state
period, seconds per step back to back (`schedules.steady`). Without a barrier the
next step's forwards fill the previous step's tail, so an order with a longer makespan
can repeat faster: play-outs are then ranked by their free-transfer period instead, none
is dropped part-way for its makespan, and `score` must return the period too (the
default one does). So under the same `score`
the result is never slower than any such built-in that fits (by construction; a
built-in may itself be the answer). When no play-out fits (a byte limit the caller checks in
`score` can be tighter than the activation estimate), the limit is lowered and tried
again. Without a limit, play-outs hold up to p or 2p-1 microbatches (ZB-H2's memory).

Units: activations in microbatches of one pipeline stage (`schedules.activations`);
score in seconds (a makespan, or a period without a barrier), math.inf for a schedule
that does not fit.
Constraints: p >= 1, m >= 1, v in {1, 2}; a limit of at least one microbatch;
step_barrier "all" or "none".
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterable

from .activations import peak_activations
from .bounded import exact_bound, play_timed, plays_at
from .greedy import OpTime, unit_times
from .ir import Schedule, ScheduleError, VirtualStage, check_positive, looped_stages, uniform_paths, v_stages
from .steady import StepTimer, period_under
from .timeline import makespan_under
from .v_pattern import v_pattern_plays

Score = Callable[[Schedule], float]
"""Seconds a schedule takes, or math.inf when it does not fit the caller's limit."""

Candidates = Callable[[int, int, tuple[int, ...], OpTime | None], list[Schedule]]
"""(ranks, microbatches, chunks, op_time) -> the built-in schedules zb-auto competes with."""

SCORED_PLAYS = 2  # play-outs per placement scored in full after the free-transfer ranking
PATTERN_BELOW = 2.0  # under a limit below this many times p activations the V's building blocks are tried
STEP_BARRIERS = ("all", "none")  # what follows a step: a barrier (makespan objective) or none (period)
PERIOD_TIES = 1e-12  # relative: Karp's divisions round a period at the work bound by less


def default_score(op_time: OpTime, max_activations: float | None, step_barrier: str = "all",
                  kept: float = 1.0) -> Score:
    """Makespan with free transfers (without a barrier, `step_barrier` "none": the
    period); inf above `max_activations` (counted with `kept`, see `build_zb_auto`)."""
    timed = period_under if step_barrier == "none" else makespan_under

    def score(schedule: Schedule) -> float:
        if max_activations is not None and peak_activations(schedule, kept) > max_activations + 1e-9:
            return math.inf
        return timed(schedule, op_time)

    return score


class _Periods:
    """Free-transfer periods of the play-outs of one placement: one StepTimer for all of
    them (they run the same ops), a new one for a play of other ops."""

    def __init__(self, op_time: OpTime):
        self.op_time, self.timer = op_time, None

    def __call__(self, schedule: Schedule) -> float:
        if self.timer is None:
            self.timer = StepTimer(schedule, self.op_time)
        try:
            return self.timer.period(schedule)
        except KeyError:  # other ops than the first play's (fused backwards)
            return StepTimer(schedule, self.op_time).period(schedule)

    def bound(self, schedule: Schedule) -> float:
        """A period no order of `schedule`'s ops beats: its busiest rank's work."""
        return StepTimer(schedule, self.op_time).work(schedule)


def placements(ranks: int, chunks: Iterable[int]) -> list[tuple[str, list[VirtualStage]]]:
    out = []
    for v in chunks:
        if v == 1:
            out.append(("looped", looped_stages(ranks, 1)))
        else:
            out.append(("v-shape", v_stages(ranks)))
            out.append(("looped", looped_stages(ranks, 2)))
    return out


def one_copy(schedule: Schedule) -> bool:
    """Whether each model stage is on one rank only (DualPipe keeps two replicas, which
    doubles the parameters and needs their gradients summed: another model layout)."""
    return len(schedule.stages) == schedule.num_model_stages


def _plays(ranks: int, microbatches: int, stages: list[VirtualStage], limit: float,
           op_time: OpTime, blocks: bool = False, periods: _Periods | None = None, kept: float = 1.0
           ) -> list[tuple[Schedule, float, str]]:
    """Play-outs at `limit` that hold at most `limit`, with their free-transfer makespans
    (with `periods`: their free-transfer periods) and what they are; on the V the
    reserving plays also run half a microbatch above it (they often hold less than they
    were allowed), and with `blocks`, below 2p activations, the V's building blocks are
    played too (`schedules.v_pattern`). Those after SCORED_PLAYS at the bound (the exact
    makespan bound, or the busiest rank's work for a period) are left out: sorted by
    that time, the first SCORED_PLAYS are the same. `kept`: see `build_zb_auto`."""
    paths, mb_paths = uniform_paths(stages, microbatches)
    two = len(stages) > ranks
    plays = [replace(how, kept=kept) for how in plays_at(limit)]
    if two and stages[0].rank == stages[-1].rank:  # the V: reservation is loosest there
        plays += [replace(how, limit=limit + 0.5) for how in plays if how.reserve]
    # Only the SCORED_PLAYS fastest (the first of equals) are scored: once that many sit at a
    # bound no play can beat, the plays still to come could only tie them and sort after.
    # A play slower than the SCORED_PLAYS-th fastest so far is not scored either: it is
    # dropped as soon as it cannot finish in time (`play_timed`'s cutoff).
    out, at_bound, bound = [], 0, None
    for how in plays:
        cutoff = sorted(t for _, t, _ in out)[SCORED_PLAYS - 1] if len(out) >= SCORED_PLAYS else math.inf
        if periods is not None:
            cutoff = math.inf  # a play that ends late may still repeat sooner than the others
        try:
            played = play_timed("zb-auto", ranks, microbatches, stages, paths, mb_paths, how, op_time,
                                {"v": 2 if two else 1}, cutoff)
        except ScheduleError:
            continue  # one microbatch does not fit
        if played is None:
            continue
        s, makespan = played
        if bound is None:  # after a play, which has checked the durations
            bound = (exact_bound(ranks, microbatches, stages, paths, mb_paths, op_time) or -math.inf
                     if periods is None else periods.bound(s) * (1 + PERIOD_TIES))
        if peak_activations(s, kept) <= limit + 1e-9:
            value = makespan if periods is None else periods(s)
            out.append((s, value, "play-out"))
            at_bound += value <= bound
            if at_bound >= SCORED_PLAYS:
                break
    if blocks and two and stages[0].rank == stages[-1].rank and at_bound < SCORED_PLAYS \
            and limit < PATTERN_BELOW * ranks:
        try:
            blocks_played = v_pattern_plays(ranks, microbatches, op_time, limit, "zb-auto", SCORED_PLAYS)
        except ScheduleError:
            blocks_played = []  # durations no play takes (the plays above were refused alike)
        # (kept by their makespans; without a barrier the period re-ranks them)
        out += [(s, makespan if periods is None else periods(s), "building blocks") for s, makespan in blocks_played
                if peak_activations(s, kept) <= limit + 1e-9]
    return out


def build_zb_auto(ranks: int, microbatches: int, chunks: int | None = None, op_time: OpTime | None = None,
                  max_activations: float | None = None, score: Score | None = None,
                  builtins: list[Schedule] | None = None, candidates: Candidates | None = None,
                  step_barrier: str = "all", weight_share: float = 1.0) -> Schedule:
    """The lowest-`score` candidate (see module doc). `builtins`: already built built-in
    schedules to compare against; without them, those `candidates(ranks, microbatches,
    chunks, op_time)` builds (`registry.build` passes `registry.builtin_candidates`),
    else none. `step_barrier` "all" minimizes the makespan, "none" the period of steps
    back to back (a caller's `score` must then time the period). `weight_share` (0..1):
    the fraction of a stage's activations a split B leaves held until its W, so that
    plays count memory as the paper's model and the simulator's bytes do (B frees the
    rest); 1, the default, counts every activation from F to W, as `max_activations`
    is defined. ScheduleError when nothing fits."""
    check_positive("zb-auto", ranks=ranks, microbatches=microbatches)
    if step_barrier not in STEP_BARRIERS:
        raise ScheduleError(f"zb-auto takes step_barrier 'all' or 'none', got {step_barrier!r}")
    if not (isinstance(weight_share, (int, float)) and 0.0 <= weight_share <= 1.0):
        raise ScheduleError(f"zb-auto's weight_share is a fraction in [0, 1], got {weight_share!r}")
    if chunks is not None and (isinstance(chunks, bool) or chunks not in (1, 2)):
        raise ScheduleError(f"zb-auto takes -v 1 or -v 2 (or none for both), got -v {chunks}")
    if max_activations is not None and not (isinstance(max_activations, (int, float)) and max_activations >= 1):
        raise ScheduleError(f"zb-auto needs room for at least one microbatch of activations, "
                            f"got {max_activations:g}")
    vs = (1, 2) if chunks is None else (chunks,)
    op_time = op_time or unit_times(ranks)
    score = score or default_score(op_time, max_activations, step_barrier, weight_share)
    scored: list[tuple[float, int, Schedule, str]] = []  # (score, order, schedule, origin)

    def keep(schedule: Schedule, origin: str) -> float:
        value = score(schedule)
        scored.append((value, len(scored), schedule, origin))
        return value

    top = 2 * ranks - 1 if max_activations is None else max_activations
    for kind, stages in placements(ranks, vs):
        limits = [ranks, top] if max_activations is None else [top]
        while limits:
            limit = limits.pop(0)
            periods = _Periods(op_time) if step_barrier == "none" else None
            plays = sorted(_plays(ranks, microbatches, stages, limit, op_time, max_activations is not None, periods,
                                  weight_share), key=lambda x: x[1])
            best = min((keep(s, f"{kind} {what} at {limit:g}") for s, _, what in plays[:SCORED_PLAYS]),
                       default=math.inf)
            step = 0.5 if len(stages) > ranks else 1.0  # a chunk of two holds half a microbatch
            if max_activations is not None and best == math.inf and limit - step >= 1:
                limits.append(limit - step)  # the caller's byte limit is tighter than the estimate
    if builtins is None:
        builtins = [] if candidates is None else candidates(ranks, microbatches, vs, op_time)
    for s in builtins:
        if s.name != "zb-auto" and one_copy(s) and (1 if s.num_model_stages == ranks else 2) in vs:
            keep(s, s.name)
    value, _, winner, origin = min(scored, key=lambda x: (x[0], x[1]), default=(math.inf, 0, None, ""))
    if winner is None or value == math.inf:
        raise ScheduleError(f"zb-auto: no schedule for p={ranks}, m={microbatches} fits the memory limit; "
                            f"raise it")
    params = dict(winner.params)
    params.update(v=winner.num_model_stages // ranks, origin=origin)
    return replace(winner, name="zb-auto", params=params)
