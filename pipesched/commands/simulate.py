"""`pipesched simulate`: predict a schedule's timeline, bubbles, overlap and memory."""
from __future__ import annotations

import argparse
import json
import math

import numpy as np

from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.metrics import Metrics, compute_metrics
from pipesched.simulator.stochastic import makespan_stats
from pipesched.simulator.trace import Trace

from ..errors import UsageError
from ..figure_options import add_figure_args, check_figure_args, figure_options, write_perfetto
from ..formatting import fmt_bytes, fmt_seconds
from ..options import add_cost_args, add_schedule_args, check_writable, costs_from_args, schedule_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="predict a schedule's timeline under a cost model")
    add_schedule_args(p)
    add_cost_args(p)
    p.add_argument("--engine", choices=("auto", "des", "exact"), default="auto",
                   help="discrete-event simulation, the exact longest path (same timeline, faster, no shared "
                        "compute), or auto (default): exact unless ranks share compute")
    p.add_argument("--runs", type=int, help="stochastic mode: this many noisy runs")
    p.add_argument("--cv", type=float, default=0.1, help="coefficient of variation of op times (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the stochastic mode")
    p.add_argument("--json", action="store_true", help="print metrics as JSON")
    p.add_argument("--trace", metavar="OUT.json", help="write the predicted Trace")
    p.add_argument("--plot", metavar="OUT.png|svg", help="draw the predicted timeline (with memory)")
    p.add_argument("--perfetto", metavar="OUT.json", help="write the timeline for ui.perfetto.dev / chrome://tracing")
    add_figure_args(p)
    p.set_defaults(handler=run)


def summary(metrics: Metrics) -> dict:
    d = metrics.to_dict()
    d["critical_path"] = [str_step for str_step in map(str, metrics.critical_path)]
    return d


def engine_label(trace: Trace) -> str:
    """The engine that ran, and why when it was chosen automatically."""
    choice = trace.meta.get("engine_choice")
    return f"{trace.meta['engine']} engine" + (f" ({choice})" if choice else "")


def print_table(m: Metrics, engine: str, model_stages: int) -> None:
    print(f"{m.schedule}: {m.ranks} ranks, {m.microbatches} microbatches, {model_stages} model stages, {engine}")
    comm = (f"communication {fmt_seconds(m.comm_time)} ({100 * m.comm_hidden_fraction:.1f} % hidden under compute)"
            if m.comm_time > 0 else "communication free (no transfer costs given)")
    print(f"makespan {fmt_seconds(m.makespan)}, bubble {100 * m.bubble_ratio:.2f} %, {comm}")
    print(f"{'rank':>4}  {'busy':>11}  {'idle':>11}  {'bubble':>7}  {'peak memory':>12}")
    for r in m.per_rank:
        print(f"{r.rank:>4}  {fmt_seconds(r.busy):>11}  {fmt_seconds(r.idle):>11}  {100 * r.bubble_ratio:>6.2f}%  "
              f"{fmt_bytes(r.peak_memory_bytes):>12}")
    ops = sum(s.kind == "compute" for s in m.critical_path)
    xfers = len(m.critical_path) - ops
    busy = sum(s.end - s.start for s in m.critical_path if s.kind == "compute")
    print(f"critical path: {ops} ops and {xfers} transfers, compute {fmt_seconds(busy)} of "
          f"{fmt_seconds(m.makespan)}; starts with {m.critical_path[0]}, ends with {m.critical_path[-1]}")


def run(args: argparse.Namespace) -> int:
    if args.runs is not None and args.runs < 1:
        raise UsageError(f"--runs must be >= 1, got {args.runs}")
    if not (math.isfinite(args.cv) and args.cv >= 0):
        raise UsageError(f"--cv must be a finite number >= 0, got {args.cv}")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    check_figure_args(args, args.plot, "--plot")
    for path in (args.trace, args.plot, args.perfetto):
        if path:
            check_writable(path)
    if args.plot:
        from ..plots.style import check_output  # matplotlib only when drawing
        check_output(args.plot)
    costs = costs_from_args(args)
    if costs.host is not None and args.engine == "exact":
        raise UsageError("--engine exact cannot model ranks sharing compute; use the DES (--engine des or auto)")
    schedule = schedule_from_args(args, costs)
    graph = validate(schedule)
    trace = simulate(graph, costs, engine=args.engine)
    metrics = compute_metrics(trace, graph)
    stats = None
    if args.runs:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                stats = makespan_stats(graph, costs, args.runs, args.cv, args.seed)
        except OverflowError:
            stats = None
        if stats is None or not math.isfinite(stats.max):
            raise UsageError(f"the noisy runs overflow to infinity at --cv {args.cv:g}; lower --cv or the costs")
    if args.trace:
        try:
            trace.save(args.trace)
        except OSError as exc:
            raise UsageError(f"cannot write {args.trace!r}: {exc.strerror or exc}") from None
    if args.perfetto:
        write_perfetto(trace, args.perfetto)
    if args.plot:
        from ..plots.timeline import plot_timeline
        plot_timeline(trace, args.plot, **figure_options(args))
    if args.json:
        out = summary(metrics)
        out["model_stages"] = schedule.num_model_stages
        out["engine"] = trace.meta["engine"]
        if "engine_choice" in trace.meta:
            out["engine_choice"] = trace.meta["engine_choice"]
        if stats:
            out["stochastic"] = stats.to_dict()
        print(json.dumps(out, indent=1))
        return 0
    print_table(metrics, engine_label(trace), schedule.num_model_stages)
    if stats:
        print(f"stochastic ({stats.runs} runs, cv {stats.cv:g}, seed {stats.seed}): makespan mean "
              f"{fmt_seconds(stats.mean)}, p50 {fmt_seconds(stats.p50)}, p95 {fmt_seconds(stats.p95)}, "
              f"max {fmt_seconds(stats.max)}")
    return 0
