"""Command-line options of data parallelism: replicas, their all-reduce link and the optimizer.

Added to the cost options of every command that builds a schedule, so `--dp D` means
the same on `simulate`, `sweep`, `plan` (the predicted step) and `run`, `calibrate`,
`validate` (as many replicas launched). See docs/data_parallel.md.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from pipesched.simulator.costs import CostError, CostModel

from .errors import UsageError


def add_dp_args(parser: argparse.ArgumentParser, bandwidth, seconds, size) -> None:
    """--dp, --dp-bandwidth, --dp-latency, --dp-bucket, --optimizer-time, --weight-grad-bytes
    (bandwidth, seconds, size: the argparse types that read units)."""
    g = parser.add_argument_group("data parallelism (the step's tail: gradient all-reduce, optimizer step)")
    g.add_argument("--dp", type=int, metavar="D", help="data-parallel replicas of the pipeline (default 1)")
    g.add_argument("--dp-bandwidth", type=bandwidth, metavar="RATE",
                   help="each rank's all-reduce bandwidth, e.g. 25GB/s (default infinite)")
    g.add_argument("--dp-latency", type=seconds, metavar="T", help="all-reduce latency per ring step, e.g. 10us")
    g.add_argument("--dp-bucket", type=size, metavar="SIZE",
                   help="all-reduce a stage's gradients in buckets of at most SIZE, e.g. 25MiB (default: one)")
    g.add_argument("--optimizer-time", type=seconds, metavar="T",
                   help="optimizer step per pipeline stage, once per step, e.g. 3ms (default 0)")
    g.add_argument("--weight-grad-bytes", type=size, metavar="SIZE",
                   help="weight-gradient bytes per pipeline stage to all-reduce (default: --param-bytes)")


DP_DESTS = ("dp", "dp_bandwidth", "dp_latency", "dp_bucket", "optimizer_time", "weight_grad_bytes")


def apply_dp_args(args: argparse.Namespace, model: CostModel) -> CostModel:
    """`model` with the data-parallel flags given applied over the cost file's; UsageError
    naming the flag for a bad value."""
    dp = model.data_parallel
    if getattr(args, "dp", None) is not None and args.dp < 1:
        raise UsageError(f"--dp must be an integer >= 1 (replicas), got {args.dp}")
    for flag, dest, ok in (("--dp-bandwidth", "dp_bandwidth", lambda x: x > 0),
                           ("--dp-latency", "dp_latency", lambda x: 0 <= x < float("inf")),
                           ("--dp-bucket", "dp_bucket", lambda x: 0 < x < float("inf")),
                           ("--optimizer-time", "optimizer_time", lambda x: 0 <= x < float("inf")),
                           ("--weight-grad-bytes", "weight_grad_bytes", lambda x: 0 <= x < float("inf"))):
        value = getattr(args, dest, None)
        if value is not None and not ok(value):
            raise UsageError(f"{flag} must be {'> 0' if dest in ('dp_bandwidth', 'dp_bucket') else 'finite and >= 0'}, "
                             f"got {value:g}")
    given = {k: v for k, v in (("degree", getattr(args, "dp", None)), ("bandwidth", getattr(args, "dp_bandwidth", None)),
                               ("latency", getattr(args, "dp_latency", None)),
                               ("bucket_bytes", getattr(args, "dp_bucket", None))) if v is not None}
    stage = {k: v for k, v in (("optimizer_time", getattr(args, "optimizer_time", None)),
                               ("weight_grad_bytes", getattr(args, "weight_grad_bytes", None))) if v is not None}
    if given:
        model = replace(model, data_parallel=replace(dp, **given))
    if stage:
        model = replace(model, stages=tuple(replace(s, **stage) for s in model.stages),
                        model_stages=None if model.model_stages is None else
                        tuple(replace(s, **stage) for s in model.model_stages))
    try:
        model.data_parallel.check()
    except CostError as exc:
        raise UsageError(str(exc)) from None
    return model
