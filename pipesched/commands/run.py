"""`pipesched run`: execute a schedule on torch.distributed and measure it.

Everything that can be checked is checked before any process starts: the schedule
(validation), the backend, the model arguments and that the stage modules chain.
Under torchrun the command runs this process's rank (env:// rendezvous); otherwise it
spawns the ranks locally.
"""
from __future__ import annotations

import argparse
import sys

from ..executor_args import (add_executor_args, add_measurement_args, check_launchable_ranks, import_executor,
                             model_from_args, model_label, prepare_checked, run_options)
from ..formatting import fmt_bytes, fmt_seconds, json_text
from ..options import add_schedule_args, add_step_args, schedule_from_args
from ..terminal import check_outputs, printable, wrote


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a schedule on torch.distributed and record a measured trace")
    add_schedule_args(p)
    add_executor_args(p)
    add_measurement_args(p, warmup=1)
    add_step_args(p, steps=False)
    p.add_argument("--trace", metavar="OUT.json",
                   help="write the measured Trace (the step of median makespan; with --dp the step nearest the mean)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_outputs({"--trace": args.trace}, {"SCHEDULE": args.schedule})
    import_executor("run")
    from pipesched.executor.comm import ExecutorError
    from pipesched.executor.job import start

    options = run_options(args)
    check_launchable_ranks(args.ranks, options.dp)
    schedule = schedule_from_args(args)
    model = model_from_args(args, schedule)
    graph = prepare_checked(schedule, model, args.backend, options.dp, args.timeout, model_label(args))
    try:
        result = start(schedule, model, options, args.backend)
    except ExecutorError as exc:
        print(f"pipesched: error: {exc}", file=sys.stderr)
        return exc.exit_status
    if result is None:  # a rank other than 0 under torchrun
        return 0
    if args.trace:
        result.trace.save(args.trace)
        wrote(args.trace, to_stderr=args.json)
    summary = result.summary()
    if args.json:
        print(json_text(summary))
    else:
        print_table(summary, graph.schedule.num_model_stages)
    check = result.check
    return 1 if check is not None and not (check.loss_matches and check.grads_match and check.replicas_identical) else 0


def print_table(s: dict, model_stages: int) -> None:
    print(f"{printable(s['schedule'])}: {s['ranks']} ranks, {s['microbatches']} microbatches, {model_stages} model stages "
          f"({s['backend']}; {s['model']})")
    which = "step nearest the mean" if s.get("data_parallel") else "median step"
    print(f"step time median {fmt_seconds(s['step_time_median'])} over {s['steps']} steps; {which}: makespan "
          f"{fmt_seconds(s['makespan'])}, bubble {100 * s['bubble_ratio']:.2f} %, communication "
          f"{fmt_seconds(s['comm_time'])} ({100 * s['comm_hidden_fraction']:.1f} % hidden under compute)")
    if s.get("period"):
        print(f"period {fmt_seconds(s['period'])} per step (median of rank 0's step-start differences, "
              f"{'no barrier' if s.get('step_barrier') == 'none' else 'a barrier'} between steps), throughput "
              f"{s['throughput']:.4g} microbatches/s")
    if s.get("data_parallel"):
        d = s["data_parallel"]
        print(f"data parallel: {d['degree']} replicas ({s['ranks'] * d['degree']} processes, the batch "
              f"{s['microbatches'] * d['degree']} microbatches); replica 0's all-reduces {fmt_seconds(d['allreduce_time'])} "
              f"over its ranks, {fmt_seconds(d['allreduce_exposed'])} exposed")
    print(f"{'rank':>4}  {'busy':>11}  {'idle':>11}  {'bubble':>7}  {'peak memory':>12}  {'overhead/op':>11}")
    for r in s["per_rank"]:
        print(f"{r['rank']:>4}  {fmt_seconds(r['busy']):>11}  {fmt_seconds(r['idle']):>11}  "
              f"{100 * r['bubble_ratio']:>6.2f}%  {fmt_bytes(r['peak_memory_bytes']):>12}  "
              f"{fmt_seconds(r['overhead_per_op']):>11}")
    if s.get("loss_matches_reference") is None:
        print("reference check skipped")
    else:
        ok = s["loss_matches_reference"] and s["grads_match_reference"]
        print(f"reference check {'passed' if ok else 'FAILED'}: loss {s['loss']:.10g} vs {s['reference_loss']:.10g} "
              f"(relative error {s['loss_rel_error']:.2g}), max gradient relative error "
              f"{s['max_grad_rel_error']:.2g} ({s['worst_parameter']}), tolerance {s['tolerance']:g}")
