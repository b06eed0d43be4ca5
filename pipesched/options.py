"""Command-line options shared by several commands: which schedule, which costs."""
from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

from pipesched.schedules import fileformat, torch_format
from pipesched.schedules.ir import Schedule
from pipesched.schedules.registry import BUILDERS, build, check_known, check_size
from pipesched.simulator import cost_file as cost_files
from pipesched.simulator.costs import CostModel, HostSharing, Link, Network, StageCost
from pipesched.simulator.units import UnitError, parse_bandwidth, parse_bytes, parse_seconds

from pipesched.simulator.budget import Budget, build_within, check_fits, with_recompute
from .dp_options import add_dp_args, apply_dp_args
from .errors import UsageError


def _argtype(parse, name: str):
    """An argparse type from a unit parser: a bad value is one line naming the option."""
    def convert(text: str) -> float:
        try:
            return parse(text)
        except UnitError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = name  # argparse names the type in its message
    return convert


SECONDS = _argtype(parse_seconds, "time")
BYTES = _argtype(parse_bytes, "size")
BANDWIDTH = _argtype(parse_bandwidth, "bandwidth")



SCHEDULE_HELP = ("a built-in name (see `pipesched list`), a schedule file (.json), "
                 "a torch CSV dump (.csv) or torch:NAME")


def add_schedule_args(parser: argparse.ArgumentParser, metavar: str = "SCHEDULE|FILE",
                      help: str = SCHEDULE_HELP, costs: bool = True) -> None:
    """The schedule positional (stored as `schedule`), -p/-m/-v and (with `costs`) the
    memory budget and cost options, so that every command builds the same order."""
    parser.add_argument("schedule", metavar=metavar, help=help)
    parser.add_argument("-p", "--ranks", type=int, help="pipeline ranks")
    parser.add_argument("-m", "--microbatches", type=int, help="microbatches per step")
    parser.add_argument("-v", "--chunks", type=int, help="chunks (virtual stages) per rank")
    add_recompute_arg(parser)
    if costs:
        add_budget_args(parser)
        add_cost_args(parser)


def add_recompute_arg(parser: argparse.ArgumentParser, search: bool = False, default: str = "off") -> None:
    """--recompute: every model stage recomputes its activations (an R op before each
    backward); with `search` (sweep, plan) the schedules are tried both without and with."""
    if search:
        choices = ("auto", "off", "on", "both") if default == "auto" else ("off", "on", "both")
        default_help = "auto: both under a memory budget, else off" if default == "auto" else default
        parser.add_argument("--recompute", choices=choices, default=default,
                            help=f"recompute activations of every model stage: off, on, or both to compare "
                                 f"(default {default_help})")
        return
    parser.add_argument("--recompute", action="store_true",
                        help="recompute activations: F keeps only its stage input, an R op re-runs it right before "
                             "each backward (every model stage; a cost file can mark single stages)")


def add_step_args(parser: argparse.ArgumentParser, steps: bool = True) -> None:
    """--step-barrier (and with `steps`, --steps K): training steps back to back
    (`simulator.steps`), with a barrier between them or none."""
    from pipesched.simulator.steps import MAX_STEPS

    if steps:
        parser.add_argument("--steps", type=int, default=1, metavar="K",
                            help=f"simulate K steps back to back (1..{MAX_STEPS}, default 1); prints the "
                                 "steady-state period and throughput")
    parser.add_argument("--step-barrier", choices=("all", "none"), default="all",
                        help="between steps: all (default: every rank finishes a step before any starts the next) "
                             "or none (a rank starts the next step once its own ops and optimizer step are done); "
                             "none reports the period (seconds per step) and throughput")


def check_step_args(args: argparse.Namespace) -> None:
    """UsageError for --steps outside 1..MAX_STEPS."""
    from pipesched.simulator.steps import MAX_STEPS

    steps = getattr(args, "steps", 1)
    if not 1 <= steps <= MAX_STEPS:
        raise UsageError(f"--steps must be between 1 and {MAX_STEPS}, got {steps}")


def add_budget_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("memory budget per rank (zb-auto builds under it; other schedules must fit)")
    g.add_argument("--max-activations", type=float, metavar="N",
                   help="microbatches of one pipeline stage's activations a rank may hold (1F1B holds p)")
    g.add_argument("--memory-limit", type=BYTES, metavar="SIZE",
                   help="bytes a rank may hold under the cost model (e.g. 40GiB)")


def budget_from_args(args: argparse.Namespace) -> Budget:
    n = getattr(args, "max_activations", None)
    if n is not None and not (math.isfinite(n) and n >= 1):
        raise UsageError(f"--max-activations must be a number >= 1 (microbatches), got {n:g}")
    limit = getattr(args, "memory_limit", None)
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise UsageError(f"--memory-limit must be a size > 0 (e.g. 40GiB), got {limit:g} bytes")
    return Budget(n, limit)


def cost_flags_given(args: argparse.Namespace) -> bool:
    """Whether any cost option was given (else builders use unit op times)."""
    return any(getattr(args, name, None) not in (None, False) for name in COST_DESTS)


def load_schedule(spec: str, ranks: int | None, microbatches: int | None, chunks: int | None,
                  costs: CostModel | None = None, budget: Budget = Budget(), recompute: bool = False,
                  builtins: list[Schedule] | None = None, seen: dict | None = None,
                  step_barrier: str = "all") -> Schedule:
    """A schedule from a name, torch:NAME, a schedule file or a torch CSV. Built-in
    schedules that adapt to costs are built for `costs`' op durations; zb-auto searches
    under `budget` and any other schedule must fit it (BudgetError). `recompute`: every
    model stage recomputes (R ops added, `schedules.recompute`); without it the stages
    `costs` mark recompute do. `builtins` and `seen`: built-ins already built and
    evaluated, for zb-auto (`simulator.budget.build_within`); `step_barrier` "none": zb-auto
    minimizes the period of steps back to back. A built-in name wins over a file or
    folder of that name in the working directory (say ./NAME for the file)."""
    path = Path(spec)
    builtin = spec in BUILDERS
    if path.is_dir() and not builtin:
        raise UsageError(f"schedule {spec!r} is a directory; give a built-in name or a schedule file")
    if not builtin and (spec.endswith((".json", ".csv")) or (path.exists() and path.is_file())):
        try:
            schedule = torch_format.read_csv(path) if spec.endswith(".csv") else fileformat.load(path)
        except UnicodeDecodeError as exc:  # the CSV reader lets it through
            raise UsageError(f"{spec!r} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
        for flag, asked, have in (("-p", ranks, schedule.ranks), ("-m", microbatches, schedule.microbatches)):
            if asked is not None and asked != have:
                raise UsageError(f"{spec} has {have} for {flag}, but {flag} {asked} was given")
        if chunks is not None:
            raise UsageError(f"-v does not apply to a schedule file: {spec}'s virtual stages are in the file")
        schedule = with_recompute(schedule, costs, recompute)
        check_fits(schedule, costs, budget)
        return schedule
    if not builtin and not spec.startswith("torch:"):
        check_known(spec)  # a misspelt name is said as such before the missing -p/-m
    if ranks is None or microbatches is None:
        raise UsageError(f"schedule {spec!r} needs -p RANKS and -m MICROBATCHES")
    if spec.startswith("torch:"):
        try:
            from pipesched.executor.torch_schedules import torch_schedule
        except ImportError as exc:
            raise UsageError(f"{spec} needs torch (pip install 'pipesched[torch]'): {exc}") from None
        if ranks > 0 and microbatches > 0 and (chunks or 2) > 0:
            check_size(spec, 3 * ranks * microbatches * (chunks or 2))  # torch's have at most 2 chunks unless -v
        schedule = with_recompute(torch_schedule(spec[len("torch:"):], ranks, microbatches, chunks), costs, recompute)
        check_fits(schedule, costs, budget)
        return schedule
    if costs is None and not budget:
        return with_recompute(build(spec, ranks, microbatches, chunks, step_barrier=step_barrier), None, recompute)
    return build_within(spec, ranks, microbatches, chunks, costs or CostModel(), budget, builtins, seen,
                        recompute=recompute, step_barrier=step_barrier)


def schedule_from_args(args: argparse.Namespace, costs: CostModel | None = None) -> Schedule:
    """The schedule the arguments name, built for `costs` or (when None) for the cost
    options given, so every command orders a built-in the way `simulate` does (zb-auto
    for the period where the command runs steps without a barrier, --step-barrier none)."""
    if costs is None and cost_flags_given(args):
        costs = costs_from_args(args)
    return load_schedule(args.schedule, args.ranks, args.microbatches, args.chunks, costs, budget_from_args(args),
                         recompute=getattr(args, "recompute", False) is True,
                         step_barrier=getattr(args, "step_barrier", "all"))


def _overlap(text: str) -> float:
    words = {"serial": 0.0, "perfect": 1.0}
    if text in words:
        return words[text]
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected serial, perfect or a number in [0, 1], got {text!r}") from None


COST_DESTS = ("costs", "f", "b", "w", "latency", "bandwidth", "activation_bytes", "activation_memory",
              "weight_memory", "param_bytes", "ranks_per_node", "inter_latency", "inter_bandwidth", "overlap",
              "op_overhead", "no_contention", "shared_compute", "rank_demand", "wait_demand", "blocking_sends",
              "partition")


def add_cost_args(parser: argparse.ArgumentParser) -> None:
    """The cost options (times take 12ms, 1.5us, ...; sizes 128MiB, 40GiB; bandwidths
    50GB/s; plain numbers are seconds, bytes, bytes/s)."""
    g = parser.add_argument_group("costs (per pipeline stage: one rank's share of the model)")
    g.add_argument("--costs", metavar="FILE", help="cost file (JSON or TOML, pipesched.costs/1)")
    g.add_argument("--f", type=SECONDS, metavar="T", help="forward time per microbatch, e.g. 12ms (default 1 s)")
    g.add_argument("--b", type=SECONDS, metavar="T", help="input-backward time per microbatch (default 1 s)")
    g.add_argument("--w", type=SECONDS, metavar="T", help="weight-backward time per microbatch (default 1 s)")
    g.add_argument("--latency", type=SECONDS, metavar="T", help="point-to-point latency, e.g. 5us")
    g.add_argument("--bandwidth", type=BANDWIDTH, metavar="RATE", help="point-to-point bandwidth, e.g. 50GB/s")
    g.add_argument("--activation-bytes", type=BYTES, metavar="SIZE",
                   help="bytes sent per microbatch at each stage boundary, e.g. 128MiB")
    g.add_argument("--activation-memory", type=BYTES, metavar="SIZE",
                   help="bytes a forward stores per microbatch until its backward")
    g.add_argument("--weight-memory", type=BYTES, metavar="SIZE", help="part of it kept from B until W")
    g.add_argument("--param-bytes", type=BYTES, metavar="SIZE", help="parameter (+grad, optimizer) bytes per stage")
    g.add_argument("--ranks-per-node", type=int, metavar="N", help="ranks per node (default: all on one)")
    g.add_argument("--inter-latency", type=SECONDS, metavar="T", help="latency between nodes")
    g.add_argument("--inter-bandwidth", type=BANDWIDTH, metavar="RATE", help="bandwidth between nodes")
    g.add_argument("--overlap", type=_overlap, metavar="X", help="overlapped pairs: serial, perfect or 0..1")
    g.add_argument("--op-overhead", type=SECONDS, metavar="T", help="time added to every op")
    g.add_argument("--no-contention", action="store_true", help="links carry transfers concurrently")
    g.add_argument("--shared-compute", type=float, metavar="C",
                   help="ranks share C processors (cores; 1 for one GPU), processor sharing")
    g.add_argument("--rank-demand", type=float, metavar="T", help="cores a computing rank uses (default 1)")
    g.add_argument("--wait-demand", type=float, metavar="W", help="cores a rank uses while it waits (default 0)")
    g.add_argument("--blocking-sends", action="store_true", help="ranks wait for their sends to finish")
    add_dp_args(parser, BANDWIDTH, SECONDS, BYTES)
    g.add_argument("--partition", type=split_counts, metavar="HOW",
                   help="with a cost file's layers section: place the layers on model stages balanced (the "
                        "slowest stage as fast as it can be; default), even (by count) or as given, e.g. 3,2,2,1")


def split_counts(text: str) -> str | tuple[int, ...]:
    """A split of layers over model stages as typed: balanced, even or counts such as
    3,2,2,1 (integers >= 0); argparse's error otherwise."""
    if text in ("balanced", "even"):
        return text
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"expected balanced, even or layers per model stage such as 3,2,2,1 "
                                         f"(a block count for every stage), got {text!r}")
    return counts


def costs_from_args(args: argparse.Namespace, base: CostModel | None = None) -> CostModel:
    """The cost file (if any; `base` instead, e.g. estimated costs) with every given
    flag applied on top."""
    times = {"forward": args.f, "backward_input": args.b, "backward_weight": args.w}
    if args.costs and any(v is not None for v in times.values()):
        raise UsageError("give op times either with --f/--b/--w or in --costs FILE, not both")
    model = base if base is not None else load_costs(args.costs) if args.costs else CostModel()
    stage_over = {k: v for k, v in times.items() if v is not None}
    for flag, name in (("activation_bytes", "activation_bytes"), ("activation_memory", "activation_memory"),
                       ("weight_memory", "weight_memory"), ("param_bytes", "param_bytes")):
        if getattr(args, flag) is not None:
            stage_over[name] = getattr(args, flag)
    model = _apply_partition(model, getattr(args, "partition", None), stage_over)
    if stage_over:
        model = replace(model, stages=tuple(replace(s, **stage_over) for s in model.stages),
                        model_stages=None if model.model_stages is None else
                        tuple(replace(s, **stage_over) for s in model.model_stages))
    net = model.network
    intra = Link(net.intra.latency if args.latency is None else args.latency,
                 net.intra.bandwidth if args.bandwidth is None else args.bandwidth)
    inter = net.inter
    if args.inter_latency is not None or args.inter_bandwidth is not None:
        base = inter or intra
        inter = Link(base.latency if args.inter_latency is None else args.inter_latency,
                     base.bandwidth if args.inter_bandwidth is None else args.inter_bandwidth)
    network = Network(intra, inter, net.ranks_per_node if args.ranks_per_node is None else args.ranks_per_node)
    host = model.host
    if args.shared_compute is not None:
        host = HostSharing(args.shared_compute)
    if host is not None and (args.rank_demand is not None or args.wait_demand is not None):
        host = replace(host, **{k: v for k, v in (("compute_demand", args.rank_demand),
                                                   ("wait_demand", args.wait_demand)) if v is not None})
    elif args.rank_demand is not None or args.wait_demand is not None:
        raise UsageError("--rank-demand and --wait-demand need --shared-compute (or host in the cost file)")
    model = replace(model, network=network, host=host,
                    overlap=model.overlap if args.overlap is None else args.overlap,
                    op_overhead=model.op_overhead if args.op_overhead is None else args.op_overhead,
                    contention=model.contention and not args.no_contention,
                    blocking_sends=model.blocking_sends or args.blocking_sends)
    model = apply_dp_args(args, model).check()
    computing = (*model.stages, *(model.model_stages or ())) if model.layers is None else \
        (*model.layers.layers, *(p for p in (model.layers.embedding, model.layers.head) if p is not None))
    if not any(_computes(s) for s in computing) and not model.op_overhead:
        raise UsageError("every op takes 0 s, so there is no timeline to predict; "
                         "give --f, --b or --w (or the cost file's times) > 0")
    return model


def _apply_partition(model: CostModel, partition, stage_over: dict) -> CostModel:
    """`model` with its layers split as --partition says; UsageError where --partition has
    no layers to split or per-stage flags would be silently ignored by them."""
    if model.layers is None:
        if partition is not None:
            raise UsageError("--partition needs a cost file with a layers section (see docs/partition.md)")
        return model
    if stage_over:
        raise UsageError("the cost file states the model layer by layer; give activation and memory sizes "
                         "in its layers section, not as --activation-bytes/--*-memory/--param-bytes")
    if partition is None:
        return model
    from pipesched.simulator.layers import with_partition
    return replace(model, layers=with_partition(model.layers, partition))


def _computes(stage: StageCost) -> bool:
    return any(stage.op_time(op) > 0 for op in ("F", "B", "W", "BW"))


def load_costs(path: str) -> CostModel:
    """A cost file; UsageError for files that are not text or nest absurdly deep, which
    the cost-file reader does not catch itself."""
    try:
        return cost_files.load(path)
    except UnicodeDecodeError as exc:
        raise UsageError(f"cost file {path!r} is not UTF-8 text (JSON or TOML): {exc.reason} at byte {exc.start}") from None
    except RecursionError:
        raise UsageError(f"cost file {path!r} is not a cost file: it nests too deeply") from None


def parse_counts(text: str, flag: str = "--microbatches", example: str = "4,8,16") -> list[int]:
    """"4,8,16" -> [4, 8, 16]; UsageError unless every item is an integer >= 1."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts:
        raise UsageError(f"{flag} needs comma-separated integers >= 1 (e.g. {example}), got {text!r}")
    if min(counts) < 1:
        if flag != "--microbatches":
            raise UsageError(f"{flag} must be >= 1, got {min(counts)}")
        raise UsageError(f"{flag} needs comma-separated integers >= 1 (e.g. {example}), got {text!r}")
    return sorted(set(counts))
