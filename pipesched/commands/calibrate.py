"""`pipesched calibrate`: measure a model's cost file on this machine.

The ranks are launched as `pipesched run` would launch them (same backend, devices and
threads); each profiles the model stages it holds under the schedule, then the rank
pairs the schedule sends between play ping-pong. The result is a `pipesched.costs/1`
file that `pipesched simulate --costs` reads.
"""
from __future__ import annotations

import argparse
import sys

from pipesched.simulator.cost_file import save, to_dict

from ..errors import UsageError
from ..executor_args import (add_calibration_args, add_executor_args, bucket_of, calibration_options,
                             check_launchable_ranks, import_executor, model_from_args, model_label, prepare_checked,
                             replicas_of)
from ..options import add_schedule_args, schedule_from_args
from ..formatting import fmt_seconds, json_text
from ..tables import print_costs
from ..terminal import check_outputs, wrote


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="profile a model's stages and links here and write a cost file")
    add_schedule_args(p)
    add_executor_args(p)
    add_calibration_args(p)
    p.add_argument("-o", "--output", metavar="COSTS.json", required=True, help="write the cost file here")
    p.add_argument("--json", action="store_true", help="print the cost file instead of a table")
    p.add_argument("--per-layer", action="store_true",
                   help="also time every layer on its own and write the model layer by layer (a layers section "
                        "that simulate --partition can re-split; docs/partition.md)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_outputs({"-o": args.output}, {"SCHEDULE": args.schedule})
    import_executor("calibrate")
    from pipesched.executor.calibrate import calibrate
    from pipesched.executor.comm import ExecutorError
    from pipesched.executor.launch import under_torchrun

    replicas, bucket = replicas_of(args), bucket_of(args)
    check_launchable_ranks(args.ranks, replicas)
    schedule = schedule_from_args(args)
    model = model_from_args(args, schedule)
    prepare_checked(schedule, model, args.backend, replicas, args.timeout, model_label(args))
    if replicas > 1 and under_torchrun():
        raise UsageError("calibrate --dp launches its own ranks twice; run it without torchrun")
    try:
        if replicas > 1:
            from pipesched.executor.dp_calibrate import calibrate_data_parallel
            costs, _ = calibrate_data_parallel(schedule, model, replicas, calibration_options(args), args.backend,
                                               bucket)
        else:
            costs = calibrate(schedule, model, calibration_options(args), args.backend)
    except ExecutorError as exc:
        print(f"pipesched: error: {exc}", file=sys.stderr)
        return exc.exit_status
    if costs is None:  # a rank other than 0 under torchrun
        return 0
    if args.per_layer:
        costs = measured_layers(costs, model, schedule, args)
    save(costs, args.output)
    if args.json:
        print(json_text(to_dict(costs)))
    else:
        print_costs(costs)
        if costs.layers is not None:
            print_layers(costs)
    wrote(args.output, to_stderr=args.json)
    return 0


def measured_layers(costs, model, schedule, args):
    """The calibrated costs with every layer timed on its own here (with the ranks' threads)."""
    from pipesched.executor.layer_profile import with_measured_layers
    from pipesched.executor.models import ExampleModel

    built = model.build(schedule.num_model_stages, schedule.microbatches) if isinstance(model, ExampleModel) else model
    threads = costs.meta.get("calibrated", {}).get("threads_per_rank")
    return with_measured_layers(costs, built, threads, args.repeats, args.calibration_warmup)


def print_layers(costs) -> None:
    """Per model stage: the sum of its layers' F+B+W against the stage timed whole."""
    layers = costs.layers
    counts = list(layers.partition)
    summed = layers.stage_costs(counts)
    whole = costs.meta.get("per_stage_measured", [])
    print(f"layers: {len(layers.layers)} timed one by one"
          f"{', embedding' if layers.embedding else ''}{', head + loss' if layers.head else ''} (the table above "
          "sums them); per model stage F+B+W, the sum of its layers against the stage timed whole:")
    for k, s in enumerate(summed):
        mine = s.forward + s.backward_input + s.backward_weight
        line = f"  stage {k} ({counts[k]} layers): {fmt_seconds(mine)}"
        if k < len(whole):
            w = whole[k]
            total = w["forward"] + w["backward_input"] + w["backward_weight"]
            line += f" vs {fmt_seconds(total)} ({100 * (mine / total - 1):+.1f} %)"
        print(line)
