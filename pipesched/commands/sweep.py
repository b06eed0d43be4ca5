"""`pipesched sweep`: every schedule over rank counts, chunks per rank and microbatch
counts: bubble, peak memory (bytes when the costs give them, and always microbatches of
activations held) and makespan as a table, a comparison chart (--plot) and a CSV (--csv).
The sweep itself is the library's (`simulator.sweep`, `pipesched.sweep`); this command
parses the options and prints and writes what it returns."""
from __future__ import annotations

import argparse
import csv
from dataclasses import asdict, fields, replace
from typing import TextIO

from pipesched.schedules.outputs import atomic_path
from pipesched.schedules.registry import BUILDERS
from pipesched.simulator.budget import Budget
from pipesched.simulator.planner import recompute_modes
from pipesched.simulator.sweep import SweepRow, default_schedules, sweep, sweep_size

from .. import terminal
from ..errors import UsageError
from ..formatting import fmt_bytes, fmt_seconds
from ..options import add_budget_args, add_cost_args, add_recompute_arg, add_step_args, budget_from_args, parse_counts
from .model_options import add_model_args, costs_from_args

PROGRESS_AFTER_S = 2.0  # on a non-terminal stderr, report progress only for sweeps this long
ACTIVATIONS = "activations (microbatches)"  # the table's column of activations held


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
    add_model_args(p)
    p.add_argument("--engine", choices=("des", "exact"), default="des", help="simulation engine (default des)")
    add_step_args(p, steps=False)
    p.add_argument("--plot", metavar="OUT.png|svg", help="write the comparison chart")
    p.add_argument("--pareto-m", type=int, metavar="M", help="microbatches of the chart's Pareto panel "
                                                            "(default: the largest swept)")
    p.add_argument("--csv", metavar="OUT.csv", help="write one row per schedule and microbatch count")
    p.set_defaults(handler=run)


def parse_schedules(text: str | None) -> list[str]:
    names = default_schedules() if text is None else [x.strip() for x in text.split(",") if x.strip()]
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


def write_csv(rows: list[SweepRow], path: str) -> None:
    """One row per point: the SweepPoint's fields with v, the activations held and whether it fits."""
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
    terminal.check_outputs({"--plot": args.plot, "--csv": args.csv},
                           {"--costs": args.costs, "--model-config": args.model_config, "--hardware": args.hardware})
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
    bar = Progress(sweep_size(names, ranks, counts, chunks, recompute_modes(args.recompute)))
    try:
        rows = sweep(ranks, counts, names, costs=costs, chunks=None if args.chunks is None else chunks,
                     engine=args.engine, max_activations=budget.max_activations, memory_limit=budget.memory_limit,
                     recompute=args.recompute, step_barrier=args.step_barrier, progress=bar)
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


def show_table(rows: list[SweepRow], budget: Budget) -> None:
    """Memory in bytes when the costs give any, and always as microbatches of activations
    (so unit costs do not print "0 B" for every schedule)."""
    in_bytes = any(r.point.peak_memory > 0 for r in rows if not r.point.error)
    periods = any(r.point.period == r.point.period for r in rows if not r.point.error)  # not nan: no barrier
    width = max([17] + [len(r.point.schedule) for r in rows])
    print(f"{'schedule':<{width}} {'p':>3} {'v':>2} {'m':>4}  {'makespan':>11}  "
          + (f"{'period':>11}  " if periods else "") + f"{'bubble':>7}  "
          + (f"{'peak memory':>12}  " if in_bytes else "") + f"{ACTIVATIONS:>{len(ACTIVATIONS)}}"
          + ("  fits" if budget else ""))
    for r in rows:
        p = r.point
        lead = f"{p.schedule:<{width}} {p.ranks:>3} {r.v if r.v else '-':>2} {p.microbatches:>4}  "
        if p.error:
            print(f"{lead}skipped: {p.error}")
            continue
        print(lead + f"{fmt_seconds(p.makespan):>11}  " + (f"{fmt_seconds(p.period):>11}  " if periods else "")
              + f"{100 * p.bubble_ratio:>6.2f}%  "
              + (f"{fmt_bytes(p.peak_memory):>12}  " if in_bytes else "") + f"{r.activations:>{len(ACTIVATIONS)}g}"
              + (("  yes" if r.fits else "  over") if budget else ""))
    print("activations: most microbatches of one pipeline stage's activations a rank holds, F to W (1F1B holds p)"
          + ("; period: seconds per step with steps back to back, no barrier between them" if periods else ""))
