"""`pipesched simulate`: predict a schedule's timeline, bubbles, overlap and memory."""
from __future__ import annotations

import argparse
import math

import numpy as np

from pipesched.schedules.validate import validate
from pipesched.simulator.api import simulate
from pipesched.simulator.layers import OBJECTIVE_LABELS, split_summary
from pipesched.simulator.metrics import Metrics, PathStep, compute_metrics
from pipesched.simulator.stochastic import makespan_stats
from pipesched.simulator.trace import Trace

from ..errors import UsageError
from ..figure_options import add_figure_args, check_figure_args, figure_options, write_perfetto
from ..formatting import fmt_bytes, fmt_seconds, json_text
from ..options import add_schedule_args, add_step_args, check_step_args, schedule_from_args
from ..terminal import Progress, check_outputs, printable, wrote
from .model_options import add_model_args, costs_from_args

MAX_RUNS = 100_000
"""The most noisy runs --runs takes; each is a full simulation."""
MAX_RUN_OPS = 200_000_000
"""The most op simulations (runs x ops) --runs may ask for: at about 10 us per op, half
an hour; more is almost surely a typo."""


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="predict a schedule's timeline under a cost model")
    add_schedule_args(p)
    add_model_args(p)
    p.add_argument("--engine", choices=("auto", "des", "exact"), default="auto",
                   help="discrete-event simulation, the exact longest path (same timeline, faster, no shared "
                        "compute), or auto (default): exact unless ranks share compute")
    p.add_argument("--runs", type=int, help=f"stochastic mode: this many noisy runs (at most {MAX_RUNS:,})")
    p.add_argument("--cv", type=float, help="with --runs: coefficient of variation of op times (default 0.1)")
    p.add_argument("--seed", type=int, help="with --runs: random seed (default 0)")
    add_step_args(p)
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


def print_table(m: Metrics, engine: str, model_stages: int, data_parallel: dict | None = None,
                steps: dict | None = None) -> None:
    print(f"{printable(m.schedule)}: {m.ranks} ranks, {m.microbatches} microbatches, {model_stages} model stages, "
          f"{engine}")
    comm = (f"communication {fmt_seconds(m.comm_time)} ({100 * m.comm_hidden_fraction:.1f} % hidden under compute)"
            if m.comm_time > 0 else "communication free (no transfer costs given)")
    print(f"makespan {fmt_seconds(m.makespan)}, bubble {100 * m.bubble_ratio:.2f} %, {comm}")
    if m.period is not None:
        print(steps_line(m, (steps or {}).get("period_method"), (steps or {}).get("critical")))
    if data_parallel is not None:
        print(f"step tail: {data_parallel['degree']} data-parallel replicas, all-reduce "
              f"{fmt_seconds(m.allreduce_time / m.ranks)} per rank on average, {fmt_seconds(m.allreduce_exposed)} "
              "exposed (the step's extra length over free all-reduces); optimizer steps included")
    print(f"{'rank':>4}  {'busy':>11}  {'idle':>11}  {'bubble':>7}  {'peak memory':>12}")
    for r in m.per_rank:
        print(f"{r.rank:>4}  {fmt_seconds(r.busy):>11}  {fmt_seconds(r.idle):>11}  {100 * r.bubble_ratio:>6.2f}%  "
              f"{fmt_bytes(r.peak_memory_bytes):>12}")
    ops = sum(s.kind == "compute" for s in m.critical_path)
    xfers = len(m.critical_path) - ops
    busy = sum(s.end - s.start for s in m.critical_path if s.kind == "compute")
    span = m.step_makespan if m.steps > 1 and m.step_makespan else m.makespan  # the path is the first step's
    print(f"critical path{' of the first step' if m.steps > 1 else ''}: {ops} ops and {xfers} transfers, compute "
          f"{fmt_seconds(busy)} of {fmt_seconds(span)}; starts with {fmt_step(m.critical_path[0])}, "
          f"ends with {fmt_step(m.critical_path[-1])}")


def steps_line(m: Metrics, method: str | None = None, critical: list | None = None) -> str:
    """The steps' line: how many, the barrier, the period beside the first step's
    makespan, and the throughput."""
    how = {"max-plus": "exact, max-plus", "barrier": "the step's end", "simulated": "simulated steps"}.get(method or "")
    line = (f"{m.steps} step{'s' if m.steps > 1 else ''}, barrier {m.step_barrier}: period {fmt_seconds(m.period)} "
            f"per step{f' ({how})' if how else ''} against a one-step makespan of {fmt_seconds(m.step_makespan)}, "
            f"throughput {m.throughput:.4g} microbatches/s")
    if critical:
        line += f"; set by {', '.join(map(str, critical[:6]))}{', ...' if len(critical) > 6 else ''}"
    return line


def fmt_step(step: PathStep) -> str:
    """A critical-path step as `str(step)` says it (--json keeps that, in seconds), its
    start and end in the unit the tables use: e.g. `F0@0 (rank 0, 0-1.5 ms)`."""
    where = f"rank {step.rank}" if step.kind == "compute" else f"{step.rank}->{step.peer}"
    verb = "" if step.kind == "compute" else "send "
    return f"{verb}{step.op}{step.mb}@{step.stage} ({where}, {fmt_span(step.start, step.end)})"


def fmt_span(start: float, end: float) -> str:
    """`start-end` in the one unit fmt_seconds would write the longer of them in."""
    unit = fmt_seconds(max(abs(start), abs(end))).rsplit(" ", 1)[1]
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    digits = ".6g" if unit == "s" else ".4g"
    return f"{start * scale:{digits}}-{end * scale:{digits}} {unit}"


def print_split(split: dict) -> None:
    """One line: the layers on each model stage and the stages' loads."""
    loads = split["stage_seconds"]
    print(f"layers per model stage {','.join(map(str, split['layers_per_stage']))} ({split['partition']}; "
          f"{OBJECTIVE_LABELS[split['objective']]} per stage {', '.join(fmt_seconds(x) for x in loads)}, "
          f"slowest {fmt_seconds(max(loads))})")


def check_stochastic_args(args: argparse.Namespace) -> None:
    """--runs within its bound; --cv and --seed only with --runs (they do nothing else)."""
    if args.runs is None:
        given = [flag for flag, value in (("--cv", args.cv), ("--seed", args.seed)) if value is not None]
        if given:
            raise UsageError(f"{given[0]} only applies to the stochastic mode; add --runs N or leave it out")
        return
    if not 1 <= args.runs <= MAX_RUNS:
        raise UsageError(f"--runs must be between 1 and {MAX_RUNS:,}, got {args.runs}")
    args.cv = 0.1 if args.cv is None else args.cv
    args.seed = 0 if args.seed is None else args.seed
    if not (math.isfinite(args.cv) and args.cv >= 0):
        raise UsageError(f"--cv must be a finite number >= 0, got {args.cv}")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")


def run(args: argparse.Namespace) -> int:
    check_stochastic_args(args)
    check_step_args(args)
    check_figure_args(args, args.plot, "--plot")
    check_outputs({"--trace": args.trace, "--plot": args.plot, "--perfetto": args.perfetto},
                  {"SCHEDULE": args.schedule, "--costs": args.costs, "--model-config": args.model_config,
                   "--hardware": args.hardware})
    if args.plot:
        from ..plots.style import check_output  # matplotlib only when drawing
        check_output(args.plot)
    costs = costs_from_args(args)
    if costs.host is not None and args.engine == "exact":
        raise UsageError("--engine exact cannot model ranks sharing compute; use the DES (--engine des or auto)")
    schedule = schedule_from_args(args, costs)
    graph = validate(schedule)
    trace = simulate(graph, costs, engine=args.engine, steps=args.steps, step_barrier=args.step_barrier)
    metrics = compute_metrics(trace, graph)
    stats = None
    if args.runs:
        if args.runs * len(graph.tasks) > MAX_RUN_OPS:
            raise UsageError(f"--runs {args.runs} x {len(graph.tasks):,} ops is more than the {MAX_RUN_OPS:,} op "
                             f"simulations the stochastic mode runs; use at most "
                             f"{max(1, MAX_RUN_OPS // len(graph.tasks)):,} runs")
        bar = Progress("simulate --runs", args.runs)
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                stats = makespan_stats(graph, costs, args.runs, args.cv, args.seed, progress=bar)
        except OverflowError:
            stats = None
        finally:
            bar.close()
        if stats is None or not math.isfinite(stats.max):
            raise UsageError(f"the noisy runs overflow to infinity at --cv {args.cv:g}; lower --cv or the costs")
    if args.trace:
        trace.save(args.trace)
        wrote(args.trace, to_stderr=args.json)
    if args.perfetto:
        write_perfetto(trace, args.perfetto, to_stderr=args.json)
    if args.plot:
        from ..plots.timeline import plot_timeline
        plot_timeline(trace, args.plot, **figure_options(args))
        wrote(args.plot, to_stderr=args.json)
    if args.json:
        out = summary(metrics)
        out["model_stages"] = schedule.num_model_stages
        if costs.layers is not None:
            out["layers"] = split_summary(costs.layers, schedule.num_model_stages)
        out["engine"] = trace.meta["engine"]
        if "engine_choice" in trace.meta:
            out["engine_choice"] = trace.meta["engine_choice"]
        if stats:
            out["stochastic"] = stats.to_dict()
        if "steps" in trace.meta:
            out["period_method"] = trace.meta["steps"].get("period_method")
            out["period_critical"] = trace.meta["steps"].get("critical")
        print(json_text(out))
        return 0
    print_table(metrics, engine_label(trace), schedule.num_model_stages, trace.meta.get("data_parallel"),
                trace.meta.get("steps"))
    if costs.layers is not None:
        print_split(split_summary(costs.layers, schedule.num_model_stages))
    if stats:
        print(f"stochastic ({stats.runs} runs, cv {stats.cv:g}, seed {stats.seed}): makespan mean "
              f"{fmt_seconds(stats.mean)}, p50 {fmt_seconds(stats.p50)}, p95 {fmt_seconds(stats.p95)}, "
              f"max {fmt_seconds(stats.max)}")
    return 0
