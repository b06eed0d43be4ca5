"""`pipesched sweep`: every schedule at p ranks over several microbatch counts: bubble,
peak memory and makespan as a table, a comparison chart (--plot) and a CSV (--csv)."""
from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import asdict, fields
from typing import Callable, TextIO

from pipesched.schedules.ir import ScheduleError
from pipesched.schedules.registry import BUILDERS
from pipesched.schedules.validate import validate
from pipesched.simulator.costs import CostModel
from pipesched.simulator.metrics import compute_metrics

from ..errors import UsageError
from ..options import add_cost_args, check_writable, costs_from_args, fmt_bytes, fmt_seconds, load_schedule
from .simulate import predict

PROGRESS_AFTER_S = 2.0  # on a non-terminal stderr, report progress only for sweeps this long


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="compare schedules over microbatch counts (table, chart, CSV)")
    p.add_argument("-p", "--ranks", type=int, required=True, help="pipeline ranks")
    p.add_argument("--microbatches", "-m", required=True, metavar="M1,M2,...",
                   help="microbatch counts, comma-separated (e.g. 4,8,16,32)")
    p.add_argument("--schedules", metavar="A,B,...", help="built-in schedules (default: all)")
    p.add_argument("-v", "--chunks", type=int, help="chunks per rank for the schedules that take it")
    add_cost_args(p)
    p.add_argument("--engine", choices=("des", "exact"), default="des", help="simulation engine (default des)")
    p.add_argument("--plot", metavar="OUT.png|svg", help="write the comparison chart")
    p.add_argument("--pareto-m", type=int, metavar="M", help="microbatches of the chart's Pareto panel "
                                                            "(default: the largest swept)")
    p.add_argument("--csv", metavar="OUT.csv", help="write one row per schedule and microbatch count")
    p.set_defaults(handler=run)


def parse_counts(text: str) -> list[int]:
    """"4,8,16" -> [4, 8, 16]; UsageError unless every item is an integer >= 1."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UsageError(f"--microbatches needs comma-separated integers >= 1 (e.g. 4,8,16), got {text!r}")
    return sorted(set(counts))


def parse_schedules(text: str | None) -> list[str]:
    names = list(BUILDERS) if text is None else [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise UsageError("--schedules is empty")
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise UsageError(f"unknown schedule {unknown[0]!r} in --schedules; built-in schedules are "
                         f"{', '.join(BUILDERS)}")
    return list(dict.fromkeys(names))


class Progress:
    """A one-line progress bar on `stream`: redrawn in place on a terminal; elsewhere a
    line per tenth, and only once the sweep has run PROGRESS_AFTER_S seconds."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30, label: str = "sweep"):
        # sys.stderr looked up now, not at import: callers (and tests) may have replaced it
        self.total, self.stream, self.width, self.label = max(total, 1), stream or sys.stderr, width, label
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self.shown = 0  # tenths already reported on a non-terminal
        self.drawn = False

    def __call__(self, done: int, what: str) -> None:
        elapsed = time.monotonic() - self.t0
        if self.tty:
            full = self.width * done // self.total
            self.stream.write(f"\r{self.label} [{'#' * full}{'.' * (self.width - full)}] {done}/{self.total} "
                              f"{elapsed:.0f}s {what:<30.30}")
            self.drawn = True
        elif elapsed >= PROGRESS_AFTER_S and 10 * done // self.total > self.shown:
            self.shown = 10 * done // self.total
            self.stream.write(f"{self.label}: {done}/{self.total} done after {elapsed:.0f} s\n")
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def sweep(schedules: list[str], ranks: int, microbatches: list[int], costs: CostModel,
          chunks: int | None = None, engine: str = "des",
          progress: Callable[[int, str], None] | None = None) -> list:
    """Simulate every schedule at every microbatch count: a SweepPoint each (with
    `error` set where the schedule cannot be built for that p and m)."""
    from ..plots.sweep import SweepPoint  # matplotlib only when needed

    points = []
    todo = [(name, m) for name in schedules for m in microbatches]
    for done, (name, m) in enumerate(todo):
        if progress:
            progress(done, f"{name} m={m}")
        v = chunks if BUILDERS[name].chunks is None else None
        try:
            graph = validate(load_schedule(name, ranks, m, v, costs))
        except ScheduleError as exc:
            points.append(SweepPoint(name, ranks, m, error=str(exc)))
            continue
        met = compute_metrics(predict(graph, costs, engine))
        points.append(SweepPoint(name, ranks, m, met.makespan, met.bubble_ratio,
                                 max(r.peak_memory_bytes for r in met.per_rank), met.comm_hidden_fraction))
    if progress:
        progress(len(todo), "done")
    return points


def write_csv(points: list, path: str) -> None:
    try:
        with open(path, "w", newline="") as f:
            out = csv.DictWriter(f, [x.name for x in fields(points[0])])
            out.writeheader()
            for p in points:
                out.writerow({k: ("" if v is None or v != v else v) for k, v in asdict(p).items()})
    except OSError as exc:
        raise UsageError(f"cannot write {path!r}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    if args.ranks < 1:
        raise UsageError(f"-p must be >= 1, got {args.ranks}")
    if args.chunks is not None and args.chunks < 1:
        raise UsageError(f"-v must be >= 1, got {args.chunks}")
    counts = parse_counts(args.microbatches)
    names = parse_schedules(args.schedules)
    for path in (args.plot, args.csv):
        if path:
            check_writable(path)
    if args.plot:
        from ..plots.style import check_output
        check_output(args.plot)
    if args.pareto_m is not None and args.pareto_m not in counts:
        raise UsageError(f"--pareto-m {args.pareto_m} is not one of --microbatches {args.microbatches}")
    costs = costs_from_args(args)
    if costs.host is not None and args.engine == "exact":
        raise UsageError("--engine exact cannot model ranks sharing compute; use the DES (the default)")
    bar = Progress(len(names) * len(counts))
    try:
        points = sweep(names, args.ranks, counts, costs, args.chunks, args.engine, bar)
    finally:
        bar.close()
    if all(p.error for p in points):
        raise UsageError(f"no schedule could be built for p={args.ranks}: {points[0].error}")
    print(f"{'schedule':<17} {'m':>4}  {'makespan':>11}  {'bubble':>7}  {'peak memory':>12}")
    for p in points:
        if p.error:
            print(f"{p.schedule:<17} {p.microbatches:>4}  skipped: {p.error}")
        else:
            print(f"{p.schedule:<17} {p.microbatches:>4}  {fmt_seconds(p.makespan):>11}  "
                  f"{100 * p.bubble_ratio:>6.2f}%  {fmt_bytes(p.peak_memory):>12}")
    if args.csv:
        write_csv(points, args.csv)
    if args.plot:
        from ..plots.sweep import plot_sweep
        plot_sweep(points, args.plot, pareto_m=args.pareto_m)
    return 0
