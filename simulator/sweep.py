"""A sweep: every schedule asked for over rank counts, chunks per rank and microbatch
counts, simulated, with its bubble, peak memory (bytes when the costs give them, and
always microbatches of activations held) and makespan. `pipesched sweep` prints it as a
table, a CSV and a comparison chart (`plots.sweep`, which draws the `SweepPoint`s).

Units: seconds, bytes; activations in microbatches of one pipeline stage
(`schedules.activations`; 1F1B holds p).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from pipesched.schedules.activations import peak_activations
from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import BUILDERS, builtin_candidates
from pipesched.schedules.validate import validate

from .api import simulate
from .budget import Budget, BudgetError, Evaluation, build_within, engine_for
from .costs import CostError, CostModel
from .metrics import compute_metrics
from .planner import count_list, recompute_modes, schedule_list
from .steps import check_step_costs, check_steps

ENGINES = ("des", "exact")


@dataclass(frozen=True)
class SweepPoint:
    """One schedule at one number of microbatches. Seconds and bytes; `error` says why
    the schedule could not be built there (the numbers are then nan)."""

    schedule: str
    ranks: int
    microbatches: int
    makespan: float = math.nan
    bubble_ratio: float = math.nan
    peak_memory: float = math.nan
    comm_hidden_fraction: float = math.nan
    period: float = math.nan  # seconds per step back to back without a barrier (step_barrier "none")
    error: str | None = None


@dataclass
class SweepRow:
    """One simulated point of a sweep: `point` (schedule, ranks, microbatches, makespan
    in seconds, bubble ratio, peak memory in bytes, the fraction of transfer time hidden
    behind compute; `point.error` set where the schedule cannot be built there) plus
    `v`: chunks per rank; `activations`: most microbatches of one pipeline stage's
    activations a rank holds (1F1B holds p); `fits`: within the memory budget;
    `recompute`: every model stage recomputes (the point's schedule is named
    NAME+recompute)."""

    point: SweepPoint
    v: int | None
    activations: float = float("nan")
    fits: bool = True
    recompute: bool = False


def default_schedules() -> list[str]:
    """What a sweep compares unless told: every built-in but zb-auto (which searches, slower)."""
    return [n for n, b in BUILDERS.items() if not b.searches]


def sweep_size(schedules: list[str], ranks: list[int], microbatches: list[int], chunks: list[int | None],
               recompute: tuple[bool, ...]) -> int:
    """How many points `sweep_rows` simulates (for a progress bar)."""
    per_rank = sum(len(chunks) if BUILDERS[n].chunks is None else 1 for n in schedules)
    return len(ranks) * len(microbatches) * len(recompute) * per_rank


def sweep_rows(schedules: list[str], ranks: list[int], microbatches: list[int], costs: CostModel,
               chunks: list[int | None] | None = None, engine: str = "des",
               progress: Callable[[int, str], None] | None = None, budget: Budget = Budget(),
               recompute: tuple[bool, ...] = (False,), step_barrier: str = "all") -> list[SweepRow]:
    """Simulate every schedule at every p, v and m, without and/or with recomputation of
    every model stage (`recompute`): a SweepRow each (its point's `error` set where the
    schedule cannot be built there). Schedules with a fixed v run once. With
    `step_barrier` "none" each point also has its period (`simulator.steps`). Arguments
    are not checked: see `sweep`."""
    rows = []
    chunks = chunks or [None]
    todo = [(name, p, v, m, rc) for p in ranks for name in schedules
            for v in (chunks if BUILDERS[name].chunks is None else [None]) for m in microbatches for rc in recompute]
    # zb-auto compares against every built-in at its p and m: hand it those built here, and
    # their evaluations when this engine is the one it scores with (same numbers, not 1e-9
    # apart); with recomputation it builds and scores its own
    built: dict[tuple, dict] = {}     # (p, m) -> {(name, v as given to build): Schedule or ScheduleError}
    seen: dict[int, Evaluation] = {}  # id(schedule) -> its evaluation
    keep = any(BUILDERS[n].searches for n in schedules)
    reuse = keep and engine == engine_for(costs)
    for done, (name, p, v, m, rc) in enumerate(todo):
        shown = name + "+recompute" if rc else name
        if progress:
            progress(done, f"{shown} p={p} m={m}" + (f" v={v}" if v else ""))
        searches = BUILDERS[name].searches
        fixed = BUILDERS[name].chunks or (BUILDERS[name].default_chunks if v is None and not searches else v)
        if built and next(iter(built))[0] != p:  # the sweep moved on to another p: let go of the last one's
            built.clear()
            seen.clear()
        here = built.setdefault((p, m), {}) if keep and not rc else {}
        try:
            if searches:
                builtins = (builtin_candidates(p, m, (1, 2) if v is None else (v,), costs.op_time_for(p), here)
                            if v in (None, 1, 2) and not rc else None)
                schedule = build_within(name, p, m, v, costs, budget, builtins, None if rc else seen, recompute=rc,
                                        step_barrier=step_barrier)
            else:
                try:
                    schedule = build_within(name, p, m, v, costs, Budget(), recompute=rc)
                except ScheduleError as exc:
                    here[name, v] = exc
                    raise
                here[name, v] = schedule
            graph = validate(schedule)
        except (ScheduleError, CostError, BudgetError) as exc:  # CostError: e.g. calibrated model_stages for another S
            rows.append(SweepRow(SweepPoint(shown, p, m, error=str(exc)), fixed, recompute=rc))
            continue
        met = compute_metrics(simulate(graph, costs, engine=engine, step_barrier=step_barrier))
        peak = max(r.peak_memory_bytes for r in met.per_rank)
        acts = peak_activations(schedule)
        if reuse and not searches and not rc:
            seen[id(schedule)] = Evaluation(schedule, met.makespan, met.bubble_ratio, peak, acts,
                                            budget.admits(peak, acts))
        rows.append(SweepRow(SweepPoint(shown, p, m, met.makespan, met.bubble_ratio, peak, met.comm_hidden_fraction,
                                        math.nan if met.period is None else met.period),
                             schedule.num_model_stages // p, acts, budget.admits(peak, acts), rc))
    if progress:
        progress(len(todo), "done")
    return rows


def sweep(ranks: int | Iterable[int], microbatches: int | Iterable[int], schedules: Iterable[str] | None = None, *,
          costs: CostModel | None = None, chunks: int | Iterable[int] | None = None, engine: str = "des",
          max_activations: float | None = None, memory_limit: float | None = None,
          recompute: bool | str = False, step_barrier: str = "all",
          progress: Callable[[int, str], None] | None = None) -> list[SweepRow]:
    """Simulate each built-in in `schedules` (default: all but zb-auto, which searches
    and is slower) at every rank count in `ranks`, microbatch count in `microbatches`
    and, for schedules that take it, v in `chunks` (chunks per rank; default: each
    schedule's own), under `costs` (default: unit op times, no transfers or memory).
    One `SweepRow` per point, rank count by rank count, in the order of `schedules`;
    a schedule that cannot be built at a point gets a row whose `point.error` says why.

    `engine`: "des" (default) or "exact" (faster; not with ranks sharing compute).
    Budget, per rank: `max_activations` (microbatches of one pipeline stage's
    activations, >= 1) and `memory_limit` (bytes, > 0): zb-auto searches under it and
    every row says whether it `fits`. `recompute`: False or "off" (default), True or
    "on" (every model stage recomputes its activations, rows named NAME+recompute), or
    "both". `step_barrier`: "all" (default) or "none": steps back to back without a
    barrier, each point's `period` the seconds per step then (`simulator.steps`).
    `ranks`, `microbatches` and `chunks`: an integer >= 1 or a list of them.
    Seconds and bytes throughout (SweepRow); ValueError (ScheduleError for an unknown
    schedule name) on bad arguments.
    """
    rank_counts = count_list(ranks, "ranks", "[4, 8]")
    counts = count_list(microbatches, "microbatches", "[4, 8, 16]")
    v_counts: list[int | None] = [None] if chunks is None else count_list(chunks, "chunks", "[1, 2]")
    names = schedule_list(schedules, default_schedules())
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if costs is not None and not isinstance(costs, CostModel):
        raise ValueError(f"costs must be a CostModel, got {type(costs).__name__}")
    costs = CostModel().check() if costs is None else costs.check()
    if costs.host is not None and engine == "exact":
        raise ValueError("the exact engine cannot model ranks sharing compute (costs.host); use engine='des'")
    budget = Budget(max_activations, memory_limit).check()
    if recompute == "auto":
        raise ValueError("recompute must be True, False, 'off', 'on' or 'both', got 'auto'")
    check_steps(1, step_barrier)
    check_step_costs(costs, step_barrier)
    return sweep_rows(names, rank_counts, counts, costs, v_counts, engine, progress, budget,
                      recompute_modes(recompute), step_barrier)
