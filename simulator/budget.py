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
from typing import Callable

import numpy as np

from pipesched.schedules.activations import peak_activations
from pipesched.schedules.graph import TaskGraph
from pipesched.schedules.ir import Schedule
from pipesched.schedules.numbers import is_real
from pipesched.schedules.recompute import add_recompute
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.timeline import OpTime
from pipesched.schedules.validate import validate

from .api import exact_makespan, simulate
from .costs import CostError, CostModel
from .metrics import compute_metrics
from .steps import steady_period
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

    def weight_share(self, costs: CostModel) -> float:
        """What zb-auto's plays count a split B as leaving held until its W, as a
        fraction of the activations: under a byte limit alone, the costs' largest
        weight_memory / activation_memory where some stage states weight_memory (B frees
        the rest, as the simulator's bytes do); else 1, every activation from F to W
        (how max_activations counts, and the safe count where the costs say nothing)."""
        stages = [s for s in (*costs.stages, *(costs.model_stages or ())) if s.activation_memory > 0]
        if self.max_activations is not None or self.memory_limit is None or \
                not any(s.weight_memory > 0 for s in stages):
            return 1.0
        return min(1.0, max(s.weight_memory / s.activation_memory for s in stages))

    def activation_limit(self, costs: CostModel, ranks: int | None = None,
                         chunks: int | None = None) -> float | None:
        """The activations (microbatches of one pipeline stage) the byte limit leaves
        room for after the parameters and two transfer buffers, rounded down to half a
        microbatch; combined with max_activations. None: no limit on activations.

        Per-stage costs (`costs.stages`) give one stage's bytes. Costs per model stage
        (a layers section, or `model_stages`) need `ranks`: then each rank's own model
        stages count (v = `chunks`, 1 or 2; None: both), on either two-chunk placement
        (the V, rank r with stage 2p-1-r, and the loop, with r+p), and the tightest rank
        sets the limit, counting each microbatch at the larger of what F stores and what
        a split B leaves for W (so every play under it fits: no lowering and replaying);
        without `ranks` such costs give no limit."""
        limits = [] if self.max_activations is None else [self.max_activations]
        if self.memory_limit is not None:
            room = min((self._room(act, params, sent) for act, params, sent in _rank_loads(costs, ranks, chunks)),
                       default=math.inf)
            if room < 2.0 ** 53:  # beyond it (or inf) the bytes leave room for more than any schedule holds
                limits.append(math.floor(room) / 2)
        return min(limits) if limits else None

    def _room(self, act: float, params: float, sent: float) -> float:
        """Twice the microbatches of `act` bytes each that fit beside `params` bytes and
        two buffers of `sent` bytes (a receive and a send in flight: the least the
        buffers add; zb-auto lowers the estimate further when the simulated peak is
        still over)."""
        return 2 * (max(0.0, self.memory_limit - params - 2 * sent) / act) if act > 0 else math.inf


def _rank_loads(costs: CostModel, ranks: int | None, chunks: int | None) -> list[tuple[float, float, float]]:
    """(activation bytes of one microbatch of one pipeline stage, parameter bytes,
    largest transfer bytes) per rank and placement, for `Budget.activation_limit`."""
    buffered = costs.comm_buffers
    if costs.layers is None and costs.model_stages is None:
        s = costs.stages
        return [(max(x.activation_memory for x in s), max(x.param_bytes for x in s),
                 max(x.activation_bytes for x in s) if buffered else 0.0)]
    if ranks is None:
        return []
    out = []
    for v in ((1, 2) if chunks is None else (chunks,)):
        try:
            stages = costs.model_stage_costs(ranks, v * ranks)
        except CostError:  # a split these costs cannot make: the schedule will say so when built
            continue
        sent = max(s.activation_bytes for s in stages) if buffered else 0.0
        placements = [[(r,) for r in range(ranks)]] if v == 1 else \
            [[(r, 2 * ranks - 1 - r) for r in range(ranks)], [(r, r + ranks) for r in range(ranks)]]
        for placement in placements:
            for held in placement:
                # a split B may leave more held for its W than F stored (weight_memory, e.g. the
                # output gradients B captured): a microbatch between B and W then holds that
                out.append((sum(max(stages[k].activation_memory, stages[k].weight_memory) for k in held),
                            sum(stages[k].param_bytes for k in held), sent))
    return out


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


def evaluate(schedule: Schedule, costs: CostModel, budget: Budget = Budget(),
             graph: TaskGraph | None = None) -> Evaluation:
    """Simulate `schedule` under `costs` and check it against `budget`. `graph`: the
    schedule already validated (`schedules.validate`), which one search simulating it
    under several cost models passes instead of validating it again."""
    graph = validate(schedule) if graph is None else graph
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
    return any(c.recompute for c in (*costs.stages, *(costs.model_stages or ()),
                                     *(() if costs.layers is None else costs.layers.layers)))


def marks_recompute(costs: CostModel) -> bool:
    """Whether the costs ask some stage (or layer) to recompute (`StageCost.recompute`):
    then the R ops a schedule gets, and so the schedule, depend on the costs."""
    return _marks_recompute(costs)


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


def steps_period(schedule: Schedule, costs: CostModel) -> float:
    """Seconds per step of `schedule` back to back without a barrier under `costs`
    (max-plus, or the DES's simulated period where ranks share compute)."""
    graph = validate(schedule)
    with np.errstate(over="ignore", invalid="ignore"):
        if costs.host is None:
            return steady_period(graph, costs, "none")
        return simulate(graph, costs, engine="des", step_barrier="none").meta["steps"]["period"]


def scorer(costs: CostModel, budget: Budget, seen: dict[int, Evaluation] | None = None, recompute: bool = False,
           step_barrier: str = "all"):
    """zb-auto's score: the simulated makespan under `costs` (with `step_barrier` "none":
    the period of steps back to back, `steps_period`), inf when over `budget`.
    `seen` collects every evaluation by id(schedule) and answers from those it has.
    Without a byte limit, on the exact engine, a candidate `seen` lacks is only timed
    (`exact_makespan`: the same makespan, no trace or memory), not evaluated: a search
    scores many candidates and keeps one, which its caller then evaluates. With
    `recompute` (or stages the costs mark), a candidate is scored with its R ops added."""
    seen = {} if seen is None else seen
    timed: dict[int, tuple[Schedule, float]] = {}  # the schedule kept, so its id stays its own
    makespan_score = _makespan_scorer(costs, budget, seen, recompute, timed)
    if step_barrier != "none":
        return makespan_score

    def period_score(schedule: Schedule) -> float:
        # one step's fit holds back to back: a rank starts its next step once its own ops
        # (every W freeing its activations) are done
        if budget.memory_limit is None:
            if not budget.admits(0.0, peak_activations(with_recompute(schedule, costs, recompute))):
                return math.inf
        elif makespan_score(schedule) == math.inf:  # evaluates the bytes
            return math.inf
        key = ("period", id(schedule))
        if key not in timed:
            period = steps_period(with_recompute(schedule, costs, recompute), costs)
            if not math.isfinite(period):
                raise CostError(OVERFLOW)
            timed[key] = (schedule, period)
        return timed[key][1]

    return period_score


def _makespan_scorer(costs: CostModel, budget: Budget, seen: dict[int, Evaluation], recompute: bool,
                     timed: dict) -> Callable[[Schedule], float]:
    """The makespan score of `scorer` (its doc), filing what it times in `timed`."""
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
                 seen: dict[int, Evaluation] | None = None, recompute: bool = False,
                 step_barrier: str = "all") -> Schedule:
    """Build a built-in for `costs`; zb-auto searches under `budget`, any other schedule
    is refused (BudgetError) when it does not fit. With `recompute` every model stage
    recomputes (else the stages the costs mark): R ops are added after building, and
    cost-adaptive builders order for backwards that include their R. `step_barrier`
    "none": zb-auto minimizes the period of steps back to back, not the makespan."""
    op_time = recompute_op_time(costs.op_time_for(ranks), costs, ranks, recompute)
    if name in BUILDERS and BUILDERS[name].searches:
        seen = {} if seen is None else seen
        limit = budget.activation_limit(costs, ranks, chunks)
        schedule = build(name, ranks, microbatches, chunks, op_time, max_activations=limit,
                         score=scorer(costs, budget, seen, recompute, step_barrier), builtins=builtins,
                         step_barrier=step_barrier, weight_share=budget.weight_share(costs))
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
