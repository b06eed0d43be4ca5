"""`pipesched calibrate`: measure a model's cost file on this machine.

The ranks are launched as `pipesched run` would launch them (same backend, devices and
threads); each profiles the model stages it holds under the schedule, then the rank
pairs the schedule sends between play ping-pong. The result is a `pipesched.costs/1`
file that `pipesched simulate --costs` reads.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from pipesched.simulator.costs import CostModel, to_dict

from ..errors import UsageError
from ..executor_args import add_executor_args, check_writable, import_executor, model_from_args, prepare_checked
from ..options import add_schedule_args, fmt_bytes, fmt_seconds, schedule_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="profile a model's stages and links here and write a cost file")
    add_schedule_args(p)
    add_executor_args(p)
    add_calibration_args(p)
    p.add_argument("-o", "--output", metavar="COSTS.json", required=True, help="write the cost file here")
    p.add_argument("--json", action="store_true", help="print the cost file instead of a table")
    p.set_defaults(handler=run)


def add_calibration_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("calibration")
    g.add_argument("--repeats", type=int, default=15, help="measured repetitions per op and message size (default 15)")
    g.add_argument("--calibration-warmup", type=int, default=3, metavar="N",
                   help="unmeasured repetitions first (default 3)")


def calibration_options(args: argparse.Namespace):
    from pipesched.executor.calibrate import CalibrationOptions

    if args.repeats < 1 or args.calibration_warmup < 0:
        raise UsageError(f"need --repeats >= 1 and --calibration-warmup >= 0, "
                         f"got {args.repeats} and {args.calibration_warmup}")
    return CalibrationOptions(repeats=args.repeats, warmup=args.calibration_warmup, timeout=args.timeout)


def run(args: argparse.Namespace) -> int:
    import_executor("calibrate")
    from pipesched.executor.calibrate import calibrate
    from pipesched.executor.comm import ExecutorError

    check_writable(args.output)
    schedule = schedule_from_args(args)
    model = model_from_args(args, schedule)
    prepare_checked(schedule, model, args.backend)
    try:
        costs = calibrate(schedule, model, calibration_options(args), args.backend)
    except ExecutorError as exc:
        print(f"pipesched: error: {exc}", file=sys.stderr)
        return 1
    if costs is None:  # a rank other than 0 under torchrun
        return 0
    doc = to_dict(costs)
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_costs(costs)
        print(f"wrote {args.output}")
    return 0


def print_costs(costs: CostModel) -> None:
    """A table of calibrated costs: per model stage, the links, shared compute."""
    print(f"{'stage':>5}  {'T_F':>9}  {'T_B':>9}  {'T_W':>9}  {'T_BW':>9}  {'sends':>10}  {'saved per F':>11}  "
          f"{'kept B->W':>10}  {'parameters':>10}")
    for k, s in enumerate(costs.model_stages or costs.stages):
        print(f"{k:>5}  {fmt_seconds(s.forward):>9}  {fmt_seconds(s.backward_input):>9}  "
              f"{fmt_seconds(s.backward_weight):>9}  {fmt_seconds(s.op_time('BW')):>9}  "
              f"{fmt_bytes(s.activation_bytes):>10}  {fmt_bytes(s.activation_memory):>11}  "
              f"{fmt_bytes(s.weight_memory):>10}  {fmt_bytes(s.param_bytes):>10}")
    net = costs.network
    for name, link in (("link", net.intra), ("inter-node link", net.inter)):
        if link is not None:
            bw = "unlimited" if math.isinf(link.bandwidth) else f"{link.bandwidth / 1e9:.3g} GB/s"
            print(f"{name}: latency {fmt_seconds(link.latency)}, bandwidth {bw}")
    o = costs.host_overhead
    if o.any:
        print(f"runtime host time: {fmt_seconds(o.per_op)} per op, {fmt_seconds(o.per_send)} to post a send "
              f"(its data leaves after {fmt_seconds(o.send_leaves)}), {fmt_seconds(o.per_recv)} to post a receive, "
              f"{fmt_seconds(o.per_take)} to take one")
    if costs.host is not None and costs.host.gpu:
        print(f"one host: {costs.host.capacity:g} GPUs time-sliced between the ranks' ops; host time per rank")
    elif costs.host is not None:
        h = costs.host
        shared = f"; ranks pinned round-robin, {100 * h.switching:.1f} % below a fair share of a shared core" \
            if h.pinned else ""
        print(f"one host: {h.capacity:g} cores, {h.compute_demand:g} threads per rank; compute "
              f"{100 * h.interference:.1f} % slower with every core busy{shared}")
