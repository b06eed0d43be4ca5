"""`pipesched plan`: the fastest schedule that fits a memory budget per rank.

The search is the library's (`simulator.planner.plan`, `pipesched.plan`): every built-in
and zb-auto (searched under the budget) for the costs at each microbatch count and v
asked for, simulated, what does not fit dropped, the rest ranked by throughput. This
command parses the options, prints the ranking and the Pareto front of throughput
against peak memory, and writes the winner as a schedule file that `simulate`, `run`
and `validate` take.
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import replace

from pipesched.schedules import fileformat
from pipesched.schedules.registry import BUILDERS, MAX_OPS
from pipesched.simulator.budget import engine_for
from pipesched.simulator.planner import (JITTER_CV, JITTER_RUNS, JITTER_TOP, Candidate, CostVariant, Plan,
                                         max_microbatches, plan, recompute_modes, search_size)
from pipesched.simulator.units import parse_bandwidth, parse_bytes, parse_seconds

from ..errors import UsageError
from ..formatting import fmt_bytes, fmt_seconds, json_text
from ..options import (COST_DESTS, add_budget_args, add_cost_args, add_recompute_arg, add_step_args,
                       budget_from_args, parse_counts)
from ..terminal import Progress, check_outputs, warn
from .model_options import add_model_args, check_model_args, costs_from_args, hardware_from_args, model_given, \
    model_words

RESCUES_SHOWN = 5  # schedules named as fitting only with recomputation, fastest first


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="find the fastest schedule that fits a memory budget per rank")
    p.add_argument("-p", "--ranks", type=int, required=True, help="pipeline ranks")
    p.add_argument("-m", "--microbatches", metavar="M1,M2,...|A..B",
                   help="microbatch counts: a list, or A..B for A, 2A, 4A, ... up to B (default 2p)")
    p.add_argument("--global-batch", type=int, metavar="G",
                   help="samples per step (with --microbatch-size: m = G/size)")
    p.add_argument("--microbatch-size", metavar="S|S1,S2,...",
                   help="samples (sequences) per microbatch: throughput in samples/s; with a model a list, "
                        "e.g. 1,2,4: the costs estimated for each size, all searched and ranked together")
    p.add_argument("-v", "--chunks", default="1,2", metavar="V1,V2", help="chunks per rank to try (default 1,2)")
    p.add_argument("--schedules", metavar="A,B,...", help="built-ins to consider (default: all, with zb-auto)")
    add_recompute_arg(p, search=True, default="auto")
    add_budget_args(p)
    add_cost_args(p)
    add_model_args(p, microbatch_size=False)
    add_step_args(p, steps=False)
    p.add_argument("-o", "--output", metavar="FILE.json", help="write the winning schedule file")
    p.add_argument("--plot", metavar="OUT.png|svg", help="draw the winner's predicted timeline")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows of the ranked table (default 15)")
    p.add_argument("--json", action="store_true", help="print best, candidates and Pareto front as JSON")
    p.add_argument("--processes", type=int, metavar="N",
                   help="processes searching at once (default: one per core; the plan is the same)")
    p.set_defaults(handler=run)


def parse_range(text: str | None, ranks: int) -> list[int]:
    """The microbatch counts -m asks for (default 2p), each at most what a schedule on
    `ranks` ranks can have within the op limit (checked before the list is made)."""
    if text is None:
        check_microbatches(2 * ranks, ranks, "-m (default 2p)")
        return [2 * ranks]
    if ".." in text:
        lo_hi = text.split("..")
        try:
            lo, hi = int(lo_hi[0]), int(lo_hi[1])
        except (ValueError, IndexError):
            raise UsageError(f"-m A..B needs two integers, got {text!r}") from None
        if lo < 1 or hi < lo or len(lo_hi) != 2:
            raise UsageError(f"-m A..B needs 1 <= A <= B, got {text!r}")
        check_microbatches(hi, ranks, "-m A..B")
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= 2
        return out
    counts = parse_counts(text)
    check_microbatches(counts[-1], ranks, "-m")
    return counts


def check_microbatches(m: int, ranks: int, flag: str) -> None:
    """UsageError when no schedule on `ranks` ranks could have `m` microbatches."""
    most = max_microbatches(ranks)
    if m > most:
        shown = f"{m:,}" if m < 10 ** 30 else f"a number of {len(str(m))} digits"
        raise UsageError(f"{flag}: {shown} microbatches is more than the {most:,} a schedule on {ranks:,} ranks can "
                         f"have ({MAX_OPS:,} ops of F, B and W at most)")


def parse_chunks(text: str) -> list[int]:
    try:
        vs = sorted({int(x) for x in text.split(",")})
    except ValueError:
        vs = []
    if not vs or min(vs) < 1:
        raise UsageError(f"-v needs comma-separated integers >= 1 (e.g. 1,2), got {text!r}")
    return vs


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
    if args.ranks > MAX_OPS // 3:
        raise UsageError(f"-p {args.ranks:,} is more than the {MAX_OPS // 3:,} ranks a schedule within the "
                         f"{MAX_OPS:,} op limit can have")
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if args.processes is not None and args.processes < 1:
        raise UsageError(f"--processes must be an integer >= 1, got {args.processes}")
    sizes = parse_sizes(args.microbatch_size)
    check_model_args(args)
    model = model_given(args)
    if sizes is not None and len(sizes) > 1 and not model:
        raise UsageError("--microbatch-size takes one size with --costs or cost flags: a list needs a model "
                         "(--model-preset or --model-config) to estimate the costs of each size")
    if args.global_batch is not None:
        if sizes is None or args.microbatches is not None:
            raise UsageError("--global-batch needs --microbatch-size (and no -m): m = global batch / size")
        for b in sizes:
            if args.global_batch < 1 or args.global_batch % b:
                raise UsageError(f"--global-batch {args.global_batch} is not a positive multiple of "
                                 f"--microbatch-size {b}")
            check_microbatches(args.global_batch // b, args.ranks, "--global-batch / --microbatch-size")
        counts_of = [[args.global_batch // b] for b in sizes]
    else:
        counts_of = [parse_range(args.microbatches, args.ranks)] * len(sizes or [None])
    vs = parse_chunks(args.chunks)
    names = list(BUILDERS) if args.schedules is None else [x.strip() for x in args.schedules.split(",") if x.strip()]
    unknown = [n for n in names if n not in BUILDERS]
    if unknown or not names:
        raise UsageError(f"unknown schedule {unknown[0] if unknown else ''!r} in --schedules; built-in schedules are "
                         f"{', '.join(BUILDERS)}")
    budget = budget_from_args(args)
    check_outputs({"-o": args.output, "--plot": args.plot},
                  {"--costs": args.costs, "--model-config": args.model_config, "--hardware": args.hardware})
    if args.plot:
        from ..plots.style import check_output
        check_output(args.plot)
    recompute = args.recompute
    variants = [CostVariant(costs_from_args(args, b), b, "" if b is None else f"b={b}") for b in sizes or [None]]
    if model:
        if not budget:  # a cluster plan without a limit would rank what no GPU holds: the GPU's memory is it
            budget = replace(budget, memory_limit=hardware_from_args(args).gpu.memory)
            warn(f"plan: no --memory-limit given; planning for the GPU's memory, {fmt_bytes(budget.memory_limit)} "
                 "per rank")
        if (args.layer_recompute or "none") != "none" and recompute == "auto":
            recompute = "off"  # the layers already recompute; a stage's R would re-run them again
    modes = recompute_modes(recompute, budget)
    bar = Progress("plan", sum(search_size(names, counts, vs, modes) for counts in counts_of))
    try:
        several = len(variants) > 1
        result = plan(args.ranks, None if several and args.global_batch is not None else counts_of[0],
                      costs=variants if several else variants[0].costs, chunks=vs, schedules=names,
                      max_activations=budget.max_activations, memory_limit=budget.memory_limit,
                      recompute=recompute, microbatch_size=None if several else variants[0].microbatch_size,
                      progress=bar, step_barrier=args.step_barrier,
                      global_batch=args.global_batch if several else None, processes=args.processes)
    finally:
        bar.close()
    winner = result.best
    best = winner.result.schedule
    if args.output:
        fileformat.save(best, args.output)
    if args.plot:
        from ..plots.timeline import plot_timeline
        from pipesched.simulator.api import simulate
        plot_timeline(simulate(best, winner.costs, engine=engine_for(winner.costs)), args.plot)
    if args.json:
        print(json_text({**result.to_dict(), "output": args.output}))
        return 0
    show_table(args, result)
    return 0


def parse_sizes(text: str | None) -> list[int] | None:
    """--microbatch-size: one size or a list (sorted, distinct); None when not given."""
    if text is None:
        return None
    return parse_counts(text, "--microbatch-size", "1,2,4")


def show_table(args: argparse.Namespace, result: Plan) -> None:
    """The ranking, the Pareto front, what fits only recomputing, the winner and how to
    run it. Memory in bytes when the costs give any, else in microbatches of activations."""
    found, fitting, budget, samples, best = result.candidates, result.fitting, result.budget, \
        result.microbatch_size, result.best
    bytes_given = any(c.result.peak_bytes > 0 for c in fitting)
    sized = len({c.variant for c in found}) > 1  # several microbatch sizes: a column says which
    unit = "samples/s" if samples or sized else "microbatches/s"
    dropped = sum(1 for c in found if c.result and not c.result.fits)
    failed = sum(1 for c in found if not c.result)
    print(f"plan for p={result.ranks}, budget {budget.describe()}: {len(found)} candidates, {len(fitting)} fit, "
          f"{dropped} over the budget, {failed} not buildable"
          + (", each without and with recomputation" if len({c.recompute for c in found}) > 1 else ""))
    if budget.memory_limit is not None and not result.memory_modelled:
        print("memory is not modelled: no activation or parameter memory given (--activation-memory, "
              "--param-bytes, or a cost file's), so every schedule holds 0 B and --memory-limit cannot bind")
    room_in_activations = budget.max_activations is not None and not (budget.memory_limit is not None and bytes_given)
    room_head = "headroom (microbatches)" if room_in_activations else "headroom"
    room_width = max(10, len(room_head))
    periods = best.period is not None  # planned for steps without a barrier: ranked by microbatches per period
    head = (f"{'#':>3} {'schedule':<20} " + (f"{'b':>3} " if sized else "") + f"{'m':>4} {'v':>2}  {'makespan':>10}  "
            + (f"{'period':>10}  " if periods else "") + f"{unit:>14}  {'bubble':>7}  ")
    head += f"{'peak mem':>10}  " if bytes_given else ""
    head += f"{'activ.':>6}  {room_head:>{room_width}}  {'p95':>10}"
    print(head)
    for i, c in enumerate(fitting[:args.top], 1):
        r = c.result
        if budget.memory_limit is not None and bytes_given:
            room = fmt_bytes(budget.memory_limit - r.peak_bytes)
        elif budget.max_activations is not None:
            room = f"{budget.max_activations - r.peak_activations:g}"
        else:
            room = "-"
        line = (f"{i:>3} {c.label:<20} " + (f"{c.microbatch_size:>3} " if sized else "")
                + f"{c.microbatches:>4} {c.v:>2}  {fmt_seconds(r.makespan):>10}  "
                + (f"{fmt_seconds(c.period):>10}  " if periods else "")
                + f"{c.throughput(samples):>14.4g}  {100 * r.bubble:>6.2f}%  ")
        line += f"{fmt_bytes(r.peak_bytes):>10}  " if bytes_given else ""
        line += f"{r.peak_activations:>6g}  {room:>{room_width}}  {fmt_seconds(c.p95) if c.p95 else '-':>10}"
        print(line)
    if len(fitting) > args.top:
        print(f"... {len(fitting) - args.top} more (--top N, or --json for all)")

    def held(c: Candidate, what: str = " of activations") -> str:
        return fmt_bytes(c.result.peak_bytes) if bytes_given else f"{c.result.peak_activations:g} microbatches{what}"

    def where(c: Candidate) -> str:
        return (f"b={c.microbatch_size} " if sized else "") + f"m={c.microbatches} v={c.v}"

    front = dict.fromkeys(f"{c.label} {where(c)} ({c.throughput(samples):.4g} {unit}, {held(c)})"
                          for c in result.pareto)  # one entry for candidates that print alike
    print("Pareto front (throughput against peak memory): " + ", ".join(front))
    rescued = result.rescued
    if rescued:
        more = f", and {len(rescued) - RESCUES_SHOWN} more" if len(rescued) > RESCUES_SHOWN else ""
        print("fit only with recomputation (+R: every model stage recomputes its activations before its backward): "
              + ", ".join(f"{c.schedule} {where(c)} ({held(c, '')} with, {held(without, '')} without)"
                          for c, without in rescued[:RESCUES_SHOWN]) + more)
    print(f"p95: makespan of {JITTER_RUNS} runs with op times jittered by cv {JITTER_CV} (best {JITTER_TOP} only); "
          "activ.: microbatches of one pipeline stage's activations held (1F1B holds p)"
          + ("; period: seconds per step back to back without a barrier, which the throughput counts" if periods
             else ""))
    origin = f" (built from {best.origin})" if best.schedule == "zb-auto" else ""
    origin += " with recomputation" if best.recompute else ""
    size = f"microbatches of {best.microbatch_size}, " if sized else ""
    print(f"best: {best.schedule}{origin} with {size}m={best.microbatches}, v={best.v}: makespan "
          f"{fmt_seconds(best.result.makespan)}"
          + (f", period {fmt_seconds(best.period)} without a barrier" if periods else "")
          + f", peak {fmt_bytes(best.result.peak_bytes) if bytes_given else ''}"
          f"{' / ' if bytes_given else ''}{best.result.peak_activations:g} microbatches of activations")
    if args.output:
        words = " ".join(model_words(args, best.microbatch_size if sized else None) + [cost_words(args)]).strip() \
            if model_given(args) else cost_words(args)
        print(f"wrote {args.output}")
        print(f"  predict it: pipesched simulate {args.output} {words}".rstrip())
        print(f"  run it:     pipesched run {args.output}   (and pipesched validate {args.output} to compare "
              f"with the prediction)")
    if args.plot:
        print(f"wrote {args.plot}")
