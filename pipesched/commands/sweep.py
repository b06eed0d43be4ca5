"""`pipesched sweep`: every schedule over rank counts, chunks per rank and microbatch
counts: bubble, peak memory (bytes when the costs give them, and always microbatches of
activations held) and makespan as a table, a comparison chart (--plot) and a CSV (--csv)."""
from __future__ import annotations

import argparse
import csv
from dataclasses import asdict, dataclass, fields, replace
from typing import Callable, TextIO

from pipesched.schedules.activations import peak_activations
from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import BUILDERS
from pipesched.schedules.validate import validate
from pipesched.schedules.zb_auto import builtin_candidates
from pipesched.schedules.outputs import atomic_path
from pipesched.simulator.api import simulate
from pipesched.simulator.costs import CostError, CostModel
from pipesched.simulator.metrics import compute_metrics

from ..budget import Budget, Evaluation, engine_for
from ..errors import UsageError
from .. import terminal
from ..plots.points import SweepPoint
from ..formatting import fmt_bytes, fmt_seconds
from ..options import (add_budget_args, add_cost_args, add_recompute_arg, budget_from_args, costs_from_args,
                       load_schedule, parse_counts, recompute_modes)

PROGRESS_AFTER_S = 2.0  # on a non-terminal stderr, report progress only for sweeps this long


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="compare schedules over rank, chunk and microbatch counts (table, chart, CSV)")
    p.add_argument("-p", "--ranks", required=True, metavar="P1,P2,...", help="pipeline ranks, comma-separated")
    p.add_argument("--microbatches", "-m", required=True, metavar="M1,M2,...",
                   help="microbatch counts, comma-separated (e.g. 4,8,16,32)")
    p.add_argument("--schedules", metavar="A,B,...",
                   help="built-in schedules (default: all but zb-auto, which searches and is slower)")
    p.add_argument("-v", "--chunks", metavar="V1,V2,...",
                   help="chunks per rank for the schedules that take it, comma-separated (default: each one's own)")
    add_recompute_arg(p, search=True)
    add_budget_args(p)
    add_cost_args(p)
    p.add_argument("--engine", choices=("des", "exact"), default="des", help="simulation engine (default des)")
    p.add_argument("--plot", metavar="OUT.png|svg", help="write the comparison chart")
    p.add_argument("--pareto-m", type=int, metavar="M", help="microbatches of the chart's Pareto panel "
                                                            "(default: the largest swept)")
    p.add_argument("--csv", metavar="OUT.csv", help="write one row per schedule and microbatch count")
    p.set_defaults(handler=run)


def parse_schedules(text: str | None) -> list[str]:
    names = [n for n, b in BUILDERS.items() if not b.searches] if text is None else \
        [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise UsageError("--schedules is empty")
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise UsageError(f"unknown schedule {unknown[0]!r} in --schedules; built-in schedules are "
                         f"{', '.join(BUILDERS)}")
    return list(dict.fromkeys(names))


def Progress(total: int, stream: TextIO | None = None, label: str = "sweep") -> terminal.Progress:
    """The sweep's progress bar (see `terminal.Progress`)."""
    return terminal.Progress(label, total, stream, after_s=PROGRESS_AFTER_S)


@dataclass
class Row:
    """One simulated point: the chart's SweepPoint plus what the chart does not draw.
    `v`: chunks per rank; `activations`: most microbatches of one pipeline stage's
    activations a rank holds (1F1B holds p); `fits`: within the memory budget; `recompute`:
    every model stage recomputes (the point's schedule is named NAME+recompute)."""

    point: object  # plots.sweep.SweepPoint
    v: int | None
    activations: float = float("nan")
    fits: bool = True
    recompute: bool = False


def sweep_rows(schedules: list[str], ranks: list[int], microbatches: list[int], costs: CostModel,
               chunks: list[int | None] | None = None, engine: str = "des",
               progress: Callable[[int, str], None] | None = None, budget: Budget = Budget(),
               recompute: tuple[bool, ...] = (False,)) -> list[Row]:
    """Simulate every schedule at every p, v and m, without and/or with recomputation of
    every model stage (`recompute`): a Row each (its point's `error` set where the
    schedule cannot be built there). Schedules with a fixed v run once."""

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
                schedule = load_schedule(name, p, m, v, costs, budget, rc, builtins, None if rc else seen)
            else:
                try:
                    schedule = load_schedule(name, p, m, v, costs, Budget(), rc)
                except ScheduleError as exc:
                    here[name, v] = exc
                    raise
                here[name, v] = schedule
            graph = validate(schedule)
        except (ScheduleError, CostError, UsageError) as exc:  # CostError: e.g. calibrated model_stages for another S
            rows.append(Row(SweepPoint(shown, p, m, error=str(exc)), fixed, recompute=rc))
            continue
        met = compute_metrics(simulate(graph, costs, engine=engine))
        peak = max(r.peak_memory_bytes for r in met.per_rank)
        acts = peak_activations(schedule)
        if reuse and not searches and not rc:
            seen[id(schedule)] = Evaluation(schedule, met.makespan, met.bubble_ratio, peak, acts,
                                            budget.admits(peak, acts))
        fits = ((budget.max_activations is None or acts <= budget.max_activations + 1e-9)
                and (budget.memory_limit is None or peak <= budget.memory_limit))
        rows.append(Row(SweepPoint(shown, p, m, met.makespan, met.bubble_ratio, peak, met.comm_hidden_fraction),
                        schedule.num_model_stages // p, acts, fits, rc))
    if progress:
        progress(len(todo), "done")
    return rows


def sweep(schedules: list[str], ranks: int, microbatches: list[int], costs: CostModel,
          chunks: int | None = None, engine: str = "des",
          progress: Callable[[int, str], None] | None = None) -> list:
    """The chart's SweepPoints at one p and v (see `sweep_rows`)."""
    return [r.point for r in sweep_rows(schedules, [ranks], microbatches, costs, [chunks], engine, progress)]


def write_csv(rows: list[Row], path: str) -> None:
    point_fields = [x.name for x in fields(rows[0].point)]
    columns = point_fields[:2] + ["v"] + point_fields[2:-1] + ["peak_activations", "fits", point_fields[-1]]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        out = csv.DictWriter(f, columns)
        out.writeheader()
        for r in rows:
            values = {**asdict(r.point), "v": r.v, "peak_activations": r.activations,
                      "fits": "" if r.point.error else r.fits}
            out.writerow({k: ("" if v is None or v != v else v) for k, v in values.items()})


def run(args: argparse.Namespace) -> int:
    ranks = parse_counts(args.ranks, "-p", "4,8")
    chunks: list[int | None] = [None] if args.chunks is None else parse_counts(args.chunks, "-v", "1,2")
    counts = parse_counts(args.microbatches)
    names = parse_schedules(args.schedules)
    budget = budget_from_args(args)
    if args.chunks is not None and all(BUILDERS[n].chunks is not None for n in names):
        raise UsageError(f"-v applies to schedules with a chosen number of chunks "
                         f"({', '.join(n for n, b in BUILDERS.items() if b.chunks is None)}); none is swept")
    terminal.check_outputs({"--plot": args.plot, "--csv": args.csv}, {"--costs": args.costs})
    if args.pareto_m is not None and not args.plot:
        raise UsageError("--pareto-m chooses the chart's Pareto panel; it needs --plot")
    if args.plot:
        from ..plots.style import check_output
        check_output(args.plot)
    if args.plot and (len(ranks) > 1):
        raise UsageError("--plot draws one rank count; give one -p (the table and --csv take several)")
    if args.pareto_m is not None and args.pareto_m not in counts:
        raise UsageError(f"--pareto-m {args.pareto_m} is not one of --microbatches {args.microbatches}")
    costs = costs_from_args(args)
    if costs.host is not None and args.engine == "exact":
        raise UsageError("--engine exact cannot model ranks sharing compute; use the DES (the default)")
    total = len(ranks) * len(counts) * len(recompute_modes(args.recompute)) * sum(len(chunks) if BUILDERS[n].chunks is None else 1 for n in names)
    bar = Progress(total)
    try:
        rows = sweep_rows(names, ranks, counts, costs, chunks, args.engine, bar, budget, recompute_modes(args.recompute))
    finally:
        bar.close()
    if all(r.point.error for r in rows):
        raise UsageError(f"no schedule could be built for p={args.ranks}: {rows[0].point.error}")
    show_table(rows, budget)
    if args.csv:
        write_csv(rows, args.csv)
        terminal.wrote(args.csv)
    if args.plot:
        from ..plots.sweep import plot_sweep
        several_v = len({(r.point.schedule, r.v) for r in rows}) > len({r.point.schedule for r in rows})
        points = [replace(r.point, schedule=f"{r.point.schedule} v={r.v}") if several_v and
                  BUILDERS[r.point.schedule.removesuffix("+recompute")].chunks is None else r.point for r in rows]
        plot_sweep(points, args.plot, pareto_m=args.pareto_m)
        terminal.wrote(args.plot)
    return 0


def show_table(rows: list[Row], budget: Budget) -> None:
    """Memory in bytes when the costs give any, and always as microbatches of activations
    (so unit costs do not print "0 B" for every schedule)."""
    in_bytes = any(r.point.peak_memory > 0 for r in rows if not r.point.error)
    width = max([17] + [len(r.point.schedule) for r in rows])
    print(f"{'schedule':<{width}} {'p':>3} {'v':>2} {'m':>4}  {'makespan':>11}  {'bubble':>7}  "
          + (f"{'peak memory':>12}  " if in_bytes else "") + f"{'activations':>11}" + ("  fits" if budget else ""))
    for r in rows:
        p = r.point
        lead = f"{p.schedule:<{width}} {p.ranks:>3} {r.v if r.v else '-':>2} {p.microbatches:>4}  "
        if p.error:
            print(f"{lead}skipped: {p.error}")
            continue
        print(lead + f"{fmt_seconds(p.makespan):>11}  {100 * p.bubble_ratio:>6.2f}%  "
              + (f"{fmt_bytes(p.peak_memory):>12}  " if in_bytes else "") + f"{r.activations:>8g} mb"
              + (("  yes" if r.fits else "  over") if budget else ""))
    print("activations: most microbatches of one pipeline stage's activations a rank holds, F to W (1F1B holds p)")
