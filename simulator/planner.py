"""The planner: the fastest schedule that fits a memory budget per rank.

`plan` builds every built-in schedule, and zb-auto searched under the budget, for the
costs at each microbatch count and v asked for (without and/or with recomputation),
simulates them, drops what does not fit, ranks the rest by throughput, and keeps the
Pareto front of throughput against peak memory and the p95 makespan of the best few
under jittered op times. `pipesched plan` prints it and writes the winner.

Units: seconds, bytes, bytes per second; activations in microbatches of one pipeline
stage (`schedules.activations`; 1F1B holds p); throughput in microbatches (or samples)
per second.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.numbers import is_int
from pipesched.schedules.registry import BUILDERS, MAX_OPS, build, check_known
from pipesched.schedules.validate import validate

from .budget import Budget, BudgetError, Evaluation, build_within, engine_for, evaluate, marks_recompute, \
    recompute_op_time, with_recompute
from .api import simulate
from .costs import CostModel
from .steps import check_step_costs, check_steps
from .stochastic import makespan_stats
from .units import fmt_bytes
from .workers import cores, run_in_order

JITTER_RUNS, JITTER_CV, JITTER_TOP = 20, 0.1, 3  # p95 of the makespan for the best few
RECOMPUTE_MODES = {"off": (False,), "on": (True,), "both": (False, True)}
PARALLEL_FROM_OPS = 50_000  # a smaller search runs in this process: forking would cost more than it saves

Progress = Callable[[int, str], None]
"""progress(done, what): `done` of the candidates are built, `what` is the next."""


@dataclass
class Candidate:
    """One schedule the planner built: built-in `schedule` at `microbatches` and `v`
    chunks per rank, with every model stage recomputing its activations when
    `recompute`. `result`: its simulated makespan (s), bubble, peak memory (bytes) and
    activations (microbatches) and whether it fits the budget; None when it could not
    be built (`error` says why). `p95`: seconds, the 95th percentile makespan under op
    times jittered by JITTER_CV (the best JITTER_TOP fitting only, else None).
    `period`: seconds per step with steps back to back and no barrier between them
    (`simulator.steps`; planned with step_barrier "none", else None), which the
    throughput then counts instead of the makespan."""

    schedule: str
    microbatches: int
    v: int
    result: Evaluation | None = None
    error: str | None = None
    p95: float | None = None
    recompute: bool = False  # every model stage recomputes its activations (R ops)
    period: float | None = None  # seconds per step without a barrier between steps
    microbatch_size: int | None = None  # samples per microbatch of its cost variant, if stated
    variant: str = ""  # the cost variant it was planned under (`CostVariant.label`), when several
    costs: CostModel | None = field(default=None, repr=False, compare=False)  # what it was simulated under

    def throughput(self, samples: int | None = None) -> float:
        """Microbatches (or samples: of its variant's size, else `samples` each) per
        second: per makespan, or per period where steps run without a barrier."""
        size = self.microbatch_size or samples or 1
        return self.microbatches * size / (self.result.makespan if self.period is None else self.period)

    @property
    def origin(self) -> str | None:
        """What zb-auto built its winner from (a built-in's name or a play-out); None for others."""
        if self.schedule != "zb-auto" or self.result is None:
            return None
        return self.result.schedule.params.get("origin")

    @property
    def label(self) -> str:
        """The schedule as tables name it: zb-auto=NAME where zb-auto kept a built-in's
        order, " +R" where every model stage recomputes."""
        shown = f"zb-auto={self.origin}" if self.origin in BUILDERS else self.schedule
        return shown + " +R" if self.recompute else shown

    def to_dict(self, samples: int | None, budget: Budget) -> dict:
        """A JSON-ready summary (seconds, bytes, microbatches; headroom against `budget`)."""
        d = {"schedule": self.schedule, "microbatches": self.microbatches, "v": self.v, "recompute": self.recompute}
        if self.microbatch_size is not None:
            d["microbatch_size"] = self.microbatch_size
        if self.variant:
            d["variant"] = self.variant
        if self.result is None:
            return {**d, "error": self.error}
        r = self.result
        d.update(makespan=r.makespan, throughput=self.throughput(samples), bubble=r.bubble,
                 peak_memory=r.peak_bytes, peak_activations=r.peak_activations, fits=r.fits,
                 headroom_bytes=None if budget.memory_limit is None else budget.memory_limit - r.peak_bytes,
                 headroom_activations=None if budget.max_activations is None
                 else budget.max_activations - r.peak_activations, p95=self.p95)
        if self.period is not None:
            d["period"] = self.period
        if self.schedule == "zb-auto":
            d["origin"] = r.schedule.params.get("origin")
        return d


@dataclass(frozen=True)
class CostVariant:
    """One cost model a plan searches, among others: `costs`, `microbatch_size` samples
    per microbatch under them (costs estimated for that size; None: unstated), `label`
    naming it in tables (e.g. "b=2"), `recompute`: the recompute settings tried on it
    (None: the plan's; `(False,)` where the costs already recompute inside each layer)."""

    costs: CostModel
    microbatch_size: int | None = None
    label: str = ""
    recompute: tuple[bool, ...] | None = None


@dataclass
class Plan:
    """What `plan` found for `ranks` ranks under `budget`.

    candidates: every (schedule, m, v, recompute) tried, in the order built.
    fitting: the candidates within the budget, fastest (highest throughput) first.
    best: fitting[0]; its `result.schedule` is the schedule to run.
    pareto: fitting candidates no other beats on both throughput and peak memory,
        by peak memory (bytes, then microbatches of activations).
    rescued: (with, without) recomputation for every schedule, m and v that fits only
        recomputing, fastest first.
    memory_modelled: some candidate holds bytes at its peak; False when the costs give
        no activation, parameter or transfer sizes, so a `memory_limit` cannot bind.
    microbatch_size: samples per microbatch (throughput in samples/s), or None.
    """

    ranks: int
    budget: Budget
    candidates: list[Candidate]
    fitting: list[Candidate]
    pareto: list[Candidate]
    rescued: list[tuple[Candidate, Candidate]]
    memory_modelled: bool
    microbatch_size: int | None = None
    best: Candidate = field(init=False)

    def __post_init__(self) -> None:
        self.best = self.fitting[0]

    def to_dict(self) -> dict:
        """The plan as JSON-ready data: ranks, budget, best, candidates and pareto."""
        samples, budget = self.microbatch_size, self.budget
        return {"ranks": self.ranks, "budget": {"max_activations": budget.max_activations,
                                                "memory_limit": budget.memory_limit},
                "best": self.best.to_dict(samples, budget),
                "candidates": [c.to_dict(samples, budget) for c in self.candidates],
                "pareto": [c.to_dict(samples, budget) for c in self.pareto],
                "memory_modelled": self.memory_modelled}


def chunk_options(name: str, vs: Iterable[int]) -> list[int | None]:
    """The v values to build `name` with: its fixed v when asked for, else each asked v
    (zb-auto: 1 and 2 only)."""
    b = BUILDERS[name]
    if b.chunks is not None:
        return [None] if b.chunks in vs else []
    return [v for v in vs if not b.searches or v in (1, 2)]


def search_size(names: list[str], counts: list[int], vs: list[int], recompute: tuple[bool, ...]) -> int:
    """How many candidates `search` builds (for a progress bar)."""
    return sum(len(chunk_options(n, vs)) for n in names) * len(counts) * len(recompute)


def candidate_ops(name: str, ranks: int, microbatches: int, v: int | None, recompute: bool) -> int:
    """About how many ops a candidate has: F, B and W (and R when recomputing) for
    every microbatch on every virtual stage."""
    chunks = v or BUILDERS[name].chunks or 1
    return (4 if recompute else 3) * ranks * microbatches * chunks


def search_ops(names: list[str], ranks: int, counts: list[int], vs: list[int],
               recompute: tuple[bool, ...]) -> int:
    """About how many ops `search` builds and simulates in all, leaving out candidates
    that are over the op limit themselves (refused at once, one by one)."""
    total = 0
    for m in counts:
        for rc in recompute:
            for name in names:
                for v in chunk_options(name, vs):
                    ops = candidate_ops(name, ranks, m, v, rc)
                    total += ops if ops <= MAX_OPS else 0
    return total


def max_microbatches(ranks: int) -> int:
    """The most microbatches any schedule on `ranks` ranks can have within the op limit."""
    return max(0, MAX_OPS // (3 * ranks))


def search(names: list[str], ranks: int, counts: list[int], vs: list[int], costs: CostModel,
           budget: Budget, progress: Progress | None = None, cache: dict | None = None,
           recompute: tuple[bool, ...] = (False,), step_barrier: str = "all",
           shared: dict | None = None) -> list[Candidate]:
    """Every (schedule, m, v), built and simulated, for each recompute setting (True:
    every model stage recomputes); zb-auto searched under `budget` against the built-ins
    already built at that m, v and setting. `cache` (give the same dict to searches with
    the same costs and other budgets) keeps built-ins and evaluations, which do not
    depend on the budget. `shared` (give the same dict to searches with other costs on
    the same ranks) keeps what does not depend on the costs either: the built-ins that
    do not adapt to op times, and their validated graphs. Arguments are not checked:
    see `plan`."""
    cache = {} if cache is None else cache
    builtins: dict = cache.setdefault("builtins", {})   # (name, m, v, recompute) -> Schedule or error
    fixed: dict = builtins if shared is None or marks_recompute(costs) else shared.setdefault("builtins", {})
    graphs: dict = {} if shared is None else shared.setdefault("graphs", {})  # id -> (schedule, graph)
    todo = [(name, m, v, rc) for m in counts for rc in recompute for name in names for v in chunk_options(name, vs)]
    out: list[Candidate] = []
    for done, (name, m, v, rc) in enumerate(todo):
        seen: dict[int, Evaluation] = cache.setdefault(("seen", rc), {})  # one per setting: ids are not shared
        op_time = recompute_op_time(costs.op_time_for(ranks), costs, ranks, rc)
        if progress:
            progress(done, f"{name} m={m}" + (f" v={v}" if v else "") + (" recompute" if rc else ""))
        reused = False  # built once for every cost model: validated once too
        try:
            if BUILDERS[name].searches:
                others = [c.result.schedule for c in out if c.result and c.microbatches == m and c.v == v
                          and c.recompute == rc]
                schedule = build_within(name, ranks, m, v, costs, budget, builtins=others, seen=seen, recompute=rc,
                                        step_barrier=step_barrier)
            else:
                store = builtins if BUILDERS[name].adapts_to_costs else fixed  # the order, not its times
                reused = store is not builtins
                if (name, m, v, rc) not in store:
                    try:
                        store[name, m, v, rc] = with_recompute(build(name, ranks, m, v, op_time), costs, rc)
                    except ScheduleError as exc:
                        store[name, m, v, rc] = exc
                schedule = store[name, m, v, rc]
                if isinstance(schedule, ScheduleError):
                    raise schedule
        except ScheduleError as exc:
            out.append(Candidate(name, m, v or BUILDERS[name].chunks or 1, error=str(exc), recompute=rc))
            continue
        ev = seen.get(id(schedule))
        if ev is None:
            graph = None
            if reused:
                if id(schedule) not in graphs:
                    graphs[id(schedule)] = (schedule, validate(schedule))  # kept with it: its id stays its own
                graph = graphs[id(schedule)][1]
            ev = seen[id(schedule)] = evaluate(schedule, costs, budget, graph)
        # zb-auto renames the winner it scored; the fit is this budget's
        result = Evaluation(schedule, ev.makespan, ev.bubble, ev.peak_bytes, ev.peak_activations,
                            budget.admits(ev.peak_bytes, ev.peak_activations))
        period = None
        if step_barrier == "none":  # seconds per step back to back, kept with the schedule its id names
            periods = cache.setdefault(("periods", rc), {})
            if id(schedule) not in periods:
                steps = simulate(validate(schedule), costs, engine=engine_for(costs), step_barrier="none")
                periods[id(schedule)] = (schedule, steps.meta["steps"]["period"])
            period = periods[id(schedule)][1]
        out.append(Candidate(name, m, schedule.num_model_stages // ranks, result, recompute=rc, period=period))
    if progress:
        progress(len(todo), "done")
    return out


def pareto(rows: list[Candidate], samples: int | None = None) -> list[Candidate]:
    """Fitting candidates no other beats on both throughput and peak memory, by memory."""
    key = lambda c: (c.result.peak_bytes, c.result.peak_activations)  # noqa: E731
    front: list[Candidate] = []
    for c in sorted(rows, key=lambda c: (key(c), -c.throughput(samples))):
        if not front or c.throughput(samples) > front[-1].throughput(samples) * (1 + 1e-12):
            front.append(c)
    return front


def recompute_rescues(found: list[Candidate]) -> list[tuple[Candidate, Candidate]]:
    """(with, without) for every schedule, m, v (and cost variant) that fits with
    recomputation and not without."""
    def key(c: Candidate) -> tuple:
        return c.schedule, c.microbatches, c.v, c.variant

    without = {key(c): c for c in found if c.result and not c.recompute}
    return [(c, without[key(c)]) for c in found
            if c.result and c.recompute and c.result.fits and key(c) in without and not without[key(c)].result.fits]


def recompute_modes(recompute: bool | str, budget: Budget = Budget()) -> tuple[bool, ...]:
    """The recompute settings to try: False or "off", True or "on", "both", or "auto"
    (both under a memory budget, where recomputing can make a schedule fit, else off)."""
    if recompute is True or recompute is False:
        return (recompute,)
    if recompute == "auto":
        recompute = "both" if budget else "off"
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be True, False, 'off', 'on', 'both' or 'auto', got {recompute!r}")
    return RECOMPUTE_MODES[recompute]


def count_list(values, what: str, example: str) -> list[int]:
    """Sorted distinct integers >= 1 from one integer or an iterable of them; ValueError otherwise."""
    items = [values] if is_int(values) else list(values) if isinstance(values, Iterable) and \
        not isinstance(values, (str, bytes)) else None
    if not items or any(not is_int(x) or x < 1 for x in items):
        raise ValueError(f"{what} must be an integer >= 1 or a list of them (e.g. {example}), got {values!r}")
    return sorted(set(int(x) for x in items))


def schedule_list(schedules: Iterable[str] | str | None, default: Iterable[str]) -> list[str]:
    """Distinct built-in names in the order given (`default` when None); ScheduleError
    naming the built-ins for an unknown one."""
    names = list(default) if schedules is None else [schedules] if isinstance(schedules, str) else list(schedules)
    if not names:
        raise ValueError("schedules is empty; give built-in names (see pipesched.schedule_names())")
    for name in names:
        check_known(name)
    return list(dict.fromkeys(names))


def plan(ranks: int, microbatches: int | Iterable[int] | None = None, *,
         costs: CostModel | Sequence[CostVariant] | None = None,
         chunks: int | Iterable[int] = (1, 2), schedules: Iterable[str] | None = None,
         max_activations: float | None = None, memory_limit: float | None = None,
         recompute: bool | str = "auto", microbatch_size: int | None = None,
         progress: Progress | None = None, step_barrier: str = "all", global_batch: int | None = None,
         processes: int | None = None) -> Plan:
    """The fastest schedule for `ranks` ranks that fits a memory budget per rank.

    Builds every built-in in `schedules` (default: all, zb-auto last, searched under the
    budget) at each microbatch count in `microbatches` (default 2 x ranks) and each v in
    `chunks` (chunks per rank; a schedule with a fixed v is built when its v is asked
    for, zb-auto takes 1 and 2), simulates them under `costs` (default: unit op times,
    no transfers or memory), drops those over the budget and ranks the rest by
    throughput (microbatches/s, or samples/s with `microbatch_size` samples per
    microbatch); see `Plan`.

    `costs` may be a list of `CostVariant`s instead: cost models of the same model at
    other microbatch sizes (or other settings), each searched in full and ranked with
    the others by samples per second (each candidate names its `variant` and size);
    `microbatch_size` is then theirs. `global_batch` (samples per step, instead of
    `microbatches`): each size plans m = global_batch / size, which it must divide.

    Budget, per rank: `max_activations` (microbatches of one pipeline stage's
    activations, >= 1; 1F1B holds p) and `memory_limit` (bytes, > 0, against the
    simulated peak of parameters, activations and transfer buffers). `recompute`: False
    or "off", True or "on" (every model stage recomputes its activations), "both", or
    "auto" (default: both under a budget, else off).

    Constraints: ranks >= 1; microbatches and chunks integers >= 1 (one or a list);
    microbatch_size an integer >= 1. `step_barrier` "none" ranks by the throughput of
    steps back to back without a barrier: microbatches per period (`simulator.steps`;
    default "all": per makespan). `progress(done, what)` is called before each
    candidate is built (with several processes: as each microbatch count's candidates
    are done). `processes`: how many processes search at once (default: one per core
    the process may use, one for a search under PARALLEL_FROM_OPS ops); each takes one
    microbatch count and recompute setting at a time, and the plan is the same whatever
    their number. Returns a `Plan`: makespans and p95 in seconds, peak memory in
    bytes and in microbatches of activations, throughput per second. Raises ValueError
    on bad arguments (ScheduleError for an unknown schedule name, when no candidate can
    be built, naming why, and when the search would build and simulate more than
    MAX_OPS ops in all), BudgetError when nothing fits, CostError when the costs overflow.
    """
    if not is_int(ranks) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    if microbatch_size is not None and (not is_int(microbatch_size) or microbatch_size < 1):
        raise ValueError(f"microbatch_size must be an integer >= 1 (samples), got {microbatch_size!r}")
    variants = cost_variants(costs, microbatch_size)
    several = len(variants) > 1
    sizes = [v.microbatch_size for v in variants]
    samples = sizes[0] if not several else None
    if global_batch is not None:
        if microbatches is not None or None in sizes or not is_int(global_batch) or global_batch < 1:
            raise ValueError("global_batch (an integer >= 1) needs microbatch sizes and no microbatches: "
                             "m = global_batch / size")
        bad = [b for b in sizes if global_batch % b]
        if bad:
            raise ValueError(f"global_batch {global_batch} is not a multiple of the microbatch size {bad[0]}")
        counts_of = [[global_batch // b] for b in sizes]
    else:
        counts = [2 * ranks] if microbatches is None else count_list(microbatches, "microbatches", "[8, 16, 32]")
        counts_of = [counts] * len(variants)
    vs = count_list(chunks, "chunks", "[1, 2]")
    names = schedule_list(schedules, BUILDERS)
    names.sort(key=lambda n: (BUILDERS[n].searches, list(BUILDERS).index(n)))  # zb-auto last
    budget = Budget(max_activations, memory_limit).check()
    modes = recompute_modes(recompute, budget)
    modes_of = [modes if v.recompute is None else v.recompute for v in variants]
    if processes is not None and (not is_int(processes) or processes < 1):
        raise ValueError(f"processes must be an integer >= 1, got {processes!r}")
    check_steps(1, step_barrier)
    for v in variants:
        check_step_costs(v.costs, step_barrier)
    total = sum(search_ops(names, ranks, c, vs, rc) for c, rc in zip(counts_of, modes_of))
    if total > MAX_OPS:
        size = sum(search_size(names, c, vs, rc) for c, rc in zip(counts_of, modes_of))
        most = max(max(c) for c in counts_of)
        raise ScheduleError(f"the search would build and simulate about {total:,} ops "
                            f"({size} candidates, m up to {most:,}), more "
                            f"than the {MAX_OPS:,} a plan takes; ask for fewer microbatch counts, chunks or schedules")
    if processes is None:
        processes = cores() if total >= PARALLEL_FROM_OPS else 1
    found = _search_all(names, ranks, vs, budget, variants, counts_of, modes_of, step_barrier, processes, progress)
    built = [c for c in found if c.result]
    fitting = sorted((c for c in built if c.result.fits), key=lambda c: -c.throughput(samples))
    if not found:
        raise ScheduleError(f"no candidate to build: none of {', '.join(names)} takes v = "
                            f"{', '.join(map(str, vs))} (chunks per rank)")
    if not built:
        reasons = list(dict.fromkeys(c.error for c in found))
        raise ScheduleError(f"no schedule could be built for p={ranks}: {reasons[0]}"
                            + (f" (and {len(reasons) - 1} other reason{'s' if len(reasons) > 2 else ''}; "
                               f"{len(found)} candidates)" if len(reasons) > 1 else ""))
    if not fitting:
        least = min(built, key=lambda c: c.result.peak_bytes, default=None)
        raise BudgetError(f"no schedule fits the memory budget ({budget.describe()})"
                          + (f"; the smallest, {least.schedule} at m={least.microbatches}"
                             + (f" ({least.variant})" if least.variant else "") + ", holds "
                             f"{least.result.peak_activations:g} microbatches of activations, "
                             f"{fmt_bytes(least.result.peak_bytes)}" if least else ""))
    for c in fitting[:JITTER_TOP]:
        c.p95 = makespan_stats(validate(c.result.schedule), c.costs, JITTER_RUNS, JITTER_CV, 0,
                               engine_for(c.costs)).p95
    rescued = sorted(recompute_rescues(found), key=lambda pair: -pair[0].throughput(samples))
    return Plan(ranks, budget, found, fitting, pareto(fitting, samples), rescued,
                any(c.result.peak_bytes > 0 for c in built), samples)


def _search_all(names: list[str], ranks: int, vs: list[int], budget: Budget, variants: list[CostVariant],
                counts_of: list[list[int]], modes_of: list[tuple[bool, ...]], step_barrier: str, processes: int,
                progress: Progress | None) -> list[Candidate]:
    """`search` of every variant at each of its microbatch counts and recompute settings,
    in that order (variant, m, recompute, schedule, v). One job per (m, recompute): every
    variant that asks for it, sharing the built-ins that do not adapt to costs; the jobs
    run on `processes` processes, the biggest first."""
    several = len(variants) > 1
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, (counts, modes) in enumerate(zip(counts_of, modes_of)):
        for m in counts:
            for rc in modes:
                groups.setdefault((m, rc), []).append(i)
    jobs = list(groups.items())
    sizes = [search_size(names, [m], vs, (rc,)) * len(which) for (m, rc), which in jobs]
    here = processes <= 1
    done = 0

    def job(item: tuple[tuple[int, bool], list[int]]) -> list[list[Candidate]]:
        (m, rc), which = item
        shared: dict = {}  # the built-ins that do not adapt to op times, built once for every variant
        rows = []
        for i in which:
            step = _progress_in(progress, done + len(rows) * search_size(names, [m], vs, (rc,)),
                                variants[i].label if several else "") if here else None
            rows.append(search(names, ranks, [m], vs, variants[i].costs, budget, step, recompute=(rc,),
                               step_barrier=step_barrier, shared=shared if several else None))
        return rows

    def finished(k: int, rows: list[list[Candidate]]) -> None:
        nonlocal done
        done += sizes[k]
        if progress:
            (m, rc), _ = jobs[k]
            progress(done, "done" if done == sum(sizes) else f"m={m}" + (" recompute" if rc else "") + " done")

    results = run_in_order(job, jobs, processes,
                           weights=[search_ops(names, ranks, [m], vs, (rc,)) * len(w) for (m, rc), w in jobs],
                           finished=finished)
    by_key = {(i, m, rc): rows for ((m, rc), which), per in zip(jobs, results) for i, rows in zip(which, per)}
    found: list[Candidate] = []
    for i, (variant, counts, modes) in enumerate(zip(variants, counts_of, modes_of)):
        for m in counts:
            for rc in modes:
                for c in by_key[i, m, rc]:
                    c.microbatch_size, c.costs = variant.microbatch_size, variant.costs
                    c.variant = variant.label if several else ""
                    found.append(c)
    return found


def cost_variants(costs: CostModel | Sequence[CostVariant] | None,
                  microbatch_size: int | None = None) -> list[CostVariant]:
    """The cost models a plan searches: one (`costs`, default unit costs, of
    `microbatch_size`) or the variants given, checked; ValueError otherwise."""
    if costs is None or isinstance(costs, CostModel):
        model = CostModel() if costs is None else costs
        return [CostVariant(model.check(), microbatch_size)]
    if isinstance(costs, (str, bytes)) or not isinstance(costs, Sequence) or not costs or \
            not all(isinstance(v, CostVariant) for v in costs):
        raise ValueError(f"costs must be a CostModel or a non-empty list of CostVariants, got {type(costs).__name__}")
    if microbatch_size is not None:
        raise ValueError("with cost variants the microbatch sizes are theirs: leave microbatch_size out")
    labels = [v.label for v in costs]
    if len(costs) > 1 and len(set(labels)) < len(labels):
        raise ValueError(f"cost variants need distinct labels, got {labels}")
    for v in costs:
        if not isinstance(v.costs, CostModel):
            raise ValueError(f"CostVariant.costs must be a CostModel, got {type(v.costs).__name__}")
        v.costs.check()
        if v.microbatch_size is not None and (not is_int(v.microbatch_size) or v.microbatch_size < 1):
            raise ValueError(f"microbatch_size must be an integer >= 1 (samples), got {v.microbatch_size!r}")
        if v.recompute is not None and (not v.recompute or not all(isinstance(x, bool) for x in v.recompute)):
            raise ValueError(f"CostVariant.recompute must be a tuple of True/False, got {v.recompute!r}")
    return list(costs)


def _progress_in(progress: Progress | None, offset: int, label: str) -> Progress | None:
    """`progress` for one search within a plan: counted on from `offset`, its label in
    front of what it builds; its "done" is not passed on (the plan says it once)."""
    if progress is None:
        return None

    def step(done: int, what: str) -> None:
        if what != "done":
            progress(offset + done, f"{label}: {what}" if label else what)

    return step
