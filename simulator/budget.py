"""A memory budget per rank, and building and scoring schedules under it.

Two limits, either or both: `max_activations` (microbatches of one pipeline stage's
activations held from F until W or BW, `schedules.activations`; 1F1B holds p) and
`memory_limit` (bytes, against the simulator's memory: parameters, activations and
communication buffers under the cost model). A schedule fits when it is within both.
Units: seconds, bytes, microbatches of activations. A schedule over its budget is a
`BudgetError`; costs whose times or memory overflow to infinity a `CostError`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from pipesched.schedules.activations import peak_activations
from pipesched.schedules.ir import Schedule
from pipesched.schedules.numbers import is_real
from pipesched.schedules.recompute import add_recompute
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.timeline import OpTime
from pipesched.schedules.validate import validate

from .api import exact_makespan, simulate
from .costs import CostError, CostModel
from .metrics import compute_metrics
from .units import fmt_bytes

OVERFLOW = "the costs are too large: predicted times or memory overflow to infinity"


class BudgetError(ValueError):
    """A schedule does not fit its memory budget (or none does); the message names its peak."""


@dataclass(frozen=True)
class Budget:
    """A memory budget per rank: `max_activations` (microbatches of one pipeline stage's
    activations, >= 1; 1F1B holds p) and `memory_limit` (bytes, > 0); None: no limit.
    False when it has neither limit."""

    max_activations: float | None = None  # microbatches of one pipeline stage
    memory_limit: float | None = None     # bytes per rank

    def check(self) -> "Budget":
        """This budget, or ValueError naming a limit that is not a positive number."""
        n, limit = self.max_activations, self.memory_limit
        if n is not None and not (is_real(n) and math.isfinite(n) and n >= 1):
            raise ValueError(f"max_activations must be a number >= 1 (microbatches), got {n!r}")
        if limit is not None and not (is_real(limit) and math.isfinite(limit) and limit > 0):
            raise ValueError(f"memory_limit must be a number of bytes > 0, got {limit!r}")
        return self

    def __bool__(self) -> bool:
        return self.max_activations is not None or self.memory_limit is not None

    def describe(self) -> str:
        parts = []
        if self.max_activations is not None:
            parts.append(f"{self.max_activations:g} microbatches of activations")
        if self.memory_limit is not None:
            parts.append(fmt_bytes(self.memory_limit))
        return " and ".join(parts) or "no limit"

    def admits(self, peak_bytes: float, peak_activations: float) -> bool:
        """Whether a schedule holding this much at its peak fits."""
        return ((self.max_activations is None or peak_activations <= self.max_activations + 1e-9)
                and (self.memory_limit is None or peak_bytes <= self.memory_limit))

    def activation_limit(self, costs: CostModel) -> float | None:
        """The activations (microbatches of one pipeline stage) the byte limit leaves
        room for after the parameters and two transfer buffers, rounded down to half a
        microbatch; combined with max_activations. None: no limit on activations."""
        limits = [] if self.max_activations is None else [self.max_activations]
        if self.memory_limit is not None:
            act = max(s.activation_memory for s in costs.stages)
            params = max(s.param_bytes for s in costs.stages)
            # a receive and a send in flight: the least the buffers add (zb-auto lowers
            # the estimate further when the simulated peak is still over)
            buffers = 2 * max(s.activation_bytes for s in costs.stages) if costs.comm_buffers else 0.0
            room = 2 * (max(0.0, self.memory_limit - params - buffers) / act) if act > 0 else math.inf
            if room < 2.0 ** 53:  # beyond it (or inf) the bytes leave room for more than any schedule holds
                limits.append(math.floor(room) / 2)
        return min(limits) if limits else None


@dataclass
class Evaluation:
    """One schedule under the cost model: seconds, bytes, microbatches of activations."""

    schedule: Schedule
    makespan: float
    bubble: float
    peak_bytes: float
    peak_activations: float
    fits: bool
    # the schedule as built, when `schedule` is it with R ops added: kept alive because
    # evaluations are filed by id() of the built schedule, which must not be reused
    built: Schedule | None = None


def engine_for(costs: CostModel) -> str:
    """The exact engine (faster) unless ranks share compute, which only the DES models."""
    return "des" if costs.host is not None else "exact"


def evaluate(schedule: Schedule, costs: CostModel, budget: Budget = Budget()) -> Evaluation:
    """Simulate `schedule` under `costs` and check it against `budget`."""
    graph = validate(schedule)
    with np.errstate(over="ignore", invalid="ignore"):
        trace = simulate(graph, costs, engine=engine_for(costs))
    metrics = compute_metrics(trace)  # the makespan and bubble `simulate` prints
    makespan, bubble = metrics.makespan, metrics.bubble_ratio
    peak = max((r.peak_memory_bytes for r in metrics.per_rank), default=0.0)
    if not (math.isfinite(makespan) and math.isfinite(peak)):
        raise CostError(OVERFLOW)
    acts = peak_activations(schedule)
    return Evaluation(schedule, makespan, bubble, peak, acts, budget.admits(peak, acts))


def _marks_recompute(costs: CostModel) -> bool:
    return any(c.recompute for c in (*costs.stages, *(costs.model_stages or ())))


def recompute_choice(schedule: Schedule, costs: CostModel | None, recompute: bool) -> bool | set[int]:
    """Which model stages of `schedule` recompute: all with `recompute` (--recompute),
    else those the costs mark (`StageCost.recompute`)."""
    if recompute:
        return True
    if costs is None or not _marks_recompute(costs):
        return False
    return costs.recomputed_stages(schedule.ranks, schedule.num_model_stages)


def with_recompute(schedule: Schedule, costs: CostModel | None, recompute: bool) -> Schedule:
    """`schedule` with R ops for the stages `recompute_choice` names."""
    return add_recompute(schedule, recompute_choice(schedule, costs, recompute))


def recompute_op_time(op_time: OpTime, costs: CostModel, ranks: int, recompute: bool) -> OpTime:
    """Op times for cost-adaptive builders when stages recompute: a recomputed stage's
    backward (B or BW) costs its R too, since R runs right before it."""
    marked: dict[int, set[int]] = {}  # num_model_stages -> the stages the costs mark

    def timed(op: str, model_stage: int, num_model_stages: int) -> float:
        t = op_time(op, model_stage, num_model_stages)
        if op in ("B", "BW"):
            if not recompute and num_model_stages not in marked:
                marked[num_model_stages] = costs.recomputed_stages(ranks, num_model_stages)
            if recompute or model_stage in marked[num_model_stages]:
                t += op_time("R", model_stage, num_model_stages)
        return t

    if not recompute and not _marks_recompute(costs):
        return op_time
    return timed


def scorer(costs: CostModel, budget: Budget, seen: dict[int, Evaluation] | None = None, recompute: bool = False):
    """zb-auto's score: the simulated makespan under `costs`, inf when over `budget`.
    `seen` collects every evaluation by id(schedule) and answers from those it has.
    Without a byte limit, on the exact engine, a candidate `seen` lacks is only timed
    (`exact_makespan`: the same makespan, no trace or memory), not evaluated: a search
    scores many candidates and keeps one, which its caller then evaluates. With
    `recompute` (or stages the costs mark), a candidate is scored with its R ops added."""
    seen = {} if seen is None else seen
    timed: dict[int, tuple[Schedule, float]] = {}  # the schedule kept, so its id stays its own

    def score(schedule: Schedule) -> float:
        ev = seen.get(id(schedule))
        if ev is not None:
            return ev.makespan if budget.admits(ev.peak_bytes, ev.peak_activations) else math.inf
        candidate = with_recompute(schedule, costs, recompute)
        if budget.memory_limit is None and engine_for(costs) == "exact":
            if not budget.admits(0.0, peak_activations(candidate)):
                return math.inf
            if id(schedule) not in timed:
                with np.errstate(over="ignore", invalid="ignore"):
                    makespan = exact_makespan(candidate, costs)
                if not math.isfinite(makespan):
                    raise CostError(OVERFLOW)
                timed[id(schedule)] = (schedule, makespan)
            return timed[id(schedule)][1]
        ev = seen[id(schedule)] = replace(evaluate(candidate, costs, budget), built=schedule)
        return ev.makespan if budget.admits(ev.peak_bytes, ev.peak_activations) else math.inf

    return score


def build_within(name: str, ranks: int, microbatches: int, chunks: int | None, costs: CostModel,
                 budget: Budget, builtins: list[Schedule] | None = None,
                 seen: dict[int, Evaluation] | None = None, recompute: bool = False) -> Schedule:
    """Build a built-in for `costs`; zb-auto searches under `budget`, any other schedule
    is refused (BudgetError) when it does not fit. With `recompute` every model stage
    recomputes (else the stages the costs mark): R ops are added after building, and
    cost-adaptive builders order for backwards that include their R."""
    op_time = recompute_op_time(costs.op_time_for(ranks), costs, ranks, recompute)
    if name in BUILDERS and BUILDERS[name].searches:
        seen = {} if seen is None else seen
        schedule = build(name, ranks, microbatches, chunks, op_time, max_activations=budget.activation_limit(costs),
                         score=scorer(costs, budget, seen, recompute), builtins=builtins)
        winner = with_recompute(schedule, costs, recompute)
        # zb-auto returns its winner renamed: file the winner's evaluation under it too
        for ev in list(seen.values()):
            if (ev.built or ev.schedule).programs is schedule.programs:
                seen[id(winner)] = replace(ev, schedule=winner, built=schedule)
                break
        return winner
    schedule = with_recompute(build(name, ranks, microbatches, chunks, op_time), costs, recompute)
    check_fits(schedule, costs, budget)
    return schedule


def check_fits(schedule: Schedule, costs: CostModel | None, budget: Budget) -> None:
    """BudgetError naming the schedule's peak when it is over `budget`."""
    if not budget:
        return
    ev = evaluate(schedule, costs or CostModel(), budget)
    if not ev.fits:
        raise BudgetError(f"{schedule.name} does not fit the memory limit ({budget.describe()}): it holds "
                         f"{ev.peak_activations:g} microbatches of activations, {fmt_bytes(ev.peak_bytes)} at peak; "
                         f"try zb-auto or `pipesched plan`")
