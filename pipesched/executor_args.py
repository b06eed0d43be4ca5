"""Command-line options of the commands that run the executor: run, calibrate, validate.

The executor needs torch; these helpers import it only when a command runs, and turn
every problem found before launch (backend, model arguments, stage shapes) into a
one-line UsageError.
"""
from __future__ import annotations

import argparse
import math
import os

from pipesched.schedules.ir import Schedule, ScheduleError

from .errors import UsageError
from .options import SECONDS, split_counts

MIN_TIME = 1.0   # seconds of measured steps, by default
MAX_STEPS = 200  # the most steps --min-time asks for


def add_executor_args(parser: argparse.ArgumentParser) -> None:
    """--backend, the model and its sizes, and --timeout."""
    parser.add_argument("--backend", choices=("gloo", "nccl", "gloo-cuda"), default="gloo",
                        help="gloo on CPU (default), nccl with one GPU per rank, or gloo with CUDA compute "
                             "(ranks may share a GPU; tensors staged through host memory)")
    g = parser.add_argument_group("model")
    g.add_argument("--model", default="mlp", metavar="MODEL",
                   help="mlp or transformer (example blocks), hf-llama or hf-gpt2 (tiny transformers language "
                        "models, random weights; needs pipesched[hf]), or package.module:function returning a "
                        "PipelineModel for (num_stages, microbatches) (default mlp; see docs/models.md)")
    g.add_argument("--hidden", type=int,
                   help=f"hidden size (default {DEFAULT_HIDDEN['mlp']} for mlp, whose ops then take a few ms on a CPU "
                        f"core, long enough to predict well; {DEFAULT_HIDDEN['other']} for the others)")
    g.add_argument("--vocab", type=int, default=2048, help="vocabulary size, hf-* only (default 2048)")
    g.add_argument("--layers-per-stage", type=layer_counts, metavar="N|N,N,..|balanced|even",
                   help=f"blocks per model stage (default: {BLOCKS_PER_RANK} blocks per rank, so that every schedule "
                        f"runs the same network: {BLOCKS_PER_RANK} per model stage at one model stage per rank, "
                        f"{BLOCKS_PER_RANK // 2} at two, 1 beyond); a list gives each model stage its own (3,2,2,1); "
                        "balanced or even: the split of the --costs file's layers section (docs/partition.md)")
    g.add_argument("--microbatch-size", type=int,
                   help=f"samples per microbatch (default {DEFAULT_MICROBATCH['mlp']} for mlp, "
                        f"{DEFAULT_MICROBATCH['other']} for the others)")
    g.add_argument("--seq", type=int, help="sequence length, transformer and hf-* only (default 32)")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--seed", type=int, default=0, help="initialisation and data seed (default 0)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds any wait may take (default 300)")


def default_blocks(schedule: Schedule) -> int:
    """Blocks per model stage of the example and hf-* models when --layers-per-stage is not
    given: BLOCKS_PER_RANK per rank, so that `run 1f1b` and `run zb-v` run one network
    (as one calibration predicts both), or 1 where a rank's model stages outnumber them."""
    per_rank, rest = divmod(schedule.num_model_stages, schedule.ranks)
    if rest or not per_rank or BLOCKS_PER_RANK % per_rank:
        return 1
    return BLOCKS_PER_RANK // per_rank


def layer_counts(text: str) -> int | tuple[int, ...] | str:
    """--layers-per-stage: "2" (every model stage), "3,2,2,1" (each its own), or balanced/even."""
    counts = split_counts(text)
    return counts[0] if isinstance(counts, tuple) and len(counts) == 1 and "," not in text else counts


def layers_from_costs(args: argparse.Namespace, schedule: Schedule) -> tuple[int, ...]:
    """The split of the --costs file's layers for `schedule` (--layers-per-stage balanced|even)."""
    from .options import costs_from_args

    if not getattr(args, "costs", None):
        raise UsageError(f"--layers-per-stage {args.layers_per_stage} splits the layers of a cost file: give "
                         "--costs FILE with a layers section (docs/partition.md)")
    costs = costs_from_args(args)
    if costs.layers is None:
        raise UsageError(f"--layers-per-stage {args.layers_per_stage} needs a layers section in {args.costs}")
    return tuple(costs.layers.split(schedule.num_model_stages, args.layers_per_stage))


def add_measurement_args(parser: argparse.ArgumentParser, warmup: int, steps: int = 5) -> None:
    """--steps, --warmup, --recv-lookahead and --no-check."""
    r = parser.add_argument_group("measurement")
    r.add_argument("--steps", type=int, default=steps,
                   help=f"measured steps; the trace is of the step of median makespan (default {steps})")
    r.add_argument("--warmup", type=int, default=warmup, help=f"unmeasured steps first (default {warmup})")
    r.add_argument("--min-time", type=SECONDS, default=MIN_TIME, metavar="T",
                   help=f"measure at least T of steps: more than --steps when steps are short, at most "
                        f"{MAX_STEPS} (default {MIN_TIME:g}s; 0: exactly --steps)")
    r.add_argument("--recv-lookahead", type=int, default=2, metavar="UNITS",
                   help="gloo: post each receive at least this many ops ahead (default 2; -1: all at the start)")
    r.add_argument("--no-check", action="store_true", help="skip the comparison with the unpipelined model")


def run_options(args: argparse.Namespace):
    """The executor's RunOptions from the measurement flags (checked)."""
    from pipesched.executor.job import RunOptions

    if args.steps < 1 or args.warmup < 0:
        raise UsageError(f"need --steps >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    if not 0 <= args.min_time < math.inf:
        raise UsageError(f"--min-time must be finite and >= 0, got {args.min_time:g}")
    return RunOptions(steps=args.steps, warmup=args.warmup, min_time=args.min_time,
                      max_steps=max(MAX_STEPS, args.steps), timeout=args.timeout, check=not args.no_check,
                      lookahead=args.recv_lookahead, dp=replicas_of(args), bucket_bytes=bucket_of(args),
                      step_barrier=getattr(args, "step_barrier", "all"))


def replicas_of(args: argparse.Namespace) -> int:
    """--dp (default 1): the data-parallel replicas to launch; UsageError below 1."""
    dp = getattr(args, "dp", None)
    if dp is None:
        return 1
    if dp < 1:
        raise UsageError(f"--dp must be an integer >= 1 (replicas), got {dp}")
    return dp


def bucket_of(args: argparse.Namespace) -> float | None:
    bucket = getattr(args, "dp_bucket", None)
    if bucket is not None and not (0 < bucket < math.inf):
        raise UsageError(f"--dp-bucket must be > 0, got {bucket:g}")
    return bucket


def import_executor(command: str) -> None:
    """UsageError unless torch (and so the executor) can be imported. Long commands
    report progress on stderr from here on (`executor.progress`)."""
    try:
        import pipesched.executor.job  # noqa: F401
        from pipesched.executor import progress
    except ImportError as exc:
        raise UsageError(f"{command} needs torch (pip install 'pipesched[torch]'): {exc}") from None
    os.environ[progress.ENV] = "1"


EXAMPLES = ("mlp", "transformer")
BLOCKS_PER_RANK = 2  # the example models' default depth: blocks per rank (see default_blocks)
# the default MLP's ops take ~4 ms on one core of the project's 2-core machine: ops much
# shorter are within a few times the runtime's own time per op (docs/accuracy.md)
DEFAULT_HIDDEN = {"mlp": 512, "other": 128}
DEFAULT_OP_TIMES = "auto"
DEFAULT_MICROBATCH = {"mlp": 32, "other": 8}


def model_from_args(args: argparse.Namespace, schedule: Schedule):
    """The model the flags describe for `schedule`: an ExampleModel (built in the ranks),
    or a PipelineModel (a preset or the user's function, built here)."""
    from pipesched.executor.hf_models import HF_PRESETS, HFModel
    from pipesched.executor.launch import available_memory, under_torchrun
    from pipesched.executor.models import ExampleModel, ModelError

    from .user_model import build_user_model, guarded, is_spec

    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.seq is not None and (args.model == "mlp" or is_spec(args.model)):
        raise UsageError(f"--seq is the sequence length of the transformer and hf-* models; --model {args.model} "
                         "has none")
    seq = 32 if args.seq is None else args.seq
    kind = "mlp" if args.model == "mlp" else "other"
    if args.hidden is None:
        args.hidden = DEFAULT_HIDDEN[kind]
    if args.microbatch_size is None:
        args.microbatch_size = DEFAULT_MICROBATCH[kind]
    microbatches = schedule.microbatches * replicas_of(args)  # the global batch, split across the replicas
    if is_spec(args.model) and args.layers_per_stage is not None:
        raise UsageError(f"--layers-per-stage sizes the example and hf-* models; --model {args.model} builds its "
                         "own stages, so it would do nothing")
    if args.layers_per_stage is None:
        args.layers_per_stage = default_blocks(schedule)
    if isinstance(args.layers_per_stage, str):
        args.layers_per_stage = layers_from_costs(args, schedule)
    if isinstance(args.layers_per_stage, tuple) and len(args.layers_per_stage) != schedule.num_model_stages:
        raise UsageError(f"--layers-per-stage gives {len(args.layers_per_stage)} model stages, the schedule has "
                         f"{schedule.num_model_stages}")
    if is_spec(args.model):
        return build_user_model(args.model, schedule.num_model_stages, microbatches, args.timeout)
    if args.model in EXAMPLES:
        return ExampleModel(args.model, args.hidden, args.layers_per_stage, args.microbatch_size, seq,
                            args.dtype, args.seed)
    if args.model in HF_PRESETS:
        spec = HFModel(args.model, args.hidden, args.layers_per_stage, args.microbatch_size, seq, args.vocab,
                       args.dtype, args.seed)
        try:
            spec.check().check_fits(schedule.num_model_stages, microbatches, rank_copies(schedule, replicas_of(args)),
                                    None if under_torchrun() else available_memory())
            return guarded(spec.build, schedule.num_model_stages, microbatches, what=f"building {args.model}",
                           timeout=args.timeout, ours=(ModelError, UsageError))
        except ModelError as exc:
            raise UsageError(str(exc)) from None
    raise UsageError(f"unknown --model {args.model!r}; use {', '.join(EXAMPLES + HF_PRESETS)} or "
                     "package.module:function")


def model_label(args: argparse.Namespace) -> str | None:
    """How messages name a user's --model function ("--model pkg.mod:fn"); None for the
    built-in models."""
    from .user_model import is_spec
    return f"--model {args.model}" if is_spec(args.model) else None


def rank_copies(schedule: Schedule, replicas: int = 1) -> float:
    """Copies of the whole model the local ranks hold: each virtual stage holds its model
    stage's share (DualPipe's two replicas hold it twice), times the replicas."""
    return replicas * len(schedule.stages) / max(1, schedule.num_model_stages)


def check_launchable_ranks(ranks: int | None, replicas: int = 1) -> None:
    """UsageError at once when -p (times --dp) asks for more local ranks than this host can
    start (before the schedule or any model stage is built); nothing to check under torchrun."""
    from pipesched.executor.launch import check_launchable, under_torchrun

    if ranks is None or ranks < 1 or under_torchrun():
        return
    try:
        check_launchable(ranks * replicas)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def prepare_checked(schedule: Schedule, model, backend: str, replicas: int = 1, timeout: float | None = None,
                    label: str | None = None):
    """`executor.job.prepare` with every problem as one line: the schedule's own error,
    else a UsageError. The model check runs the model's own code (`user_model.guarded`):
    `timeout` seconds cut a hang, a signal stops it at once, and anything but a ValueError
    from it is one line naming `label` (e.g. "--model pkg.mod:fn"). Returns the
    validated task graph."""
    from pipesched.executor.job import prepare
    from pipesched.executor.launch import under_torchrun

    from .user_model import guarded

    if under_torchrun() and int(os.environ["WORLD_SIZE"]) != schedule.ranks * replicas:
        raise UsageError(f"torchrun started {os.environ['WORLD_SIZE']} ranks, the schedule has {schedule.ranks}"
                         + (f" x {replicas} replicas" if replicas > 1 else ""))
    where = f"{label}: the model check" if label else "the model check"
    try:
        return guarded(prepare, schedule, model, backend, replicas, what=where, timeout=timeout, ours=(ValueError,))
    except ValueError as exc:
        if isinstance(exc, (ScheduleError, UsageError)):
            raise
        raise UsageError(f"{label}: {exc}" if label else str(exc)) from None

def add_calibration_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("calibration")
    g.add_argument("--repeats", type=int, default=15, help="measured repetitions per op and message size (default 15)")
    g.add_argument("--calibration-warmup", type=int, default=3, metavar="N",
                   help="unmeasured repetitions first (default 3)")
    g.add_argument("--op-times", choices=("auto", "runs", "solo"), default=DEFAULT_OP_TIMES,
                   help="runs: op times from short runs of 1F1B and ZB-H1 (interleaved 1F1B and ZB-V for v = 2) "
                        "on the same model, so under a pipeline's concurrency; solo: each op profiled with "
                        "the other ranks idle; auto (default): runs on CPUs, solo on GPUs "
                        "(docs/accuracy.md compares them)")


def calibration_options(args: argparse.Namespace):
    from pipesched.executor.calibrate import CalibrationOptions

    if args.repeats < 1 or args.calibration_warmup < 0:
        raise UsageError(f"need --repeats >= 1 and --calibration-warmup >= 0, "
                         f"got {args.repeats} and {args.calibration_warmup}")
    return CalibrationOptions(repeats=args.repeats, warmup=args.calibration_warmup, timeout=args.timeout,
                              from_runs=None if args.op_times == "auto" else args.op_times == "runs")
