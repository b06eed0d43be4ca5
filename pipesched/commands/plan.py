"""`pipesched plan`: the fastest schedule that fits a memory budget per rank.

Builds every built-in and zb-auto (searched under the budget) for the costs at each
microbatch count and v asked for, simulates them, drops what does not fit, ranks the
rest by throughput, prints the Pareto front of throughput against peak memory, and
writes the winner as a schedule file that `simulate`, `run` and `validate` take.
"""
from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass

from pipesched.schedules import fileformat
from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import BUILDERS, build
from pipesched.schedules.validate import validate
from pipesched.simulator.costs import CostModel
from pipesched.simulator.stochastic import makespan_stats
from pipesched.simulator.units import parse_bandwidth, parse_bytes, parse_seconds

from ..budget import Budget, Evaluation, build_within, engine_for, evaluate, recompute_op_time, with_recompute
from ..errors import UsageError
from ..formatting import fmt_bytes, fmt_seconds
from ..options import (COST_DESTS, add_budget_args, add_cost_args, add_recompute_arg, budget_from_args,
                       costs_from_args, parse_counts, recompute_modes)
from ..terminal import Progress, check_outputs

JITTER_RUNS, JITTER_CV, JITTER_TOP = 20, 0.1, 3  # p95 of the makespan for the best few
RESCUES_SHOWN = 5  # schedules named as fitting only with recomputation, fastest first


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="find the fastest schedule that fits a memory budget per rank")
    p.add_argument("-p", "--ranks", type=int, required=True, help="pipeline ranks")
    p.add_argument("-m", "--microbatches", metavar="M1,M2,...|A..B",
                   help="microbatch counts: a list, or A..B for A, 2A, 4A, ... up to B (default 2p)")
    p.add_argument("--global-batch", type=int, metavar="G", help="samples per step (with --microbatch-size: m = G/size)")
    p.add_argument("--microbatch-size", type=int, metavar="S", help="samples per microbatch (throughput in samples/s)")
    p.add_argument("-v", "--chunks", default="1,2", metavar="V1,V2", help="chunks per rank to try (default 1,2)")
    p.add_argument("--schedules", metavar="A,B,...", help="built-ins to consider (default: all, with zb-auto)")
    add_recompute_arg(p, search=True, default="auto")
    add_budget_args(p)
    add_cost_args(p)
    p.add_argument("-o", "--output", metavar="FILE.json", help="write the winning schedule file")
    p.add_argument("--plot", metavar="OUT.png|svg", help="draw the winner's predicted timeline")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows of the ranked table (default 15)")
    p.add_argument("--json", action="store_true", help="print best, candidates and Pareto front as JSON")
    p.set_defaults(handler=run)


@dataclass
class Candidate:
    schedule: str
    microbatches: int
    v: int
    result: Evaluation | None = None
    error: str | None = None
    p95: float | None = None
    recompute: bool = False  # every model stage recomputes its activations (R ops)

    def throughput(self, samples: int | None) -> float:
        """Microbatches (or samples, given their size) per second."""
        return self.microbatches * (samples or 1) / self.result.makespan

    def to_dict(self, samples: int | None, budget: Budget) -> dict:
        d = {"schedule": self.schedule, "microbatches": self.microbatches, "v": self.v, "recompute": self.recompute}
        if self.result is None:
            return {**d, "error": self.error}
        r = self.result
        d.update(makespan=r.makespan, throughput=self.throughput(samples), bubble=r.bubble,
                 peak_memory=r.peak_bytes, peak_activations=r.peak_activations, fits=r.fits,
                 headroom_bytes=None if budget.memory_limit is None else budget.memory_limit - r.peak_bytes,
                 headroom_activations=None if budget.max_activations is None
                 else budget.max_activations - r.peak_activations, p95=self.p95)
        if self.schedule == "zb-auto":
            d["origin"] = r.schedule.params.get("origin")
        return d


def parse_range(text: str | None, ranks: int) -> list[int]:
    if text is None:
        return [2 * ranks]
    if ".." in text:
        lo_hi = text.split("..")
        try:
            lo, hi = int(lo_hi[0]), int(lo_hi[1])
        except (ValueError, IndexError):
            raise UsageError(f"-m A..B needs two integers, got {text!r}") from None
        if lo < 1 or hi < lo or len(lo_hi) != 2:
            raise UsageError(f"-m A..B needs 1 <= A <= B, got {text!r}")
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= 2
        return out
    return parse_counts(text)


def parse_chunks(text: str) -> list[int]:
    try:
        vs = sorted({int(x) for x in text.split(",")})
    except ValueError:
        vs = []
    if not vs or min(vs) < 1:
        raise UsageError(f"-v needs comma-separated integers >= 1 (e.g. 1,2), got {text!r}")
    return vs


def chunk_options(name: str, vs: list[int]) -> list[int | None]:
    """The -v values to build `name` with: its fixed v when asked for, else each asked v
    (zb-auto: 1 and 2 only)."""
    b = BUILDERS[name]
    if b.chunks is not None:
        return [None] if b.chunks in vs else []
    return [v for v in vs if not b.searches or v in (1, 2)]


def search(names: list[str], ranks: int, counts: list[int], vs: list[int], costs: CostModel,
           budget: Budget, progress=None, cache: dict | None = None,
           recompute: tuple[bool, ...] = (False,)) -> list[Candidate]:
    """Every (schedule, m, v), built and simulated, for each recompute setting (True:
    every model stage recomputes); zb-auto searched under `budget` against the built-ins
    already built at that m, v and setting. `cache` (give the same dict to searches with
    the same costs and other budgets) keeps built-ins and evaluations, which do not
    depend on the budget."""
    cache = {} if cache is None else cache
    builtins: dict = cache.setdefault("builtins", {})   # (name, m, v, recompute) -> Schedule or error
    todo = [(name, m, v, rc) for m in counts for rc in recompute for name in names for v in chunk_options(name, vs)]
    out: list[Candidate] = []
    for done, (name, m, v, rc) in enumerate(todo):
        seen: dict[int, Evaluation] = cache.setdefault(("seen", rc), {})  # one per setting: ids are not shared
        op_time = recompute_op_time(costs.op_time_for(ranks), costs, ranks, rc)
        if progress:
            progress(done, f"{name} m={m}" + (f" v={v}" if v else "") + (" recompute" if rc else ""))
        try:
            if BUILDERS[name].searches:
                others = [c.result.schedule for c in out if c.result and c.microbatches == m and c.v == v
                          and c.recompute == rc]
                schedule = build_within(name, ranks, m, v, costs, budget, builtins=others, seen=seen, recompute=rc)
            else:
                if (name, m, v, rc) not in builtins:
                    try:
                        builtins[name, m, v, rc] = with_recompute(build(name, ranks, m, v, op_time), costs, rc)
                    except ScheduleError as exc:
                        builtins[name, m, v, rc] = exc
                schedule = builtins[name, m, v, rc]
                if isinstance(schedule, ScheduleError):
                    raise schedule
        except ScheduleError as exc:
            out.append(Candidate(name, m, v or BUILDERS[name].chunks or 1, error=str(exc), recompute=rc))
            continue
        ev = seen.get(id(schedule))
        if ev is None:
            ev = seen[id(schedule)] = evaluate(schedule, costs, budget)
        # zb-auto renames the winner it scored; the fit is this budget's
        result = Evaluation(schedule, ev.makespan, ev.bubble, ev.peak_bytes, ev.peak_activations,
                            budget.admits(ev.peak_bytes, ev.peak_activations))
        out.append(Candidate(name, m, schedule.num_model_stages // ranks, result, recompute=rc))
    if progress:
        progress(len(todo), "done")
    return out


def pareto(rows: list[Candidate], samples: int | None) -> list[Candidate]:
    """Fitting candidates no other beats on both throughput and peak memory."""
    key = lambda c: (c.result.peak_bytes, c.result.peak_activations)  # noqa: E731
    front = []
    for c in sorted(rows, key=lambda c: (key(c), -c.throughput(samples))):
        if not front or c.throughput(samples) > front[-1].throughput(samples) * (1 + 1e-12):
            front.append(c)
    return front


def recompute_rescues(found: list[Candidate]) -> list[tuple[Candidate, Candidate]]:
    """(with, without) for every schedule, m and v that fits with recomputation and not without."""
    without = {(c.schedule, c.microbatches, c.v): c for c in found if c.result and not c.recompute}
    return [(c, without[c.schedule, c.microbatches, c.v]) for c in found
            if c.result and c.recompute and c.result.fits and (c.schedule, c.microbatches, c.v) in without
            and not without[c.schedule, c.microbatches, c.v].result.fits]


TIME_FLAGS = {"f", "b", "w", "latency", "inter_latency", "op_overhead"}
SIZE_FLAGS = {"activation_bytes", "activation_memory", "weight_memory", "param_bytes"}
RATE_FLAGS = {"bandwidth", "inter_bandwidth"}


def with_unit(dest: str, value: float) -> str:
    """`value` written with the unit a person would type ("12ms", "128MiB", "50GB/s"),
    or as a plain number when no unit reads back exactly."""
    if dest in TIME_FLAGS:
        options = [(value, ""), (value * 1e3, "ms"), (value * 1e6, "us")]  # plain: seconds
        parse = parse_seconds
    elif dest in SIZE_FLAGS:
        options = [(value / 2 ** 30, "GiB"), (value / 2 ** 20, "MiB"), (value / 1e9, "GB"), (value / 1e6, "MB")]
        parse = parse_bytes
    elif dest in RATE_FLAGS:
        options = [(value / 1e9, "GB/s"), (value / 2 ** 30, "GiB/s"), (value / 1e6, "MB/s")]
        parse = parse_bandwidth
    else:
        return format(value, "g") if float(format(value, "g")) == value else repr(value)
    for number, unit in options:
        text = f"{number:g}{unit}"
        if 1 <= abs(number) < 1e4 and parse(text) == value:
            return text
    return repr(value)


def cost_words(args: argparse.Namespace) -> str:
    """The cost options given, as flags to repeat in the suggested commands."""
    words = []
    for dest in COST_DESTS:
        value = getattr(args, dest, None)
        if value is None or value is False:
            continue
        flag = "--" + dest.replace("_", "-")
        if value is True:
            words.append(flag)
        else:
            words += [flag, with_unit(dest, value) if isinstance(value, float) else shlex.quote(str(value))]
    return " ".join(words)


def run(args: argparse.Namespace) -> int:
    if args.ranks < 1:
        raise UsageError(f"-p must be >= 1, got {args.ranks}")
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    samples = args.microbatch_size
    if samples is not None and samples < 1:
        raise UsageError(f"--microbatch-size must be >= 1, got {samples}")
    if args.global_batch is not None:
        if samples is None or args.microbatches is not None:
            raise UsageError("--global-batch needs --microbatch-size (and no -m): m = global batch / size")
        if args.global_batch < 1 or args.global_batch % samples:
            raise UsageError(f"--global-batch {args.global_batch} is not a positive multiple of --microbatch-size {samples}")
        counts = [args.global_batch // samples]
    else:
        counts = parse_range(args.microbatches, args.ranks)
    vs = parse_chunks(args.chunks)
    names = list(BUILDERS) if args.schedules is None else [x.strip() for x in args.schedules.split(",") if x.strip()]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown or not names:
        raise UsageError(f"unknown schedule {unknown[0] if unknown else ''!r} in --schedules; built-in schedules are "
                         f"{', '.join(BUILDERS)}")
    names = sorted(set(names), key=lambda n: (BUILDERS[n].searches, list(BUILDERS).index(n)))  # zb-auto last
    budget = budget_from_args(args)
    check_outputs({"-o": args.output, "--plot": args.plot}, {"--costs": args.costs})
    if args.plot:
        from ..plots.style import check_output
        check_output(args.plot)
    costs = costs_from_args(args)
    modes = recompute_modes(args.recompute, budget)
    bar = Progress("plan", sum(len(chunk_options(n, vs)) for n in names) * len(counts) * len(modes))
    try:
        found = search(names, args.ranks, counts, vs, costs, budget, bar, recompute=modes)
    finally:
        bar.close()
    built = [c for c in found if c.result]
    fitting = sorted((c for c in built if c.result.fits), key=lambda c: -c.throughput(samples))
    if not fitting:
        least = min(built, key=lambda c: c.result.peak_bytes, default=None)
        raise UsageError(f"no schedule fits the memory budget ({budget.describe()})"
                         + (f"; the smallest, {least.schedule} at m={least.microbatches}, holds "
                            f"{least.result.peak_activations:g} microbatches of activations, "
                            f"{fmt_bytes(least.result.peak_bytes)}" if least else ""))
    graphs_engine = engine_for(costs)
    for c in fitting[:JITTER_TOP]:
        stats = makespan_stats(validate(c.result.schedule), costs, JITTER_RUNS, JITTER_CV, 0, graphs_engine)
        c.p95 = stats.p95
    best = fitting[0]
    front = pareto(fitting, samples)
    if args.output:
        fileformat.save(best.result.schedule, args.output)
    if args.plot:
        from ..plots.timeline import plot_timeline
        from pipesched.simulator.api import simulate
        plot_timeline(simulate(best.result.schedule, costs, engine=graphs_engine), args.plot)
    if args.json:
        cands = [c.to_dict(samples, budget) for c in found]
        print(json.dumps({"ranks": args.ranks, "budget": {"max_activations": budget.max_activations,
                                                          "memory_limit": budget.memory_limit},
                          "best": best.to_dict(samples, budget), "candidates": cands,
                          "pareto": [c.to_dict(samples, budget) for c in front],
                          "output": args.output}, indent=1))
        return 0
    show_table(args, found, fitting, front, best, budget, samples, costs)
    return 0


def show_table(args, found, fitting, front, best, budget: Budget, samples, costs: CostModel) -> None:
    bytes_given = any(c.result.peak_bytes > 0 for c in fitting)
    unit = "samples/s" if samples else "mb/s"
    dropped = sum(1 for c in found if c.result and not c.result.fits)
    failed = sum(1 for c in found if not c.result)
    print(f"plan for p={args.ranks}, budget {budget.describe()}: {len(found)} candidates, {len(fitting)} fit, "
          f"{dropped} over the budget, {failed} not buildable"
          + (", each without and with recomputation" if len({c.recompute for c in found}) > 1 else ""))
    head = f"{'#':>3} {'schedule':<20} {'m':>4} {'v':>2}  {'makespan':>10}  {'throughput':>12}  {'bubble':>7}  "
    head += f"{'peak mem':>10}  " if bytes_given else ""
    head += f"{'activ.':>6}  {'headroom':>10}  {'p95':>10}"
    print(head)
    for i, c in enumerate(fitting[:args.top], 1):
        r = c.result
        if budget.memory_limit is not None and bytes_given:
            room = fmt_bytes(budget.memory_limit - r.peak_bytes)
        elif budget.max_activations is not None:
            room = f"{budget.max_activations - r.peak_activations:g} mb"
        else:
            room = "-"
        shown = c.schedule
        if c.schedule == "zb-auto" and r.schedule.params.get("origin") in BUILDERS:
            shown = f"zb-auto={r.schedule.params['origin']}"  # the search kept a built-in's order
        if c.recompute:
            shown += " +R"
        line = (f"{i:>3} {shown:<20} {c.microbatches:>4} {c.v:>2}  {fmt_seconds(r.makespan):>10}  "
                f"{c.throughput(samples):>8.4g} {unit:<3}  {100 * r.bubble:>6.2f}%  ")
        line += f"{fmt_bytes(r.peak_bytes):>10}  " if bytes_given else ""
        line += f"{r.peak_activations:>6g}  {room:>10}  {fmt_seconds(c.p95) if c.p95 else '-':>10}"
        print(line)
    if len(fitting) > args.top:
        print(f"... {len(fitting) - args.top} more (--top N, or --json for all)")
    print("Pareto front (throughput against peak memory): " + ", ".join(
        f"{c.schedule} m={c.microbatches} v={c.v} ({c.throughput(samples):.4g} {unit}, "
        f"{fmt_bytes(c.result.peak_bytes) if bytes_given else f'{c.result.peak_activations:g} mb'})" for c in front))
    rescued = sorted(recompute_rescues(found), key=lambda pair: -pair[0].throughput(samples))
    if rescued:
        more = f", and {len(rescued) - RESCUES_SHOWN} more" if len(rescued) > RESCUES_SHOWN else ""
        rescued = rescued[:RESCUES_SHOWN]
        print("fit only with recomputation (+R: every model stage recomputes its activations before its backward): "
              + ", ".join(f"{c.schedule} m={c.microbatches} v={c.v} ({fmt_bytes(c.result.peak_bytes) if bytes_given else f'{c.result.peak_activations:g} mb'} "
                          f"with, {fmt_bytes(without.result.peak_bytes) if bytes_given else f'{without.result.peak_activations:g} mb'} without)"
                          for c, without in rescued) + more)
    print(f"p95: makespan of {JITTER_RUNS} runs with op times jittered by cv {JITTER_CV} (best {JITTER_TOP} only); "
          "activ.: microbatches of one pipeline stage's activations held (1F1B holds p)")
    origin = f" (built from {best.result.schedule.params['origin']})" if best.schedule == "zb-auto" else ""
    origin += " with recomputation" if best.recompute else ""
    print(f"best: {best.schedule}{origin} with m={best.microbatches}, v={best.v}: makespan "
          f"{fmt_seconds(best.result.makespan)}, peak {fmt_bytes(best.result.peak_bytes) if bytes_given else ''}"
          f"{' / ' if bytes_given else ''}{best.result.peak_activations:g} microbatches of activations")
    if args.output:
        words = cost_words(args)
        print(f"wrote {args.output}")
        print(f"  predict it: pipesched simulate {args.output} {words}".rstrip())
        print(f"  run it:     pipesched run {args.output}   (and pipesched validate {args.output} to compare "
              f"with the prediction)")
    if args.plot:
        print(f"wrote {args.plot}")
